"""SphericalKMeans on the CPU: faiss-cpu's spherical clustering from the same initial centers
(where faiss is installed), what a fitted model gives (unit centers, cosine transform,
inertia, score), the rules (zero rows, copy_x, init), and the estimator protocols (params,
clone, pickle, to_sklearn refused, check_estimator). The backends' spherical fits against
the numpy backend's are in `kmeans_xp.testing.check_backend`, which every backend's contract
test runs; GPU fits in test_spherical_gpu.py."""
import json
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

from kmeans_xp import KMeans, SphericalKMeans
from kmeans_xp.contract.sphere import ZeroNormError
from kmeans_xp.testing import asymmetric_data
from tests._helpers import directions


def unit(X):
    X64 = np.asarray(X, dtype=np.float64)
    return X64 / np.linalg.norm(X64, axis=1, keepdims=True)


# -- faiss-cpu's spherical k-means ---------------------------------------------------------
def faiss_spherical(X_unit, init, niter, weights=None):
    """faiss.Kmeans(spherical=True) from `init` for exactly `niter` iterations on all points
    (no subsampling, no early stop), and its labels: the largest inner product with its
    final centroids."""
    faiss = pytest.importorskip("faiss")
    kw = dict(spherical=True, seed=1, max_points_per_centroid=1 << 30,
              min_points_per_centroid=1)
    # faiss >= 1.14 stops once its float32 objective repeats, even while labels change;
    # from 1.14.2 early_stop_threshold < 0 turns that off, before it one-iteration trainings
    # chained do (each normalises the centroids it is given again: a no-op up to an ulp)
    if hasattr(faiss.ClusteringParameters(), "early_stop_threshold"):
        kw["early_stop_threshold"] = -1.0
        steps = [niter]
    else:
        version = tuple(int(v) for v in faiss.__version__.split(".")[:2])
        steps = [1] * niter if version >= (1, 14) else [niter]
    x32 = np.ascontiguousarray(X_unit, dtype=np.float32)
    C = np.ascontiguousarray(init, dtype=np.float32)
    stats = []
    for n_iter in steps:
        km = faiss.Kmeans(X_unit.shape[1], init.shape[0], niter=n_iter, **kw)
        km.train(x32, weights=None if weights is None else weights.astype(np.float32),
                 init_centroids=C)
        C, stats = km.centroids, stats + km.iteration_stats
    km.iteration_stats = stats
    _, labels = km.assign(x32)
    return km, labels


def _agree_with_faiss(X, init, dtype, backend="numpy", make_array=np.asarray, weights=None):
    pytest.importorskip("faiss")  # (CI may not have it)
    U = unit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = SphericalKMeans(init.shape[0], init=init, backend=backend, max_iter=300,
                               tol=0).fit(make_array(X.astype(dtype)),
                                          sample_weight=None if weights is None
                                          else make_array(weights.astype(dtype)))
    labels = np.asarray(ours.labels_)
    centers = np.asarray(ours.cluster_centers_, dtype=np.float64)
    assert ours.n_iter_ < 300, "did not converge: no fixed point to compare"
    # faiss runs two iterations past our convergence: at a fixed point they change nothing
    km, faiss_labels = faiss_spherical(U, unit(init), ours.n_iter_ + 2, weights)
    assert sum(s["nsplit"] for s in km.iteration_stats) == 0, \
        "faiss split an empty cluster (its rule differs from sklearn's relocation): other data"
    if init.shape[0] > 1:  # the test's premise: no near-tie that float32 rounding could flip
        two = np.sort(U @ centers.T, axis=1)[:, -2:]
        assert (two[:, 1] - two[:, 0]).min() > 1e-6, "a near-tie in the data: other data"
    if init.shape[0] == len(X):
        # faiss ignores init when n == k (its centroids are the points in order): the same
        # partition into singletons, numbered otherwise
        np.testing.assert_array_equal(np.sort(labels), np.arange(len(X)))
        labels, centers = np.arange(len(X)), centers[labels]  # point i's cluster is i
    np.testing.assert_array_equal(labels, faiss_labels)
    np.testing.assert_allclose(centers, km.centroids, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(centers, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, d, k, spread", [
    (1031, 3, 1, 0.3), (2053, 3, 7, 0.3), (3001, 3, 100, 1 / 40), (4099, 8, 300, 1 / 30),
    (6007, 32, 1000, 1 / 20), (211, 5, 211, 0.3)])
def test_same_partition_as_faiss_spherical(n, d, k, spread, dtype):
    """From the same initial centers, on rows of any length (faiss gets them at unit norm),
    k from 1 to n, n a prime (no chunk size divides it)."""
    X = directions(n, d, max(1, k // 2 + 1) if k < 100 else k, seed=n + k, spread=spread)
    init = X[np.random.default_rng(k).choice(n, k, replace=False)]
    _agree_with_faiss(X, init, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_partition_as_faiss_with_weights(dtype):
    X = directions(2053, 4, 9, seed=3, spread=0.3)
    w = np.random.default_rng(4).uniform(0.2, 5.0, len(X))
    init = X[np.random.default_rng(5).choice(len(X), 9, replace=False)]
    _agree_with_faiss(X, init, dtype, weights=w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_partition_as_faiss_on_array_api_strict(dtype):
    xps = pytest.importorskip("array_api_strict")
    X = directions(2053, 3, 6, seed=8, spread=0.3)
    init = X[np.random.default_rng(9).choice(len(X), 10, replace=False)]
    _agree_with_faiss(X, init, dtype, backend="array-api", make_array=xps.asarray)


def test_same_partition_as_faiss_on_dask():
    da = pytest.importorskip("dask.array")
    X = directions(2053, 3, 6, seed=8, spread=0.3)
    init = X[np.random.default_rng(9).choice(len(X), 10, replace=False)]
    _agree_with_faiss(X, init, np.float64, backend="dask",
                      make_array=lambda a: da.from_array(a, chunks=(500, -1)[:a.ndim]))


# -- what a fit gives ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fitted_model_is_cosine_kmeans(dtype):
    X = directions(3001, 5, 8, seed=1).astype(dtype)
    w = np.random.default_rng(2).uniform(0.5, 2.0, len(X)).astype(dtype)
    km = SphericalKMeans(8, random_state=0, backend="numpy").fit(X, sample_weight=w)
    C = km.cluster_centers_
    assert C.dtype == dtype
    np.testing.assert_allclose(np.linalg.norm(C.astype(np.float64), axis=1), 1.0,
                               atol=4 * np.finfo(dtype).eps)
    cos = unit(X) @ unit(C).T
    np.testing.assert_array_equal(km.labels_, cos.argmax(1))
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    D = km.transform(X)
    assert D.dtype == dtype and D.shape == (len(X), 8)
    np.testing.assert_allclose(D, 1 - cos, atol=1e-5 if dtype == np.float32 else 1e-12)
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    inertia = float(np.sum(w * (1 - cos.max(1))))
    assert km.inertia_ == pytest.approx(inertia, rel=rtol)
    assert km.score(X, sample_weight=w) == pytest.approx(-km.inertia_, rel=rtol)
    assert km.history_["inertia"][-1] >= km.inertia_ * (1 - rtol)
    # each center is its cluster's normalised weighted sum
    sums = np.zeros((8, X.shape[1]))
    np.add.at(sums, km.labels_, unit(X) * w[:, None])
    np.testing.assert_allclose(C, unit(sums), atol=1e-5 if dtype == np.float32 else 1e-12)


def test_row_lengths_do_not_matter_and_x_is_never_written():
    X = directions(2003, 4, 6, seed=4)
    scaled = X * np.exp2(np.random.default_rng(5).integers(-40, 40, size=(len(X), 1)))
    before = scaled.copy()
    init = X[:6]
    a = SphericalKMeans(6, init=init, backend="numpy").fit(X)
    b = SphericalKMeans(6, init=init * 1e3, backend="numpy").fit(scaled)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(scaled, before)
    # extreme but finite rows: normalised without overflow or underflow
    huge = np.concatenate([X[:1000] * 1e300, X[1000:] * 1e-300])
    c = SphericalKMeans(6, init=init, backend="numpy").fit(huge)
    np.testing.assert_array_equal(c.labels_, a.labels_)


@pytest.mark.parametrize("init", ["k-means++", "k-means||", "random"])
def test_every_init_gives_unit_centers_and_is_seeded(init):
    X = directions(2003, 3, 5, seed=6).astype(np.float32)
    a = SphericalKMeans(5, init=init, random_state=3, backend="numpy").fit(X)
    b = SphericalKMeans(5, init=init, random_state=3, backend="numpy").fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(np.linalg.norm(a.cluster_centers_, axis=1), 1.0, atol=1e-6)
    assert len(np.unique(a.labels_)) == 5


def test_kmeans_plusplus_draws_as_on_the_unit_rows():
    """k-means++ runs on the unit rows (the squared chord distance): the same draws as
    KMeans's k-means++ on X normalised by hand (translation does not change its draws)."""
    X = directions(1501, 3, 6, seed=7)
    sph = SphericalKMeans(6, random_state=11, max_iter=1, backend="numpy").fit(X)
    euc = KMeans(6, random_state=11, max_iter=1, backend="numpy").fit(unit(X))
    # the first assignment is to the initial centers: the same cost (chord^2 = 2 (1 - cos))
    assert 2 * sph.history_["inertia"][0] == pytest.approx(euc.history_["inertia"][0],
                                                           rel=1e-12)
    other = SphericalKMeans(6, random_state=12, max_iter=1, backend="numpy").fit(X)
    assert other.history_["inertia"][0] != pytest.approx(sph.history_["inertia"][0])


def test_callable_init_sees_x_as_given_and_is_projected():
    X = directions(1001, 3, 4, seed=8)
    seen = []

    def init(X_, k, random_state):
        seen.append(X_)
        return X_[:k] * 7.0

    km = SphericalKMeans(4, init=init, n_init=1, backend="numpy").fit(X)
    ref = SphericalKMeans(4, init=X[:4], backend="numpy").fit(X)
    assert seen[0] is X
    np.testing.assert_array_equal(km.labels_, ref.labels_)


# -- rules ---------------------------------------------------------------------------------
def test_rows_of_norm_zero_are_refused_everywhere():
    X = directions(501, 3, 4, seed=9)
    Z = X.copy()
    Z[[7, 300]] = 0
    with pytest.raises(ZeroNormError, match=r"rows of norm 0 \(rows \[7, 300\]\)"):
        SphericalKMeans(4, random_state=0, backend="numpy").fit(Z)
    assert issubclass(ZeroNormError, ValueError)
    km = SphericalKMeans(4, random_state=0, backend="numpy").fit(X)
    for method in (km.predict, km.transform, km.score):
        with pytest.raises(ZeroNormError, match=r"rows \[7, 300\]"):
            method(Z)
    bad = X[:4].copy()
    bad[2] = 0
    with pytest.raises(ZeroNormError, match=r"init has rows of norm 0 \(rows \[2\]\)"):
        SphericalKMeans(4, init=bad, backend="numpy").fit(X)
    with pytest.raises(ZeroNormError, match="The centers init returned"):
        SphericalKMeans(4, init=lambda X_, k, random_state: bad, n_init=1,
                        backend="numpy").fit(X)


def test_copy_x_false_takes_unit_rows_as_given():
    X = directions(1001, 3, 4, seed=10)
    U = unit(X)
    a = SphericalKMeans(4, init=X[:4], copy_x=False, backend="numpy").fit(U)
    b = SphericalKMeans(4, init=X[:4], backend="numpy").fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, atol=1e-14)
    with pytest.raises(ValueError, match="copy_x=False.*unit L2 norm.*copy_x=True"):
        SphericalKMeans(4, copy_x=False, backend="numpy").fit(X)


def test_a_center_whose_points_cancel_keeps_its_direction():
    """Two clusters of two opposite points each: a mean of norm 0 has no direction."""
    from array_api_compat import numpy as np_xp

    from kmeans_xp.algorithms.lloyd import new_centers
    sums = np.array([[0.0, 0.0], [2.0, 0.0]])
    old = np.array([[0.6, 0.8], [1.0, 0.0]])
    got = new_centers(sums, np.array([2.0, 2.0]), old, np_xp, spherical=True)
    np.testing.assert_array_equal(got, old)


# -- the estimator among others --------------------------------------------------------------
def test_params_clone_repr_and_feature_names():
    sklearn = pytest.importorskip("sklearn")
    from sklearn.base import clone
    km = SphericalKMeans(5, init="random", tol=0.0, backend="numpy")
    assert km.get_params() == KMeans(5, init="random", tol=0.0, backend="numpy").get_params()
    c = clone(km)
    assert type(c) is SphericalKMeans and c.get_params() == km.get_params()
    assert repr(km) == "SphericalKMeans(backend='numpy', init='random', n_clusters=5, tol=0.0)"
    X = directions(300, 3, 5, seed=12)
    km.fit(X)
    assert km.get_feature_names_out().tolist() == [f"sphericalkmeans{i}" for i in range(5)]
    pytest.importorskip("pandas")
    frame = km.set_output(transform="pandas").transform(X)
    assert list(frame.columns) == km.get_feature_names_out().tolist()
    np.testing.assert_allclose(frame.to_numpy().min(1), 1 - (unit(X) @ unit(
        km.cluster_centers_).T).max(1), atol=1e-12)
    assert sklearn.base.is_clusterer(km)


def test_pickle_roundtrip_predicts_the_same():
    X = directions(1001, 3, 4, seed=13).astype(np.float32)
    km = SphericalKMeans(4, random_state=0, backend="numpy").fit(X)
    back = pickle.loads(pickle.dumps(km))
    assert type(back) is SphericalKMeans
    np.testing.assert_array_equal(back.predict(X), km.labels_)
    np.testing.assert_array_equal(back.transform(X), km.transform(X))
    assert back.score(X) == km.score(X)


def test_to_sklearn_is_refused_and_the_suggested_pipeline_predicts_alike():
    pytest.importorskip("sklearn")
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import Normalizer
    X = directions(1001, 3, 4, seed=14)
    km = SphericalKMeans(4, random_state=0, backend="numpy").fit(X)
    with pytest.raises(TypeError, match="not a scikit-learn KMeans.*Normalizer"):
        km.to_sklearn()
    sk = KMeans(4, init=km.cluster_centers_, max_iter=1, backend="numpy").fit(
        unit(X)).to_sklearn()
    sk.cluster_centers_ = km.cluster_centers_.copy()
    np.testing.assert_array_equal(make_pipeline(Normalizer(), sk).predict(X), km.labels_)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_dtypes_as_sklearns_check_without_zero_rows(dtype):
    X = (3 * np.random.default_rng(0).uniform(size=(20, 5)) + 1).astype(dtype)
    km = SphericalKMeans(2, n_init=2, max_iter=5, random_state=1).fit(X)
    km.predict(X)
    km.transform(X)


def test_check_estimator_passes_but_for_zero_rows():
    """sklearn's check_estimator: everything passes but check_estimators_dtypes, whose integer
    data has rows of zeros, which a spherical fit refuses (they have no direction; the test
    above runs that check's dtypes without them)."""
    pytest.importorskip("sklearn")
    code = """
import json, warnings
warnings.simplefilter("ignore")
from sklearn.utils.estimator_checks import check_estimator
from kmeans_xp import SphericalKMeans
xfail = {"check_sample_weight_equivalence_on_dense_data": "as sklearn's KMeans",
         "check_sample_weight_equivalence_on_sparse_data": "as sklearn's KMeans",
         # (sparse X is fitted, tests/test_sparse.py; these checks' data has zero rows)
         "check_estimator_sparse_tag": "rows of norm 0 are refused",
         "check_estimator_sparse_array": "rows of norm 0 are refused",
         "check_estimator_sparse_matrix": "rows of norm 0 are refused",
         "check_estimators_dtypes": "rows of norm 0 are refused"}
res = check_estimator(SphericalKMeans(n_clusters=2, n_init=2, max_iter=5), on_fail=None,
                      expected_failed_checks=xfail)
out = [[r["check_name"], r["status"], repr(r["exception"])[:300]] for r in res]
from sklearn.utils import estimator_checks as ec
for check, kw in [(ec.check_clustering, {}), (ec.check_clustering, {"readonly_memmap": True}),
                  (ec.check_clusterer_compute_labels_predict, {})]:
    try:
        check("SphericalKMeans", SphericalKMeans(n_clusters=2, n_init=2, max_iter=5), **kw)
        out.append([check.__name__, "passed", ""])
    except Exception as exc:
        out.append([check.__name__, "failed", repr(exc)[:300]])
print(json.dumps(out))
"""
    env = {**os.environ, "SCIPY_ARRAY_API": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    failed = [(n, e) for n, st, e in results if st == "failed"]
    assert not failed, failed
    status = {n: st for n, st, _ in results}
    assert status["check_estimators_dtypes"] == "xfail"
    assert status["check_clustering"] == "passed"
    assert len(results) > 40


def test_dask_zero_rows_are_refused_with_their_row_numbers():
    da = pytest.importorskip("dask.array")
    X = directions(1000, 3, 4, seed=15)
    X[730] = 0  # in the third block: numbered as a row of X, not of its block
    with pytest.raises(ZeroNormError, match=r"rows \[730\]"):
        SphericalKMeans(4, random_state=0, backend="dask").fit(
            da.from_array(X, chunks=(300, 3)))


def test_numpy_and_array_api_strict_give_one_answer_on_unnormalised_float32():
    xps = pytest.importorskip("array_api_strict")
    X = asymmetric_data(2049, 3, 6, dtype=np.float32, seed=16, offset=5.0)
    init = X[:6]
    a = SphericalKMeans(6, init=init, backend="numpy", tol=0).fit(X)
    b = SphericalKMeans(6, init=xps.asarray(init), backend="array-api", tol=0).fit(
        xps.asarray(X))
    np.testing.assert_array_equal(np.asarray(b.labels_), a.labels_)
    assert b.inertia_ == pytest.approx(a.inertia_, rel=1e-5)


# -- the CuPy backends, their real kernels emulated on the CPU ----------------------------------
@pytest.mark.parametrize("name", ["cupy-kernels", "cupy-chunked", "cupy-fused"])
def test_cupy_backends_emulated(fake_cupy, name):
    """test_spherical_gpu.py's comparison on the emulated device, at small sizes: NumPy X (its
    device copy normalised in place) and "device" X, float32 and float64, d=3 and 17."""
    from tests.test_spherical_gpu import same_spherical_fit
    for dtype in (np.float32, np.float64):
        for d in (3, 17):
            X = directions(1201, d, 6, seed=d).astype(dtype)
            init = X[np.random.default_rng(d).choice(len(X), 8, replace=False)]
            for on_device in (False, True):
                same_spherical_fit(fake_cupy, name, X, init, on_device=on_device,
                                   exact=dtype == np.float64 or d <= 3)


@pytest.mark.parametrize("name", ["cupy-kernels", "cupy-chunked"])
def test_cupy_streamed_emulated(fake_cupy, name):
    from tests.test_spherical_gpu import same_spherical_fit
    X = directions(3001, 3, 6, seed=3)
    got, _ = same_spherical_fit(fake_cupy, name, X, X[:6], on_device=False,
                                options={"stream": True, "stream_rows": 997})
    assert "stream" in got.memory_report_
