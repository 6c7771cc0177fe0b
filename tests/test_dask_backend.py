"""The dask backend: the numpy backend's answer from the same init, on a LocalCluster of two
worker processes, whatever the chunking; `accepts` computes nothing; the contract suite."""
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from kmeans_xp_backends.dask_ import DaskBackend, DaskNamespace  # noqa: E402

from kmeans_xp import KMeans  # noqa: E402
from kmeans_xp.registry import select_backend  # noqa: E402
from kmeans_xp.testing import asymmetric_data, check_backend  # noqa: E402


@pytest.fixture
def local_scheduler():
    """dask's local threaded scheduler even while the cluster's client exists."""
    with dask.config.set(scheduler="threads"):
        yield


def _problem(dtype, n=601, k=8, seed=3):
    X = asymmetric_data(n, 3, k, dtype=dtype, seed=seed)
    rng = np.random.default_rng(seed)
    init = X[rng.choice(n, k, replace=False)]
    w = rng.uniform(0.5, 2.0, size=n).astype(dtype)
    w[rng.random(n) < 0.1] = 0
    return X, init, w


# k=8. Chunks: uneven (the last block short), one block, and blocks of 4 rows for n=80: more
# blocks (20) than points in any cluster. Few blocks: the cluster's per-task overhead,
# not the arithmetic, sets the time here.
CASES = {"uneven": (241, (100, 3)), "one": (241, (241, 3)), "tiny": (80, (4, 3))}


def _params():
    for chunking in CASES:
        for dtype in (np.float32, np.float64):
            # the 20-block case in float32 runs on the threaded scheduler: on the cluster it
            # adds ~10 s of task overhead on a 2-core machine and tests nothing new there
            on_cluster = not (chunking == "tiny" and dtype == np.float32)
            yield pytest.param(chunking, dtype, on_cluster,
                               id=f"{chunking}-{np.dtype(dtype)}-"
                                  f"{'cluster' if on_cluster else 'threads'}")


@pytest.mark.parametrize("chunking, dtype, on_cluster", list(_params()))
def test_same_partition_as_numpy(request, chunking, dtype, on_cluster):
    if on_cluster:
        request.getfixturevalue("client")
        _same_partition(chunking, dtype)
    else:
        with dask.config.set(scheduler="threads"):
            _same_partition(chunking, dtype)


def _same_partition(chunking, dtype):
    n, chunks = CASES[chunking]
    X, init, w = _problem(dtype, n=n)
    ref = KMeans(8, init=init, backend="numpy", max_iter=30, tol=0).fit(X, sample_weight=w)
    Xd = da.from_array(X, chunks=chunks)
    got = KMeans(8, init=init, backend="dask", max_iter=30, tol=0).fit(
        Xd, sample_weight=da.from_array(w, chunks=50))
    if chunking == "tiny":
        assert Xd.numblocks[0] > np.bincount(ref.labels_).max()  # blocks > points per cluster
    assert isinstance(got.labels_, da.Array) and got.labels_.chunks == Xd.chunks[:1]
    assert isinstance(got.cluster_centers_, np.ndarray)
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    assert got.n_iter_ == ref.n_iter_
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=rtol * 10,
                               atol=rtol * 10)
    pred = got.predict(Xd)
    assert isinstance(pred, da.Array)
    np.testing.assert_array_equal(pred.compute(), ref.labels_)


def test_accepts_computes_nothing(client):
    def boom(block):
        raise AssertionError("the graph was computed")

    X = da.zeros((1000, 3), chunks=(100, 3)).map_blocks(boom, dtype=np.float64,
                                                        meta=np.empty((0, 0)))
    backend = DaskBackend()
    assert backend.accepts(X, n_clusters=5)
    chosen, why = select_backend("auto", X, n_clusters=5)
    assert chosen.name == "dask" and "dask.array" in why
    xp = backend.array_namespace(X)  # building the namespace computes nothing either
    assert isinstance(xp, DaskNamespace)


def test_reject_reasons():
    backend = DaskBackend()
    X = da.from_array(np.ones((10, 3)), chunks=5)
    unknown = X[X[:, 0] > 0]
    assert "unknown chunk sizes" in backend.reject_reason(unknown, n_clusters=2)
    strict = pytest.importorskip("array_api_strict")
    assert "dask arrays" in backend.reject_reason(strict.ones((4, 2)), n_clusters=2)
    with pytest.raises(TypeError, match="scheduler address"):
        DaskBackend(scheduler=42)
    with pytest.raises(ValueError, match="split_every"):
        DaskBackend(split_every=1)


@pytest.mark.parametrize("bad, match", [(np.nan, "NaN"), (np.inf, "infinity")])
def test_nan_and_inf_are_found_while_persisting(client, bad, match):
    X = asymmetric_data(300, 3, 4, seed=1)
    X[217, 2] = bad
    with pytest.raises(ValueError, match=match):
        KMeans(4, backend="dask", n_init=1).fit(da.from_array(X, chunks=(100, 3)))


def test_init_methods_match_numpy(local_scheduler):
    X = asymmetric_data(900, 3, 6, dtype=np.float64, seed=5)
    Xd = da.from_array(X, chunks=(200, 3))
    for init in ("k-means||", "k-means++"):
        a = KMeans(6, init=init, random_state=1, backend="dask").fit(Xd)
        b = KMeans(6, init=init, random_state=1, backend="numpy").fit(X)
        np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-10)
        np.testing.assert_array_equal(a.labels_.compute(), b.labels_)


def test_numpy_input_and_column_chunks(local_scheduler):
    X, init, _ = _problem(np.float64)
    ref = KMeans(8, init=init, backend="numpy", max_iter=20).fit(X)
    got = KMeans(8, init=init, backend="dask", max_iter=20).fit(X)  # wrapped by to_backend
    assert isinstance(got.labels_, np.ndarray)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    split_cols = da.from_array(X, chunks=(200, 2))  # rows and columns chunked
    got = KMeans(8, init=init, backend="dask", max_iter=20).fit(split_cols)
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    assert got.transform(split_cols).shape == (X.shape[0], 8)
    assert got.score(split_cols) == pytest.approx(-ref.inertia_, rel=1e-9)


def test_tree_reduction_and_empty_clusters(local_scheduler):
    # a far-away init center gets no points: relocation must match the numpy backend
    X, init, w = _problem(np.float64, n=400)
    init = init.copy()
    init[3] += 1e4
    ref = KMeans(8, init=init, backend="numpy", max_iter=10, tol=0).fit(X, sample_weight=w)
    got = KMeans(8, init=init, backend="dask", max_iter=10, tol=0,
                 backend_options={"split_every": 2}).fit(da.from_array(X, chunks=(33, 3)),
                                                         sample_weight=w)
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)


def test_contract_suite(local_scheduler):
    passed = check_backend(DaskBackend, make_array=lambda a: da.from_array(
        a, chunks=(max(1, a.shape[0] // 3 + 1), -1)))
    assert passed > 0


def test_scheduler_address_option(client):
    X, init, _ = _problem(np.float32, n=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        km = KMeans(8, init=init, backend="dask", max_iter=5,
                    backend_options={"scheduler": client.scheduler.address})
        km.fit(da.from_array(X, chunks=(150, 3)))
    ref = KMeans(8, init=init, backend="numpy", max_iter=5).fit(X)
    np.testing.assert_array_equal(km.labels_.compute(), ref.labels_)
    from kmeans_xp_backends import dask_
    for c in list(dask_._clients.values()):
        c.close()
    dask_._clients.clear()


def test_estimate_memory():
    from kmeans_xp import estimate_memory
    est = estimate_memory(10**6, 3, 100, dtype="float32", backend="dask")
    assert est.parts["data"] == 12 * 10**6 and est.total > est.parts["data"]
    assert est.parts["centered_copy"] == est.parts["data"]  # the actors hold X - mean
    assert est.parts["labels_and_distances"] == 2 * 10**6 * 12  # the last two calls


def test_namespace_keeps_small_arrays_eager_and_per_sample_arrays_aligned():
    X = da.from_array(np.arange(30.0).reshape(10, 3), chunks=(4, 3))
    xp = DaskBackend().array_namespace(X)
    ones = xp.asarray(np.ones(10))
    assert isinstance(ones, da.Array) and ones.chunks == ((4, 4, 2),)
    assert not any(isinstance(v, np.ndarray) and v.size == 10
                   for v in dict(ones.__dask_graph__()).values())  # made, not shipped
    w = xp.asarray(np.arange(10.0))
    assert isinstance(w, da.Array) and w.chunks == X.chunks[:1]
    small = xp.asarray(np.ones((3, 3)))
    assert isinstance(small, np.ndarray)
    assert isinstance(xp.where(small > 0, small, xp.zeros_like(small)), np.ndarray)
    assert isinstance(xp.full(10, 1.0), da.Array) and isinstance(xp.full(3, 1.0), np.ndarray)
    mixed = xp.take(small, xp.asarray(np.array([0, 2, 1, 0, 0, 1, 2, 2, 0, 1])), axis=0)
    assert isinstance(mixed, da.Array)
    np.testing.assert_array_equal(mixed.compute(), np.ones((10, 3)))
    idx = xp.searchsorted(xp.cumulative_sum(w), xp.asarray(np.array([0.5, 44.0])))
    np.testing.assert_array_equal(idx.compute(), [1, 9])
    assert xp.float64 is np.float64 and xp.isdtype(xp.float32, "real floating")


@pytest.mark.parametrize("reduce", ["client", "tree"])
def test_cluster_iteration_futures_path(client, reduce):
    """On the cluster: X's in-memory blocks are sent to the workers once (futures, not data in
    every graph), weights are persisted next to X's blocks, each iteration's keys are new
    (repeated centers reuse none), the partial sums match the numpy backend's, and with
    timings each block's own time comes back."""
    from distributed import Future, futures_of
    from kmeans_xp_backends.numpy_ import NumpyBackend
    X, init, w = _problem(np.float64, n=500)
    backend = DaskBackend(engine="graph", reduce=reduce, split_every=2, timings=True)
    Xd = backend.to_backend(da.from_array(X, chunks=(120, 3)))
    assert all(isinstance(v, Future) for v in dict(Xd.__dask_graph__()).values())
    xp = backend.array_namespace(Xd)
    wd = backend.persist(xp.asarray(w))
    distributed.wait(futures_of(wd))
    who = client.who_has(futures_of(Xd) + futures_of(wd))
    for xk, wk in zip(Xd.__dask_keys__(), wd.__dask_keys__()):  # a worker has both blocks
        assert set(who[wk]) & set(who[xk[0]])
    ref = NumpyBackend().lloyd_iter(X, w, init, xp=np)
    for _ in range(2):  # the same centers twice: new keys each time
        it = backend.lloyd_iter(Xd, wd, init, xp=xp)
        np.testing.assert_allclose(it.weighted_sums, ref.weighted_sums, rtol=1e-12)
        np.testing.assert_allclose(it.weight_in_clusters, ref.weight_in_clusters, rtol=1e-12)
        np.testing.assert_array_equal(it.labels.compute(), ref.labels)
        np.testing.assert_allclose(it.min_sq_dist.compute(), ref.min_sq_dist, rtol=1e-12)
    t = backend.last_iter_timings
    assert t["reduce"] == reduce and t["blocks"] == Xd.numblocks[0]
    if reduce == "client":
        assert len(t["block_times"]) == Xd.numblocks[0]
        assert all(b["seconds"] >= 0 and b["rows"] > 0 for b in t["block_times"])
    with pytest.raises(ValueError, match="reduce"):
        DaskBackend(reduce="nope")


# -- the actors engine ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("far_center", [False, True], ids=["plain", "empty-cluster"])
def test_actors_engine_matches_graph_and_numpy(client, dtype, far_center):
    """engine='actors' == engine='graph' (bit for bit) == the numpy backend, from the same
    init, on uneven blocks (the last one short); with a far init center, a cluster is empty
    and relocated."""
    X, init, w = _problem(dtype, n=401)
    if far_center:
        init = init.copy()
        init[3] += 1e4
    ref = KMeans(8, init=init, backend="numpy", max_iter=30, tol=0).fit(X, sample_weight=w)
    fits = {}
    for engine in ("graph", "actors"):
        fits[engine] = KMeans(8, init=init, backend="dask", max_iter=30, tol=0,
                              backend_options={"engine": engine}).fit(
            da.from_array(X, chunks=(150, 3)), sample_weight=da.from_array(w, chunks=70))
    g, a = fits["graph"], fits["actors"]
    assert isinstance(a.labels_, da.Array) and a.labels_.chunks == ((150, 150, 101),)
    np.testing.assert_array_equal(a.labels_.compute(), g.labels_.compute())
    np.testing.assert_array_equal(a.labels_.compute(), ref.labels_)
    np.testing.assert_array_equal(a.cluster_centers_, g.cluster_centers_)
    assert a.n_iter_ == g.n_iter_ == ref.n_iter_
    assert a.inertia_ == g.inertia_
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    assert a.inertia_ == pytest.approx(ref.inertia_, rel=rtol)
    np.testing.assert_array_equal(a.predict(da.from_array(X, chunks=(150, 3))).compute(),
                                  ref.labels_)


def test_actors_engine_strict_convergence(client):
    X, init, _ = _problem(np.float64, n=300)
    ref = KMeans(8, init=init, backend="numpy", max_iter=100).fit(X)
    got = KMeans(8, init=init, backend="dask", max_iter=100,
                 backend_options={"engine": "actors"}).fit(da.from_array(X, chunks=(70, 3)))
    assert got.n_iter_ == ref.n_iter_ < 100
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)


def test_actors_engine_lloyd_iter(client):
    """lloyd_iter with engine='actors': one actor per worker holding its blocks; the same
    labels, distances and (bit for bit) partial sums as the graph engine, for several
    iterations in a row; update_centers=False too; timings per block."""
    X, init, w = _problem(np.float64, n=500)
    graph = DaskBackend(reduce="client")
    actors = DaskBackend(engine="actors", timings=True)
    Xd = graph.to_backend(da.from_array(X, chunks=(120, 3)))
    xp = graph.array_namespace(Xd)
    wd = graph.persist(xp.asarray(w))
    centers = init
    from kmeans_xp.lloyd import new_centers
    for _ in range(3):
        ig = graph.lloyd_iter(Xd, wd, centers, xp=xp)
        ia = actors.lloyd_iter(Xd, wd, centers, xp=xp)
        np.testing.assert_array_equal(ia.weighted_sums, ig.weighted_sums)
        np.testing.assert_array_equal(ia.weight_in_clusters, ig.weight_in_clusters)
        np.testing.assert_array_equal(ia.labels.compute(), ig.labels.compute())
        np.testing.assert_array_equal(ia.min_sq_dist.compute(), ig.min_sq_dist.compute())
        centers = new_centers(ig.weighted_sums, ig.weight_in_clusters, centers, np)
    state = actors._actors.state
    assert len(state["actors"]) == len(client.scheduler_info()["workers"])
    assert sorted(i for a in state["actors"] for i in a["indices"]) == list(range(5))
    t = actors.last_iter_timings
    assert t["engine"] == "actors" and len(t["block_times"]) == 5
    ia = actors.lloyd_iter(Xd, None, centers, xp=xp, update_centers=False)
    ig = graph.lloyd_iter(Xd, None, centers, xp=xp, update_centers=False)
    np.testing.assert_array_equal(ia.labels.compute(), ig.labels.compute())
    actors.finish()
    assert actors._actors.state is None


def test_actors_engine_label_blocks_anywhere_and_kept_calls(client):
    """A label block asked for on a worker without the actor comes over the network, the same;
    the labels of a call older than the actor keeps raise a clear error."""
    from kmeans_xp_backends._dask_actors import KEEP, actor_output
    X, init, w = _problem(np.float64, n=300)
    actors = DaskBackend(engine="actors")
    Xd = actors.to_backend(da.from_array(X, chunks=(100, 3)))
    xp = actors.array_namespace(Xd)
    first = actors.lloyd_iter(Xd, xp.asarray(w), init, xp=xp)
    state = actors._actors.state
    workers = sorted(client.scheduler_info()["workers"])
    a = next(a for a in state["actors"] if a["indices"])
    other = next(wk for wk in workers if wk != a["address"])
    gen = int(first.labels.name.split("-")[3])
    here = client.submit(actor_output, a["key"], a["address"], gen, 0, 0,
                         workers=[a["address"]], pure=False).result()
    away = client.submit(actor_output, a["key"], a["address"], gen, 0, 0, workers=[other],
                         allow_other_workers=False, pure=False).result()
    np.testing.assert_array_equal(here, away)
    assert away.dtype == np.int64 and len(away) == 100
    for _ in range(KEEP):
        actors.lloyd_iter(Xd, xp.asarray(w), init, xp=xp)
    with pytest.raises(RuntimeError, match="gone from the actor"):
        first.labels.compute()
    actors.finish()


def test_actors_engine_through_the_scheduler(client):
    """direct_gather=False: actor calls go through the handles (the scheduler proxies them
    when the client does not connect to workers); the same fit."""
    X, init, w = _problem(np.float32, n=300)
    fits = [KMeans(8, init=init, backend="dask", max_iter=20, tol=0,
                   backend_options={"engine": "actors", "direct_gather": direct}).fit(
        da.from_array(X, chunks=(110, 3)), sample_weight=w) for direct in (True, False)]
    np.testing.assert_array_equal(fits[0].labels_.compute(), fits[1].labels_.compute())
    np.testing.assert_array_equal(fits[0].cluster_centers_, fits[1].cluster_centers_)
    assert fits[0].n_iter_ == fits[1].n_iter_


def test_engine_auto_is_actors_on_a_cluster_graph_elsewhere(client):
    backend = DaskBackend()
    assert backend.engine == "auto" and backend.uses_actors()
    assert backend.kmeans_single is not None
    with dask.config.set(scheduler="threads"):  # the client exists, dask does not use it
        assert not backend.uses_actors() and backend.kmeans_single is None
    assert not DaskBackend(engine="graph").uses_actors()


def test_actors_engine_options(local_scheduler, monkeypatch):
    monkeypatch.setattr(DaskBackend, "current_client", staticmethod(lambda: None))
    with pytest.raises(ValueError, match="engine"):
        DaskBackend(engine="nope")
    X, init, _ = _problem(np.float64, n=100)
    with pytest.raises(RuntimeError, match="distributed"):
        KMeans(8, init=init, backend="dask", backend_options={"engine": "actors"}).fit(
            da.from_array(X, chunks=(50, 3)))
