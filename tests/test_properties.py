"""Property tests (hypothesis): the invariants of Lloyd and k-means++ on random problems.

Data come from a seed hypothesis draws, as continuous Gaussian blobs, so exact distance ties
(where either label is right) have probability zero; the sizes stay small.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kmeans_xp import KMeans
from kmeans_xp.algorithms.init import kmeans_plusplus, random_init
from kmeans_xp.contract.namespaces import array_namespace
from kmeans_xp.testing import asymmetric_data

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw, max_n=300, max_d=6, max_k=12):
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(1, max_d))
    k = draw(st.integers(1, min(n, max_k)))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    blobs = draw(st.integers(1, 6))
    X = asymmetric_data(n, d, blobs, dtype=dtype, seed=seed)
    return X, k, seed


def _sq_dists(X, C):
    X64, C64 = X.astype(np.float64), np.asarray(C, dtype=np.float64)
    return ((X64[:, None, :] - C64[None, :, :]) ** 2).sum(-1)


@SETTINGS
@given(problems(), st.sampled_from(["k-means++", "random"]))
def test_inertia_never_increases(problem, init):
    X, k, seed = problem
    km = KMeans(k, init=init, n_init=1, tol=0.0, random_state=seed, max_iter=100).fit(X)
    hist = np.asarray(km.history_["inertia"], dtype=np.float64)
    assert len(hist) == km.n_iter_ >= 1
    assert np.all(hist >= 0)
    # each value is a sum of GEMM-expanded distances: allow their rounding, nothing more
    eps = 1e-10 if X.dtype == np.float64 else 1e-4
    slack = eps * (hist[0] + _sq_dists(X, X.mean(0, keepdims=True)).sum() + 1e-30)
    rises = np.diff(hist)
    assert np.all(rises <= slack), f"inertia rose by {rises.max()} (slack {slack})"
    assert km.inertia_ <= hist[-1] + slack


@SETTINGS
@given(problems(), st.sampled_from(["k-means++", "random"]), st.integers(1, 50))
def test_labels_are_argmins(problem, init, max_iter):
    X, k, seed = problem
    km = KMeans(k, init=init, n_init=1, random_state=seed, max_iter=max_iter).fit(X)
    D = _sq_dists(X, km.cluster_centers_)
    lab = np.asarray(km.labels_)
    assert lab.shape == (X.shape[0],) and lab.min() >= 0 and lab.max() < k
    chosen = D[np.arange(len(lab)), lab]
    best = D.min(axis=1)
    # ties (and float32 near-ties) may go either way; anything else must be the argmin
    rtol = 1e-9 if X.dtype == np.float64 else 1e-4
    scale = (X.astype(np.float64) - X.mean(0)).__pow__(2).sum(1) + D.min(1)
    assert np.all(chosen <= best + rtol * (scale + 1e-12)), "a label is not an argmin"
    # inertia_ is the weighted sum of those minima
    assert km.inertia_ == pytest.approx(best.sum(), rel=10 * rtol, abs=1e-9)


@SETTINGS
@given(st.integers(2, 120), st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1),
       st.sampled_from([np.float64, np.float32]))
def test_integer_weights_equal_repeated_rows(n, d, k, seed, dtype):
    rng = np.random.default_rng(seed)
    X = asymmetric_data(n, d, 3, dtype=dtype, seed=seed)
    w = rng.integers(0, 4, size=n)
    k = min(k, int(np.count_nonzero(w)))
    if k == 0:
        w[0], k = 1, 1
    # init from distinct positive-weight rows: both fits start from the same centers
    init = X[rng.choice(np.flatnonzero(w > 0), k, replace=False)]
    X_rep = np.repeat(X, w, axis=0)
    weighted = KMeans(k, init=init, tol=0.0, max_iter=100).fit(X, sample_weight=w)
    repeated = KMeans(k, init=init, tol=0.0, max_iter=100).fit(X_rep)
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    scale = float(np.abs(X).max()) + 1
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_,
                               rtol=rtol, atol=rtol * scale)
    assert weighted.inertia_ == pytest.approx(repeated.inertia_, rel=rtol * 10,
                                              abs=rtol * scale ** 2)
    np.testing.assert_array_equal(np.repeat(weighted.labels_, w), repeated.labels_)
    # the two fits centre X on different means, so with tol=0 a center shift that is
    # exactly 0 in one may be a rounding error in the other: one more (strict) iteration
    assert abs(weighted.n_iter_ - repeated.n_iter_) <= 1


def _plusplus(X, k, w, seed, rows=7):
    xp = array_namespace(X)
    return kmeans_plusplus(X, k, sample_weight=xp.asarray(w), random_state=np.random.RandomState(
        seed), xp=xp, rows=rows)


@SETTINGS
@given(st.integers(1, 200), st.integers(1, 5), st.integers(1, 15), st.integers(0, 2**31 - 1),
       st.floats(0.0, 0.95))
def test_zero_weight_points_never_seeds(n, d, k, seed, zero_fraction):
    rng = np.random.default_rng(seed)
    X = asymmetric_data(n, d, 4, seed=seed)
    w = rng.uniform(0.1, 3.0, size=n)
    w[rng.random(n) < zero_fraction] = 0.0
    if not np.any(w > 0):
        w[rng.integers(n)] = 1.0
    # zero-weight points are the ones farthest out: D^2 sampling would favour them
    X[w == 0] *= 100.0
    k = min(k, int(np.count_nonzero(w)))
    centers, idx = _plusplus(X, k, w, seed)
    idx = np.asarray(idx)
    assert idx.shape == (k,)
    assert np.all(w[idx] > 0), f"zero-weight seeds chosen: {idx[w[idx] == 0]}"
    assert len(set(idx.tolist())) == k, "a seed was chosen twice"
    np.testing.assert_array_equal(np.asarray(centers), X[idx])
    _, ridx = random_init(X, k, sample_weight=w, random_state=np.random.RandomState(seed),
                          xp=array_namespace(X))
    assert np.all(w[np.asarray(ridx)] > 0)


def test_zero_weight_duplicates_and_exactly_k_positive():
    """Only k points may be seeds, some duplicated among zero-weight ones: those k are chosen."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(301, 3)) * 50
    w = np.zeros(301)
    pos = rng.choice(301, 6, replace=False)
    w[pos] = rng.uniform(0.5, 2, size=6)
    X[rng.choice(301, 40)] = X[pos[0]]  # zero-weight copies of a seed
    for seed in range(5):
        _, idx = _plusplus(X, 6, w, seed)
        assert sorted(np.asarray(idx).tolist()) == sorted(pos.tolist())


def test_plusplus_local_trials_default():
    """Greedy k-means++ draws 2 + int(ln k) candidates per center (sklearn's variant): one
    number for the first center and that many for each other, all taken from the random
    state at once, so the state moves on exactly as far as drawing them step by step."""
    X = asymmetric_data(200, 2, 5, seed=1)
    xp = array_namespace(X)
    rs = np.random.RandomState(0)
    kmeans_plusplus(X, 20, sample_weight=xp.ones(200), random_state=rs, xp=xp, rows=50)
    ref = np.random.RandomState(0)
    ref.uniform()
    for _ in range(19):
        ref.uniform(size=2 + int(math.log(20)))
    assert rs.uniform() == ref.uniform()


def test_zero_weight_never_seed_when_draws_come_close_to_one():
    """RandomState.uniform may return 1 - 2**-53. When every positive-weight point is already
    a center (duplicates), the draw falls back on the weights alone; its total must be the
    cumulative sum's last value, or the draw lands past it, on the last (zero-weight) row."""
    class NearOne(np.random.RandomState):
        def uniform(self, low=0.0, high=1.0, size=None):
            v = 1.0 - 2.0**-53
            return v if size is None else np.full(size, v)

    n = 1000
    X = np.zeros((n, 2))
    X[-5:] = 100.0  # the zero-weight rows are the only other points
    rng = np.random.default_rng(0)
    for _ in range(100):  # weights whose pairwise sum exceeds their sequential cumsum
        w = rng.uniform(0.1, 1.0, size=n)
        w[-5:] = 0.0
        if float(np.sum(w)) > float(np.cumsum(w)[-1]):
            break
    else:
        pytest.fail("no weights found whose sum and cumsum round apart")
    xp = array_namespace(X)
    _, idx = kmeans_plusplus(X, 3, sample_weight=xp.asarray(w), random_state=NearOne(0),
                             xp=xp, rows=64)
    assert np.all(w[np.asarray(idx)] > 0), f"zero-weight seeds: {idx}"
