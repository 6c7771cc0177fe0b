"""`check_backend(cls)`: the contract suite every backend passes, ours and plugins alike.

It checks the primitives against a brute-force float64 reference on asymmetric data (features
on different scales and offsets, so a swapped or dropped feature fails), in float32 and
float64, with n not a multiple of any chunk size, k from 1 to n, zero weights, a full
Lloyd run that must give the numpy backend's partition from the same initial centers (and,
for a backend that runs the whole loop itself, `lloyd`, the driver's on its primitives),
MiniBatchKMeans's steps (its `lloyd_iter` on gathered batches, through `batch_backend`),
which must give the numpy backend's centers, counts and steps, for spherical k-means, the
placement's unit rows and whole `SphericalKMeans` fits likewise, on NumPy input the
bounded assignment (`assign_bounded`, each bounds method) against `assign`, the m nearest
centers of a balanced fit (`nearest`) against the brute-force distances, and batches of
problems (`testing.batches`): `batch_lloyd_iter` equal to each problem's `lloyd_iter`, and
batched fits equal to the numpy backend's single fits.

    from kmeans_xp.testing import check_backend
    check_backend(MyBackend)                       # raises AssertionError on the first failure
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kmeans_xp.contract import return_checks as returned
from kmeans_xp.contract.backend import Array, KMeansBackend, Namespace
from kmeans_xp.contract.namespaces import device, to_numpy
from kmeans_xp.testing.batches import check_batch_fit, check_batch_iteration
from kmeans_xp.testing.fits import (  # noqa: F401 - asymmetric_data and lloyd_cases are public here
    _dev,
    _host,
    asymmetric_data,
    check_lloyd,
    check_minibatch,
    check_own_loop,
    check_unit_rows,
    lloyd_cases,
)
from kmeans_xp.testing.precision_checks import check_half_precision


def _brute(X: np.ndarray, C: np.ndarray, labels: np.ndarray | None = None,
           w: Any = None) -> dict[str, np.ndarray]:
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


def _tie_free(dist: np.ndarray, labels: np.ndarray, rtol: float) -> np.ndarray:
    """Rows whose best and second-best distances differ clearly (ties may go either way)."""
    if dist.shape[1] == 1:
        return np.ones(len(labels), bool)
    part = np.partition(dist, 1, axis=1)
    return (part[:, 1] - part[:, 0]) > rtol * (1 + np.abs(part[:, 0]))


def _cases() -> list[tuple[int, int, int]]:
    # (n, d, k): n odd and prime-ish so no chunk or block size divides it
    return [(1, 1, 1), (97, 1, 1), (257, 2, 7), (1031, 3, 13), (401, 17, 50), (211, 5, 211),
            (3001, 3, 500), (523, 128, 9)]


def check_backend(cls: type[KMeansBackend], *,
                  make_array: Callable[[np.ndarray], Array] | None = None,
                  dtypes: Sequence[npt.DTypeLike] = (np.float32, np.float64),
                  max_memory: int | str = "2MB",
                  cases: Sequence[tuple[int, int, int]] | None = None) -> int:
    """Run the contract suite on backend class `cls`.

    make_array: converts a NumPy array into the backend's input namespace (default: NumPy if
    the backend takes NumPy, else its placement's `to_backend`). max_memory is small on
    purpose, so that chunking is exercised; on NumPy input the peak memory of a `lloyd_iter`
    is measured (tracemalloc) against the backend's `estimate_memory`. Returns the number of
    checks passed.
    """
    _check_class(cls)
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
            Xb = backend.placement.to_backend(X)
            xp = backend.placement.namespace(Xb)
            C = xp.asarray(C_np, device=_dev(Xb))
            w = xp.asarray(w_np, device=_dev(Xb))
            where = f"{cls.name} n={n} d={d} k={k} {np.dtype(dtype)}"
            ref = Reference(X_np, C_np, w_np, rtol)
            passed += _failed_check(where, check_primitives, backend, Xb, C, w, ref, xp, where)
            passed += _failed_check(where, check_iteration, backend, Xb, C, w, ref, xp, where)
            passed += _failed_check(where, check_extras, backend, Xb, C, w, ref, xp, where)
            passed += _failed_check(where, check_nearest, backend, Xb, C, ref, xp, where)
            passed += _failed_check(where, check_seeding, backend, Xb, w, min(k, 6), xp, where)
            passed += _failed_check(where, check_bounded, backend, Xb, C_np, rtol, xp, where)
        where = f"{cls.name} {np.dtype(dtype)}"
        for check, kw in ((check_memory_bound, {}), (check_lloyd, {}), (check_own_loop, {}),
                          (check_minibatch, {}), (check_unit_rows, {}),
                          (check_lloyd, {"spherical": True}),
                          (check_own_loop, {"spherical": True}),
                          (check_batch_iteration, {}), (check_batch_fit, {})):
            passed += _failed_check(f"{where} {check.__name__}", check, backend, to_arr, dtype,
                                    **kw)
    passed += int(_failed_check(f"{cls.name} half precision", check_half_precision, backend,
                                to_arr))
    return passed


def _failed_check(where: str, check: Any, *args: Any, **kwargs: Any) -> Any:
    """check(*args, **kwargs), where whatever a malformed return makes fail (a contract
    fault, or an error while the suite reads the result) is a failed check: an
    AssertionError saying where and why, never another exception."""
    try:
        return check(*args, **kwargs)
    except AssertionError:
        raise
    except returned.BackendContractError as exc:
        raise AssertionError(f"{where}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - reported as the failed check it is
        raise AssertionError(f"{where}: {check.__name__} failed on the backend's results: "
                             f"{type(exc).__name__}: {exc}") from exc


def _check_class(cls: type[KMeansBackend]) -> None:
    from kmeans_xp.contract.backend import Option
    assert isinstance(cls, type) and issubclass(cls, KMeansBackend), \
        f"{cls!r} must subclass kmeans_xp.KMeansBackend"
    assert isinstance(cls.name, str) and cls.name, "backend needs a non-empty `name`"
    assert isinstance(cls.namespaces, frozenset) and cls.namespaces, \
        "backend needs `namespaces`, a non-empty frozenset of namespace names"
    assert all(isinstance(o, Option) for o in cls.options.values()), \
        "`options` maps option names to kmeans_xp.contract.backend.Option"


def _default_maker(backend: KMeansBackend) -> Callable[[np.ndarray], Array]:
    """NumPy input when the backend takes it, else its placement's `to_backend`."""
    if backend.accepts(np.zeros((2, 2)), n_clusters=1):
        return lambda a: a
    return backend.placement.to_backend


class Reference:
    """Brute-force float64 answers for one case."""

    n: int
    k: int
    scale: float

    def __init__(self, X: np.ndarray, C: np.ndarray, w: np.ndarray, rtol: float) -> None:
        self.X, self.C, self.w, self.rtol = X, C, w, rtol
        b = _brute(X, C)
        self.labels, self.dist = b["labels"], b["dist"]
        self.n, self.k = X.shape[0], C.shape[0]
        self.scale = np.abs(X).max() ** 2 + 1
        self.clear = _tie_free(self.dist, self.labels, rtol * 100)

    def sums(self, labels: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
        return _brute(self.X, self.C, labels, w)

    def sum_atol(self) -> Any:  # (float ** 0.5 is Any to mypy: it may be complex)
        return self.rtol * self.scale ** 0.5 * self.n ** 0.5


def check_primitives(backend: KMeansBackend, X: Array, C: Array, w: Array, ref: Reference,
                     xp: Namespace, where: str) -> int:
    """assign against the brute-force argmin; reduce against np.add.at, weighted and not."""
    n, k, rtol = ref.n, ref.k, ref.rtol
    labels, min_sq = backend.assign(X, C, xp=xp)
    returned.check_labels(backend, "assign", labels, n, k)
    lab = to_numpy(labels).astype(np.int64)
    mins = _host(returned.check_array(backend, "assign", "min_sq_dist", min_sq))
    assert lab.shape == (n,) and mins.shape == (n,), f"{where}: assign shapes {lab.shape}"
    assert lab.min() >= 0 and lab.max() < k, f"{where}: labels outside [0, {k})"
    bad = np.flatnonzero((lab != ref.labels) & ref.clear)
    assert bad.size == 0, f"{where}: {bad.size} labels are not the argmin (first at {bad[:5]})"
    assert np.all(mins >= 0), f"{where}: negative min_sq_dist"
    assert np.allclose(mins, ref.dist[np.arange(n), lab], rtol=rtol * 100,
                       atol=rtol * 10 * ref.scale), f"{where}: min_sq_dist differs from ||x-c||^2"
    for weights, w_np in ((w, ref.w.astype(np.float64)), (None, np.ones(n))):
        red = ref.sums(lab, w_np)
        sums, wsum = backend.reduce(X, labels, weights, k, xp=xp)
        returned.check_sums(backend, "reduce", sums, wsum, k, ref.X.shape[1])
        sums, wsum = _host(sums), _host(wsum)
        what = "unit weights (None)" if weights is None else "weights"
        assert sums.shape == (k, ref.X.shape[1]) and wsum.shape == (k,), \
            f"{where}: reduce shapes"
        assert np.allclose(wsum, red["weights"], rtol=rtol * 10, atol=rtol), \
            f"{where}: weight_in_clusters wrong with {what}"
        assert np.allclose(sums, red["sums"], rtol=rtol * 10, atol=ref.sum_atol()), \
            f"{where}: weighted_sums wrong with {what}"
    return 3


def check_iteration(backend: KMeansBackend, X: Array, C: Array, w: Array, ref: Reference,
                    xp: Namespace, where: str) -> int:
    """lloyd_iter: the assignment's labels, the sums, inertia and changed-label count, and
    new arrays each call (the driver keeps the last labels and may issue the next call before
    it reads them)."""
    lab = to_numpy(backend.assign(X, C, xp=xp).labels).astype(np.int64)
    it = returned.check_iteration(backend, backend.lloyd_iter(X, w, C, None, xp=xp),
                                  ref.n, ref.k, ref.X.shape[1])
    got = to_numpy(it.labels).astype(np.int64)
    assert np.array_equal(got, lab), f"{where}: lloyd_iter labels != assign"
    red = ref.sums(lab, ref.w.astype(np.float64))
    assert np.allclose(_host(it.weighted_sums), red["sums"], rtol=ref.rtol * 10,
                       atol=ref.sum_atol()), f"{where}: lloyd_iter sums"
    assert np.allclose(_host(it.weight_in_clusters), red["weights"], rtol=ref.rtol * 10,
                       atol=ref.rtol), f"{where}: lloyd_iter weights"
    inertia = float(np.sum(ref.dist[np.arange(ref.n), lab] * ref.w))
    assert np.isclose(float(_host(it.inertia)), inertia, rtol=ref.rtol * 100,
                      atol=ref.rtol * 10 * ref.scale * ref.n), f"{where}: lloyd_iter inertia"
    assert float(_host(it.n_changed)) == ref.n, f"{where}: n_changed without labels_old != n"
    before = got.copy()
    other = xp.flip(C, axis=0) * 2 + 1  # other centers: other labels
    it2 = backend.lloyd_iter(X, None, other, it.labels, xp=xp)
    lab2 = to_numpy(it2.labels).astype(np.int64)
    assert np.array_equal(to_numpy(it.labels).astype(np.int64), before), \
        f"{where}: a later call overwrote earlier labels (reused output buffers)"
    assert float(_host(it2.n_changed)) == np.count_nonzero(lab2 != before), \
        f"{where}: n_changed != number of labels that changed"
    assert np.allclose(_host(it2.weight_in_clusters), np.bincount(lab2, minlength=ref.k)), \
        f"{where}: lloyd_iter weights with unit weights (None)"
    if not backend.ahead_gate:
        return 2
    clear = xp.zeros((1,), dtype=xp.bool, device=device(C))  # (the driver's flag: not set)
    # an ahead_gate backend's lloyd_iter takes skip= (KMeansBackend.__init_subclass__)
    it3 = backend.lloyd_iter(X, w, C, None, xp=xp, skip=clear)  # type: ignore[call-arg]
    assert np.array_equal(to_numpy(it3.labels).astype(np.int64), got) and np.array_equal(
        _host(it3.weighted_sums), _host(it.weighted_sums)), \
        f"{where}: ahead_gate: lloyd_iter(skip=<not set>) differs from lloyd_iter()"
    return 3


def check_extras(backend: KMeansBackend, X: Array, C: Array, w: Array, ref: Reference,
                 xp: Namespace, where: str) -> int:
    """inertia (direct differences), labels_inertia (the same labels and inertia) and
    farthest (relocation candidates)."""
    lab = ref.labels
    labels = xp.asarray(lab, device=_dev(X))
    direct = ref.dist[np.arange(ref.n), lab]
    got = float(_host(backend.inertia(X, w, C, labels, xp=xp)))
    assert np.isclose(got, float(np.sum(direct * ref.w)), rtol=ref.rtol * 10,
                      atol=ref.rtol * ref.scale), f"{where}: inertia"
    lab_li, got_li = backend.labels_inertia(X, w, C, xp=xp)
    own = backend.assign(X, C, xp=xp).labels
    assert np.array_equal(to_numpy(lab_li).astype(np.int64), to_numpy(own).astype(np.int64)), \
        f"{where}: labels_inertia's labels are not assign's"
    own_inertia = float(_host(backend.inertia(X, w, C, own, xp=xp)))
    assert np.isclose(float(_host(got_li)), own_inertia, rtol=ref.rtol * 10,
                      atol=ref.rtol * ref.scale), f"{where}: labels_inertia's inertia"
    m = min(3, int(np.count_nonzero(ref.w > 0)))
    far = backend.farthest(X, w, C, labels, m, xp=xp)
    key = np.where(ref.w > 0, direct, -1.0)
    top = np.sort(key)[::-1][:m]
    idx = to_numpy(far.index).astype(np.int64)
    assert idx.shape == (m,), f"{where}: farthest returned {idx.shape} points, not {m}"
    assert np.allclose(_host(far.sq_dist), top, rtol=ref.rtol * 100, atol=ref.rtol * ref.scale), \
        f"{where}: farthest distances are not the largest"
    assert np.all(ref.w[idx] > 0), f"{where}: farthest picked a zero-weight point"
    assert np.allclose(_host(far.x), ref.X[idx]) and np.array_equal(
        to_numpy(far.label).astype(np.int64), lab[idx]), f"{where}: farthest rows or labels"
    assert np.allclose(_host(far.weight), ref.w[idx]), f"{where}: farthest weights"
    # farthest_many: each problem's farthest, stacked, the shorter one padded with sq_dist -1
    one = backend.farthest(X, w, C, labels, 1, xp=xp)
    many = backend.farthest_many([(X, w, C, labels, m), (X, w, C, labels, 1)], xp=xp)
    for p, (f, mp) in enumerate(((far, m), (one, 1))):
        for name in ("index", "label"):
            assert np.array_equal(to_numpy(getattr(many, name)[p, ...])[:mp].astype(np.int64),
                                  to_numpy(getattr(f, name)).astype(np.int64)), \
                f"{where}: farthest_many's {name} of problem {p} are not its farthest's"
        for name in ("x", "weight", "sq_dist"):
            assert np.array_equal(_host(getattr(many, name)[p, ...])[:mp],
                                  _host(getattr(f, name))), \
                f"{where}: farthest_many's {name} of problem {p} are not its farthest's"
    assert np.all(_host(many.sq_dist)[1, 1:] < 0), f"{where}: farthest_many's padding"
    return 3


def check_nearest(backend: KMeansBackend, X: Array, C: Array, ref: Reference,
                  xp: Namespace, where: str, m: int = 4) -> int:
    """nearest (a balanced fit's candidates): (n, min(m, k)) centers, nearest first, whose
    squared distances are the brute-force ones; column 0 is the argmin (up to near ties)
    and the columns are the m smallest distances of each row."""
    got = backend.nearest(X, C, m, xp=xp)
    mm = min(m, ref.k)
    idx = to_numpy(got.index).astype(np.int64)
    dist = _host(got.sq_dist)
    assert idx.shape == (ref.n, mm) and dist.shape == (ref.n, mm), \
        f"{where}: nearest shapes {idx.shape}, {dist.shape}, not {(ref.n, mm)}"
    assert idx.min() >= 0 and idx.max() < ref.k, f"{where}: nearest indices outside [0, k)"
    assert all(np.unique(row).size == mm for row in idx[:50]), \
        f"{where}: nearest gives a center twice in a row"
    want = np.take_along_axis(ref.dist, idx, axis=1)
    tol = ref.rtol * 10 * ref.scale
    assert np.allclose(dist, want, rtol=ref.rtol * 100, atol=tol), \
        f"{where}: nearest distances differ from ||x - c||^2"
    assert np.all(np.diff(dist, axis=1) >= -tol), f"{where}: nearest not nearest first"
    kth = np.sort(ref.dist, axis=1)[:, mm - 1]
    assert np.all(want.max(axis=1) <= kth + tol + ref.rtol * 100 * kth), \
        f"{where}: nearest's centers are not the {mm} nearest"
    bad = np.flatnonzero((idx[:, 0] != ref.labels) & ref.clear)
    assert bad.size == 0, f"{where}: nearest's first column is not the argmin at {bad[:5]}"
    return 1


def check_bounded(backend: KMeansBackend, X: Array, C: Any, rtol: float, xp: Namespace,
                  where: str) -> int:
    """assign_bounded with each bounds method (`kmeans_xp.contract.bounds`) gives `assign`'s
    labels, up to near ties: on its first call (every row computed), then after the centers
    move twice (rows kept by their bounds), the last move relocating one center far away.
    The driver asks for it on NumPy X only: nothing to check elsewhere, nor for k = 1."""
    from kmeans_xp.contract.bounds import METHODS, Bounds

    if not isinstance(X, np.ndarray) or C.shape[0] < 2:
        return 0
    n, d = X.shape
    k = C.shape[0]
    rng = np.random.default_rng(n + k)
    spread = float(np.abs(C).max()) + 1.0
    moved = (C + rng.normal(size=C.shape) * 0.01 * spread).astype(C.dtype)
    jumped = moved.copy()
    jumped[k // 2] += 3 * spread
    for method in METHODS:
        bounds = Bounds(method, n, d, k, X.dtype)
        for step, centers in enumerate((C, moved, jumped)):
            got = to_numpy(backend.assign_bounded(X, centers, bounds, xp=xp))
            want = to_numpy(backend.assign(X, centers, xp=xp).labels).astype(np.int64)
            brute = _brute(X, centers)
            clear = _tie_free(brute["dist"], brute["labels"], rtol)
            assert got.shape == (n,) and got.min() >= 0 and got.max() < k, \
                f"{where}: assign_bounded ({method}) labels outside [0, {k})"
            bad = np.flatnonzero((got != want) & clear)
            assert bad.size == 0, (f"{where}: assign_bounded ({method}, step {step}) differs "
                                   f"from assign at {bad.size} rows (first at {bad[:5]})")
    return 1


def check_seeding(backend: KMeansBackend, X: Array, w: Array, k: int, xp: Namespace,
                  where: str) -> int:
    """A backend's own k-means++ steps (`seeding`, when it has them) draw the rows the xp
    steps draw on the same X, with and without weights."""
    from kmeans_xp.algorithms.init import kmeans_plusplus
    from kmeans_xp.contract.seeding import local_trials
    passed = 0
    for weights in (None, w):
        steps = backend.seeding(X, weights, local_trials(k), xp=xp)
        if steps is None:
            continue
        kw = dict(sample_weight=weights, xp=xp, rows=X.shape[0])
        got = kmeans_plusplus(X, k, random_state=np.random.RandomState(7), seeding=steps, **kw)[1]
        ref = kmeans_plusplus(X, k, random_state=np.random.RandomState(7), **kw)[1]
        assert np.array_equal(got, ref), f"{where}: seeding drew rows {got}, the xp steps {ref}"
        passed += 1
    return passed


def check_memory_bound(backend: KMeansBackend, to_arr: Callable[[np.ndarray], Array],
                       dtype: npt.DTypeLike, n: int = 20011, d: int = 3, k: int = 300) -> int:
    """On NumPy input: the peak of one lloyd_iter stays within the backend's own estimate
    plus its outputs (labels), under a budget small enough to force chunking."""
    import tracemalloc

    X_np = asymmetric_data(n, d, 20, dtype=dtype, seed=3)
    X = to_arr(X_np)
    if not isinstance(X, np.ndarray):
        return 0
    itemsize = np.dtype(dtype).itemsize
    try:
        est = type(backend).estimate_memory(n, d, k, itemsize=itemsize,
                                            max_memory=backend.max_memory)
    except NotImplementedError:
        raise AssertionError(f"{backend.name}: estimate_memory is not implemented") from None
    C = X_np[:k].copy()
    xp = backend.placement.namespace(X)
    backend.lloyd_iter(X, None, C, None, xp=xp)  # warm: buffers a backend keeps are counted
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        it = backend.lloyd_iter(X, None, C, None, xp=xp)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    allowed = est.total + n * 8 + (256 << 10)  # the labels, and Python's own objects
    assert peak <= allowed, (
        f"{backend.name}: one lloyd_iter at n={n}, k={k}, max_memory={backend.max_memory!r} "
        f"took {peak} bytes, more than its estimate {est.total} + labels")
    del it
    return 1
