"""The table of init methods (kmeans_xp.algorithms.init.INIT_METHODS): every method it names is
accepted, run and sized from the table alone. A new method adds its row there and its test
here."""
import numpy as np
import pytest

from kmeans_xp import KMeans, MiniBatchKMeans
from kmeans_xp.algorithms.init import INIT_METHODS, seeding_dtype
from kmeans_xp.contract.memory import xp_seeding_bytes
from kmeans_xp.estimators.validation import InvalidParameterError, validate_params
from kmeans_xp.testing import asymmetric_data


@pytest.mark.parametrize("name", list(INIT_METHODS))
def test_every_method_fits(name):
    X = asymmetric_data(400, 3, 4, dtype=np.float64, seed=1)
    km = KMeans(4, init=name, n_init=1, max_iter=5, random_state=0, backend="numpy").fit(X)
    assert km.cluster_centers_.shape == (4, 3) and np.isfinite(km.inertia_)
    # the same draw through the table, on the centered X, starts the fit
    again = KMeans(4, init=name, n_init=1, max_iter=5, random_state=0, backend="numpy").fit(X)
    assert np.array_equal(km.cluster_centers_, again.cluster_centers_)


def test_validation_names_the_tables_methods():
    for name in INIT_METHODS:
        validate_params({"init": name}, "KMeans")
    with pytest.raises(InvalidParameterError, match="k-means\\|\\|"):
        validate_params({"init": "kmeans+"}, "KMeans")


@pytest.mark.parametrize("name", list(INIT_METHODS))
def test_n_init_auto_follows_the_table(name):
    runs = 1 if INIT_METHODS[name].runs_once else None
    assert KMeans(3, init=name)._resolved_n_init() == (runs or 10)
    assert MiniBatchKMeans(3, init=name)._resolved_n_init() == (runs or 3)


def test_seeding_dtype_follows_the_table():
    assert seeding_dtype("k-means++", np.float32) == "float32"
    assert seeding_dtype("k-means++", "float64") == "float64"
    assert seeding_dtype("k-means||", np.float32) == "float64"   # its candidates' k-means++
    assert seeding_dtype("random", np.float32) is None
    assert seeding_dtype(np.zeros((2, 2)), np.float32) is None
    assert seeding_dtype(lambda X, k, random_state: X[:k], np.float32) is None


@pytest.mark.parametrize("name", list(INIT_METHODS))
def test_no_method_needs_more_than_the_memory_estimate_counts(name):
    """The driver's memory estimate counts k-means++'s xp arrays for init
    (`memory.driver_bytes`): no method in the table may need more."""
    for n in (10, 10**4, 10**7):
        for k in (1, 8, 1000):
            for itemsize in (4, 8):
                assert INIT_METHODS[name].xp_bytes(n, k, itemsize) <= \
                    xp_seeding_bytes(n, k, itemsize), (n, k, itemsize)
