"""Balanced fits (`KMeans(balance=...)`): the capacity-aware assignment against an exact
solver, the caps on every CPU backend, weights, streamed host data and the soft penalty."""
import math

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.contract.capacity import (
    capacity_assign,
    cluster_cap,
    parse_balance,
    top_m,
)
from kmeans_xp.testing import asymmetric_data

#: the auction's documented bound: within n * eps of the optimum, eps = 1% of the mean cost
#: of the rows' nearest centers, so within 1% of the unconstrained cost (<= the optimum)
AUCTION_TOLERANCE = 0.01


def _problem(seed, n=240, d=3, k=8, weighted=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * [1.0, 3.0, 0.2][:d] + [5.0, 0.0, 1.0][:d]
    C = X[rng.choice(n, k, replace=False)] + rng.normal(size=(k, d)) * 0.01
    w = rng.uniform(0.5, 2.0, n) if weighted else None
    return X, C, w


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("factor", [1.0, 1.1, 1.5])
def test_auction_matches_the_exact_capacity_constrained_optimum(seed, factor):
    """Each center replicated `cap` times makes the capacity-constrained assignment a
    rectangular assignment problem, which scipy solves exactly."""
    linear_sum_assignment = pytest.importorskip("scipy.optimize").linear_sum_assignment
    X, C, w = _problem(seed, weighted=seed % 2 == 1)
    n, k = X.shape[0], C.shape[0]
    cap = cluster_cap(parse_balance(factor), n, k)
    D = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    W = np.ones(n) if w is None else w
    cost = np.repeat(D * W[:, None], cap, axis=1)
    rows, cols = linear_sum_assignment(cost)
    optimum = cost[rows, cols].sum()
    cand, dist = top_m(D, k, np)
    labels, chosen, remaining = capacity_assign(cand, dist, w, cap, k, np)
    assert labels.min() >= 0, "every row is placed"
    assert np.bincount(labels, minlength=k).max() <= cap
    got = float((D[np.arange(n), labels] * W).sum())
    assert got <= optimum * (1 + AUCTION_TOLERANCE) + 1e-9
    assert np.allclose(chosen, D[np.arange(n), labels])
    assert np.array_equal(remaining, cap - np.bincount(labels, minlength=k))


def test_cap_holds_with_few_candidates():
    """With m < k candidates, rows whose candidates fill go on to the free slots; the cap
    is never exceeded and every row is placed."""
    X, C, _ = _problem(3, n=500, k=20)
    D = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    cand, dist = top_m(D, 2, np)
    labels, _, remaining = capacity_assign(cand, dist, None, 25, 20, np)
    placed = labels >= 0
    assert np.bincount(labels[placed], minlength=20).max() <= 25
    assert (remaining >= 0).all()


def _gaussian(n, dtype, seed=1):
    """One Gaussian with features on different scales and offsets: k-means on it leaves
    clusters of uneven size (max/mean about 1.6 here), which a cap evens at little cost."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 5)) * [1.0, 3.0, 0.5, 2.0, 1.0] + [0, 5, 0, 0, 1]).astype(dtype)


@pytest.mark.parametrize("backend", ["numpy", "numba", "array-api", "dask"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_balanced_fit_caps_clusters_on_every_cpu_backend(backend, dtype):
    if backend == "dask":
        pytest.importorskip("dask")
    if backend == "numba":
        pytest.importorskip("numba")
    n, k, factor = 2001, 30, 1.1
    X = _gaussian(n, dtype)
    plain = KMeans(k, random_state=0, backend="numpy", max_iter=20).fit(X)
    km = KMeans(k, random_state=0, backend=backend, max_iter=20, balance=factor).fit(X)
    sizes = np.bincount(np.asarray(km.labels_), minlength=k)
    assert sizes.max() <= math.ceil(factor * n / k)
    assert sizes.max() / sizes.mean() <= factor + 1 / sizes.mean()
    assert np.bincount(plain.labels_, minlength=k).max() > sizes.max()  # (it did something)
    assert km.inertia_ <= plain.inertia_ * 1.05
    if backend != "numpy":
        ref = KMeans(k, random_state=0, backend="numpy", max_iter=20, balance=factor).fit(X)
        assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-3)


def test_cap_holds_on_uneven_blobs():
    """Blobs of very different sizes: the cap holds where it costs much inertia (rows of
    the big blobs go to clusters past their m nearest: the fallback)."""
    X = asymmetric_data(1501, 4, 8, dtype=np.float64, seed=1)
    km = KMeans(30, random_state=0, backend="numpy", max_iter=15, balance=1.1).fit(X)
    assert np.bincount(km.labels_, minlength=30).max() <= math.ceil(1.1 * 1501 / 30)


def test_balanced_fit_labels_hold_the_cap_and_inertia_is_theirs():
    X = asymmetric_data(2003, 4, 9, dtype=np.float64, seed=5)
    km = KMeans(25, random_state=1, backend="numpy", balance={"max_size": 90}).fit(X)
    sizes = np.bincount(km.labels_, minlength=25)
    assert sizes.max() <= 90
    C = km.cluster_centers_
    direct = ((X - C[km.labels_]) ** 2).sum()
    assert km.inertia_ == pytest.approx(direct, rel=1e-9)


def test_balanced_fit_with_sample_weights_caps_rows():
    """The cap counts rows, whatever their weights; the weights weigh the centers."""
    X = _gaussian(1501, np.float32, seed=7)
    w = np.random.default_rng(0).uniform(0.1, 5.0, len(X))
    km = KMeans(20, random_state=0, backend="numpy", balance=1.1).fit(X, sample_weight=w)
    assert np.bincount(km.labels_, minlength=20).max() <= math.ceil(1.1 * 1501 / 20)
    C = km.cluster_centers_.astype(np.float64)
    direct = (w * ((X - C[km.labels_]) ** 2).sum(1)).sum()
    assert km.inertia_ == pytest.approx(direct, rel=1e-5)


def test_balanced_fit_streams_a_memmap(tmp_path):
    X = _gaussian(2501, np.float32, seed=2)
    path = tmp_path / "X.f32"
    mm = np.memmap(path, dtype=np.float32, mode="w+", shape=X.shape)
    mm[:] = X
    mm.flush()
    ro = np.memmap(path, dtype=np.float32, mode="r", shape=X.shape)
    km = KMeans(30, random_state=0, backend="numpy", balance=1.1, copy_x=False,
                max_memory="8MB").fit(ro)
    assert np.bincount(km.labels_, minlength=30).max() <= math.ceil(1.1 * 2501 / 30)


def test_soft_penalty_narrows_the_spread():
    X = _gaussian(3001, np.float64, seed=3)
    plain = KMeans(40, random_state=0, backend="numpy", max_iter=30).fit(X)
    soft = KMeans(40, random_state=0, backend="numpy", max_iter=30,
                  balance={"penalty": 1.0}).fit(X)
    spread = lambda km: np.bincount(km.labels_, minlength=40).max() / (len(X) / 40)  # noqa: E731
    assert spread(soft) < 0.8 * spread(plain)
    assert soft.inertia_ <= plain.inertia_ * 1.05


@pytest.mark.parametrize("bad, words", [
    (0.5, "float >= 1"), (2, "a float >= 1 or a dict"), ({"max_size": 1.1, "penalty": 1.0},
                                                         "exactly one"),
    ({"maxsize": 1.1}, "takes the keys"), ({"penalty": -1.0}, ">= 0"),
    ({"max_size": 1.2, "candidates": 0}, "candidates"), ("yes", "a float >= 1 or a dict")])
def test_bad_balance_is_refused_before_any_work(bad, words):
    with pytest.raises(ValueError, match=words):
        KMeans(4, balance=bad, backend="numpy").fit(np.random.rand(50, 2))


def test_a_cap_too_small_for_n_says_what_would_hold():
    with pytest.raises(ValueError, match="at least 13 rows"):
        KMeans(8, balance={"max_size": 5}, backend="numpy").fit(np.random.rand(100, 2))


def test_statistics_reach_the_centers_namespace_from_either_side():
    """reduce may hand its sums back in another namespace than the centers' (cupy-fused: on
    the device while its centers are on the host, or the other way): the balanced step
    moves them explicitly, never through an implicit conversion, which CuPy (and
    array_api_strict, standing in for it here) refuses."""
    import array_api_strict as xps

    from kmeans_xp.algorithms.balance import _at_centers
    sums = np.arange(6, dtype=np.float32).reshape(3, 2)
    host = _at_centers(xps.asarray(sums), np.zeros((3, 2)))
    assert isinstance(host, np.ndarray) and host.dtype == np.float64
    np.testing.assert_array_equal(host, sums)
    dev = _at_centers(sums, xps.zeros((3, 2)))
    assert dev.dtype == xps.float64
    np.testing.assert_array_equal(np.from_dlpack(dev), sums)
