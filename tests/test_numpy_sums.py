"""The numpy backend's two ways to sum clusters (np.bincount per feature; rows grouped by
label and one flat np.add.reduceat, used from SORTED_SUMS_MIN_D features) agree, with weights
and empty clusters, for every label key type (uint8, uint16, intp); the result does not
depend on the thread count; its two GEMM forms ([x, 1] @ [-2 C^T; ||c||^2], and x @ -2 C^T
plus ||c||^2) give the same labels; lloyd_iter's inertia, taken from the sums, is the direct
sum of w ||x - c||^2."""
import kmeans_xp_backends.numpy.backend as nb
import numpy as np
import pytest


@pytest.mark.parametrize("d,k", [(3, 7), (20, 300), (17, 70_000)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sorted_sums_match_bincount_sums(monkeypatch, d, k, weighted, dtype):
    rng = np.random.default_rng(d + k)
    n = 30_011
    X = (rng.standard_normal((n, d)) * np.arange(1, d + 1) + 3).astype(dtype)
    labels = rng.integers(0, min(k, n // 2), n)  # clusters past n // 2 stay empty
    w = rng.uniform(0.1, 3, n).astype(dtype) if weighted else None
    got = {}
    for min_d in (10**9, 0):
        monkeypatch.setattr(nb, "SORTED_SUMS_MIN_D", min_d)
        got[min_d] = nb.NumpyBackend(n_threads=2).reduce(X, labels, w, k)
    np.testing.assert_array_equal(got[0].weight_in_clusters, got[10**9].weight_in_clusters)
    np.testing.assert_allclose(got[0].weighted_sums, got[10**9].weighted_sums, rtol=1e-12,
                               atol=1e-9)
    assert not got[0].weighted_sums[min(k, n // 2):].any()


def test_sorted_sums_do_not_depend_on_threads(monkeypatch):
    monkeypatch.setattr(nb, "SORTED_SUMS_MIN_D", 0)
    monkeypatch.setattr(nb, "TARGET_TASK_ROWS", 1000)  # many blocks
    rng = np.random.default_rng(3)
    X = rng.standard_normal((20_003, 24))
    C = X[:50].copy()
    one = nb.NumpyBackend(n_threads=1).lloyd_iter(X, None, C, None)
    two = nb.NumpyBackend(n_threads=2).lloyd_iter(X, None, C, None)
    np.testing.assert_array_equal(one.labels, two.labels)
    np.testing.assert_allclose(one.weighted_sums, two.weighted_sums, rtol=1e-13)


@pytest.mark.parametrize("d,min_d", [(3, 10**9), (3, 0), (24, 0)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_iteration_inertia_is_the_direct_sum(monkeypatch, d, min_d, weighted, dtype):
    """sum w ||x||^2 - 2 sum c.S + sum W ||c||^2 in float64 against the float64 sum of the
    squared differences, with an offset (X is not centered here) and an empty cluster."""
    monkeypatch.setattr(nb, "SORTED_SUMS_MIN_D", min_d)
    rng = np.random.default_rng(d + min_d % 7)
    X = (rng.standard_normal((20_011, d)) * np.arange(1, d + 1) + 30).astype(dtype)
    C = X[rng.choice(len(X), 40, replace=False)].copy()
    C[5] += 1e4  # nobody's nearest
    w = rng.uniform(0.1, 3, len(X)).astype(dtype) if weighted else None
    it = nb.NumpyBackend(n_threads=2, max_memory="4MB").lloyd_iter(X, w, C, None)
    diff = X.astype(np.float64) - C[it.labels].astype(np.float64)
    ww = np.ones(len(X)) if w is None else w.astype(np.float64)
    direct = float(np.sum(np.sum(diff * diff, axis=1) * ww))
    assert it.weight_in_clusters[5] == 0
    assert float(it.inertia) == pytest.approx(direct, rel=1e-9)


@pytest.mark.parametrize("n,d,k", [(50_000, 128, 1024), (200_000, 128, 1024),
                                   (2_000_000, 3, 200), (20_003, 24, 50)])
def test_blocks_are_equal_and_the_same_for_any_thread_count(n, d, k):
    """Past one block per thread, X is cut in equal blocks that do not depend on the thread
    count (so neither do the sums), and no short block leaves a thread with the tail."""
    plans = {t: nb._Plan(n, d, k, 4, "256MB", t) for t in (1, 2, 3, 4)}
    for t, p in plans.items():
        tasks = -(-n // p.block)
        assert n - (tasks - 1) * p.block >= p.block - tasks  # the last block is not short
        if -(-n // t) > p.block:
            assert p.block == plans[1].block


@pytest.mark.parametrize("r,g", [(1, 3), (127, 16), (129, 16), (1000, 7), (300, 128)])
def test_transpose_cast_is_the_cast_transpose(r, g):
    """The sums' feature-major columns, copied a piece of rows at a time (fast), are the cast
    transpose of the gathered rows, every value, for r not a multiple of the piece."""
    from kmeans_xp_backends.numpy.blocks import transpose_cast
    rows = np.random.default_rng(r).standard_normal((r, g + 2)).astype(np.float32)[:, 1:-1]
    out = np.full((g, r), np.nan)
    transpose_cast(out, rows)
    np.testing.assert_array_equal(out, rows.T.astype(np.float64))
