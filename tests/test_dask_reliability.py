"""The dask backend on awkward input: 0-row blocks (a boolean filter, then
`compute_chunk_sizes()`), unknown chunk sizes, and X whose squared distances leave its dtype:
the numpy backend's answer, or the backend's own message before anything is computed."""
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from kmeans_xp import KMeans  # noqa: E402
from kmeans_xp.testing import asymmetric_data  # noqa: E402


def _never_computed(n=200):
    def boom(block):
        raise AssertionError("X was computed")
    X = da.ones((n, 3), chunks=(50, 3)).map_blocks(boom, dtype=np.float64,
                                                   meta=np.empty((0, 0)))
    return X[X[:, 0] > 0]  # unknown chunk sizes (nan)


@pytest.mark.parametrize("backend", ["dask", "auto"])
@pytest.mark.parametrize("weights", [None, 2.0, "array"])
def test_unknown_chunk_sizes_say_what_to_do_before_any_work(backend, weights):
    Y = _never_computed()
    sw = np.ones(100) if weights == "array" else weights
    with pytest.raises(ValueError) as info:
        KMeans(3, backend=backend).fit(Y, sample_weight=sw)
    msg = str(info.value)
    assert "unknown chunk sizes" in msg and "(nan, 3)" in msg
    assert "X.compute_chunk_sizes()" in msg


def test_unknown_chunk_sizes_in_predict():
    X = asymmetric_data(200, 3, 3, seed=2)
    with dask.config.set(scheduler="sync"):
        km = KMeans(3, backend="dask", random_state=0).fit(da.from_array(X, chunks=50))
        with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
            km.predict(_never_computed())
