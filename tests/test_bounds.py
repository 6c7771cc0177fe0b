"""Triangle-inequality bounds (`kmeans_xp.contract.bounds`) are a mode of the one Lloyd
driver: every method, on every CPU backend, gives plain Lloyd's run (labels, n_iter_,
centers and inertia to rounding, history) on asymmetric data with ties, empty clusters and
sample weights; `algorithm="elkan"` is that mode, and matches scikit-learn's elkan."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.algorithms.bounded import bounded_step
from kmeans_xp.algorithms.lloyd import kmeans_single_lloyd
from kmeans_xp.contract import bounds as B
from kmeans_xp.contract.registry import get_backend
from kmeans_xp.testing import asymmetric_data, lloyd_cases

CPU_BACKENDS = ["numpy", "numba", "array-api"]


def _backend(name, **kw):
    if name == "numba":
        pytest.importorskip("numba")
    return get_backend(name)(**kw)


def _tie_data(dtype):
    """Integer points on an asymmetric grid (x in 0..12, y in 0..4 at scale 3), each
    repeated a different number of times, and centers on grid points: exact ties in the
    first assignment (points midway between two centers), which the bounds must break as
    argmin does (the lowest index)."""
    xs, ys = np.meshgrid(np.arange(13.0), np.arange(5.0) * 3.0)
    P = np.stack([xs.ravel(), ys.ravel()], axis=1)
    X = np.repeat(P, 1 + np.arange(len(P)) % 4, axis=0)
    init = P[[0, 4, 8, 12, 30, 38, 52]]
    return X.astype(dtype), init.astype(dtype)


def _cases(dtype):
    """The driver's own matrix (ties, empty clusters, weights, tol, k = 1) and wider data
    (d = 16, k = 100: Yinyang groups; n prime, a multiple of no chunk)."""
    out = [(name, kw["init"], kw.get("max_iter", 300), kw.get("tol", 1e-4), X,
            fit.get("sample_weight")) for name, kw, X, fit in lloyd_cases(dtype)]
    X, init = _tie_data(dtype)
    out.append(("grid ties", init, 100, 0.0, X, None))
    Xw = asymmetric_data(4001, 16, 40, dtype=dtype, seed=5)
    w = np.random.default_rng(3).uniform(0.2, 3.0, len(Xw)).astype(dtype)
    w[::11] = 0
    initw = Xw[np.random.default_rng(4).choice(len(Xw), 100, replace=False)]
    initw[:4] += 1e3  # far from every point: empty clusters, relocated
    out.append(("wide weighted", initw, 100, 0.0, Xw, w))
    return out


def _driver(backend, X, w, init, max_iter, tol, bounds):
    Xc = X - X.mean(axis=0)
    centers = (init - X.mean(axis=0)).astype(X.dtype)
    xp = backend.placement.namespace(Xc)
    return kmeans_single_lloyd(backend, Xc, w, centers, xp=xp, max_iter=max_iter, tol=tol,
                               bounds=bounds)


@pytest.mark.parametrize("name,pause_share", [(name, 1.0) for name in CPU_BACKENDS]
                         + [("numpy", 0.0), ("numba", 0.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bounds_give_lloyds_run(name, pause_share, dtype, monkeypatch):
    # small recompute chunks: many chunks, none dividing the rows that fail their test
    monkeypatch.setattr(B, "RECOMPUTE_BYTES", 40_000)
    # 1.0: the bounds on every iteration; 0.0: paused after each bounded iteration (plain
    # iterations between, then a restart)
    monkeypatch.setattr(B, "PAUSE_SHARE", pause_share)
    backend = _backend(name, max_memory="4MB")
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for case, init, max_iter, tol, X, w in _cases(dtype):
        ref = _driver(backend, X, w, init, max_iter, tol, None)
        for method in B.METHODS:
            got = _driver(backend, X, w, init, max_iter, tol, method)
            where = f"{name} {np.dtype(dtype)} {case!r} {method} pause {pause_share}"
            assert np.array_equal(np.asarray(got.labels), np.asarray(ref.labels)), where
            assert got.n_iter == ref.n_iter, where
            np.testing.assert_allclose(got.centers, ref.centers, rtol=rtol, atol=rtol,
                                       err_msg=where)
            assert got.inertia == pytest.approx(ref.inertia, rel=rtol * 10, abs=1e-12), where
            for key in ("inertia", "center_shift"):
                np.testing.assert_allclose(got.history[key], ref.history[key],
                                           rtol=rtol * 100, atol=1e-9, err_msg=where)


def test_bounds_pause_while_they_keep_few_rows_and_restart(monkeypatch):
    """A bounded iteration that recomputes most rows is followed by plain ones (2, then 4,
    ... at most MAX_PAUSE), then the bounds start again from a full assignment."""
    backend = _backend("numpy")
    calls = []
    plain = backend.lloyd_iter
    monkeypatch.setattr(backend, "lloyd_iter", lambda *a, **k: calls.append("plain")
                        or plain(*a, **k))
    bounded = backend.assign_bounded

    def spy(X, C, bounds, **k):
        out = bounded(X, C, bounds, **k)
        calls.append("full" if bounds.full else "kept")
        return out

    monkeypatch.setattr(backend, "assign_bounded", spy)
    monkeypatch.setattr(B, "PAUSE_SHARE", -1.0)   # every bounded iteration pauses
    X = asymmetric_data(3001, 8, 12, seed=4)
    ref = _driver(backend, X, None, X[:12], 40, 0.0, None)
    calls.clear()
    got = _driver(backend, X, None, X[:12], 40, 0.0, "elkan")
    assert calls[:9] == ["full", "kept", "plain", "plain", "full", "kept", "plain", "plain",
                         "plain"], calls
    np.testing.assert_array_equal(got.labels, ref.labels)
    assert got.n_iter == ref.n_iter


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_near_ties_take_the_plain_assignments_labels(dtype):
    """A recomputed row at a near tie takes the label `ties` gives (the backend's plain
    pass), whatever order the recompute's own rounding puts its centers in: here a
    recompute that errs within the error model towards the higher index, on points midway
    between centers. Without `ties` the argmin of the recompute decides (and differs)."""
    X, C = _tie_data(dtype)   # (integers: the ties are exact)
    k = len(C)

    def skewed(rows, centers):   # within a tenth of the error bound, towards the higher index
        D = B.plain_distances(rows, centers)
        x2 = np.einsum("ij,ij->i", rows.astype(np.float64), rows.astype(np.float64))
        c2 = float(np.einsum("ij,ij->i", centers, centers).max())
        gamma = B.Bounds("hamerly", 1, X.shape[1], k, dtype).gamma
        return (D - (0.1 * gamma * (x2 + 2 * c2))[:, None] * np.arange(k) / k).astype(dtype)

    def plain(idx, centers):
        return np.argmin(B.plain_distances(X[idx], centers), axis=1)

    for method in B.METHODS:
        with_ties = B.Bounds(method, *X.shape, k, dtype)
        without = B.Bounds(method, *X.shape, k, dtype)
        centers = C
        for it in range(4):
            ref = np.argmin(B.plain_distances(X, centers), axis=1)
            got = B.assign_bounded_numpy(X, centers, with_ties, distances=skewed,
                                         ties=lambda idx, c=centers: plain(idx, c))
            np.testing.assert_array_equal(got, ref, err_msg=f"{method} iteration {it}")
            if it == 0:   # the grid's exact ties: the skewed recompute alone breaks them up
                other = B.assign_bounded_numpy(X, centers, without, distances=skewed)
                assert np.any(other != ref), method
            centers = (centers + np.asarray([[0.5, 0.0]], dtype)).astype(dtype)


@pytest.mark.parametrize("name", ["numpy", "numba"])
@pytest.mark.parametrize("whole_share", [0.0, 2.0])
def test_bounded_run_breaks_near_ties_as_the_plain_pass(name, whole_share, monkeypatch):
    """On the seed's data at d=32, k=8 a run meets rows whose two nearest centers are
    within rounding; the plain pass and a recompute of the gathered rows (other GEMM
    shapes) ordered one of them differently at iteration 9 (numba, before `ties`), and the
    runs then parted. Every method gives the plain run: labels, centers, n_iter, the
    near-tie rows labelled by one whole pass (share 0) or by their own blocks (2)."""
    monkeypatch.setattr(B, "WHOLE_PASS_SHARE", whole_share)
    from kmeans_xp.tools.bench.workload import Workload, make_data, shared_init
    w = Workload(n=100_000, d=32, k=8, data="seed", init="k-means++", seed=0)
    X = make_data(w)
    init = shared_init(X, w)
    backend = _backend(name)
    Xc = X - X.mean(axis=0)
    C = (init - X.mean(axis=0)).astype(X.dtype)
    run = lambda bounds: kmeans_single_lloyd(backend, Xc, None, C, xp=np,  # noqa: E731
                                             max_iter=15, tol=0.0, bounds=bounds)
    ref = run(None)
    for method in B.METHODS:
        got = run(method)
        np.testing.assert_array_equal(np.asarray(got.labels), np.asarray(ref.labels), method)
        np.testing.assert_array_equal(got.centers, ref.centers, method)
        assert got.n_iter == ref.n_iter


@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_bounds_prune_rows(name):
    """The point of the bounds: once the centers settle, most rows are kept untouched."""
    backend = _backend(name)
    X = asymmetric_data(6007, 12, 30, seed=9)
    X -= X.mean(axis=0)
    C = X[:40].copy()
    for method in B.METHODS:
        bounds = B.Bounds(method, *X.shape, 40, X.dtype)
        counts = []
        for _ in range(15):
            labels = backend.assign_bounded(X, C, bounds, xp=np)
            counts.append(bounds.recomputed)
            np.testing.assert_array_equal(labels, backend.assign(X, C, xp=np).labels)
            C = np.stack([X[labels == j].mean(0) if np.any(labels == j) else C[j]
                          for j in range(40)])
        assert counts[0] == len(X)
        assert counts[-1] < 0.2 * len(X), (method, counts)


@pytest.mark.parametrize("name", ["numpy", "numba"])
@pytest.mark.parametrize("measured", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elkan_equals_lloyd(name, measured, dtype, monkeypatch):
    """elkan's fit is lloyd's: through Lloyd's kernels on the engines measured faster without
    bounds (`FUSED_PASS_ENGINES`), and through the bounds where the table takes them (the
    engines taken off that table, as a CPU plugin without such a measurement is)."""
    if not measured:
        monkeypatch.setattr(B, "FUSED_PASS_ENGINES", {})
    if name == "numba":
        pytest.importorskip("numba")
    X = asymmetric_data(3001, 10, 20, dtype=dtype, seed=11)
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(X)).astype(dtype)
    for k, d in ((20, 10), (90, 10), (20, 3)):   # elkan, yinyang, hamerly
        Xd = np.ascontiguousarray(X[:, :d])
        init = Xd[np.random.default_rng(k).choice(len(Xd), k, replace=False)]
        kw = dict(n_clusters=k, init=init, backend=name, max_iter=200)
        lloyd = KMeans(**kw).fit(Xd, sample_weight=w)
        elkan = KMeans(algorithm="elkan", **kw).fit(Xd, sample_weight=w)
        assert elkan._bounds_path[0] == B.bound_path(
            "elkan", device="cpu", n=len(Xd), d=d, k=k, room=1 << 28, engine=name)[0]
        assert (elkan._bounds_path[0] is None) == measured
        np.testing.assert_array_equal(elkan.labels_, lloyd.labels_)
        assert elkan.n_iter_ == lloyd.n_iter_
        np.testing.assert_allclose(elkan.cluster_centers_, lloyd.cluster_centers_,
                                   rtol=1e-6, atol=1e-6)
        assert elkan.inertia_ == pytest.approx(lloyd.inertia_, rel=1e-6)
        np.testing.assert_array_equal(elkan.predict(Xd), elkan.labels_)


def test_elkan_one_cluster_warns_and_runs_lloyd():
    X = asymmetric_data(500, 3, 2, seed=1)
    with pytest.warns(RuntimeWarning, match="single cluster"):
        km = KMeans(1, algorithm="elkan", n_init=1, random_state=0).fit(X)
    assert km._bounds_path[0] is None
    np.testing.assert_allclose(km.cluster_centers_[0], X.mean(0))


@pytest.mark.parametrize("distribution", ["normal", "blobs"])
@pytest.mark.parametrize("tol", [1e-2, 1e-8, 1e-100, 0])
def test_kmeans_elkan_results(distribution, tol):
    """scikit-learn's test_kmeans_elkan_results (sklearn/cluster/tests/test_k_means.py),
    dense input, on our classes: elkan's centers, labels, n_iter_ and inertia are lloyd's."""
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    seed = 42
    rnd = np.random.RandomState(seed)
    if distribution == "normal":
        X = rnd.normal(size=(5000, 10))
    else:
        X, _ = sklearn_datasets.make_blobs(random_state=rnd)
    X[X < 0] = 0
    km_lloyd = KMeans(n_clusters=5, random_state=seed, n_init=1, tol=tol)
    km_elkan = KMeans(algorithm="elkan", n_clusters=5, random_state=seed, n_init=1, tol=tol)
    km_lloyd.fit(X)
    km_elkan.fit(X)
    np.testing.assert_allclose(km_elkan.cluster_centers_, km_lloyd.cluster_centers_)
    np.testing.assert_array_equal(km_elkan.labels_, km_lloyd.labels_)
    assert km_elkan.n_iter_ == km_lloyd.n_iter_
    assert km_elkan.inertia_ == pytest.approx(km_lloyd.inertia_, rel=1e-6)


@pytest.mark.parametrize("name", ["numpy", "numba"])
@pytest.mark.parametrize("measured", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elkan_matches_sklearn_elkan(name, measured, dtype, monkeypatch):
    """From the same initial centers, scikit-learn's elkan and ours: the same partition and
    iterations, centers and inertia to rounding."""
    sk = pytest.importorskip("sklearn.cluster")
    if name == "numba":
        pytest.importorskip("numba")
    if not measured:
        monkeypatch.setattr(B, "FUSED_PASS_ENGINES", {})
    X = asymmetric_data(4001, 8, 12, dtype=dtype, seed=21)
    w = np.random.default_rng(5).uniform(0.5, 2.0, len(X)).astype(dtype)
    init = X[np.random.default_rng(6).choice(len(X), 24, replace=False)]
    kw = dict(n_clusters=24, init=init, n_init=1, max_iter=300, tol=1e-4)
    ref = sk.KMeans(algorithm="elkan", **kw).fit(X, sample_weight=w)
    got = KMeans(algorithm="elkan", backend=name, **kw).fit(X, sample_weight=w)
    assert (got._bounds_path[0] is None) == measured
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    assert got.n_iter_ == ref.n_iter_
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=rtol,
                               atol=rtol)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol)


def test_bound_path_table():
    """The rule (docs/bounds.md): Lloyd's kernels off the CPU, for k = 1, for tiny k * d,
    on the engines measured faster without bounds, and for lloyd; then Yinyang for large k,
    Hamerly for few features or no room for Elkan's n * k bounds, else Elkan."""
    def path(algorithm="elkan", **kw):
        args = dict(device="cpu", n=10_000, d=32, k=32, room=1 << 30)
        args.update(kw)
        return B.bound_path(algorithm, **args)[0]

    assert path() == "elkan"
    assert path(device="gpu") is None
    assert path(asynchronous=True) is None
    assert path(k=1) is None
    assert path(d=2, k=8) is None                        # k * d below BOUNDS_MIN_KD
    assert path(k=500) == "yinyang"
    assert path(d=4) == "hamerly"
    assert path(n=5_000_000) == "hamerly"               # n * k * 8 beyond the room
    assert path(k=500, n=10_000_000) == "yinyang"
    assert B.yinyang_groups(10_000_000, 32, 500, 1 << 30) < 50  # fewer groups to fit
    assert path(k=500, n=13_000_000) == "hamerly"        # no room for two groups
    assert path(n=10**8) is None                         # nor for Hamerly's bound
    assert path(room=0) is None
    assert path("lloyd") is None
    assert path(engine="numba") is None and path(engine="numpy") is None
    assert path(engine="a-cpu-plugin") == "elkan"
    assert "numba" in B.bound_path("elkan", device="cpu", n=10, d=32, k=32, room=0,
                                   engine="numba")[1]


def test_lloyd_named_backend_never_uses_bounds():
    X = asymmetric_data(2000, 32, 40, seed=2)
    km = KMeans(40, backend="numpy", n_init=1, random_state=0).fit(X)
    assert km._bounds_path[0] is None


def test_bounds_state_rejects_unknown_method():
    with pytest.raises(ValueError, match="hamerly"):
        B.Bounds("exponion", 10, 2, 3, np.float64)


def test_bounded_fit_does_not_write_x(monkeypatch):
    monkeypatch.setattr(B, "FUSED_PASS_ENGINES", {})   # (the bounds, not Lloyd's kernels)
    X = asymmetric_data(3001, 10, 20, seed=3)
    before = X.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        km = KMeans(20, algorithm="elkan", copy_x=False, n_init=1, random_state=0,
                    backend="numpy").fit(X)
    assert km._bounds_path[0] == "elkan"
    np.testing.assert_array_equal(X, before)


def test_spherical_elkan_equals_lloyd(monkeypatch):
    monkeypatch.setattr(B, "FUSED_PASS_ENGINES", {})
    from kmeans_xp import SphericalKMeans
    X = asymmetric_data(3001, 12, 15, seed=8, offset=5.0)
    init = X[np.random.default_rng(0).choice(len(X), 30, replace=False)]
    kw = dict(n_clusters=30, init=init, backend="numpy", max_iter=100)
    lloyd = SphericalKMeans(**kw).fit(X)
    elkan = SphericalKMeans(algorithm="elkan", **kw).fit(X)
    assert elkan._bounds_path[0] == "elkan"
    np.testing.assert_array_equal(elkan.labels_, lloyd.labels_)
    assert elkan.n_iter_ == lloyd.n_iter_
    np.testing.assert_allclose(elkan.cluster_centers_, lloyd.cluster_centers_, atol=1e-9)


def test_memmap_input_keeps_lloyds_kernels(tmp_path):
    X = asymmetric_data(2003, 12, 10, seed=6)
    path = tmp_path / "x.npy"
    np.save(path, X)
    mm = np.load(path, mmap_mode="r")
    backend = _backend("numpy")
    assert bounded_step(backend, mm, 10, "elkan") is None
    assert bounded_step(backend, X, 10, "elkan") is not None
    got = KMeans(10, algorithm="elkan", copy_x=False, backend="numpy", n_init=1,
                 random_state=0).fit(mm)
    ref = KMeans(10, backend="numpy", n_init=1, random_state=0).fit(X)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
