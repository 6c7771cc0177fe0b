"""The dask backend: the numpy backend's answer from the same init, on a LocalCluster of two
worker processes, whatever the chunking, with both engines; `accepts` computes nothing; one
round trip per iteration; the contract suite."""
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from kmeans_xp_backends.dask.backend import DaskBackend  # noqa: E402
from kmeans_xp_backends.dask.namespace import DaskNamespace  # noqa: E402

from kmeans_xp import KMeans  # noqa: E402
from kmeans_xp.contract.selection import select_backend  # noqa: E402
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
    xp = backend.placement.namespace(X)  # building the namespace computes nothing either
    assert isinstance(xp, DaskNamespace)


def test_reject_reasons():
    backend = DaskBackend()
    X = da.from_array(np.ones((10, 3)), chunks=5)
    unknown = X[X[:, 0] > 0]
    assert "unknown chunk sizes" in backend.reject_reason(unknown, n_clusters=2)
    strict = pytest.importorskip("array_api_strict")
    assert "dask arrays" in backend.reject_reason(strict.ones((4, 2)), n_clusters=2)
    with pytest.raises(ValueError, match="scheduler"):
        DaskBackend(scheduler=42)
    with pytest.raises(ValueError, match="split_every"):
        DaskBackend(split_every=1)
    with pytest.raises(ValueError, match="no option"):
        DaskBackend(nope=1)


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
        a, chunks=(max(1, a.shape[0] // 3 + 1),) + (-1,) * (a.ndim - 1)))
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
    from kmeans_xp_backends.dask.cluster import close_clients
    close_clients()


def test_estimate_memory():
    from kmeans_xp import estimate_memory
    est = estimate_memory(10**6, 3, 100, dtype="float32", backend="dask")
    assert est.parts["data"] == 12 * 10**6 and est.total > est.parts["data"]
    assert est.parts["driver_centered_copy"] == est.parts["data"]  # X - mean, persisted
    assert est.parts["labels_out"] == 8 * 10**6  # labels_ copied out of the actors
    graph = DaskBackend.estimate_memory(10**6, 3, 100, itemsize=4, engine="graph")
    assert graph.parts["labels_out"] == 0


def test_namespace_keeps_small_arrays_eager_and_per_sample_arrays_aligned():
    X = da.from_array(np.arange(30.0).reshape(10, 3), chunks=(4, 3))
    xp = DaskBackend().placement.namespace(X)
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



def _fitted_blocks(backend, X, w):
    """X and w as a fit hands them to the primitives: X persisted and centered, w persisted
    next to X's blocks (through the backend's placement)."""
    place = backend.placement
    Xd = place.to_backend(X)
    xp = place.namespace(Xd)
    wd = None if w is None else place.persist(xp.asarray(w))
    return Xd, wd, xp


def _same_stats(got, ref, exact=False):
    check = np.testing.assert_array_equal if exact else (
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12))
    for field in ("weighted_sums", "weight_in_clusters", "inertia", "n_changed"):
        a, b = getattr(got, field), getattr(ref, field)
        assert isinstance(a, np.ndarray) and a.dtype == np.float64, field
        check(a, np.asarray(b, dtype=np.float64))


@pytest.mark.parametrize("reduce", ["client", "tree"])
def test_cluster_iteration_futures_path(client, reduce):
    """On the cluster (graph engine): X's in-memory blocks are sent to the workers once
    (futures, not data in every graph), weights are persisted next to X's blocks, each
    iteration's keys are new (repeated centers reuse none), the statistics (sums, weights,
    inertia, changed labels against the last labels) match the numpy backend's, and with
    timings each block's own time comes back."""
    from distributed import Future, futures_of
    from kmeans_xp_backends.numpy.backend import NumpyBackend
    X, init, w = _problem(np.float64, n=500)
    backend = DaskBackend(engine="graph", reduce=reduce, split_every=2, timings=True)
    Xd, wd, xp = _fitted_blocks(backend, da.from_array(X, chunks=(120, 3)), w)
    assert all(isinstance(v, Future) for v in dict(Xd.__dask_graph__()).values())
    distributed.wait(futures_of(wd))
    who = client.who_has(futures_of(Xd) + futures_of(wd))
    for xk, wk in zip(Xd.__dask_keys__(), wd.__dask_keys__()):  # a worker has both blocks
        assert set(who[wk]) & set(who[xk[0]])
    numpy = NumpyBackend()
    ref = numpy.lloyd_iter(X, w, init, None, xp=np)
    last = None
    for _ in range(2):  # the same centers twice: new keys each time, nothing changed
        it = backend.lloyd_iter(Xd, wd, init, last, xp=xp)
        _same_stats(it, numpy.lloyd_iter(X, w, init, None if last is None else ref.labels,
                                         xp=np))
        np.testing.assert_array_equal(it.labels.compute(), ref.labels)
        assert last is None or it.labels.name != last.name
        last = it.labels
    assert float(it.n_changed) == 0
    with dask.config.set(scheduler="threads"):  # X on the cluster, dask computing locally:
        local = backend.lloyd_iter(Xd, w, init, None, xp=xp)  # the weights go there too
    _same_stats(local, ref)
    t = backend.last_iter_timings
    assert t["reduce"] == reduce and t["blocks"] == Xd.numblocks[0]
    if reduce == "client":
        assert len(t["block_times"]) == Xd.numblocks[0]
        assert all(b["seconds"] >= 0 and b["rows"] > 0 for b in t["block_times"])
    with pytest.raises(ValueError, match="reduce"):
        DaskBackend(reduce="nope")


def _count_round_trips(monkeypatch, client):
    """Counters of the client's graph submissions (`Client.get`) and of actor calls."""
    from kmeans_xp_backends.dask.actors import ActorEngine
    counts = {"graphs": 0, "actor_calls": 0}
    get, call = type(client).get, ActorEngine.call

    def counted_get(self, *args, **kwargs):
        counts["graphs"] += 1
        return get(self, *args, **kwargs)

    def counted_call(self, *args, **kwargs):
        counts["actor_calls"] += 1
        return call(self, *args, **kwargs)

    monkeypatch.setattr(type(client), "get", counted_get)
    monkeypatch.setattr(ActorEngine, "call", counted_call)
    return counts


@pytest.mark.parametrize("engine", ["graph", "actors"])
def test_one_round_trip_per_iteration(client, monkeypatch, engine):
    """The driver's loop costs one graph (graph engine) or one call to the actors (actors
    engine) per iteration, and one more each for the final assignment and the inertia:
    the statistics come with the sums, nothing O(n) comes to the client."""
    import kmeans_xp.estimators.kmeans as est
    X, init, w = _problem(np.float64, n=400)
    seen = {}
    loop = est.kmeans_single_lloyd

    def watched(backend, *args, **kwargs):
        counts = _count_round_trips(monkeypatch, client)
        result = loop(backend, *args, **kwargs)
        seen.update(counts, n_iter=result.n_iter)
        monkeypatch.undo()
        return result

    monkeypatch.setattr(est, "kmeans_single_lloyd", watched)
    KMeans(8, init=init, backend="dask", max_iter=2, tol=0,
           backend_options={"engine": engine}).fit(da.from_array(X, chunks=(150, 3)),
                                                   sample_weight=w)
    if engine == "graph":
        assert seen == {"graphs": 2 + 2, "actor_calls": 0, "n_iter": 2}
    else:
        assert seen == {"graphs": 0, "actor_calls": 2 + 2, "n_iter": 2}


# -- both engines, many cases -------------------------------------------------------------------
def _fit_both(X, init, w, chunks, **params):
    fits = {}
    for engine in ("graph", "actors"):
        fits[engine] = KMeans(init.shape[0], init=init, backend="dask", n_init=1, **params,
                              backend_options={"engine": engine}).fit(
            da.from_array(X, chunks=chunks), sample_weight=w)
    return fits["graph"], fits["actors"]


def _same_fit(got, ref, dtype):
    np.testing.assert_array_equal(np.asarray(got.labels_.compute()), ref.labels_)
    assert got.n_iter_ == ref.n_iter_
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=rtol * 10,
                               atol=rtol * 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("far_center", [False, True], ids=["plain", "empty-cluster"])
def test_actors_engine_matches_graph_and_numpy(client, dtype, far_center):
    """engine='actors' == engine='graph' (bit for bit) == the numpy backend, from the same
    init, on uneven blocks (the last one short); with a far init center, a cluster is empty
    and relocated (the farthest points found block by block)."""
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
    np.testing.assert_array_equal(a.cluster_centers_, g.cluster_centers_)
    assert a.n_iter_ == g.n_iter_ == ref.n_iter_
    assert a.inertia_ == g.inertia_
    assert a.history_ == g.history_
    _same_fit(a, ref, dtype)
    np.testing.assert_array_equal(a.predict(da.from_array(X, chunks=(150, 3))).compute(),
                                  ref.labels_)


@pytest.mark.parametrize("k", [1, 2, 37, 300])
@pytest.mark.parametrize("weights", ["zeros", "none"])
def test_many_clusters_and_unit_weights(client, k, weights):
    """k from 1 to 300 (more clusters than the rows of a block), weights with zeros or None
    (unit weights: no n-sized array is made on the client), float32, tol > 0: both engines
    give the numpy backend's fit."""
    X, _, w = _problem(np.float32, n=997, k=max(k // 4, 1), seed=k)
    init = X[np.random.default_rng(k).choice(len(X), k, replace=False)]
    w = w if weights == "zeros" else None
    ref = KMeans(k, init=init, backend="numpy", max_iter=25, tol=1e-4).fit(X, sample_weight=w)
    g, a = _fit_both(X, init, w, (260, 3), max_iter=25, tol=1e-4)
    for got in (g, a):
        _same_fit(got, ref, np.float32)
    np.testing.assert_array_equal(a.cluster_centers_, g.cluster_centers_)


def test_relocation_empty_clusters_both_engines(client):
    """Several clusters empty at once (duplicated init centers, a far one), zero weights
    among the farthest points: the same relocation as the numpy backend's."""
    X, init, w = _problem(np.float64, n=500, k=10)
    init = np.concatenate([init[:6], init[:2], init[6:7] + 1e3, init[7:8]])
    far = np.argsort(-np.sum((X - X.mean(0)) ** 2, axis=1))[:3]
    w[far] = 0  # the farthest points weigh nothing: never taken
    ref = KMeans(10, init=init, backend="numpy", max_iter=20, tol=0).fit(X, sample_weight=w)
    for got in _fit_both(X, init, w, (90, 3), max_iter=20, tol=0):
        _same_fit(got, ref, np.float64)


def test_primitives_match_numpy_defaults(client):
    """inertia and farthest, block by block on both engines, against the contract's
    defaults on NumPy (the numpy backend): zero weights excluded, ties to the lower index."""
    import array_api_compat.numpy as anp
    from kmeans_xp_backends.numpy.backend import NumpyBackend
    X, init, w = _problem(np.float64, n=300)
    numpy = NumpyBackend()
    far = numpy.farthest(X, w, init, numpy.assign(X, init, xp=anp).labels, 1, xp=anp)
    top = int(far.index[0])
    X[10 if top > 150 else 290] = X[top]  # the farthest point twice, in two blocks: a tie
    w[10 if top > 150 else 290] = 1.0
    labels = numpy.assign(X, init, xp=anp).labels
    ref_far = numpy.farthest(X, w, init, labels, 7, xp=anp)
    ref_in = numpy.inertia(X, w, init, labels, xp=anp)
    for engine in ("graph", "actors"):
        backend = DaskBackend(engine=engine)
        Xd, wd, xp = _fitted_blocks(backend, da.from_array(X, chunks=(70, 3)), w)
        it = backend.lloyd_iter(Xd, wd, init, None, xp=xp)
        np.testing.assert_array_equal(it.labels.compute(), labels)
        assert float(backend.inertia(Xd, wd, init, it.labels, xp=xp)) == pytest.approx(
            float(ref_in), rel=1e-12)
        far = backend.farthest(Xd, wd, init, it.labels, 7, xp=xp)
        assert far.sq_dist[0] == far.sq_dist[1] and far.index[0] < far.index[1]
        for a, b in zip(far, ref_far):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        backend.placement.finish()


def test_actors_engine_strict_convergence_and_n_init(client):
    """Strict convergence; n_init > 1: the best run's labels (an earlier run's) are still
    there at the end."""
    X, init, _ = _problem(np.float64, n=300)
    ref = KMeans(8, init=init, backend="numpy", max_iter=100).fit(X)
    got = KMeans(8, init=init, backend="dask", max_iter=100,
                 backend_options={"engine": "actors"}).fit(da.from_array(X, chunks=(70, 3)))
    assert got.n_iter_ == ref.n_iter_ < 100
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    ref = KMeans(8, init="random", n_init=4, random_state=2, backend="numpy").fit(X)
    got = KMeans(8, init="random", n_init=4, random_state=2, backend="dask",
                 backend_options={"engine": "actors"}).fit(da.from_array(X, chunks=(70, 3)))
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)


def test_actors_engine_lloyd_iter(client):
    """lloyd_iter with engine='actors': one actor per worker holding its blocks; the same
    labels and (bit for bit) statistics as the graph engine, for several iterations in a row,
    each against its last labels; assign too; timings per block."""
    X, init, w = _problem(np.float64, n=500)
    graph = DaskBackend(engine="graph", reduce="client")
    actors = DaskBackend(engine="actors", timings=True)
    Xd, wd, xp = _fitted_blocks(graph, da.from_array(X, chunks=(120, 3)), w)
    centers = init
    last = {"graph": None, "actors": None}
    for _ in range(3):
        ig = graph.lloyd_iter(Xd, wd, centers, last["graph"], xp=xp)
        ia = actors.lloyd_iter(Xd, wd, centers, last["actors"], xp=xp)
        _same_stats(ia, ig, exact=True)
        np.testing.assert_array_equal(ia.labels.compute(), ig.labels.compute())
        last = {"graph": ig.labels, "actors": ia.labels}
        centers = ig.weighted_sums / np.maximum(ig.weight_in_clusters, 1e-300)[:, None]
    state = actors.actors.state
    # one actor per worker that holds blocks (the scheduler may have put them all on one)
    assert 1 <= len(state["actors"]) <= len(client.scheduler_info()["workers"])
    assert len({a["address"] for a in state["actors"]}) == len(state["actors"])
    assert sorted(i for a in state["actors"] for i in a["indices"]) == list(range(5))
    t = actors.last_iter_timings
    assert t["engine"] == "actors" and len(t["block_times"]) == 5
    aa, ag = actors.assign(Xd, centers, xp=xp), graph.assign(Xd, centers, xp=xp)
    np.testing.assert_array_equal(aa.labels.compute(), ag.labels.compute())
    np.testing.assert_array_equal(aa.min_sq_dist.compute(), ag.min_sq_dist.compute())
    actors.placement.finish()
    assert actors.actors.state is None


def test_actors_engine_label_blocks_anywhere_and_lifetime(client):
    """A label block asked for on a worker without the actor comes over the network, the same;
    the actors drop a call's labels once the client holds no array of them (told with the
    next call), and asking for them then raises a clear error."""
    import gc

    from kmeans_xp_backends.dask.actors import actor_output
    X, init, w = _problem(np.float64, n=300)
    actors = DaskBackend(engine="actors")
    Xd, wd, xp = _fitted_blocks(actors, da.from_array(X, chunks=(100, 3)), w)
    first = actors.lloyd_iter(Xd, wd, init, None, xp=xp)
    state = actors.actors.state
    workers = sorted(client.scheduler_info()["workers"])
    a = next(a for a in state["actors"] if a["indices"])
    other = next(wk for wk in workers if wk != a["address"])
    gen = int(first.labels.name.split("-")[3])
    here = client.submit(actor_output, a["key"], a["address"], gen, 0, 0,
                         workers=[a["address"]], pure=False).result()
    away = client.submit(actor_output, a["key"], a["address"], gen, 0, 0, workers=[other],
                         allow_other_workers=False, pure=False).result()
    np.testing.assert_array_equal(here, away)
    assert away.dtype == np.int32 and len(away) == 100
    kept = actors.lloyd_iter(Xd, wd, init, first.labels, xp=xp)  # still held: still there
    assert float(kept.n_changed) == 0
    np.testing.assert_array_equal(first.labels.compute(), kept.labels.compute())
    del first
    gc.collect()
    actors.lloyd_iter(Xd, wd, init, kept.labels, xp=xp)  # tells the actors
    with pytest.raises(RuntimeError, match="gone from the actor"):
        client.submit(actor_output, a["key"], a["address"], gen, 0, 0,
                      workers=[a["address"]], pure=False).result()
    actors.placement.finish()


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
    with dask.config.set(scheduler="threads"):  # the client exists, dask does not use it
        assert not backend.uses_actors()
    assert not DaskBackend(engine="graph").uses_actors()
    assert not hasattr(backend, "kmeans_single")  # the driver's loop is the only one


def test_actors_engine_options(local_scheduler, monkeypatch):
    from kmeans_xp_backends.dask import cluster
    monkeypatch.setattr(cluster, "current_client", lambda: None)
    with pytest.raises(ValueError, match="engine"):
        DaskBackend(engine="nope")
    X, init, _ = _problem(np.float64, n=100)
    with pytest.raises(RuntimeError, match="distributed"):
        KMeans(8, init=init, backend="dask", backend_options={"engine": "actors"}).fit(
            da.from_array(X, chunks=(50, 3)))


@pytest.mark.parametrize("chunks", [(1000, 3), (333, 3), (7, 3)])
def test_mean_is_the_numpy_backends_whatever_the_chunks(local_scheduler, chunks):
    """X's mean is its float64 sum in row order, as NumPy sums X in one piece: bit for bit
    whatever the chunks (the near ties of a fit follow its last bit), and the tolerance
    matches the driver's definition."""
    import array_api_compat.numpy as anp

    from kmeans_xp.contract.chunks import feature_mean, tolerance
    X = asymmetric_data(1000, 3, 5, dtype=np.float64, seed=4) + 1e6  # a large offset
    backend = DaskBackend()
    Xd = backend.placement.to_backend(da.from_array(X, chunks=chunks))
    mean, tol = backend.placement.feature_stats(Xd, 1e-4, xp=backend.placement.namespace(Xd))
    want = feature_mean(X, anp)
    assert isinstance(mean, np.ndarray) and mean.dtype == X.dtype
    np.testing.assert_array_equal(mean, want)
    assert tol == pytest.approx(tolerance(X, want, 1e-4, anp, X.shape[0]), rel=1e-9)


def test_copy_x_false_computes_on_x_as_persisted(local_scheduler):
    """copy_x=False: no centered copy of X (the fit runs on X as given), the numpy
    backend's answer with copy_x=False."""
    X, init, w = _problem(np.float64, n=300)
    ref = KMeans(8, init=init, backend="numpy", max_iter=20, copy_x=False).fit(X.copy(),
                                                                              sample_weight=w)
    backend = DaskBackend()
    Xd = backend.placement.to_backend(da.from_array(X, chunks=(100, 3)))
    assert backend.placement.center(Xd, np.zeros(3), xp=None) is Xd
    got = KMeans(8, init=init, backend="dask", max_iter=20, copy_x=False).fit(
        da.from_array(X, chunks=(100, 3)), sample_weight=w)
    _same_fit(got, ref, np.float64)
