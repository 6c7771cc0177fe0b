"""The numpy backend's two ways to sum clusters (np.bincount per feature; rows grouped by
label and np.add.reduceat, used from SORTED_SUMS_MIN_D features) agree, with weights and
empty clusters, for every label key type (uint8, uint16, intp); and the result does not
depend on the thread count."""
import numpy as np
import pytest

import kmeans_xp_backends.numpy_ as nb


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
    np.testing.assert_allclose(got[0].weighted_sums, got[10**9].weighted_sums, rtol=1e-12, atol=1e-9)
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
