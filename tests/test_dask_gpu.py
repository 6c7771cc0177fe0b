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


def test_actors_statistics_on_the_device(cp, client):
    """The actors' changed-label counts and weighted inertia (computed on the device, fetched
    with the sums in one transfer) are the host's numbers."""
    from kmeans_xp_backends.dask_ import DaskBackend
    X, init, w = _problem(50_003, 20, np.float32, seed=5)
    backend = DaskBackend(engine="actors")
    Xd = backend.to_backend(da.from_array(cp.asarray(X), chunks=(20_000, 3), asarray=False))
    xp = backend.array_namespace(Xd)
    wd = backend.persist(xp.asarray(cp.asarray(w)))
    eng = backend._actors
    centers = init.copy()
    previous = None
    for _ in range(3):
        state, gen, sums, weights, changed, inertia = eng.step(Xd, wd, centers, True,
                                                               stats=True)
        labels, mins = (cp.asnumpy(a.compute()) for a in eng.arrays(state, gen))
        want = float(np.dot(mins.astype(np.float64), w.astype(np.float64)))
        assert inertia == pytest.approx(want, rel=1e-12)
        assert changed == (-1 if previous is None else int(np.sum(labels != previous)))
        previous = labels
        centers = (sums / np.maximum(weights, 1e-300)[:, None]).astype(np.float32)
    backend.finish()
