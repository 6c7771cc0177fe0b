"""GPU tests of the dask backend (marker gpu): X as a dask array of CuPy blocks on a
distributed cluster of two worker processes sharing the GPU, each block computed by the CuPy
backend on its worker; both engines give the numpy backend's partition from the same init.
"""

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data

pytestmark = pytest.mark.gpu

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")


def _problem(n, k, dtype, seed):
    X = asymmetric_data(n, 3, k, dtype=dtype, seed=seed)
    rng = np.random.default_rng(seed)
    init = X[rng.choice(n, k, replace=False)].copy()
    w = rng.uniform(0.5, 2.0, n).astype(dtype)
    return X, init, w


@pytest.mark.parametrize("engine", ["graph", "actors"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 37, 300])
def test_cupy_blocks_give_the_numpy_partition(cp, client, engine, dtype, k):
    """Uneven CuPy blocks (the last one short, none a multiple of a kernel block), weights:
    labels, iterations, inertia and centers as the numpy backend's; labels_ stays a dask
    array of CuPy blocks."""
    n = 90_011
    X, init, w = _problem(n, k, dtype, seed=k)
    ref = KMeans(k, init=init, backend="numpy", max_iter=15, tol=0).fit(X, sample_weight=w)
    Xd = da.from_array(cp.asarray(X), chunks=(31_000, 3), asarray=False)
    wd = da.from_array(cp.asarray(w), chunks=31_000, asarray=False)
    got = KMeans(k, init=init, backend="dask", max_iter=15, tol=0,
                 backend_options={"engine": engine}).fit(Xd, sample_weight=wd)
    labels = got.labels_.compute()
    assert isinstance(labels, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(labels), ref.labels_)
    assert got.n_iter_ == ref.n_iter_
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol)
    np.testing.assert_allclose(cp.asnumpy(cp.asarray(got.cluster_centers_)),
                               ref.cluster_centers_, rtol=rtol * 10, atol=rtol * 10)


@pytest.mark.parametrize("engine", ["graph", "actors"])
def test_cupy_blocks_unit_weights_and_empty_clusters(cp, client, engine):
    """Unit weights (sample_weight=None: none made on the client) and a far init center (a
    cluster empty, relocated to the farthest point found block by block on the device)."""
    X, init, _ = _problem(60_007, 16, np.float32, seed=3)
    init[5] += 1e3
    ref = KMeans(16, init=init, backend="numpy", max_iter=15, tol=0).fit(X)
    got = KMeans(16, init=init, backend="dask", max_iter=15, tol=0,
                 backend_options={"engine": engine}).fit(
        da.from_array(cp.asarray(X), chunks=(20_000, 3), asarray=False))
    np.testing.assert_array_equal(cp.asnumpy(got.labels_.compute()), ref.labels_)
    assert got.n_iter_ == ref.n_iter_
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-5)


def test_actors_statistics_on_the_device(cp, client):
    """The statistics computed on the device (sums, weights, weighted inertia, labels changed
    since the last call), fetched in one transfer per worker by the actors, are the graph
    engine's bit for bit, and the host's numbers."""
    from kmeans_xp_backends.dask.backend import DaskBackend
    X, init, w = _problem(50_003, 20, np.float32, seed=5)
    graph, actors = DaskBackend(engine="graph"), DaskBackend(engine="actors")
    place = graph.placement
    Xd = place.to_backend(da.from_array(cp.asarray(X), chunks=(20_000, 3), asarray=False))
    xp = place.namespace(Xd)
    wd = place.persist(xp.asarray(cp.asarray(w)))
    centers = init.copy()
    last = {"graph": None, "actors": None}
    previous = None
    for _ in range(3):
        ig = graph.lloyd_iter(Xd, wd, centers, last["graph"], xp=xp)
        ia = actors.lloyd_iter(Xd, wd, centers, last["actors"], xp=xp)
        for field in ("weighted_sums", "weight_in_clusters", "inertia", "n_changed"):
            np.testing.assert_array_equal(getattr(ia, field), getattr(ig, field))
        labels = cp.asnumpy(ia.labels.compute())
        np.testing.assert_array_equal(labels, cp.asnumpy(ig.labels.compute()))
        diff = X.astype(np.float64) - centers.astype(np.float64)[labels]
        want = float(np.dot((diff * diff).sum(axis=1), w.astype(np.float64)))
        assert float(ia.inertia) == pytest.approx(want, rel=1e-4)
        assert float(ia.n_changed) == (len(X) if previous is None else
                                       int(np.sum(labels != previous)))
        previous = labels
        last = {"graph": ig.labels, "actors": ia.labels}
        centers = (ia.weighted_sums / np.maximum(ia.weight_in_clusters, 1e-300)[:, None]
                   ).astype(np.float32)
    actors.placement.finish()
