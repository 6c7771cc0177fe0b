"""Degenerate input refused by name before any work: weights that sum to zero (R2, as
scikit-learn refuses them) and a dask array whose chunk sizes are unknown (R8)."""
import numpy as np
import pytest

from kmeans_xp import KMeans, MiniBatchKMeans, SphericalKMeans

SKLEARN_MESSAGE = "Sample weights must contain at least one non-zero number"


def _X(n=120):
    rng = np.random.default_rng(3)
    return rng.normal(size=(n, 3)) * [1, 2, 3] + [1, 0, -1]


@pytest.mark.parametrize("cls, call", [(KMeans, "fit"), (SphericalKMeans, "fit"),
                                       (MiniBatchKMeans, "fit"),
                                       (MiniBatchKMeans, "partial_fit")],
                         ids=["KMeans", "SphericalKMeans", "MiniBatchKMeans", "partial_fit"])
def test_weights_summing_to_zero_are_refused(cls, call):
    X = _X()
    w = np.zeros(len(X))
    with pytest.raises(ValueError, match=SKLEARN_MESSAGE) as info:
        getattr(cls(3, random_state=0, backend="numpy"), call)(X, sample_weight=w)
    assert "sample_weight is 0 for all 120 samples" in str(info.value)
    assert np.all(w == 0)   # the user's array untouched


def test_later_partial_fit_with_zero_weights_is_refused_and_keeps_the_model():
    X = _X()
    km = MiniBatchKMeans(3, random_state=0, backend="numpy").partial_fit(X)
    before = np.array(km.cluster_centers_)
    with pytest.raises(ValueError, match=SKLEARN_MESSAGE):
        km.partial_fit(X, sample_weight=np.zeros(len(X)))
    np.testing.assert_array_equal(km.cluster_centers_, before)


def test_matches_scikit_learn():
    sklearn = pytest.importorskip("sklearn.cluster")
    X, w = _X(), np.zeros(120)
    for ours, theirs in ((KMeans, sklearn.KMeans), (MiniBatchKMeans, sklearn.MiniBatchKMeans)):
        with pytest.raises(ValueError, match=SKLEARN_MESSAGE):
            theirs(3, n_init=1).fit(X, sample_weight=w)
        with pytest.raises(ValueError, match=SKLEARN_MESSAGE):
            ours(3, n_init=1, backend="numpy").fit(X, sample_weight=w)


def test_partial_fit_on_dask_with_unknown_chunk_sizes():
    da = pytest.importorskip("dask.array")
    X = da.from_array(_X(400), chunks=(100, 3))
    filtered = X[X[:, 0] > 0]   # a boolean filter leaves the row chunks unknown (nan)
    km = MiniBatchKMeans(3, random_state=0)
    with pytest.raises(ValueError, match="compute_chunk_sizes") as info:
        km.partial_fit(filtered)
    assert "NaN to integer" not in str(info.value)
    assert not hasattr(km, "cluster_centers_")
    km.partial_fit(filtered.compute_chunk_sizes())   # what the message says to do
    assert km.cluster_centers_.shape == (3, 3)
