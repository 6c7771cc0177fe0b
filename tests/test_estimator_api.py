"""scikit-learn's estimator API: params, clone, pipelines, check_estimator, and the methods."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from kmeans_xp import ConvergenceWarning, KMeans
from kmeans_xp.testing import asymmetric_data
from tests._helpers import AUTO_CPU

X = asymmetric_data(403, 4, 5, seed=1)
PARAMS = ["algorithm", "backend", "backend_options", "balance", "copy_x", "init", "max_iter",
          "max_memory", "n_clusters", "n_init", "precision", "random_state", "tol", "verbose"]


def test_get_params_lists_every_init_argument():
    km = KMeans(4, tol=1e-3, backend="numpy", max_memory="64MB")
    params = km.get_params()
    assert sorted(params) == PARAMS
    assert params["n_clusters"] == 4 and params["tol"] == 1e-3
    assert params["backend"] == "numpy" and params["max_memory"] == "64MB"
    assert params["init"] == "k-means++" and params["n_init"] == "auto"
    assert km.get_params(deep=False) == params


def test_set_params():
    km = KMeans()
    assert km.set_params(n_clusters=3, init="random", random_state=7) is km
    assert (km.n_clusters, km.init, km.random_state) == (3, "random", 7)
    with pytest.raises(ValueError, match="Invalid parameter 'n_cluster'.*n_clusters"):
        km.set_params(n_cluster=2)
    # validation happens at fit, as in sklearn
    km.set_params(n_clusters=0)
    with pytest.raises(ValueError, match="n_clusters"):
        km.fit(X)


def test_repr_shows_changed_params():
    assert repr(KMeans()) == "KMeans()"
    r = repr(KMeans(3, init=X[:3], backend="numpy"))
    assert "n_clusters=3" in r and "init=array(shape=(3, 4))" in r and "backend='numpy'" in r


def test_clone_unfitted_copy_with_same_params():
    km = KMeans(3, random_state=0, max_memory="1GB").fit(X)
    c = clone(km)
    assert c is not km and c.get_params() == km.get_params()
    assert not hasattr(c, "cluster_centers_")


def test_clone_with_array_init():
    init = X[[0, 100, 200]]
    km = KMeans(3, init=init)
    c = clone(km)
    assert c.init is not init and np.array_equal(c.init, init)
    np.testing.assert_array_equal(c.fit(X).labels_, km.fit(X).labels_)


def test_pipeline_with_standard_scaler():
    pipe = make_pipeline(StandardScaler(), KMeans(5, random_state=0))
    labels = pipe.fit_predict(X)
    Xs = StandardScaler().fit_transform(X)
    ref = KMeans(5, random_state=0).fit(Xs)
    np.testing.assert_array_equal(labels, ref.labels_)
    np.testing.assert_array_equal(pipe.predict(X), ref.predict(Xs))
    np.testing.assert_allclose(pipe.transform(X), ref.transform(Xs))
    # nested params reach the estimator, and the pipeline clones
    pipe.set_params(kmeans__n_clusters=3)
    assert pipe.fit(X)[-1].cluster_centers_.shape == (3, 4)
    assert clone(pipe).get_params()["kmeans__n_clusters"] == 3
    named = Pipeline([("scale", StandardScaler()), ("km", KMeans(2, random_state=0))])
    assert named.fit(X).score(X) == pytest.approx(-named["km"].inertia_)


@pytest.mark.parametrize("name, params", [
    ("KMeans", "n_clusters=2, n_init=2, max_iter=5"),
    ("MiniBatchKMeans", "n_clusters=2, n_init=2, max_iter=5, batch_size=10"),
])
def test_check_estimator_passes(name, params):
    """sklearn's check_estimator, in a subprocess with SCIPY_ARRAY_API=1 so that its array
    API check runs too (scipy reads that variable when first imported); the checks sklearn
    expects its own estimator of the name to fail are the only ones allowed to."""
    code = """
import json, warnings
warnings.simplefilter("ignore")
from sklearn.utils.estimator_checks import check_estimator
from kmeans_xp import NAME as Est
# sklearn marks these checks as expected failures for its own KMeans (see
# sklearn/utils/_test_common/instance_generator.py): with k-means++ the random draws depend
# on the rows, so repeating rows changes the init, not a bug of the fit. Exact equivalence
# from the same init is tested in test_properties.py.
try:
    from sklearn.cluster import NAME as Sk
    from sklearn.utils._test_common.instance_generator import _get_expected_failed_checks
    xfail = _get_expected_failed_checks(Sk())
except ImportError:  # a private module: older and newer sklearn may not have it
    xfail = dict.fromkeys(["check_sample_weight_equivalence_on_dense_data",
                           "check_sample_weight_equivalence_on_sparse_data"],
                          "sample_weight is not equivalent to removing/repeating samples.")
# the same estimator and params sklearn checks its own KMeans with
res = check_estimator(Est(PARAMS), on_fail=None, expected_failed_checks=xfail)
out = [[r["check_name"], r["status"], repr(r["exception"])[:500]] for r in res]
# sklearn yields its clustering checks only for ClusterMixin subclasses, which we cannot be
# without importing sklearn at run time: run them by hand
from sklearn.utils import estimator_checks as ec
for check, kw in [(ec.check_clustering, {}), (ec.check_clustering, {"readonly_memmap": True}),
                  (ec.check_clusterer_compute_labels_predict, {})]:
    name = check.__name__ + ("_readonly" if kw else "")
    try:
        check("NAME", Est(PARAMS), **kw)
        out.append([name, "passed", ""])
    except Exception as exc:
        out.append([name, "failed", repr(exc)[:500]])
# torch on the CPU by name (check_estimator's results do not say which namespace ran):
# fitted arrays, centers and outputs stay torch tensors
import importlib.util
if importlib.util.find_spec("torch") is not None:
    for dtype in ("float32", "float64"):
        name = "check_array_api_input_torch_cpu_" + dtype
        try:
            ec.check_array_api_input("NAME", Est(PARAMS), "torch", "cpu", dtype,
                                     check_values=True, check_sample_weight=True)
            out.append([name, "passed", ""])
        except Exception as exc:
            out.append([name, "failed", repr(exc)[:500]])
print(json.dumps(out))
"""
    code = code.replace("NAME", name).replace("PARAMS", params)
    env = {**os.environ, "SCIPY_ARRAY_API": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    status = {check: st for check, st, _ in results}
    failed = [(n, e) for n, st, e in results if st == "failed"]
    assert not failed, failed
    assert status["check_sample_weight_equivalence_on_dense_data"] == "xfail"
    # array_api_support is declared: every namespace, device and dtype sklearn has here runs
    # (numpy, array-api-strict's devices, torch on CPU when installed); only missing
    # libraries and devices (CuPy, CUDA, MPS, XPU, dpnp) skip
    api = [(n, st, e) for n, st, e in results if n.startswith("check_array_api")]
    assert sum(st == "passed" for _, st, _ in api) >= 4, api
    assert status["check_array_api_same_namespace"] == "passed"
    if _has("torch"):
        assert status["check_array_api_input_torch_cpu_float32"] == "passed"
        assert status["check_array_api_input_torch_cpu_float64"] == "passed"
    missing = ("not installed", "requires cuda", "XPU", "MPS", "CUDA")
    assert all(st == "passed" or any(m in e for m in missing) for _, st, e in api), api
    for name in ("check_estimators_unfitted", "check_fit2d_1sample", "check_clustering",
                 "check_clustering_readonly", "check_clusterer_compute_labels_predict",
                 "check_dtype_object", "check_estimator_sparse_array",
                 "check_transformer_preserve_dtypes", "check_fit_idempotent",
                 "check_n_features_in"):
        assert status[name] == "passed", name
    skipped = {n for n, st, _ in results if st == "skipped" and n not in
               ("check_array_api_input", "check_array_api_mixed_inputs")}
    # only the pandas check may skip, and only when pandas is missing
    allowed = set() if _has("pandas") else {"check_sample_weights_pandas_series"}
    assert skipped <= allowed, skipped
    assert len(results) > 40


def _has(module):
    import importlib.util
    return importlib.util.find_spec(module) is not None


def test_not_fitted_error_is_sklearns_when_sklearn_is_loaded():
    from sklearn.exceptions import NotFittedError as SkNotFitted

    import kmeans_xp
    with pytest.raises(SkNotFitted):
        KMeans(2).predict(X)
    with pytest.raises(kmeans_xp.NotFittedError):
        KMeans(2).transform(X)


def test_fit_predict_equals_labels():
    km = KMeans(5, random_state=3)
    labels = km.fit_predict(X)
    np.testing.assert_array_equal(labels, km.labels_)
    np.testing.assert_array_equal(labels, km.predict(X))


def _brute_distances(A, C):
    return np.sqrt(((A[:, None, :].astype(np.float64) - C[None, :, :]) ** 2).sum(-1))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_matches_brute_force(dtype):
    A = X.astype(dtype)
    km = KMeans(5, random_state=0).fit(A)
    Y = asymmetric_data(31, 4, 2, seed=9).astype(dtype)
    T = km.transform(Y)
    assert T.shape == (31, 5) and T.dtype == dtype
    ref = _brute_distances(Y, km.cluster_centers_.astype(np.float64))
    rtol = 1e-9 if dtype == np.float64 else 1e-3
    np.testing.assert_allclose(T, ref, rtol=rtol, atol=rtol * (ref.max() + 1))
    np.testing.assert_array_equal(T.argmin(1), km.predict(Y))
    assert np.all(T >= 0)


def test_fit_transform_equals_fit_then_transform():
    a = KMeans(5, random_state=0).fit_transform(X)
    b = KMeans(5, random_state=0).fit(X).transform(X)
    assert a.shape == (X.shape[0], 5)
    np.testing.assert_allclose(a, b)


def test_transform_of_centers_is_zero_on_diagonal():
    km = KMeans(5, random_state=0).fit(X)
    T = km.transform(km.cluster_centers_)
    np.testing.assert_allclose(np.diag(T), 0, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_score_is_minus_inertia_on_training_data(weighted):
    w = np.random.default_rng(0).uniform(0, 3, size=X.shape[0]) if weighted else None
    km = KMeans(5, random_state=0).fit(X, sample_weight=w)
    assert km.score(X, sample_weight=w) == pytest.approx(-km.inertia_, rel=1e-10)
    # on other data: minus the sum of squared distances to the nearest center
    Y = asymmetric_data(57, 4, 3, seed=5)
    assert km.score(Y) == pytest.approx(-(_brute_distances(Y, km.cluster_centers_).min(1) ** 2)
                                        .sum(), rel=1e-9)


def test_inertia_is_weighted_sum_of_squared_distances():
    w = np.random.default_rng(1).integers(0, 4, size=X.shape[0]).astype(float)
    km = KMeans(5, random_state=0).fit(X, sample_weight=w)
    d2 = _brute_distances(X, km.cluster_centers_).min(1) ** 2
    assert km.inertia_ == pytest.approx((d2 * w).sum(), rel=1e-10)


def test_fitted_attributes():
    km = KMeans(5, random_state=0, backend="numpy").fit(X)
    assert km.cluster_centers_.shape == (5, 4) and km.labels_.shape == (403,)
    assert km.n_features_in_ == 4 and 1 <= km.n_iter_ <= 300
    assert isinstance(km.inertia_, float) and km.inertia_ > 0
    assert km.backend_ == "numpy" and km.backend_reason_ == "named by the user"
    assert len(km.history_["inertia"]) == km.n_iter_ == len(km.history_["center_shift"])
    assert {"transfer", "init", "lloyd", "total"} <= set(km.timings_)
    assert isinstance(km.memory_report_, dict)


def test_per_iteration_time_counts_every_run():
    """timings_["per_iteration"] is Lloyd time over the iterations of all n_init runs."""
    km = KMeans(5, init="random", n_init=4, random_state=0).fit(X)
    rs = np.random.RandomState(0)  # the runs draw from one RandomState in turn
    runs = [KMeans(5, init="random", n_init=1, random_state=rs).fit(X).n_iter_
            for _ in range(4)]
    assert len(set(runs)) > 1, "the runs should differ in length for this test to bite"
    assert km.timings_["per_iteration"] * sum(runs) == pytest.approx(km.timings_["lloyd"])


def test_refit_is_idempotent_and_overwrites():
    km = KMeans(5, random_state=0)
    a = km.fit(X).cluster_centers_.copy()
    km.fit(X[:, :2])
    assert km.n_features_in_ == 2 and km.cluster_centers_.shape == (5, 2)
    np.testing.assert_array_equal(km.fit(X).cluster_centers_, a)


def test_convergence_warning_with_duplicate_points():
    A = np.repeat(np.array([[0.0, 1.0], [5.0, -2.0]]), [30, 21], axis=0)
    with pytest.warns(ConvergenceWarning, match=r"distinct clusters \(2\).*n_clusters \(3\)"):
        km = KMeans(3, random_state=0).fit(A)
    assert len(np.unique(km.labels_)) == 2
    assert km.inertia_ == pytest.approx(0.0, abs=1e-12)


def test_convergence_warning_is_sklearns_when_sklearn_is_loaded():
    from sklearn.exceptions import ConvergenceWarning as SkConvergenceWarning

    A = np.repeat(np.array([[0.0, 1.0], [5.0, -2.0]]), [30, 21], axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=SkConvergenceWarning)
        KMeans(3, random_state=0).fit(A)  # sklearn's filter silences it
    with pytest.warns(SkConvergenceWarning):
        KMeans(3, random_state=0).fit(A)


def test_no_convergence_warning_when_all_clusters_found():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        KMeans(5, random_state=0).fit(X)


def test_explicit_init_with_n_init_warns_and_runs_once():
    with pytest.warns(RuntimeWarning, match="Explicit initial center position"):
        km = KMeans(3, init=X[:3], n_init=4).fit(X)
    assert km.cluster_centers_.shape == (3, 4)


def test_verbose_prints_iterations_and_report(capsys):
    KMeans(3, random_state=0, verbose=1, max_iter=4, tol=0).fit(X)
    out = capsys.readouterr().out
    assert "Iteration 0" in out and f"backend: {AUTO_CPU}" in out and "timings:" in out


def test_callable_init_gets_data_k_and_random_state():
    calls = []

    def init(data, k, random_state):
        calls.append((np.asarray(data).shape, k, type(random_state)))
        return np.asarray(data)[random_state.choice(len(data), k, replace=False)]

    km = KMeans(4, init=init, n_init=3, random_state=0).fit(X)
    assert calls == [((403, 4), 4, np.random.RandomState)] * 3
    assert km.cluster_centers_.shape == (4, 4)
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        KMeans(4, init=lambda d, k, random_state: np.asarray(d)[:2]).fit(X)


def test_label_counts_where_the_labels_live():
    """Points per cluster from NumPy and dask labels alike (dask: only the k counts are
    computed and fetched, not the labels)."""
    from kmeans_xp.contract.namespaces import label_counts
    labels = np.array([0, 2, 2, 5, 0, 2])
    np.testing.assert_array_equal(label_counts(labels, 7), [2, 0, 3, 0, 0, 1, 0])
    da = pytest.importorskip("dask.array")
    got = label_counts(da.from_array(labels, chunks=4), 7)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, [2, 0, 3, 0, 0, 1, 0])


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_fewer_distinct_clusters_than_asked_warns(backend):
    """sklearn's warning when duplicate points leave fewer distinct clusters than n_clusters."""
    X = np.repeat(np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]]), 10, axis=0)
    if backend == "dask":
        da = pytest.importorskip("dask.array")
        X = da.from_array(X, chunks=(7, 2))
    with pytest.warns(ConvergenceWarning, match=r"distinct clusters \(3\)"):
        KMeans(5, n_init=1, random_state=0, backend=backend).fit(X)


def test_timings_account_for_the_whole_fit():
    """timings_ names every stage of a fit (validation, transfer, stats, init, lloyd,
    copy_back) and they add up to its total, which is the wall time of `fit`."""
    import time

    from kmeans_xp.testing import asymmetric_data
    X = asymmetric_data(200_003, 3, 20, seed=3)
    t0 = time.perf_counter()
    km = KMeans(20, n_init=2, max_iter=20, random_state=0, backend="numpy").fit(X)
    wall = time.perf_counter() - t0
    stages = ("validation", "transfer", "stats", "init", "lloyd", "copy_back")
    assert set(stages) <= set(km.timings_)
    parts = sum(km.timings_[s] for s in stages)
    assert abs(parts - km.timings_["total"]) <= 0.05 * km.timings_["total"]
    assert abs(km.timings_["total"] - wall) <= 0.05 * wall
