"""The contract suite's data and whole fits (`kmeans_xp.testing.check_backend` runs them): the
asymmetric test data, and KMeans, SphericalKMeans and MiniBatchKMeans fits through a backend
that must give the numpy backend's answers from the same initial centers."""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract import registry
from kmeans_xp.contract.namespaces import to_numpy


def asymmetric_data(n, d, k, *, dtype=np.float64, seed=0, offset=0.0):
    """k blobs whose features have different scales and offsets (never symmetric in x<->y)."""
    rng = np.random.default_rng(seed)
    scales = 1.0 + np.arange(d) * 0.7
    centers = rng.uniform(-10, 10, size=(k, d)) * scales + np.arange(d) * 3.0
    X = centers[rng.integers(0, k, size=n)] + rng.normal(size=(n, d)) * scales * 0.8
    return (X + offset).astype(dtype)


def _dev(x):
    from array_api_compat import device
    return device(x)


def fit_max_memory(backend, X, k, weighted=False):
    """max_memory for a whole fit of X in the suite: the backend's own (small) budget beside
    what the driver's arrays need (max_memory bounds both: `contract.fitmemory`)."""
    from kmeans_xp.contract.fitmemory import least_max_memory
    from kmeans_xp.contract.memory import compute_itemsize, parse_memory

    budget = parse_memory(backend.max_memory)
    if budget == "auto":
        return "auto"
    n, d = X.shape
    try:
        least = least_max_memory(type(backend), n, d, k, compute_itemsize(X.dtype),
                                 weighted=weighted)
    except NotImplementedError:   # (no estimate: the backend's budget alone)
        return budget
    return least + budget


def _host(a):
    return to_numpy(a).astype(np.float64)


#: the driver's test matrix: (name, KMeans kwargs, data maker, fit kwargs)
def lloyd_cases(dtype):
    X = asymmetric_data(2049, 3, 12, dtype=dtype, seed=7)
    init = X[np.random.default_rng(1).choice(len(X), 12, replace=False)]
    w = np.random.default_rng(2).uniform(0.5, 2.0, len(X)).astype(dtype)
    w[::7] = 0
    far = init.copy()
    far[:3] += 1e3      # three centers nobody is near: empty clusters, relocation
    # five points, each repeated (identical centers, ties in every assignment); unequal
    # counts, so that no two points sit at exactly the same distance from a mean (that tie
    # would be decided by the last bit of the mean, which exact and rounded sums differ in)
    dup = np.repeat(X[:5], [40, 41, 42, 43, 44], axis=0)
    guard = np.array([[0.0]] * 4 + [[1.0]] * 6, dtype=dtype)  # every point on a center
    return [
        ("relocation guard", dict(n_clusters=5, init=np.zeros((5, 1), dtype)), guard, {}),
        ("plain", dict(n_clusters=12, init=init, max_iter=50), X, {}),
        ("weights", dict(n_clusters=12, init=init, max_iter=50), X, {"sample_weight": w}),
        ("empty clusters", dict(n_clusters=12, init=far, max_iter=50), X, {}),
        ("duplicates", dict(n_clusters=8, init=dup[:8], max_iter=50), dup, {}),
        ("tol", dict(n_clusters=12, init=init, max_iter=50, tol=1e-2), X, {}),
        ("max_iter 1", dict(n_clusters=12, init=init, max_iter=1), X, {}),
        ("k 1", dict(n_clusters=1, init=init[:1], max_iter=10), X, {}),
    ]


def spherical_cases(dtype):
    """The spherical driver's test matrix, as `lloyd_cases`: data on one side of the origin
    (directions in a cone, as of nonnegative features), so that centers pointing away from
    it (`far`) lose every point and are relocated; unit rows fitted as given; d=17."""
    X = asymmetric_data(2049, 3, 12, dtype=dtype, seed=7, offset=12.0)
    init = X[np.random.default_rng(1).choice(len(X), 12, replace=False)]
    w = np.random.default_rng(2).uniform(0.5, 2.0, len(X)).astype(dtype)
    w[::7] = 0
    far = init.copy()
    far[:3] *= -1
    X64 = X.astype(np.float64)
    unit = (X64 / np.linalg.norm(X64, axis=1, keepdims=True)).astype(dtype)
    wide = asymmetric_data(1031, 17, 6, dtype=dtype, seed=3, offset=2.0)
    return [
        ("plain", dict(n_clusters=12, init=init, max_iter=50), X, {}),
        ("weights", dict(n_clusters=12, init=init, max_iter=50), X, {"sample_weight": w}),
        ("empty clusters", dict(n_clusters=12, init=far, max_iter=50), X, {}),
        ("tol", dict(n_clusters=12, init=init, max_iter=50, tol=1e-2), X, {}),
        ("max_iter 1", dict(n_clusters=12, init=init, max_iter=1), X, {}),
        ("k 1", dict(n_clusters=1, init=init[:1], max_iter=10), X, {}),
        ("unit rows as given", dict(n_clusters=12, init=init, max_iter=50, copy_x=False),
         unit, {}),
        ("d 17", dict(n_clusters=9, init=wide[:9], max_iter=50), wide, {}),
    ]


def check_unit_rows(backend, to_arr, dtype):
    """`placement.unit_rows` (a spherical fit's data) on the backend's input: X's rows at
    unit norm in X's dtype, on a new array (X unchanged), and a row of norm 0 refused."""
    from kmeans_xp.contract.sphere import ZeroNormError
    X_np = asymmetric_data(3001, 5, 7, dtype=dtype, seed=5, offset=1.0)
    X_np[17] *= dtype(1e-30)  # tiny, not zero: still a direction
    place = backend.placement
    where = f"{backend.name} {np.dtype(dtype)} unit_rows"
    for X_case in (X_np, np.concatenate([X_np[:100], np.zeros((1, 5), dtype), X_np[100:]])):
        X_user = to_arr(X_case)
        before = np.array(to_numpy(X_user), copy=True)
        X = place.to_backend(X_user)
        try:
            U = _host(place.unit_rows(X, xp=place.namespace(X)))
        except ZeroNormError as exc:
            assert X_case.shape[0] != X_np.shape[0], f"{where}: raised on nonzero rows: {exc}"
            assert "[100]" in str(exc), f"{where}: the error does not name row 100: {exc}"
            continue
        assert X_case.shape[0] == X_np.shape[0], f"{where}: a row of norm 0 was accepted"
        X64 = X_case.astype(np.float64)
        ref = X64 / np.linalg.norm(X64, axis=1, keepdims=True)
        tol = 4 * np.finfo(dtype).eps
        assert U.shape == X_case.shape and np.allclose(U, ref, rtol=tol, atol=tol), \
            f"{where}: rows are not X's at unit norm"
        assert np.array_equal(to_numpy(X_user), before), f"{where}: the caller's X was written"
    return 1


def check_lloyd(backend, to_arr, dtype, spherical=False):
    """Whole fits from the same init give the numpy backend's partition, iterations and
    inertia on every case of the driver's matrix (`SphericalKMeans` on `spherical_cases`
    with `spherical`, whose centers must have unit norm)."""
    import warnings

    from kmeans_xp.estimators.kmeans import KMeans
    from kmeans_xp.estimators.spherical import SphericalKMeans

    name = backend.name
    checked = 0
    cls, cases = (SphericalKMeans, spherical_cases) if spherical else (KMeans, lloyd_cases)
    for case, kwargs, X, fit_kw in cases(dtype):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = cls(backend="numpy", **kwargs).fit(X, **fit_kw)
            with registry.registered(type(backend)):
                sw = fit_kw.get("sample_weight")
                got = cls(backend=name, max_memory=fit_max_memory(
                    backend, X, kwargs["n_clusters"], sw is not None), **kwargs).fit(
                    to_arr(X), **({} if sw is None else {"sample_weight": to_arr(sw)}))
        where = f"{name} {np.dtype(dtype)} {cls.__name__} case {case!r}"
        assert got.backend_ == name, f"the fit ran on {got.backend_!r}, not {name!r}"
        labels = to_numpy(got.labels_)
        assert np.array_equal(labels, ref.labels_), \
            f"{where}: partition differs from numpy backend " \
            f"({np.mean(labels != ref.labels_):.4%} of labels)"
        assert got.n_iter_ == ref.n_iter_, f"{where}: n_iter {got.n_iter_} != {ref.n_iter_}"
        rtol = 1e-4 if dtype == np.float32 else 1e-9
        assert abs(got.inertia_ - ref.inertia_) <= rtol * ref.inertia_ + 1e-12, \
            f"{where}: inertia {got.inertia_} != {ref.inertia_}"
        centers = _host(got.cluster_centers_)
        assert np.allclose(centers, ref.cluster_centers_, rtol=rtol * 10, atol=rtol), \
            f"{where}: centers"
        assert not spherical or np.allclose(np.linalg.norm(centers, axis=1), 1.0,
                                            rtol=0, atol=rtol), f"{where}: centers not unit"
        checked += 1
    return checked


def check_own_loop(backend, to_arr, dtype, spherical=False):
    """A backend that runs the whole Lloyd loop itself (`KMeansBackend.lloyd`) gives, on
    every case of the driver's matrix, what the driver gives on the same backend's
    primitives: the same partition, iterations, inertia, centers and history. (`check_lloyd`
    compares both with the numpy backend.) Nothing to check for a backend without one."""
    import warnings

    from kmeans_xp.contract.backend import KMeansBackend
    from kmeans_xp.estimators.kmeans import KMeans
    from kmeans_xp.estimators.spherical import SphericalKMeans

    own = type(backend)
    if own.lloyd is KMeansBackend.lloyd:
        return 0
    # the same backend with the loop left to the driver
    driven = type(f"{own.__name__}Driven", (own,), {"lloyd": KMeansBackend.lloyd})
    est, cases = (SphericalKMeans, spherical_cases) if spherical else (KMeans, lloyd_cases)
    checked = 0
    for case, kwargs, X, fit_kw in cases(dtype):
        sw = fit_kw.get("sample_weight")
        fits = []
        for cls in (own, driven):
            with warnings.catch_warnings(), registry.registered(cls):
                warnings.simplefilter("ignore")
                bound = fit_max_memory(backend, X, kwargs["n_clusters"], sw is not None)
                fits.append(est(backend=own.name, max_memory=bound, **kwargs).fit(
                    to_arr(X), **({} if sw is None else {"sample_weight": to_arr(sw)})))
        got, ref = fits
        where = f"{own.name} {np.dtype(dtype)} {est.__name__} case {case!r}: its own loop"
        assert np.array_equal(to_numpy(got.labels_), to_numpy(ref.labels_)), \
            f"{where} gives another partition than the driver's"
        assert got.n_iter_ == ref.n_iter_, f"{where}: n_iter {got.n_iter_} != {ref.n_iter_}"
        rtol = 1e-5 if dtype == np.float32 else 1e-11
        assert abs(got.inertia_ - ref.inertia_) <= rtol * ref.inertia_ + 1e-12, \
            f"{where}: inertia {got.inertia_} != {ref.inertia_}"
        assert np.allclose(_host(got.cluster_centers_), _host(ref.cluster_centers_),
                           rtol=rtol * 10, atol=rtol), f"{where}: centers"
        for key in ("inertia", "center_shift"):
            assert np.allclose(got.history_[key], ref.history_[key], rtol=rtol * 10,
                               atol=1e-12), f"{where}: history {key}"
        checked += 1
    return checked


def minibatch_cases(dtype):
    """MiniBatchKMeans's test matrix: (name, kwargs, data, fit kwargs); n is no multiple of
    the batch sizes, and the far centers are reassigned."""
    X = asymmetric_data(2049, 3, 10, dtype=dtype, seed=8)
    init = X[np.random.default_rng(3).choice(len(X), 10, replace=False)]
    far = init.copy()
    far[:2] += 1e3
    w = np.random.default_rng(4).uniform(0.5, 2.0, len(X)).astype(dtype)
    w[::9] = 0
    base = dict(n_clusters=10, init=init, batch_size=200, random_state=5, max_iter=3)
    return [
        ("plain", base, X, {}),
        ("weights", base, X, {"sample_weight": w}),
        ("reassigned", {**base, "init": far, "reassignment_ratio": 0.2}, X, {}),
        ("tol", {**base, "tol": 1e-2, "max_iter": 20}, X, {}),
        ("k-means++", {**base, "init": "k-means++", "batch_size": 97}, X, {}),
    ]


def check_minibatch(backend, to_arr, dtype):
    """MiniBatchKMeans through the backend: fit, and partial_fit over slices, give the numpy
    backend's centers, counts and number of steps (the same batches from the same seed)."""
    import warnings

    from kmeans_xp.estimators.minibatch import MiniBatchKMeans

    name = backend.name
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    checked = 0
    for case, kwargs, X, fit_kw in minibatch_cases(dtype):
        sw = fit_kw.get("sample_weight")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = MiniBatchKMeans(backend="numpy", **kwargs).fit(X, **fit_kw)
            with registry.registered(type(backend)):
                got = MiniBatchKMeans(backend=name, max_memory=backend.max_memory,
                                      **kwargs).fit(to_arr(X), sample_weight=None if sw is
                                                    None else to_arr(sw))
                part = MiniBatchKMeans(backend=name, max_memory=backend.max_memory, **kwargs)
                part_ref = MiniBatchKMeans(backend="numpy", **kwargs)
                for start in range(0, X.shape[0], 500):
                    batch = to_arr(X[start:start + 500])
                    part.partial_fit(batch)
                    # a dask array is a step per block of rows
                    for size in getattr(batch, "chunks", ((batch.shape[0],),))[0]:
                        part_ref.partial_fit(X[start:start + size])
                        start += size
        where = f"{name} {np.dtype(dtype)} mini-batch case {case!r}"
        assert got.n_steps_ == ref.n_steps_, f"{where}: {got.n_steps_} steps, not {ref.n_steps_}"
        for a, b, what in ((got, ref, "fit"), (part, part_ref, "partial_fit")):
            assert np.allclose(to_numpy(a.cluster_centers_), b.cluster_centers_,
                               rtol=rtol * 100, atol=rtol * 100), f"{where}: {what} centers"
            assert np.allclose(to_numpy(a._counts), b._counts, rtol=rtol), \
                f"{where}: {what} counts"
        assert abs(got.inertia_ - ref.inertia_) <= rtol * 10 * ref.inertia_, \
            f"{where}: inertia {got.inertia_} != {ref.inertia_}"
        checked += 1
    return checked
