"""Agreement with scikit-learn's Lloyd KMeans given the same initial centers.

Same init array, `algorithm="lloyd"`, `n_init=1`: the partition must be the same (ARI 1),
the inertia equal to 1e-7 (float64) / 1e-4 (float32) relative, and n_iter_ the same. Sizes
are never multiples of 64/256/1024 so chunk edges are exercised.
"""
import importlib.util
import warnings

import numpy as np
import pytest
import sklearn.cluster as sklearn_cluster
from sklearn.metrics import adjusted_rand_score

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data

RTOL = {np.float64: 1e-7, np.float32: 1e-4}
#: the CPU backends held to sklearn's answers (numba where it is installed)
CPU_BACKENDS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba is not installed"))]


def _init_rows(X, k, seed):
    idx = np.random.default_rng(seed).choice(X.shape[0], k, replace=False)
    return X[idx].copy()


def _both(X, init, *, sample_weight=None, max_iter=300, tol=1e-4, backend="numpy"):
    k = init.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning for k=n and duplicates
        ref = sklearn_cluster.KMeans(k, init=init, n_init=1, algorithm="lloyd",
                                     max_iter=max_iter, tol=tol).fit(
            X, sample_weight=sample_weight)
        got = KMeans(k, init=init, n_init=1, max_iter=max_iter, tol=tol,
                     backend=backend).fit(X, sample_weight=sample_weight)
    return ref, got


def _assert_agree(ref, got, dtype):
    labels = np.asarray(got.labels_)
    ari = adjusted_rand_score(ref.labels_, labels)
    assert ari == 1.0, f"partition differs from sklearn: ARI {ari}"
    rtol = RTOL[np.dtype(dtype).type]
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol, abs=1e-12), \
        f"inertia {got.inertia_} vs sklearn {ref.inertia_}"
    assert got.n_iter_ == ref.n_iter_, f"n_iter_ {got.n_iter_} vs sklearn {ref.n_iter_}"
    assert got.cluster_centers_.shape == ref.cluster_centers_.shape
    scale = np.abs(ref.cluster_centers_).max() + 1
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_,
                               rtol=rtol * 10, atol=rtol * 10 * scale)


# (n, d, k): d=1, d=3 asymmetric, d=40, k=1, k=n; n never a multiple of 64/256/1024
CASES = [
    (1, 1, 1),
    (97, 1, 1),
    (1001, 1, 5),
    (2049, 3, 13),
    (3001, 3, 40),
    (777, 40, 9),
    (333, 3, 1),
    (151, 2, 151),
    (61, 40, 61),
    (515, 7, 100),
]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n,d,k", CASES)
def test_same_init_same_result(n, d, k, dtype, backend):
    X = asymmetric_data(n, d, max(1, min(k, 20)), dtype=dtype, seed=n + d + k)
    init = _init_rows(X, k, seed=k)
    ref, got = _both(X, init, backend=backend)
    assert got.labels_.shape == (n,)
    assert got.cluster_centers_.dtype == dtype
    _assert_agree(ref, got, dtype)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sample_weight(dtype, backend):
    n, d, k = 1537, 3, 11
    X = asymmetric_data(n, d, k, dtype=dtype, seed=3)
    rng = np.random.default_rng(3)
    w = rng.uniform(0.1, 5.0, size=n)
    w[rng.random(n) < 0.05] = 0.0
    init = _init_rows(X, k, seed=4)
    ref, got = _both(X, init, sample_weight=w, backend=backend)
    _assert_agree(ref, got, dtype)
    # weights matter: an unweighted fit from the same init differs
    plain = KMeans(k, init=init, backend="numpy").fit(X)
    assert plain.inertia_ != pytest.approx(got.inertia_, rel=1e-3)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_float32_with_large_offset(backend):
    """float32 data far from the origin: mean-centering keeps the precision sklearn has."""
    n, d, k = 2311, 3, 9
    X = asymmetric_data(n, d, k, dtype=np.float32, seed=11, offset=1e5)
    assert X.dtype == np.float32 and X.mean() > 9e4
    init = _init_rows(X, k, seed=5)
    ref, got = _both(X, init, backend=backend)
    _assert_agree(ref, got, np.float32)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n_empty", [1, 3])
def test_empty_cluster_relocation_matches_sklearn(n_empty, weighted, backend):
    """Centers far from every point lose all their points and are relocated, farthest point
    first, as sklearn does."""
    X = asymmetric_data(1201, 3, 6, seed=21)
    init = _init_rows(X, 8, seed=2)
    far = [X.max(axis=0) * 50 + 1e3, X.max(axis=0) * 70 + 2e3, -X.max(axis=0) * 70 - 2e3]
    for j, c in zip([2, 5, 6][:n_empty], far):
        init[j] = c  # nobody is closest to these at first
    w = np.random.default_rng(0).uniform(0.5, 2, len(X)) if weighted else None
    ref, got = _both(X, init, sample_weight=w, backend=backend)
    _assert_agree(ref, got, np.float64)
    assert len(np.unique(got.labels_)) == 8


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("max_iter", [1, 2, 5])
def test_max_iter_and_tol_zero(max_iter, backend):
    X = asymmetric_data(1999, 5, 20, seed=8)
    init = _init_rows(X, 20, seed=8)
    ref, got = _both(X, init, max_iter=max_iter, tol=0.0, backend=backend)
    _assert_agree(ref, got, np.float64)
    assert got.n_iter_ == max_iter


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_strict_convergence_with_tol_zero(backend):
    X = asymmetric_data(603, 2, 4, seed=9)
    init = _init_rows(X, 4, seed=9)
    ref, got = _both(X, init, tol=0.0, backend=backend)
    _assert_agree(ref, got, np.float64)
    assert got.n_iter_ < 300


def test_array_api_backend_agrees_with_sklearn():
    X = asymmetric_data(1031, 3, 8, seed=12)
    init = _init_rows(X, 8, seed=12)
    ref, got = _both(X, init, backend="array-api")
    _assert_agree(ref, got, np.float64)


@pytest.mark.parametrize("init", ["k-means++", "random", "array"])
def test_labels_equal_predict(init):
    X = asymmetric_data(1234, 4, 10, seed=13)
    init_arg = _init_rows(X, 10, seed=1) if init == "array" else init
    km = KMeans(10, init=init_arg, n_init=2 if init != "array" else 1, random_state=0,
                max_iter=3).fit(X)  # stopped early, so the final assignment matters
    np.testing.assert_array_equal(km.labels_, km.predict(X))
    np.testing.assert_array_equal(km.fit_predict(X), km.predict(X))


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_n_init_keeps_best_run(init):
    X = asymmetric_data(1500, 3, 15, seed=14)
    n_init = 6
    # the n_init runs draw from one RandomState in turn, so single fits sharing one
    # RandomState reproduce them one by one
    rs = np.random.RandomState(42)
    singles = [KMeans(15, init=init, n_init=1, random_state=rs, backend="numpy").fit(X)
               for _ in range(n_init)]
    inertias = [m.inertia_ for m in singles]
    assert len(set(np.round(inertias, 6))) > 1, "runs should differ for this test to bite"
    best = KMeans(15, init=init, n_init=n_init, random_state=np.random.RandomState(42),
                  backend="numpy").fit(X)
    assert best.inertia_ == pytest.approx(min(inertias), rel=1e-12)
    chosen = singles[int(np.argmin(inertias))]
    np.testing.assert_array_equal(best.labels_, chosen.labels_)
    np.testing.assert_allclose(best.cluster_centers_, chosen.cluster_centers_)


def test_kmeans_plusplus_quality_close_to_sklearn():
    """Same algorithm (greedy k-means++) with other random draws: similar quality."""
    X = asymmetric_data(2001, 3, 12, seed=15)
    ours = [KMeans(12, random_state=s, n_init=1).fit(X).inertia_ for s in range(4)]
    theirs = [sklearn_cluster.KMeans(12, random_state=s, n_init=1).fit(X).inertia_
              for s in range(4)]
    assert np.median(ours) <= 1.1 * np.median(theirs)
