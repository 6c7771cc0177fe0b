"""Sparse X (scipy.sparse CSR and CSC, matrix and array): the same fits as scikit-learn's from
the same init, never densified, within the chunked memory plan (docs/sparse.md). GPU tests
(cupyx.scipy.sparse, and host sparse X moved to the device) are marked `gpu`."""
import numpy as np
import pytest

sp = pytest.importorskip("scipy.sparse")
sklearn_cluster = pytest.importorskip("sklearn.cluster")

from kmeans_xp import KMeans, MiniBatchKMeans, kmeans_plusplus  # noqa: E402
from kmeans_xp.contract.fitmemory import least_max_memory  # noqa: E402

CONTAINERS = [sp.csr_matrix, sp.csr_array, sp.csc_matrix, sp.csc_array]


def _max_memory(X, k, budget, weighted=False):
    """max_memory that leaves the scipy-sparse backend `budget` bytes for its chunks: it bounds
    the driver's arrays too (`contract.fitmemory`), so their least comes first."""
    from kmeans_xp_backends.numpy.sparse import ScipySparseBackend
    n, d = X.shape
    return least_max_memory(ScipySparseBackend, n, d, k, X.dtype.itemsize,
                            weighted=weighted) + budget


def _data(n=1003, d=57, density=0.08, seed=0):
    """Asymmetric sparse data: features on different scales, some columns empty, clusters
    in different supports."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=seed,
                  data_rvs=lambda m: rng.uniform(0.5, 3.0, m)).toarray()
    X *= 1.0 + np.arange(d) * 0.3
    X[: n // 3, : d // 4] += rng.uniform(0, 4, (n // 3, d // 4)) * (
        rng.random((n // 3, d // 4)) < 0.3)
    X[:, 5] = 0.0
    return X, rng.uniform(0.1, 3.0, n)


X_DENSE, W = _data()


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_fit_is_sklearns_from_the_same_init(container, dtype, weighted):
    X = container(X_DENSE.astype(dtype))
    init = X_DENSE[[3, 400, 700, 900, 1000, 20]].astype(dtype)
    w = W if weighted else None
    ours = KMeans(6, init=init, n_init=1, tol=1e-6).fit(X, sample_weight=w)
    ref = sklearn_cluster.KMeans(6, init=init, n_init=1, tol=1e-6).fit(X, sample_weight=w)
    assert ours.backend_ == "scipy-sparse"
    assert np.mean(ours.labels_ == ref.labels_) > 0.995   # up to near ties
    assert ours.n_iter_ == pytest.approx(ref.n_iter_, abs=1)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(ours.inertia_, ref.inertia_, rtol=rtol)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=rtol,
                               atol=rtol * 10)
    assert ours.cluster_centers_.dtype == dtype
    np.testing.assert_array_equal(ours.predict(X), ours.labels_)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kmeans_plus_plus_makes_sklearns_draws(dtype):
    X = sp.csr_matrix(X_DENSE.astype(dtype))
    for w in (None, W):
        c, idx = kmeans_plusplus(X, 7, random_state=3, sample_weight=w)
        c_ref, idx_ref = sklearn_cluster.kmeans_plusplus(X, 7, random_state=3,
                                                         sample_weight=w)
        np.testing.assert_array_equal(idx, idx_ref)
        np.testing.assert_array_equal(c, X_DENSE[idx].astype(dtype))
    ours = KMeans(5, random_state=7).fit(X, sample_weight=W)
    ref = sklearn_cluster.KMeans(5, random_state=7).fit(X, sample_weight=W)
    assert np.mean(ours.labels_ == ref.labels_) > 0.995


def test_sparse_fit_equals_the_dense_fit():
    init = X_DENSE[[1, 500, 999]]
    dense = KMeans(3, init=init, backend="numpy").fit(X_DENSE, sample_weight=W)
    sparse = KMeans(3, init=init).fit(sp.csr_array(X_DENSE), sample_weight=W)
    np.testing.assert_array_equal(sparse.labels_, dense.labels_)
    np.testing.assert_allclose(sparse.cluster_centers_, dense.cluster_centers_, rtol=1e-10)
    np.testing.assert_allclose(sparse.inertia_, dense.inertia_, rtol=1e-10)
    # each model predicts, transforms and scores the other kind of input
    for model in (dense, sparse):
        for X in (X_DENSE, sp.csr_matrix(X_DENSE), sp.csc_array(X_DENSE)):
            np.testing.assert_array_equal(model.predict(X), dense.labels_)
            np.testing.assert_allclose(model.transform(X), dense.transform(X_DENSE),
                                       rtol=1e-9, atol=1e-9)
            assert model.score(X, sample_weight=W) == pytest.approx(-dense.inertia_,
                                                                    rel=1e-10)


def test_chunked_fit_is_the_one_chunk_fit():
    """A budget of a few rows per chunk (n a multiple of no chunk size) gives the fit of one
    chunk, relocation of empty clusters included."""
    X = sp.csr_matrix(X_DENSE)
    init = np.vstack([X_DENSE[[2, 600]], np.full((1, X_DENSE.shape[1]), 1e3)])  # one empty
    one = KMeans(3, init=init, n_init=1).fit(X, sample_weight=W)
    small = KMeans(3, init=init, n_init=1, max_memory=_max_memory(
        X, 3, 97 * 24 * 3 + 97 * 64, weighted=True)).fit(
        X, sample_weight=W)
    np.testing.assert_array_equal(small.labels_, one.labels_)
    np.testing.assert_allclose(small.cluster_centers_, one.cluster_centers_, rtol=1e-12)
    ref = sklearn_cluster.KMeans(3, init=init, n_init=1).fit(X, sample_weight=W)
    np.testing.assert_array_equal(one.labels_, ref.labels_)


def test_never_densified():
    """A million features: a dense copy of X would be 8 GB, its dense rows per chunk larger
    than the budget; the fit holds the CSR, the (k, d) sums and (rows, k) distances."""
    n, d = 2000, 1_000_000
    rng = np.random.default_rng(1)
    rows = np.repeat(np.arange(n), 21)
    cols = np.where(np.arange(rows.size) % 21 == 0, rows % 7, rng.integers(7, d, rows.size))
    vals = np.where(cols < 7, 5.0 * (1 + rows % 3), rng.uniform(0, 1, rows.size))
    X = sp.csr_matrix((vals, (rows, cols)), shape=(n, d))  # three clusters, in column < 7
    max_memory = _max_memory(X, 3, 64 * 10**6)   # (the driver's (3, d) centers and sums)
    km = KMeans(3, random_state=0, max_memory=max_memory).fit(X)
    assert km.cluster_centers_.shape == (3, d)
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    mb = MiniBatchKMeans(3, random_state=0, batch_size=256, max_memory="64MB").fit(X)
    assert mb.transform(X[:10]).shape == (10, 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_minibatch_is_sklearns(dtype):
    X = sp.csr_matrix(X_DENSE.astype(dtype))
    init = X_DENSE[[3, 400, 700, 900]].astype(dtype)
    kw = dict(init=init, n_init=1, batch_size=100, random_state=0, max_iter=3)
    ours = MiniBatchKMeans(4, **kw).fit(X, sample_weight=W)
    ref = sklearn_cluster.MiniBatchKMeans(4, **kw).fit(X, sample_weight=W)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=rtol,
                               atol=rtol)
    assert np.mean(ours.labels_ == ref.labels_) > 0.995
    # partial_fit, batch by batch
    p1 = MiniBatchKMeans(4, random_state=2)
    p2 = sklearn_cluster.MiniBatchKMeans(4, random_state=2)
    for s in range(0, 1003, 300):
        p1.partial_fit(X[s:s + 300], sample_weight=W[s:s + 300])
        p2.partial_fit(X[s:s + 300], sample_weight=W[s:s + 300])
    np.testing.assert_allclose(p1.cluster_centers_, p2.cluster_centers_, rtol=rtol,
                               atol=rtol)


@pytest.mark.parametrize("named", ["numpy", "numba"])
def test_named_cpu_backend_takes_its_sparse_path(named):
    if named == "numba":
        pytest.importorskip("numba")
    km = KMeans(3, backend=named, random_state=0).fit(sp.csr_matrix(X_DENSE))
    assert km.backend_ == "scipy-sparse"
    assert named in km.backend_reason_ and "sparse" in km.backend_reason_


def test_fit_predict_and_fit_transform():
    X = sp.csc_matrix(X_DENSE)
    km = KMeans(4, random_state=1)
    labels = km.fit_predict(X)
    np.testing.assert_array_equal(labels, km.labels_)
    D = KMeans(4, random_state=1).fit_transform(X)
    np.testing.assert_allclose(D.min(axis=1) ** 2 @ np.ones(len(labels)), km.inertia_,
                               rtol=1e-9)


def test_integer_sparse_is_float64_and_user_data_is_untouched():
    X = sp.csr_matrix((X_DENSE * 10).astype(np.int64))
    before = X.copy()
    km = KMeans(3, random_state=0).fit(X)
    assert km.cluster_centers_.dtype == np.float64
    assert (X != before).nnz == 0 and X.dtype == np.int64
    # predicted in the fit's dtype whatever the input's
    np.testing.assert_array_equal(km.predict(X.astype(np.float32)), km.labels_)


def test_dask_of_sparse_chunks_is_refused_clearly():
    da = pytest.importorskip("dask.array")
    X = da.from_array(sp.csr_matrix(X_DENSE), chunks=(500, X_DENSE.shape[1]),
                      asarray=False)
    with pytest.raises(TypeError, match="sparse chunks"):
        KMeans(3).fit(X)


# -- GPU: cupyx.scipy.sparse through cuSPARSE ---------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("on_device", [False, True])
def test_cupy_sparse_is_the_cpu_sparse_fit(dtype, on_device):
    import cupy
    import cupyx.scipy.sparse as cusparse
    X = sp.csr_matrix(X_DENSE.astype(dtype))
    init = X_DENSE[[3, 400, 700, 900]].astype(dtype)
    cpu = KMeans(4, init=init, n_init=1).fit(X, sample_weight=W)
    Xg = cusparse.csr_matrix(X) if on_device else X
    gpu = KMeans(4, init=init, n_init=1, backend="cupy-sparse").fit(Xg, sample_weight=W)
    labels = cupy.asnumpy(gpu.labels_) if on_device else gpu.labels_
    assert isinstance(gpu.labels_, cupy.ndarray) == on_device
    assert np.mean(labels == cpu.labels_) > 0.995
    np.testing.assert_allclose(cupy.asnumpy(cupy.asarray(gpu.cluster_centers_)),
                               cpu.cluster_centers_, rtol=1e-4, atol=1e-5)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-4)
    auto = KMeans(4, init=init, n_init=1).fit(cusparse.csr_matrix(X))
    assert auto.backend_ == "cupy-sparse"
    named = KMeans(4, init=init, n_init=1, backend="cupy-chunked").fit(Xg)
    assert named.backend_ == "cupy-sparse"
    D = cpu.transform(X)   # (the same weighted fit's centers)
    np.testing.assert_allclose(cupy.asnumpy(cupy.asarray(gpu.transform(Xg))), D,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cupy_sparse_minibatch_and_kmeans_plus_plus():
    import cupyx.scipy.sparse as cusparse
    X = sp.csr_matrix(X_DENSE)
    cpu = MiniBatchKMeans(4, random_state=0, batch_size=100).fit(X)
    gpu = MiniBatchKMeans(4, random_state=0, batch_size=100,
                          backend="cupy-sparse").fit(cusparse.csr_matrix(X))
    assert gpu.cluster_centers_.shape == cpu.cluster_centers_.shape
    c, idx = kmeans_plusplus(X, 5, random_state=1)
    ref = KMeans(5, random_state=1, backend="cupy-sparse").fit(X)
    assert ref.backend_ == "cupy-sparse" and len(idx) == 5 and c.shape == (5, 57)


def test_spherical_on_sparse_rows():
    from kmeans_xp import SphericalKMeans
    dense = X_DENSE.copy()
    dense[np.arange(len(dense)), np.arange(len(dense)) % dense.shape[1]] += 1.0  # no 0 row
    X = sp.csr_matrix(dense)
    a = SphericalKMeans(4, random_state=0).fit(X, sample_weight=W)
    b = SphericalKMeans(4, random_state=0, backend="numpy").fit(X.toarray(), sample_weight=W)
    assert a.backend_ == "scipy-sparse"
    assert np.mean(a.labels_ == b.labels_) > 0.995
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-9)
    np.testing.assert_allclose(a.transform(X), b.transform(X.toarray()), atol=1e-12)


def test_threaded_chunks_give_the_dense_fit(monkeypatch):
    """Chunks on all cores (the work threshold lowered: this fit is small), their sums added
    in row order, give the dense numpy backend's fit from the same init."""
    from kmeans_xp_backends.numpy import sparse_threads
    monkeypatch.setattr(sparse_threads, "MIN_THREADED_WORK", 0)
    n, d = 40_003, 150
    rng = np.random.default_rng(5)
    X = sp.random(n, d, density=0.05, format="csr", random_state=5, dtype=np.float64)
    X = X + sp.csr_matrix((np.full(n, 4.0), (np.arange(n), rng.integers(0, 6, n))),
                          shape=(n, d))
    w = rng.uniform(0.5, 2.0, n)
    init = X[:6].toarray()
    max_memory = _max_memory(X, 6, 4 * 10**6, weighted=True)
    sparse = KMeans(6, init=init, n_init=1, max_iter=20, max_memory=max_memory).fit(
        X, sample_weight=w)
    dense = KMeans(6, init=init, n_init=1, max_iter=20, backend="numpy").fit(
        X.toarray(), sample_weight=w)
    assert np.mean(sparse.labels_ == dense.labels_) > 0.999
    np.testing.assert_allclose(sparse.cluster_centers_, dense.cluster_centers_, rtol=1e-9,
                               atol=1e-9)
    assert sparse.inertia_ == pytest.approx(dense.inertia_, rel=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_transform_is_zero_on_a_center(dtype):
    X = sp.csr_matrix(X_DENSE.astype(dtype))
    km = KMeans(4, random_state=0).fit(X)
    rows = X[[0, 10, 20]]
    on = KMeans(3, init=rows.toarray(), n_init=1, max_iter=1).fit(rows)   # centers = rows
    np.testing.assert_array_equal(np.diag(on.transform(rows)), 0)
    D = km.transform(X)
    ref = np.linalg.norm(X_DENSE[:, None, :] - km.cluster_centers_.astype(np.float64)[None],
                         axis=2)
    np.testing.assert_allclose(D, ref, rtol=1e-5 if dtype == np.float32 else 1e-10,
                               atol=1e-6)
