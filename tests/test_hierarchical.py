"""init="hierarchical" (`kmeans_xp.algorithms.hierarchical`): a coarse fit at sqrt(k), each
coarse cluster split, then the flat Lloyd iterations; checked against the flat fit."""
import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.algorithms.hierarchical import MIN_K, coarse_k, split_counts

#: the hierarchical fit's inertia against the flat k-means++ fit's, at the same max_iter
#: (docs/large_k.md gives the measured figures; this bound leaves room for the data)
QUALITY_FACTOR = 1.05


def _data(n, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d)) * np.linspace(0.5, 3.0, d) + np.arange(d)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_hierarchical_fit_is_close_to_the_flat_fit(dtype, backend):
    pytest.importorskip(backend)
    X = _data(6007, 8, dtype)
    flat = KMeans(100, max_iter=10, tol=0, random_state=0, backend=backend).fit(X)
    hier = KMeans(100, init="hierarchical", max_iter=10, tol=0, random_state=0,
                  backend=backend).fit(X)
    assert hier.cluster_centers_.shape == (100, 8)
    assert len(np.unique(hier.labels_)) == 100
    assert hier.inertia_ <= flat.inertia_ * QUALITY_FACTOR


def test_hierarchical_with_weights_and_balance():
    X = _data(4001, 5, np.float64, seed=3)
    w = np.random.default_rng(1).uniform(0.0, 2.0, len(X))
    km = KMeans(64, init="hierarchical", max_iter=5, random_state=0, backend="numpy",
                balance=1.1).fit(X, sample_weight=w)
    assert np.bincount(km.labels_, minlength=64).max() <= int(np.ceil(1.1 * 4001 / 64))


def test_hierarchical_is_reproducible_and_small_k_is_kmeans_plusplus():
    X = _data(2001, 4, np.float64, seed=2)
    a = KMeans(40, init="hierarchical", max_iter=3, random_state=5, backend="numpy").fit(X)
    b = KMeans(40, init="hierarchical", max_iter=3, random_state=5, backend="numpy").fit(X)
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    k = MIN_K - 1
    small = KMeans(k, init="hierarchical", max_iter=3, random_state=5, backend="numpy").fit(X)
    pp = KMeans(k, init="k-means++", max_iter=3, random_state=5, backend="numpy").fit(X)
    assert np.array_equal(small.cluster_centers_, pp.cluster_centers_)


def test_split_counts_are_proportional_and_sum_to_k():
    sizes = np.array([500, 3, 0, 120, 1, 40])
    counts = split_counts(sizes, 50)
    assert counts.sum() == 50
    assert np.all(counts <= sizes) and np.all(counts[sizes > 0] >= 1) and counts[2] == 0
    assert counts[0] > counts[3] > counts[5]
    assert split_counts(np.array([2, 2, 2]), 6).tolist() == [2, 2, 2]
    assert coarse_k(16384) == 128 and coarse_k(1) == 1
    with pytest.raises(ValueError):
        split_counts(np.array([1, 1]), 3)
