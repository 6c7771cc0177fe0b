"""The driver's semantics, made right in the one place they live (kmeans_xp.algorithms.lloyd)."""
import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp import KMeans
from kmeans_xp.contract.backend import InvalidOptionError
from kmeans_xp.contract.chunks import feature_mean, tolerance
from kmeans_xp.testing import asymmetric_data


def test_relocation_guard_matches_sklearn():
    """Every point on a center: nothing relocates, empty clusters take the heaviest
    cluster's center, and the run converges as scikit-learn's does (it ran 300 iterations,
    moving centers by 3.0 each time)."""
    sk = pytest.importorskip("sklearn.cluster")
    X = np.array([[0.0]] * 4 + [[1.0]] * 6)
    init = np.zeros((5, 1))
    ours = KMeans(5, init=init, n_init=1, backend="numpy").fit(X)
    ref = sk.KMeans(5, init=init, n_init=1).fit(X)
    assert ours.n_iter_ == ref.n_iter_ == 4
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    assert ours.history_["center_shift"][-1] == pytest.approx(0, abs=1e-20)


def test_relocation_matches_sklearn_when_clusters_empty():
    sk = pytest.importorskip("sklearn.cluster")
    X = asymmetric_data(3001, 2, 6, seed=4)
    init = X[:8].copy()
    init[:3] += 1e3  # three centers nobody is near
    ours = KMeans(8, init=init, n_init=1, backend="numpy").fit(X)
    ref = sk.KMeans(8, init=init, n_init=1, algorithm="lloyd").fit(X)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-10)


@pytest.mark.parametrize("offset", [1e6, 1e7])
def test_tol_from_an_accurate_variance(offset):
    """float32 X far from the origin: its variance (of the centered X, in float64) is
    float64's, so float32 stops where float64 does (np.var gave 68x at 1e6, 12,000x at 1e7)."""
    rng = np.random.default_rng(0)
    X64 = rng.normal(size=(20_000, 3)) * 10 + offset
    X32 = X64.astype(np.float32)
    exact = np.mean(np.var(X32.astype(np.float64), axis=0))
    mean = feature_mean(X32, np)
    from array_api_compat import numpy as xp
    tol = tolerance(X32, mean, 1.0, xp, 4096)
    assert tol == pytest.approx(exact, rel=1e-6)
    if offset > 1e6:  # float32 holds integers only there: its labels differ from float64's
        return
    init = X32[:20].copy()
    f32 = KMeans(20, init=init, tol=1e-4, backend="numpy").fit(X32)
    f64 = KMeans(20, init=init.astype(np.float64), tol=1e-4, backend="numpy").fit(
        X32.astype(np.float64))
    assert abs(f32.n_iter_ - f64.n_iter_) <= 1


def test_float64_sums_are_deterministic_across_fits():
    """Blocks add into fixed slots in block order: repeated fits are bit-identical."""
    X = asymmetric_data(600_011, 3, 50, seed=1)
    init = X[:50].copy()
    fits = [KMeans(50, init=init, max_iter=5, tol=0, backend="numpy",
                   backend_options={"n_threads": 4}, max_memory="64MB").fit(X)
            for _ in range(4)]
    for f in fits[1:]:
        assert np.array_equal(f.cluster_centers_, fits[0].cluster_centers_)
        assert f.inertia_ == fits[0].inertia_


def test_one_small_read_per_iteration(monkeypatch):
    """The driver reads one small array per iteration, and with the first one the data
    checks of the backend's first return (labels' range, sums' totals: 4 values), copied
    behind it rather than read on their own (a read that waits for the device)."""
    from kmeans_xp.contract.backend import Placement
    reads = []
    real = Placement.fetch

    def counting(self, values):
        reads.append(values.shape)
        return real(self, values)

    monkeypatch.setattr(Placement, "fetch", counting)
    X = asymmetric_data(5003, 3, 10, seed=2)
    km = KMeans(10, init=X[:10].copy(), max_iter=7, tol=0, backend="numpy").fit(X)
    assert len(reads) == km.n_iter_ + 1 and all(s == (4,) for s in reads)


@pytest.mark.parametrize("options,match", [
    ({"n_thread": 2}, r"takes no option\(s\) \['n_thread'\].*knows: \['n_threads', 'processes'\]"),
    ({"n_threads": 0}, r"n_threads.*must be.*got 0"),
    ({"n_threads": -3}, r"n_threads.*must be.*got -3"),
    ({"n_threads": 2.5}, r"n_threads.*must be.*got 2.5"),
])
def test_backend_options_checked_by_name(options, match):
    X = asymmetric_data(301, 3, 3, seed=0)
    with pytest.raises(InvalidOptionError, match=match):
        KMeans(3, backend="numpy", backend_options=options).fit(X)
    with pytest.raises(TypeError):   # what a bad keyword raises in Python
        NumpyBackend(**options)


class _AsyncPlacement(NumpyBackend.placement_class):
    """A placement that says work is queued: the driver issues each next iteration before it
    reads the last one's statistics (as on a GPU stream)."""
    asynchronous = True


class AsyncNumpy(NumpyBackend):
    name = "numpy-async"
    placement_class = _AsyncPlacement
    calls = 0

    def lloyd_iter(self, *args, **kwargs):
        type(self).calls += 1
        return super().lloyd_iter(*args, **kwargs)


@pytest.fixture
def always_ahead(monkeypatch):
    """However long an iteration takes on this machine, the driver issues the next ahead."""
    from kmeans_xp.algorithms import lloyd
    monkeypatch.setattr(lloyd, "AHEAD_MAX_ITERATION_S", float("inf"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_issuing_ahead_gives_the_drivers_answer(dtype, always_ahead):
    """Issuing the next iteration ahead (dropped after a relocation or strict convergence,
    used as the final assignment otherwise) changes nothing in the result, on the whole
    case matrix the contract suite uses."""
    from kmeans_xp.testing import check_lloyd
    assert check_lloyd(AsyncNumpy(), lambda a: a, dtype) >= 7


@pytest.mark.parametrize("limit", [float("inf"), 0.0])
def test_long_iterations_are_read_before_the_next_is_issued(monkeypatch, limit):
    """Past AHEAD_MAX_ITERATION_S the driver waits for an iteration's statistics before it
    issues the next (a pass lost to a relocation would cost more than the wait saves), and
    the final assignment is a separate pass (`labels_inertia`); the answer is the same
    either way."""
    from kmeans_xp.algorithms import lloyd
    from kmeans_xp.contract import registry
    monkeypatch.setattr(lloyd, "AHEAD_MAX_ITERATION_S", limit)
    X = asymmetric_data(5003, 3, 10, seed=2)
    registry.register_backend(AsyncNumpy)
    assigns = []
    monkeypatch.setattr(AsyncNumpy, "labels_inertia", lambda self, *a, **kw:
                        assigns.append(1) or NumpyBackend.labels_inertia(self, *a, **kw))
    try:
        AsyncNumpy.calls = 0
        ref = KMeans(10, init=X[:10].copy(), max_iter=4, tol=0, backend="numpy").fit(X)
        km = KMeans(10, init=X[:10].copy(), max_iter=4, tol=0, backend="numpy-async").fit(X)
        np.testing.assert_array_equal(km.labels_, ref.labels_)
        # ahead: 4 iterations + the final assignment as a 5th lloyd_iter; read first: 4
        # iterations, and the final labels from one `labels_inertia`
        expect_calls, expect_assigns = (4 + 1, 0) if limit else (4, 1)
        assert (AsyncNumpy.calls, len(assigns)) == (expect_calls, expect_assigns)
    finally:
        registry._runtime.pop("numpy-async")
        registry.list_backends.cache_clear()


def test_issuing_ahead_costs_no_extra_pass_at_tol_or_max_iter(always_ahead):
    X = asymmetric_data(5003, 3, 10, seed=2)
    from kmeans_xp.contract import registry
    registry.register_backend(AsyncNumpy)
    try:
        AsyncNumpy.calls = 0
        km = KMeans(10, init=X[:10].copy(), max_iter=4, tol=0, backend="numpy-async").fit(X)
        assert km.n_iter_ == 4
        assert AsyncNumpy.calls == 4 + 1   # the 5th pass is the final assignment
    finally:
        registry._runtime.pop("numpy-async")
        registry.list_backends.cache_clear()


@pytest.mark.parametrize("n", [2047, 1024 * 5 + 17, 1024 * 40])
def test_column_sums_in_row_blocks_equal_the_plain_sum(n):
    """chunks.column_sums on a namespace that is not NumPy (array-api-strict here, a GPU
    in use) sums per block of rows and then over the blocks, the tail after them: the same
    float64 sums as one pass, to rounding, for n below, off and on a multiple of the blocks,
    and for a strided view."""
    xps = pytest.importorskip("array_api_strict")
    from kmeans_xp.contract.chunks import column_sums
    A = asymmetric_data(n, 3, 5, dtype=np.float32, seed=n) + np.float32(1e3)
    got = np.asarray(column_sums(xps.asarray(A), xps))
    ref = A.astype(np.float64).sum(axis=0)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(column_sums(xps.asarray(A)[::2, :], xps)),
                               A[::2].astype(np.float64).sum(axis=0), rtol=1e-13)


def test_relocation_moves_points_in_sklearns_order():
    """relocate_empty equals scikit-learn's loop bit for bit where one cluster gives several
    points (the subtractions from it happen in the candidates' order) and with weights."""
    from kmeans_xp.algorithms.lloyd import relocate_empty
    from kmeans_xp.contract.backend import Farthest, KMeansBackend

    rng = np.random.default_rng(7)
    k, d, m = 9, 5, 4
    sums = rng.normal(size=(k, d)) * 1e3
    weights = rng.uniform(1, 50, k)
    empty = np.array([1, 4, 6, 8])
    sums[empty], weights[empty] = 0, 0
    x = rng.normal(size=(m, d)) * np.array([1e-3, 1, 1e3, 7, 1e5])
    far = Farthest(np.arange(m), x, rng.uniform(0.1, 3, m), np.array([3, 3, 0, 3]),
                   np.array([9.0, 8.0, 7.0, 6.0]))

    class Backend:
        farthest_many = KMeansBackend.farthest_many   # (the contract's: farthest each)

        def farthest(self, *args, **kw):
            return far

        class placement:
            @staticmethod
            def namespace(a):
                import array_api_compat.numpy as xp
                return xp

    s_ref, w_ref = sums.copy(), weights.copy()
    for j, new_id in enumerate(empty):  # sklearn's _relocate_empty_clusters_dense
        s_ref[far.label[j]] -= x[j] * far.weight[j]
        s_ref[new_id] = x[j] * far.weight[j]
        w_ref[far.label[j]] -= far.weight[j]
        w_ref[new_id] = far.weight[j]
    s, w = relocate_empty(Backend(), None, None, None, None, sums.copy(), weights.copy(), np)
    assert np.array_equal(np.asarray(s), s_ref) and np.array_equal(np.asarray(w), w_ref)


def test_relocation_of_many_problems_equals_each_alone():
    """relocate_empty_many over problems (clusters giving several points, one problem whose
    points sit on their centers, one left out of the list) equals each problem's own
    relocate_empty, bit for bit."""
    from kmeans_xp.algorithms.relocation import Problem, relocate_empty, relocate_empty_many
    from kmeans_xp.contract.backend import Farthest, KMeansBackend

    rng = np.random.default_rng(11)
    P, k, d = 4, 12, 3
    sums = rng.normal(size=(P, k, d)) * 1e3
    weights = rng.uniform(1, 50, (P, k))
    fars = {}
    for p in range(P):
        empty = np.sort(rng.choice(k, p + 1, replace=False))
        sums[p, empty], weights[p, empty] = 0, 0
        full = np.setdiff1d(np.arange(k), empty)
        m = empty.size
        x = rng.normal(size=(m, d)) * np.array([1e-3, 1.0, 1e3])
        dist = np.sort(rng.uniform(1, 9, m))[::-1].copy()
        if p == 2:
            x, dist = np.zeros((m, d)), np.zeros(m)   # on their centers: nothing moves
        fars[p] = Farthest(np.arange(m), x, rng.uniform(0.1, 3, m),
                           rng.choice(full[:2], m), dist)   # (two clusters give them all)

    class Backend:
        farthest_many = KMeansBackend.farthest_many   # (the contract's: farthest each)

        def farthest(self, X, sample_weight, centers, labels, m, **kw):
            return fars[X]

        class placement:
            @staticmethod
            def namespace(a):
                import array_api_compat.numpy as xp
                return xp

    chosen = [0, 2, 3]   # (problem 1 is not relocated)
    s, w = relocate_empty_many(Backend(), [Problem(p, p, None, None, None) for p in chosen],
                               sums.copy(), weights.copy(), np)
    for p in range(P):
        if p in chosen:
            s1, w1 = relocate_empty(Backend(), p, None, None, None, sums[p].copy(),
                                    weights[p].copy(), np)
        else:
            s1, w1 = sums[p], weights[p]
        assert np.array_equal(np.asarray(s)[p], s1) and np.array_equal(np.asarray(w)[p], w1)
    assert not np.array_equal(np.asarray(s)[3], sums[3])
