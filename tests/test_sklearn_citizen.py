"""scikit-learn's protocols beyond the estimator API: metadata routing, parameter errors of
sklearn's type, the array API checks on every array-api-strict device and dtype, Jupyter's
HTML repr. kmeans_xp imports none of sklearn for them (test_import_light.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from kmeans_xp import InvalidParameterError, KMeans  # noqa: E402
from kmeans_xp.testing import asymmetric_data  # noqa: E402

X = asymmetric_data(600, 3, 4, seed=2)
W = np.random.default_rng(3).uniform(0.1, 5.0, len(X))
INIT = X[[0, 150, 300, 450]]


def _km(**kw):
    return KMeans(4, init=INIT, backend="numpy", **kw)


@pytest.fixture
def routing():
    with sklearn.config_context(enable_metadata_routing=True):
        yield


# -- metadata routing ---------------------------------------------------------------------------
def test_pipeline_routes_sample_weight_to_fit_and_score(routing):
    Xs = StandardScaler().fit_transform(X)
    init = StandardScaler().fit(X).transform(INIT)
    km = KMeans(4, init=init, backend="numpy").set_fit_request(sample_weight=True)
    scaler = StandardScaler().set_fit_request(sample_weight=False)
    pipe = Pipeline([("scale", scaler), ("km", km.set_score_request(sample_weight=True))])
    pipe.fit(X, sample_weight=W)
    weighted = KMeans(4, init=init, backend="numpy").fit(Xs, sample_weight=W)
    plain = KMeans(4, init=init, backend="numpy").fit(Xs)
    assert km.inertia_ == pytest.approx(weighted.inertia_, rel=1e-12)
    assert km.inertia_ != pytest.approx(plain.inertia_, rel=1e-6)
    assert pipe.score(X, sample_weight=W) == pytest.approx(weighted.score(Xs, sample_weight=W))


def test_unrequested_weights_raise_and_refused_ones_are_not_passed(routing):
    from sklearn.exceptions import UnsetMetadataPassedError
    scaler = StandardScaler().set_fit_request(sample_weight=False)
    with pytest.raises(UnsetMetadataPassedError, match="KMeans.fit"):
        Pipeline([("scale", scaler), ("km", _km())]).fit(X, sample_weight=W)
    # weights for the scaler only: KMeans fits unweighted
    scaler = StandardScaler().set_fit_request(sample_weight=True)
    pipe = Pipeline([("scale", scaler), ("km", _km().set_fit_request(sample_weight=False))])
    pipe.fit(X, sample_weight=W)
    Xs = StandardScaler().fit(X, sample_weight=W).transform(X)
    assert pipe.named_steps["km"].inertia_ == _km().fit(Xs).inertia_


def test_alias_and_clone_keep_the_request(routing):
    km = _km().set_fit_request(sample_weight="w")
    for est in (km, clone(km)):
        pipe = Pipeline([("km", est)]).fit(X, w=W)
        assert pipe.named_steps["km"].inertia_ == _km().fit(X, sample_weight=W).inertia_
    routing_ = clone(km).get_metadata_routing()
    assert routing_.fit.requests == {"sample_weight": "w"}
    assert routing_.score.requests == {"sample_weight": None}


def test_cross_validate_routes_weights(routing):
    from sklearn.model_selection import cross_validate
    km = _km().set_fit_request(sample_weight=True).set_score_request(sample_weight=True)
    res = cross_validate(km, X, params={"sample_weight": W}, cv=3)
    assert np.all(np.isfinite(res["test_score"]))


def test_request_errors(routing):
    with pytest.raises(TypeError):
        _km().set_fit_request(weights=True)
    with pytest.raises(ValueError, match="alias"):
        _km().set_fit_request(sample_weight="not an identifier")
    assert not hasattr(_km(), "set_predict_request")  # predict takes no metadata


def test_requests_need_routing_enabled():
    with pytest.raises(RuntimeError, match="enable_metadata_routing=True"):
        _km().set_fit_request(sample_weight=True)


# -- parameter errors -----------------------------------------------------------------------------
BAD = [("n_clusters", 0), ("n_clusters", "3"), ("n_clusters", 2.5), ("tol", -1.0),
       ("max_iter", 0), ("n_init", 0), ("n_init", "many"), ("init", "kmeans"),
       ("algorithm", "full"), ("copy_x", "yes"), ("verbose", -1), ("random_state", "0")]


@pytest.mark.parametrize("name, value", BAD)
def test_parameter_errors_are_sklearns_type(name, value):
    from sklearn.cluster import KMeans as SkKMeans
    from sklearn.utils._param_validation import InvalidParameterError as SkInvalid
    with pytest.raises(SkInvalid, match=f"The '{name}' parameter of KMeans must be") as ours:
        KMeans(**{name: value}).fit(X)
    assert isinstance(ours.value, (InvalidParameterError, ValueError, TypeError))
    with pytest.raises(SkInvalid):  # sklearn refuses the same value with the same type
        SkKMeans(**{name: value}).fit(X)


def test_parameter_error_without_sklearn_loaded():
    code = ("from kmeans_xp import KMeans, InvalidParameterError\n"
            "import sys\n"
            "try:\n    KMeans(0).fit([[0.0], [1.0]])\n"
            "except InvalidParameterError as e:\n"
            "    assert isinstance(e, ValueError) and isinstance(e, TypeError)\n"
            "    assert 'sklearn' not in sys.modules\n    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


# -- array API: every array-api-strict device and dtype -----------------------------------------
ARRAY_API = """
import json, warnings
warnings.simplefilter("ignore")
from sklearn.utils import estimator_checks as ec, get_tags
from kmeans_xp import KMeans
est = KMeans(n_clusters=2, n_init=2, max_iter=5)
out = {"tag": get_tags(est).array_api_support, "runs": []}
for dev in ("CPU_DEVICE", "device1", "device2"):
    ec.check_array_api_same_namespace("KMeans", est, "array_api_strict", dev)
    for dtype in ("float32", "float64"):
        for sw in (False, True):
            ec.check_array_api_input_and_values("KMeans", est, "array_api_strict", dev,
                                                dtype, check_sample_weight=sw)
            out["runs"].append([dev, dtype, sw])
print(json.dumps(out))
"""


def test_array_api_checks_on_array_api_strict():
    pytest.importorskip("array_api_strict")
    env = {**os.environ, "SCIPY_ARRAY_API": "1"}
    run = subprocess.run([sys.executable, "-c", ARRAY_API], capture_output=True, text=True,
                         env=env, check=False, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["tag"] is True
    assert len(out["runs"]) == 12


def test_other_namespace_refused_only_under_dispatch(monkeypatch):
    strict = pytest.importorskip("array_api_strict")
    km = KMeans(4, init=INIT).fit(X)
    # sklearn's dispatch needs SCIPY_ARRAY_API set before scipy loads (done in the subprocess
    # above); here only the switch kmeans_xp reads
    config = {**sklearn.get_config(), "array_api_dispatch": True}
    with monkeypatch.context() as m:
        m.setattr(sklearn, "get_config", lambda: config)
        km.predict(X.tolist())  # array-likes go with NumPy, as in sklearn
        with pytest.raises(ValueError, match=r"KMeans.transform\(\) must use the same"):
            km.transform(strict.asarray(X))
    # without dispatch: a backend is chosen for the input, the same labels come back
    assert np.array_equal(np.asarray(km.predict(strict.asarray(X))), km.labels_)


# -- Jupyter ----------------------------------------------------------------------------------
def test_html_repr_unfitted_and_fitted():
    km = KMeans(3, backend="numpy", max_memory="<2GB>")
    text = km._repr_html_()
    assert "KMeans(" in text and "n_clusters=3" in text
    assert "&lt;2GB&gt;" in text and "<2GB>" not in text  # escaped
    assert "fitted" in text
    km = KMeans(3, backend="numpy", random_state=0).fit(X)
    text = km._repr_html_()
    assert "numpy (named by the user)" in text and f"{km.inertia_:.6g}" in text


def test_html_repr_inside_a_pipeline():
    pipe = Pipeline([("scale", StandardScaler()), ("km", KMeans(3, backend="numpy"))])
    assert "KMeans" in pipe._repr_html_()
