"""`check_backend(cls)`: the contract suite every backend passes, ours and plugins alike.

It checks the primitives against a brute-force float64 reference on asymmetric data (features
on different scales and offsets, so a swapped or dropped feature fails), in float32 and
float64, with n not a multiple of any chunk size, k from 1 to n, zero weights, and a full
Lloyd run that must give the numpy backend's partition from the same initial centers.

    from kmeans_xp.testing import check_backend
    check_backend(MyBackend)                       # raises AssertionError on the first failure
"""
from __future__ import annotations

import contextlib

import numpy as np

from .namespaces import array_namespace, to_numpy
from .backend import KMeansBackend


def asymmetric_data(n, d, k, *, dtype=np.float64, seed=0, offset=0.0):
    """k blobs whose features have different scales and offsets (never symmetric in x<->y)."""
    rng = np.random.default_rng(seed)
    scales = 1.0 + np.arange(d) * 0.7
    centers = rng.uniform(-10, 10, size=(k, d)) * scales + np.arange(d) * 3.0
    X = centers[rng.integers(0, k, size=n)] + rng.normal(size=(n, d)) * scales * 0.8
    return (X + offset).astype(dtype)


def _brute(X, C, labels=None, w=None):
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    d = ((X64[:, None, :] - C64[None, :, :]) ** 2).sum(-1)
    lab = d.argmin(1)
    out = {"labels": lab, "min": d[np.arange(len(X)), lab], "dist": d}
    if labels is not None:
        k = C.shape[0]
        sums = np.zeros((k, X.shape[1]))
        np.add.at(sums, labels, X64 * w[:, None])
        out["sums"], out["weights"] = sums, np.bincount(labels, weights=w, minlength=k)
    return out


def _tie_free(dist, labels, rtol):
    """Rows whose best and second-best distances differ clearly (ties may go either way)."""
    if dist.shape[1] == 1:
        return np.ones(len(labels), bool)
    part = np.partition(dist, 1, axis=1)
    return (part[:, 1] - part[:, 0]) > rtol * (1 + np.abs(part[:, 0]))


def _cases():
    # (n, d, k): n odd and prime-ish so no chunk or block size divides it
    return [(1, 1, 1), (97, 1, 1), (257, 2, 7), (1031, 3, 13), (401, 17, 50), (211, 5, 211),
            (3001, 3, 500), (523, 128, 9)]


def check_backend(cls, *, make_array=None, dtypes=(np.float32, np.float64),
                  max_memory="2MB", cases=None):
    """Run the contract suite on backend class `cls`.

    make_array: converts a NumPy array into the backend's input namespace (default: NumPy if
    the backend takes NumPy, else its `to_backend`). max_memory is small on purpose, so that
    chunking is exercised. Returns the number of checks passed.
    """
    assert isinstance(cls, type) and issubclass(cls, KMeansBackend), \
        f"{cls!r} must subclass kmeans_xp.KMeansBackend"
    assert isinstance(cls.name, str) and cls.name, "backend needs a non-empty `name`"
    assert isinstance(cls.namespaces, frozenset) and cls.namespaces, \
        "backend needs `namespaces`, a non-empty frozenset of namespace names"
    backend = cls(max_memory=max_memory)
    to_arr = make_array or _default_maker(backend)
    passed = 0
    for dtype in dtypes:
        rtol = 1e-4 if dtype == np.float32 else 1e-10
        for n, d, k in cases or _cases():
            X_np = asymmetric_data(n, d, max(1, k // 2), dtype=dtype, seed=n + d + k)
            X_np -= X_np.mean(axis=0)  # the driver hands backends mean-centered data
            rng = np.random.default_rng(k)
            jitter = rng.normal(size=(k, d)).astype(dtype) * 0.01
            C_np = X_np[rng.choice(n, k, replace=False)] + jitter
            w_np = rng.uniform(0.5, 2.0, size=n).astype(dtype)
            w_np[rng.random(n) < 0.1] = 0
            X = to_arr(X_np)
            assert backend.accepts(X, n_clusters=k), f"{cls.name} refuses its own input"
            Xb = backend.to_backend(X)
            xp = array_namespace(Xb)
            C = xp.asarray(C_np, device=_dev(Xb))
            w = xp.asarray(w_np, device=_dev(Xb))
            passed += _check_primitives(backend, Xb, C, w, X_np, C_np, w_np, xp, rtol,
                                        f"{cls.name} n={n} d={d} k={k} {np.dtype(dtype)}")
        passed += _check_lloyd(backend, to_arr, dtype)
    return passed


def _default_maker(backend):
    """NumPy input when the backend takes it, else the backend's own `to_backend` (as the
    docstring of `check_backend` promises)."""
    if backend.accepts(np.zeros((2, 2)), n_clusters=1):
        return lambda a: a
    return backend.to_backend


def _dev(x):
    from array_api_compat import device
    return device(x)


def _check_primitives(backend, X, C, w, X_np, C_np, w_np, xp, rtol, where):
    ref = _brute(X_np, C_np)
    labels, min_sq = backend.assign(X, C, xp=xp)
    lab = to_numpy(labels).astype(np.int64)
    mins = to_numpy(min_sq).astype(np.float64)
    n, k = X_np.shape[0], C_np.shape[0]
    assert lab.shape == (n,) and mins.shape == (n,), f"{where}: assign shapes {lab.shape}"
    assert lab.min() >= 0 and lab.max() < k, f"{where}: labels outside [0, {k})"
    clear = _tie_free(ref["dist"], ref["labels"], rtol * 100)
    bad = np.flatnonzero((lab != ref["labels"]) & clear)
    assert bad.size == 0, f"{where}: {bad.size} labels are not the argmin (first at {bad[:5]})"
    scale = np.abs(X_np).max() ** 2 + 1
    assert np.all(mins >= 0), f"{where}: negative min_sq_dist"
    assert np.allclose(mins, ref["dist"][np.arange(n), lab], rtol=rtol * 100,
                       atol=rtol * 10 * scale), f"{where}: min_sq_dist differs from ||x - c||^2"
    red = _brute(X_np, C_np, lab, w_np.astype(np.float64))
    sums, weights = backend.reduce(X, labels, w, k, xp=xp)
    sums, weights = to_numpy(sums).astype(np.float64), to_numpy(weights).astype(np.float64)
    assert sums.shape == (k, X_np.shape[1]) and weights.shape == (k,), f"{where}: reduce shapes"
    assert np.allclose(weights, red["weights"], rtol=rtol * 10, atol=rtol), \
        f"{where}: weight_in_clusters wrong"
    assert np.allclose(sums, red["sums"], rtol=rtol * 10, atol=rtol * scale ** 0.5 * n ** 0.5), \
        f"{where}: weighted_sums wrong"
    it = backend.lloyd_iter(X, w, C, xp=xp)
    assert np.array_equal(to_numpy(it.labels), lab), f"{where}: lloyd_iter labels != assign"
    assert np.allclose(to_numpy(it.weighted_sums), sums, rtol=rtol * 10,
                       atol=rtol * scale ** 0.5 * n ** 0.5), f"{where}: lloyd_iter sums"
    it2 = backend.lloyd_iter(X, w, C, xp=xp, update_centers=False)
    assert np.array_equal(to_numpy(it2.labels), lab), f"{where}: update_centers=False labels"
    _check_fresh_results(backend, X, w, C, it, xp, where)
    return 5


def _check_fresh_results(backend, X, w, C, it, xp, where):
    """Results are new arrays: the driver keeps last iteration's labels to detect strict
    convergence, which a backend that reuses its output buffers would silently overwrite."""
    before = to_numpy(it.labels).copy(), to_numpy(it.min_sq_dist).copy()
    other = xp.flip(C, axis=0) * 2 + 1  # other centers: other labels and distances
    backend.lloyd_iter(X, w, other, xp=xp)
    backend.assign(X, other, xp=xp)
    assert np.array_equal(to_numpy(it.labels), before[0]) and np.array_equal(
        to_numpy(it.min_sq_dist), before[1]), \
        f"{where}: a later call overwrote earlier results (reused output buffers)"


@contextlib.contextmanager
def _registered(cls):
    """`cls` is what its name resolves to while the fit runs, then the registry is as it was:
    the class under test is used even when an installed backend (a built-in, a plugin, an
    older version of it) has the same name."""
    from . import registry

    previous = registry._runtime.get(cls.name)
    registry._runtime[cls.name] = cls
    registry.list_backends.cache_clear()
    try:
        yield
    finally:
        if previous is None:
            registry._runtime.pop(cls.name, None)
        else:
            registry._runtime[cls.name] = previous
        registry.list_backends.cache_clear()


def _check_lloyd(backend, to_arr, dtype):
    """A whole fit from the same init gives the numpy backend's partition."""
    from .estimator import KMeans

    X = asymmetric_data(2049, 3, 12, dtype=dtype, seed=7)
    init = X[np.random.default_rng(1).choice(len(X), 12, replace=False)]
    ref = KMeans(12, init=init, backend="numpy", max_iter=50).fit(X)
    name = backend.name
    with _registered(type(backend)):
        got = KMeans(12, init=init, backend=name, max_iter=50,
                     max_memory=backend.max_memory).fit(to_arr(X))
    assert got.backend_ == name, f"the fit ran on {got.backend_!r}, not {name!r}"
    labels = to_numpy(got.labels_)
    assert np.array_equal(labels, ref.labels_), \
        f"{name} {np.dtype(dtype)}: partition differs from numpy backend " \
        f"({np.mean(labels != ref.labels_):.4%} of labels)"
    assert got.n_iter_ == ref.n_iter_, f"{name}: n_iter {got.n_iter_} != {ref.n_iter_}"
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    assert abs(got.inertia_ - ref.inertia_) <= rtol * ref.inertia_, f"{name}: inertia"
    return 1
