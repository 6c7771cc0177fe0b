"""The public API's docstrings are numpydoc: numpydoc's validator where it is installed, else
a check that the sections are there and name every parameter."""
import inspect
import re

import pytest

import kmeans_xp

#: the public API checked: the estimator, its public methods, the top-level planning function
METHODS = ["fit", "predict", "fit_predict", "transform", "fit_transform", "score",
           "get_params", "set_params", "set_output", "get_feature_names_out", "to_sklearn",
           "set_fit_request", "set_score_request", "get_metadata_routing"]
OBJECTS = ["kmeans_xp.KMeans", *(f"kmeans_xp.KMeans.{m}" for m in METHODS),
           "kmeans_xp.estimate_memory", "kmeans_xp.MiniBatchKMeans",
           *(f"kmeans_xp.MiniBatchKMeans.{m}" for m in ("fit", "partial_fit", "to_sklearn")),
           "kmeans_xp.SphericalKMeans", *(f"kmeans_xp.SphericalKMeans.{m}" for m in METHODS)]
#: numpydoc checks left out, as scikit-learn leaves them out: the extended summary, See Also,
#: an Examples section on every method (the class and estimate_memory have one, checked
#: below), named returns ("self : KMeans", RT02)
IGNORED = {"ES01", "SA01", "EX01", "GL01", "GL02", "RT02"}


def _resolve(name):
    obj = kmeans_xp
    for part in name.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", OBJECTS)
def test_numpydoc_validation(name):
    validate = pytest.importorskip("numpydoc.validate").validate
    errors = [(code, msg) for code, msg in validate(name)["errors"] if code not in IGNORED]
    assert not errors, errors


@pytest.mark.parametrize("name", OBJECTS)
def test_sections_name_every_parameter(name):
    """The same promise without numpydoc: a summary, a Parameters section naming every
    parameter, and Returns for what returns something."""
    obj = _resolve(name)
    doc = inspect.getdoc(obj) or ""
    assert doc.split("\n", 1)[0].strip(), f"{name}: no summary line"
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
    if params:
        assert "Parameters\n----------" in doc, f"{name}: no Parameters section"
        documented = set()
        for line in re.findall(r"^(\*{0,2}\w[\w, ]*) :", doc, re.M):
            documented.update(p.strip().lstrip("*") for p in line.split(","))
        assert set(params) <= documented, (name, set(params) - documented)
    if not inspect.isclass(obj):
        assert "Returns\n-------" in doc, f"{name}: no Returns section"


@pytest.mark.parametrize("cls", ["KMeans", "MiniBatchKMeans", "SphericalKMeans"])
def test_class_has_attributes_and_examples(cls):
    doc = inspect.getdoc(getattr(kmeans_xp, cls))
    for section in ("Attributes\n----------", "Examples\n--------"):
        assert section in doc
    for attr in ("cluster_centers_", "labels_", "inertia_", "n_iter_", "n_features_in_",
                 "feature_names_in_", "backend_", "backend_reason_", "history_", "timings_",
                 "memory_report_"):
        assert re.search(rf"^{attr} :", doc, re.M), attr


def test_examples_run():
    """The docstrings' examples are doctests that pass."""
    import doctest
    for obj in (kmeans_xp.KMeans, kmeans_xp.MiniBatchKMeans, kmeans_xp.SphericalKMeans,
                kmeans_xp.estimate_memory):
        finder = doctest.DocTestFinder(recurse=False)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        for test in finder.find(obj, globs={}):
            runner.run(test)
        assert runner.failures == 0 and runner.tries > 0, obj
