"""init="k-means||" (scalable k-means++): valid centers, weights respected, deterministic, and
as good as k-means++ after Lloyd."""
import warnings

import numpy as np
import pytest
from array_api_compat import numpy as np_xp
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp import KMeans
from kmeans_xp.estimators.kmeans import ConvergenceWarning
from kmeans_xp.algorithms.init import kmeans_parallel
from kmeans_xp.testing import asymmetric_data
from kmeans_xp.estimators.validation import INIT_METHODS, validate_params


def _run(X, k, seed, w=None, backend="numpy", **kw):
    w = np.ones(len(X), dtype=X.dtype) if w is None else w
    be = NumpyBackend(max_memory="4MB") if backend == "numpy" else None
    return kmeans_parallel(X, k, sample_weight=w, random_state=np.random.RandomState(seed),
                           xp=np_xp, rows=1000, backend=be, **kw)


@pytest.mark.parametrize("backend", ["numpy", None])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_returns_k_distinct_rows_of_X(backend, dtype):
    X = asymmetric_data(3001, 3, 9, dtype=dtype, seed=2)
    for k in (1, 7, 40):
        centers, idx = _run(X, k, seed=k, backend=backend)
        assert centers.shape == (k, 3) and centers.dtype == X.dtype
        assert len(np.unique(idx)) == k
        np.testing.assert_array_equal(centers, X[idx])
        assert len(np.unique(centers, axis=0)) == k


def test_zero_weight_points_are_never_chosen():
    rng = np.random.default_rng(0)
    X = asymmetric_data(2000, 2, 5, seed=1)
    w = np.ones(len(X))
    zero = rng.random(len(X)) < 0.7
    X[zero] *= 50.0  # far away: D^2 alone would favour them
    w[zero] = 0.0
    for seed in range(8):
        for backend in ("numpy", None):
            _, idx = _run(X, 25, seed, w=w, backend=backend)
            assert not zero[idx].any()


def test_deterministic_for_a_seed():
    X = asymmetric_data(5000, 3, 12, dtype=np.float32, seed=4)
    a = _run(X, 12, seed=3)[1]
    b = _run(X, 12, seed=3)[1]
    c = _run(X, 12, seed=4)[1]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    fit = [KMeans(12, init="k-means||", random_state=5, backend="numpy").fit(X)
           for _ in range(2)]
    np.testing.assert_array_equal(fit[0].cluster_centers_, fit[1].cluster_centers_)


def test_inertia_after_fit_within_a_few_percent_of_kmeans_plusplus():
    X = asymmetric_data(20000, 3, 30, dtype=np.float64, seed=11)
    ratios = []
    for seed in range(3):
        par = KMeans(30, init="k-means||", random_state=seed, backend="numpy").fit(X)
        pp = KMeans(30, init="k-means++", random_state=seed, backend="numpy").fit(X)
        ratios.append(par.inertia_ / pp.inertia_)
    assert np.mean(ratios) < 1.03, ratios
    assert max(ratios) < 1.08, ratios


def test_duplicates_give_distinct_positions_when_there_are_enough():
    base = asymmetric_data(10, 3, 10, seed=5)
    X = np.repeat(base, 300, axis=0)  # 10 distinct positions, 3000 rows
    centers, idx = _run(X, 10, seed=0)
    assert len(np.unique(centers, axis=0)) == 10


def test_fewer_distinct_points_than_k_terminates_and_warns():
    X = np.repeat(asymmetric_data(4, 2, 4, seed=6), 50, axis=0)
    centers, idx = _run(X, 6, seed=0)
    assert centers.shape == (6, 2) and len(np.unique(idx)) <= 6
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        KMeans(6, init="k-means||", random_state=0, backend="numpy").fit(X)
    assert any(issubclass(r.category, ConvergenceWarning) for r in rec)


def test_estimator_wiring():
    assert "k-means||" in INIT_METHODS
    km = KMeans(5, init="k-means||")
    validate_params(km.get_params())
    assert km._resolved_n_init() == 1
    X = asymmetric_data(1000, 2, 5, seed=8)
    km.set_params(random_state=0, backend="numpy").fit(X)
    assert km.cluster_centers_.shape == (5, 2) and km.timings_["init"] > 0


def test_oversampling_and_rounds():
    X = asymmetric_data(2000, 3, 8, seed=9)
    for factor, rounds in ((0.5, 1), (4, 8), (2, 0)):
        centers, idx = _run(X, 8, 0, oversampling_factor=factor, n_rounds=rounds)
        assert len(np.unique(idx)) == 8
    with pytest.raises(ValueError, match="oversampling_factor"):
        _run(X, 8, 0, oversampling_factor=0)
    with pytest.raises(ValueError, match="n_rounds"):
        _run(X, 8, 0, n_rounds=-1)


def test_array_api_strict_namespace():
    xps = pytest.importorskip("array_api_strict")
    X = asymmetric_data(1500, 3, 6, seed=10)
    Xs = xps.asarray(X)
    w = xps.ones(X.shape[0], dtype=xps.float64)
    centers, idx = kmeans_parallel(Xs, 6, sample_weight=w, random_state=np.random.RandomState(0),
                                   xp=xps, rows=512)
    assert centers.shape == (6, 3) and len(np.unique(idx)) == 6
    np.testing.assert_allclose(X[idx], np.from_dlpack(centers))
