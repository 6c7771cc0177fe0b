"""The numba backend: the contract, the numpy backend's partition, sums that do not depend on
the thread count, a memory-mapped X, and "auto" choosing it only where numba is installed."""
import importlib.util

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.contract import cpu_engines, registry
from kmeans_xp.testing import asymmetric_data, check_backend
from kmeans_xp.testing.label_bounds import fit_differences

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    registry._runtime.clear()
    registry.list_backends.cache_clear()


def _backend():
    from kmeans_xp_backends.numba.backend import NumbaBackend
    return NumbaBackend


def test_passes_contract():
    assert check_backend(_backend()) > 50


def test_one_thread_passes_contract():
    class OneThread(_backend()):
        name = "numba-one-thread"

        def __init__(self, max_memory="auto"):
            super().__init__(max_memory, n_threads=1)

    assert check_backend(OneThread) > 50


def test_gemm_path_passes_contract_at_every_d(monkeypatch):
    """The wide path (a BLAS GEMM per tile) taken for any d, the register kernels' too."""
    import kmeans_xp_backends.numba.backend as nb
    monkeypatch.setattr(nb, "REGISTER_WIDTHS", ())

    class Gemm(nb.NumbaBackend):
        name = "numba-gemm"

    assert check_backend(Gemm) > 50


def _iteration(backend_cls, X, C, w, **options):
    be = backend_cls(**options)
    return be.lloyd_iter(X, w, C, None)


@pytest.mark.parametrize("d", [3, 40])
def test_sums_do_not_depend_on_the_thread_count(d):
    """Fixed tasks, merged in task order: float64 sums equal bit for bit on 1, 2 and 3
    threads, and from one call to the next."""
    X = asymmetric_data(50_021, d, 12, dtype=np.float32, seed=4)
    X -= X.mean(axis=0)
    C = X[:30].copy()
    w = np.random.default_rng(0).uniform(0.5, 2, len(X)).astype(np.float32)
    runs = [_iteration(_backend(), X, C, w, n_threads=t) for t in (1, 2, 3, 2)]
    for it in runs[1:]:
        np.testing.assert_array_equal(it.labels, runs[0].labels)
        assert np.array_equal(it.weighted_sums, runs[0].weighted_sums)
        assert np.array_equal(it.weight_in_clusters, runs[0].weight_in_clusters)
        assert it.inertia == runs[0].inertia


def test_the_split_is_the_same_for_any_thread_count():
    from kmeans_xp_backends.numba.backend import _Plan
    for n, d, k, mem in [(2_000_000, 3, 200, "auto"), (200_000, 128, 1024, "auto"),
                         (20011, 3, 300, "2MB"), (97, 1, 1, "auto"),
                         (200_000, 128, 1024, "8MB"), (2_000_000, 3, 5000, "3MB")]:
        plans = [_Plan(n, d, k, 4, mem, t) for t in (1, 2, 16, 64)]
        assert len({(p.n_tasks, p.task_rows) for p in plans}) == 1, (n, d, k, mem)
        p = plans[0]
        assert p.n_tasks * p.task_rows >= n > (p.n_tasks - 1) * p.task_rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 8, 9, 17])
def test_partition_equals_the_numpy_backends(dtype, d):
    """Every register kernel's widths (d up to 4, up to 8: zero-padded) and GEMM tiles past
    them: the numpy backend's partition from the same init."""
    X = asymmetric_data(30_011, d, 40, dtype=dtype, seed=d)
    init = X[np.random.default_rng(d).choice(len(X), 40, replace=False)]
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(X)).astype(dtype)
    ref = KMeans(40, init=init, max_iter=30, backend="numpy").fit(X, sample_weight=w)
    got = KMeans(40, init=init, max_iter=30, backend="numba").fit(X, sample_weight=w)
    # numba's distances (direct, or SciPy's BLAS) round otherwise than NumPy's GEMM
    assert not fit_differences(X, got, ref, sample_weight=w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d,k", [(32, 1), (33, 2), (130, 8), (130, 16), (1030, 5)])
def test_few_centers_small_gemm_tiles_equal_the_numpy_backends(dtype, d, k):
    """Few centers and many features: tiles of 16-512 rows (OpenBLAS's small-matrix GEMM),
    n a multiple of none of them, the numpy backend's partition."""
    from kmeans_xp_backends.numba.backend import SMALL_GEMM_OUT, _Plan
    n = 6_007
    assert _Plan(n, d, k, np.dtype(dtype).itemsize, "auto", 2).tile * k <= SMALL_GEMM_OUT
    X = asymmetric_data(n, d, max(k, 2), dtype=dtype, seed=d + k)
    init = X[np.random.default_rng(k).choice(n, k, replace=False)]
    w = np.random.default_rng(2).uniform(0.5, 2.0, n).astype(dtype)
    ref = KMeans(k, init=init, max_iter=20, backend="numpy").fit(X, sample_weight=w)
    got = KMeans(k, init=init, max_iter=20, backend="numba").fit(X, sample_weight=w)
    assert not fit_differences(X, got, ref, sample_weight=w)


@pytest.mark.parametrize("weighted", [False, True])
def test_iteration_inertia_from_the_sums_is_each_xs_own(weighted):
    """An iteration's inertia comes from its sums and sum w ||x||^2, kept per X and weights
    until the fit ends: a second X (or other weights) on the same backend gets its own, equal
    to the inertia by differences of the same labels; and a fit's history is the numpy
    backend's (to 1e-6: weighted, a near-tie row or two may go the other way)."""
    rng = np.random.default_rng(5)
    X1 = asymmetric_data(20_011, 40, 6, dtype=np.float32, seed=1)
    X2 = X1 * np.float32(3) + np.float32(1)   # same shape, another sum of squares
    C = X1[:6].copy()
    w = rng.uniform(0.5, 2, len(X1)).astype(np.float32) if weighted else None
    be = _backend()(n_threads=2)
    for X, sw in ((X1, w), (X2, w), (X1, None), (X1, w)):
        it = be.lloyd_iter(X, sw, C, None)
        exact = be.inertia(X, sw, C, it.labels)
        assert float(it.inertia) == pytest.approx(float(exact), rel=1e-9)
    ref = KMeans(6, init=C, max_iter=8, tol=0, backend="numpy").fit(X1, sample_weight=w)
    got = KMeans(6, init=C, max_iter=8, tol=0, backend="numba").fit(X1, sample_weight=w)
    np.testing.assert_allclose(got.history_["inertia"], ref.history_["inertia"], rtol=1e-6)


def test_many_centers_big_tiles_equal_the_numpy_backends():
    """Centers of a megabyte or more (packed by BLAS for every tile): tiles of at least
    BIG_CENTERS_MIN_TILE rows, n a multiple of none, the numpy backend's partition."""
    from kmeans_xp_backends.numba.backend import BIG_CENTERS_MIN_TILE, _Plan
    n, d, k = 3_001, 128, 2_100
    assert _Plan(n, d, k, 4, "auto", 2).tile >= BIG_CENTERS_MIN_TILE
    X = asymmetric_data(n, d, 40, dtype=np.float32, seed=9)
    init = X[np.random.default_rng(9).choice(n, k, replace=False)]
    ref = KMeans(k, init=init, max_iter=3, backend="numpy").fit(X)
    got = KMeans(k, init=init, max_iter=3, backend="numba").fit(X)
    assert not fit_differences(X, got, ref)


@pytest.mark.parametrize("d", [3, 7, 12])
def test_exact_ties_go_to_the_lowest_index_as_on_the_numpy_backend(d):
    """Integer points and centers: distances are exact, so ties are real ties (each
    register kernel's width and GEMM tiles; 19 centers: four at a time, and a rest)."""
    rng = np.random.default_rng(3)
    X = rng.integers(-4, 5, size=(4001, d)).astype(np.float32)
    C = np.repeat(rng.integers(-4, 5, size=(9, d)), 2, axis=0).astype(np.float32)
    C = np.concatenate([C, C[-1:]])   # (19: the rest after four at a time is a tie too)
    from kmeans_xp_backends.numpy.backend import NumpyBackend
    ref = NumpyBackend().assign(X, C)
    got = _backend()().assign(X, C)
    np.testing.assert_array_equal(got.labels, ref.labels)
    np.testing.assert_array_equal(got.min_sq_dist, ref.min_sq_dist)
    assert np.all(got.labels % 2 == 0)  # of two equal centers, the first


def test_memmap_fit_equals_in_memory_fit(tmp_path):
    X = asymmetric_data(20_011, 3, 8, dtype=np.float32, seed=5, offset=50.0)
    path = tmp_path / "X.f32"
    X.tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=X.shape)
    init = X[:8].copy()
    ref = KMeans(8, init=init, backend="numba").fit(X)
    got = KMeans(8, init=init, backend="numba").fit(mm)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)


def test_strided_and_fortran_input():
    X = asymmetric_data(5003, 6, 7, seed=6)
    init = X[:7].copy()
    ref = KMeans(7, init=init, backend="numba").fit(X)
    for other in (np.asfortranarray(X), np.repeat(X, 2, axis=1)[:, ::2]):
        km = KMeans(7, init=init, backend="numba").fit(other)
        np.testing.assert_array_equal(km.labels_, ref.labels_)



@pytest.mark.parametrize("k, store", [(7, np.uint8), (300, np.uint16)])
@pytest.mark.parametrize("d", [3, 24])
def test_every_pass_of_a_fit_takes_one_labels_dtype(monkeypatch, k, d, store):
    """numba compiles a pass once per argument types: a fit's passes (the iterations, the
    sum of squared norms, the final labels), predict's and score's all give the kernels
    labels of k's compact dtype, so a fit's first use compiles each pass once; the labels
    users get are int32."""
    import kmeans_xp_backends.numba.kernels as nk
    seen = []
    for name in ("pass_narrow", "pass_wide"):
        kernel = getattr(nk, name)

        def spy(*args, kernel=kernel):
            seen.append((args[7].dtype, args[8].dtype))   # labels, labels_old
            return kernel(*args)
        monkeypatch.setattr(nk, name, spy)
    X = asymmetric_data(3001, d, k, seed=3)
    km = KMeans(k, init=X[:k].copy(), max_iter=4, backend="numba").fit(X)
    predicted = km.predict(X[:500])
    km.score(X[:500])
    assert len(seen) >= 6
    assert set(seen) == {(np.dtype(store), np.dtype(store))}
    assert km.labels_.dtype == np.int32 and predicted.dtype == np.int32
    np.testing.assert_array_equal(predicted, km.labels_[:500])

def test_the_flags_are_the_kernels():
    import kmeans_xp_backends.numba.backend as nb
    import kmeans_xp_backends.numba.kernels as nk
    names = ("ASSIGN", "MIN_SQ", "SUMS", "INERTIA", "CHANGED")
    assert [getattr(nb, f) for f in names] == [getattr(nk, f) for f in names]


def test_refuses_what_it_cannot_compute():
    be = _backend()()
    assert "float32 and float64" in be.reject_reason(np.zeros((3, 2), np.int32), n_clusters=2)
    assert be.reject_reason(np.zeros((3, 2), np.float32), n_clusters=2) is None
    assert "float16" in be.reject_reason(np.zeros((3, 2), np.float16), n_clusters=2)


def test_auto_picks_numba_where_installed_and_numpy_where_not(monkeypatch):
    X = asymmetric_data(2001, 3, 5, seed=1)
    small = KMeans(5, random_state=0).fit(X)   # n*k*d below AUTO_NUMBA_MIN_WORK
    assert small.backend_ == "numpy"
    monkeypatch.setattr(cpu_engines, "AUTO_NUMBA_MIN_WORK", X.shape[0] * 5 * 3)
    km = KMeans(5, random_state=0).fit(X)
    assert km.backend_ == "numba" and km.backend_reason_.startswith("auto: numpy input")
    assert not fit_differences(X, km, small)
    spec = registry.BUILTIN_BACKENDS["numba"]
    monkeypatch.setitem(registry.BUILTIN_BACKENDS, "numba",
                        spec._replace(requires="numba_is_not_installed_here"))
    registry.list_backends.cache_clear()
    km_np = KMeans(5, random_state=0).fit(X)
    assert km_np.backend_ == "numpy"
    assert not fit_differences(X, km, km_np)


def test_estimate_bounds_the_plan():
    from kmeans_xp_backends.numba.backend import NumbaBackend, _Plan

    from kmeans_xp import estimate_memory
    for n, d, k, mem in [(2_000_000, 3, 500, "auto"), (200_000, 128, 1024, "auto"),
                         (20011, 3, 300, "2MB"), (200_000, 128, 1024, "8MB")]:
        # (the backend's own estimate: estimate_memory gives it its share of max_memory)
        est = NumbaBackend.estimate_memory(n, d, k, itemsize=4, max_memory=mem, n_threads=16)
        assert estimate_memory(n, d, k, backend="numba").total > 0
        plan = _Plan(n, d, k, 4, mem, 16)
        assert est.parts["task_sums"] == plan.accumulators
        if mem != "auto":
            from kmeans_xp.contract.memory import parse_memory
            assert plan.total <= parse_memory(mem), (n, d, k, mem)


@pytest.mark.parametrize("d", [2, 5, 128])
@pytest.mark.parametrize("threads", [1, 2])
def test_feature_stats_are_the_numpy_backends_bits(d, threads):
    """The tol's deviation sums in one compiled pass give NumPy's float64 sums bit for bit
    (an offset in float32 X included), so a fit's tol is the same on either backend."""
    from kmeans_xp_backends.numpy.backend import NumpyBackend
    rng = np.random.default_rng(d)
    X = (rng.normal(size=(20_011, d)) * np.linspace(1, 9, d) + 1e3).astype(np.float32)
    got = _backend()(n_threads=threads).placement.feature_stats(X, 1e-4, xp=np)
    want = NumpyBackend(n_threads=threads).placement.feature_stats(X, 1e-4, xp=np)
    assert np.array_equal(got[0], want[0]) and got[1] == want[1] > 0
