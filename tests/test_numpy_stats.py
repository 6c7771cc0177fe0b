"""The numpy backend's passes outside the iteration (`numpy_stats`: the mean's column sums,
the tolerance's sums, the centered copy, the farthest points) give the driver's single-
threaded NumPy results bit for bit, in float32 and float64, with n not a multiple of a block,
one to many features, many threads; and a fit's mean, tol and centered X are the base
placement's."""
import kmeans_xp_backends.numpy.stats as st
import numpy as np
import pytest
from array_api_compat import numpy as xp
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp.contract.backend import KMeansBackend, Placement
from kmeans_xp.contract.chunks import feature_mean, spawn, tolerance


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    # many blocks and threads on small data
    monkeypatch.setattr(st, "BLOCK_ROWS", 1000)
    monkeypatch.setattr(st, "MIN_PARALLEL_ROWS", 10)


def skewed(n, d, dtype, seed=0):
    """Columns of very different scales and offsets (their float64 sums round)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * rng.uniform(1e-3, 1e4, d) + rng.uniform(-1e5, 1e5, d)
    return X.astype(dtype)


SHAPES = [(12_345, 1), (12_345, 2), (9_001, 3), (5_003, 5), (3_001, 130)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d", SHAPES)
def test_column_sums_and_centering_are_numpys(n, d, dtype, tmp_path):
    X = skewed(n, d, dtype)
    if d >= 2:
        assert st.parallel_columns(X)
        assert np.array_equal(st.column_sums(X, spawn, 7), np.sum(X, axis=0, dtype=np.float64))
    else:  # one column is summed pairwise by NumPy: left to it
        assert not st.parallel_columns(X)
    assert not st.parallel_columns(np.asfortranarray(X)) or d == 1
    assert not st.parallel_columns(np.memmap(tmp_path / "X", dtype=dtype, mode="w+",
                                             shape=X.shape))
    mean = feature_mean(X, xp)
    got = st.centered(X, mean, spawn, 7)
    assert got.dtype == X.dtype and np.array_equal(got, X - mean)
    Y = X.copy()
    assert st.centered(Y, mean, spawn, 7, out=Y) is Y and np.array_equal(Y, X - mean)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("rows", [777, 100_000])
def test_tolerance_sums_are_the_drivers(n, d, dtype, rows):
    X = skewed(n, d, dtype, seed=1)
    mean = feature_mean(X, xp)

    def by_columns(sl, mean64):
        return st.deviation_sums_by_columns(X, sl, mean64, spawn, 9)

    assert (tolerance(X, mean, 1e-4, xp, rows, chunk_sums=by_columns)
            == tolerance(X, mean, 1e-4, xp, rows))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tol", [0.0, 1e-4])
def test_placement_stats_and_center_are_the_base_ones(dtype, tol):
    X = skewed(20_011, 6, dtype, seed=2)
    be = NumpyBackend(n_threads=5)
    mean, t = be.placement.feature_stats(X, tol, xp=xp)
    ref_mean, ref_t = Placement.feature_stats(be.placement, X, tol, xp=xp)
    assert np.array_equal(mean, ref_mean) and mean.dtype == ref_mean.dtype and t == ref_t
    assert np.array_equal(be.placement.center(X, mean, xp=xp), X - mean)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("m", [0, 1, 7, 50, 20_003, 30_000])
def test_farthest_is_the_default(dtype, weighted, m):
    rng = np.random.default_rng(m)
    n, d, k = 20_003, 9, 13
    X = rng.integers(-2, 3, (n, d)).astype(dtype)   # distances tie everywhere
    C = rng.integers(-2, 3, (k, d)).astype(dtype)
    labels = rng.integers(0, k, n).astype(np.uint8)
    w = rng.integers(0, 3, n).astype(dtype) if weighted else None   # zero weights too
    be = NumpyBackend(n_threads=6)
    got = be.farthest(X, w, C, labels, m)
    ref = KMeansBackend.farthest(be, X, w, C, labels, m, xp=xp)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert len(got.index) == min(m, n)


def test_numba_farthest_is_the_default():
    pytest.importorskip("numba")
    from kmeans_xp_backends.numba.backend import NumbaBackend
    rng = np.random.default_rng(3)
    X = rng.integers(-2, 3, (20_003, 3)).astype(np.float32)
    C = rng.integers(-2, 3, (5, 3)).astype(np.float32)
    labels = rng.integers(0, 5, len(X)).astype(np.uint8)
    be = NumbaBackend(n_threads=4)
    for a, b in zip(be.farthest(X, None, C, labels, 9),
                    KMeansBackend.farthest(be, X, None, C, labels, 9, xp=xp)):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_two_fits_at_once_share_the_pool():
    """Fits in two threads, each growing the shared pool, both finish with the same mean."""
    from concurrent.futures import ThreadPoolExecutor
    X = skewed(30_011, 4, np.float32, seed=4)
    ref = np.sum(X, axis=0, dtype=np.float64)
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda t: st.column_sums(X, spawn, t), [2, 3, 4, 5, 6, 7, 8, 9]))
    assert all(np.array_equal(o, ref) for o in outs)


def test_farthest_of_a_memmap_seen_centered(tmp_path):
    """X given as `HostRows` (a memmap centered block by block): the same points."""
    from kmeans_xp.contract.rows import HostRows
    rng = np.random.default_rng(5)
    data = np.memmap(tmp_path / "X", dtype=np.float32, mode="w+", shape=(20_011, 4))
    data[:] = rng.standard_normal(data.shape)
    X = HostRows(data, data.mean(axis=0))
    C = rng.standard_normal((6, 4)).astype(np.float32)
    labels = rng.integers(0, 6, data.shape[0]).astype(np.uint8)
    be = NumpyBackend(n_threads=4)
    for a, b in zip(be.farthest(X, None, C, labels, 5),
                    KMeansBackend.farthest(be, X, None, C, labels, 5, xp=xp)):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("n,d,dtype", [(1, 3, np.float32), (2, 2, np.float64),
                                       (st.BLOCK_ROWS + 1, 5, np.float32),
                                       (2 * st.BLOCK_ROWS + 7, 33, np.float32),
                                       (3001, 2, np.float64)])
def test_blocked_deviation_sums_are_the_whole_chunks_bits(n, d, dtype):
    """The tol's deviation sums through one block buffer with the sums carried (no float64
    copies of the chunk) give `chunks.deviation_sums`' bits, an offset in X included."""
    from kmeans_xp.contract.chunks import deviation_sums
    from kmeans_xp_backends.numpy.stats import _deviation_sums_blocked
    rng = np.random.default_rng(n + d)
    X = (rng.normal(size=(n, d)) * rng.uniform(0.1, 100, d) + 1e3).astype(dtype)
    mean64 = X.astype(np.float64).mean(axis=0)
    want, got = deviation_sums(X, mean64, np), _deviation_sums_blocked(X, mean64)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
