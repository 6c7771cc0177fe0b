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
from tests._helpers import blobs  # noqa: E402

INITS = ["k-means++", "random", "k-means||", "array"]


def _filtered(n=600, block=100, seed=1):
    """(X with blocks 1, 3 and 5 of 6 emptied by a boolean filter, its sizes computed; the
    same rows as NumPy)."""
    X = asymmetric_data(n, 3, 5, seed=seed)
    keep = (np.arange(n) // block) % 2 == 0
    Xd = da.from_array(X, chunks=(block, 3))
    Y = Xd[da.from_array(keep, chunks=block)]
    Y.compute_chunk_sizes()
    assert 0 in Y.chunks[0]
    return Y, X[keep]


def _same_as_numpy(Y, ref_X, init, sample_weight=None, **options):
    init_ = ref_X[[0, 150, 299, 60, 210]] if init == "array" else init
    kw = dict(init=init_, random_state=0, n_init=1, max_iter=50)
    got = KMeans(5, backend="dask", backend_options=options, **kw).fit(
        Y, sample_weight=sample_weight)
    w = None if sample_weight is None else np.asarray(sample_weight)
    ref = KMeans(5, backend="numpy", **kw).fit(ref_X, sample_weight=w)
    assert got.labels_.chunks == Y.chunks[:1]   # laid out like X, 0-row blocks included
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-10)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    pred = got.predict(Y)
    assert pred.chunks == Y.chunks[:1]
    np.testing.assert_array_equal(pred.compute(), ref.labels_)
    assert got.transform(Y).compute().shape == (Y.shape[0], 5)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
@pytest.mark.parametrize("init", INITS)
def test_zero_row_blocks_local_schedulers(scheduler, init):
    Y, ref_X = _filtered()
    with dask.config.set(scheduler=scheduler):
        _same_as_numpy(Y, ref_X, init)


@pytest.mark.parametrize("engine", ["graph", "actors"])
@pytest.mark.parametrize("init", INITS)
def test_zero_row_blocks_on_a_cluster(client, engine, init):
    Y, ref_X = _filtered()
    _same_as_numpy(Y, ref_X, init, engine=engine)


@pytest.mark.parametrize("engine", ["graph", "actors"])
def test_zero_row_blocks_persisted_with_weights(client, engine):
    """X persisted by the user (its futures reused in place) and weights laid out like it."""
    Y, ref_X = _filtered(seed=4)
    Y = Y.persist()
    w = np.random.default_rng(0).uniform(0.5, 2, Y.shape[0])
    _same_as_numpy(Y, ref_X, "k-means||", sample_weight=da.from_array(w, chunks=(
        Y.chunks[0],)), engine=engine)


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


@pytest.mark.parametrize("scale, dtype", [(1e19, np.float32), (1e-22, np.float32),
                                          (1e154, np.float64)])
@pytest.mark.parametrize("persisted", [False, True])
def test_extreme_scales_rescaled_on_dask(scale, dtype, persisted):
    """Finite dask X whose squared distances overflow (or underflow) its dtype is rescaled
    by a power of two, its max |X| measured with the NaN/inf check: X / scale's partition."""
    X, init = blobs()
    ref = KMeans(5, init=init.astype(dtype), backend="numpy").fit(X.astype(dtype))
    big = (X * scale).astype(dtype)
    with dask.config.set(scheduler="threads"):
        Xd = da.from_array(big, chunks=(4000, 3))
        Xd = Xd.persist() if persisted else Xd
        km = KMeans(5, init=(init * scale).astype(dtype), backend="dask").fit(Xd)
        labels = km.labels_.compute()
        np.testing.assert_array_equal(labels, ref.labels_)
        assert km.n_iter_ == ref.n_iter_
        np.testing.assert_allclose(km.cluster_centers_ / scale, ref.cluster_centers_,
                                   rtol=1e-5)
        np.testing.assert_array_equal(km.predict(Xd).compute(), labels)
    expect = ref.inertia_ * scale * scale   # inf where X's own units cannot hold it
    assert km.inertia_ == pytest.approx(expect, rel=1e-4) or (
        expect == np.inf and km.inertia_ == np.inf)
