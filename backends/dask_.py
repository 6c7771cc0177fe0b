"""The `dask` backend: X as a dask array (NumPy or CuPy blocks), exact Lloyd across blocks,
workers and machines.

Every iteration computes each row block's labels, squared distances and per-cluster partial
sums with the best local backend for the block (the numpy backend on NumPy blocks;
cupy-fused, else cupy-chunked, else cupy-kernels on CuPy blocks); labels and distances stay
on the workers, and only the (k, d) partial sums come back to the client, which updates the
small centers with the driver's rules (`kmeans_xp.lloyd`). Two engines carry an iteration:
"graph" (here: one dask graph per iteration, sums added in a tree `split_every` at a time)
and "actors" (`_dask_actors`: one dask Actor per worker, one message each way per worker and
iteration), the default on a distributed cluster. X is validated (NaN/inf) and persisted
once, in `to_backend`.

The scheduler is dask's current one: the active `distributed.Client` when there is one
(`LocalCluster`, dask-cuda's `LocalCUDACluster`, any scheduler address), else the local
threaded scheduler. `backend_options={"scheduler": "tcp://host:8786"}` connects to (and makes
current) a client for that address.
"""
from __future__ import annotations

import itertools
import sys
import threading
import time
import uuid

import numpy as np

from kmeans_xp.namespaces import namespace_name, to_numpy
from kmeans_xp.backend import AssignResult, IterResult, KMeansBackend, ReduceResult
from kmeans_xp.memory import MemoryEstimate

from ._dask_actors import ActorEngine

#: partial sums added this many at a time in the reduction tree
SPLIT_EVERY = 8
#: local backends tried, in order, on CuPy blocks
CUPY_BLOCK_BACKENDS = ("cupy-fused", "cupy-chunked", "cupy-kernels")
#: on a distributed cluster, per-block partial sums up to this many bytes in all are gathered
#: to the client and added there (one hop less than a reduction task); more: a tree of tasks
CLIENT_REDUCE_BYTES = 64 << 20

_ids = itertools.count()

_clients = {}


# -- what a block is -------------------------------------------------------------------------
def block_kind(X) -> str:
    """'numpy', 'cupy' or the module of the blocks, read from the dask array's meta (no
    compute)."""
    meta = getattr(X, "_meta", None)
    if isinstance(meta, np.ndarray):
        return "numpy"
    return type(meta).__module__.split(".")[0]


def _cupy():
    import cupy
    return cupy


def _like_block(a, kind):
    """Small host/device array `a` as the block library's array."""
    if kind == "cupy":
        return _cupy().asarray(a)
    return to_numpy(a)


# -- per-block work (runs on the workers; module level so it pickles) ------------------------
_local = threading.local()


def _local_backend(kind, name, max_memory):
    """The backend that computes one block on this worker thread, cached per thread (CuPy
    backends keep chunk buffers and compiled kernels between iterations)."""
    cache = getattr(_local, "cache", None)
    if cache is None:
        cache = _local.cache = {}
    key = (kind, name, max_memory)
    backend = cache.get(key)
    if backend is None:
        if name is None:
            name = "numpy" if kind == "numpy" else _first_cupy_backend()
        from kmeans_xp.registry import get_backend
        cls = get_backend(name)
        backend = cls(max_memory=max_memory, n_threads=1) if name == "numpy" else cls(
            max_memory=max_memory)
        cache[key] = backend
    return backend


def _first_cupy_backend():
    from kmeans_xp.registry import available_backends
    have = available_backends()
    for name in CUPY_BLOCK_BACKENDS:
        if name in have:
            return name
    raise RuntimeError(f"X has CuPy blocks but no CuPy backend is available on this worker "
                       f"(tried {list(CUPY_BLOCK_BACKENDS)}; installed: {have}). Install "
                       f"kmeans_xp[cuda12] (or [cuda13]) on the workers.")


def _block_xp(xb):
    from array_api_compat import array_namespace
    return array_namespace(xb)


def _host64(a):
    return np.asarray(to_numpy(a), dtype=np.float64)


def _assign_block(xb, centers, kind, name, max_memory):
    return _iter_block(xb, None, centers, kind, name, max_memory, update=False)


def _sync_device(kind):
    if kind == "cupy":
        _cupy().cuda.Device().synchronize()


def _worker_name():
    try:
        from distributed import get_worker
        return get_worker().address
    except Exception:  # not on a distributed worker (local scheduler)
        return threading.current_thread().name


def block_step(xb, wb, centers, kind, name, max_memory, update=True, timed=False):
    """(IterResult, timing or None) of one row block on its local backend, where the block
    lives; labels int64 and distances in X's dtype, the sums left where the backend made
    them. With `timed`, the device is synchronised before and after and the block's own
    wall time (start/stop on this host's clock, seconds inside) comes back as a small dict."""
    if timed:
        _sync_device(kind)
        start, t0 = time.time(), time.perf_counter()
    backend = _local_backend(kind, name, max_memory)
    xp = _block_xp(xb)
    c = _like_block(centers, kind)
    if c.dtype != xb.dtype:
        c = c.astype(xb.dtype)
    if kind == "cupy" and wb is not None:
        wb = _like_block(wb, kind)  # no copy for CuPy blocks (the backend persists them so)
    it = backend.lloyd_iter(xb, wb, c, xp=xp, update_centers=update)
    labels = it.labels if it.labels.dtype == np.int64 else it.labels.astype(np.int64)
    mins = it.min_sq_dist if it.min_sq_dist.dtype == xb.dtype else it.min_sq_dist.astype(
        xb.dtype)
    info = None
    if timed:
        _sync_device(kind)
        info = {"worker": _worker_name(), "rows": int(xb.shape[0]), "start": start,
                "stop": time.time(), "seconds": time.perf_counter() - t0,
                "labels_cast": it.labels.dtype != np.int64,
                "weights_type": None if wb is None else type(wb).__module__.split(".")[0]}
    return it._replace(labels=labels, min_sq_dist=mins), info


def _iter_block(xb, wb, centers, kind, name, max_memory, update=True, timed=False):
    """(labels, min_sq_dist, sums or None, weights or None, timing or None) of one row block
    (a graph task); the partial sums come back as float64 NumPy (they are k x d, and cross
    workers)."""
    it, info = block_step(xb, wb, centers, kind, name, max_memory, update, timed)
    sums = weights = None
    if update:
        sums, weights = _host64(it.weighted_sums), _host64(it.weight_in_clusters)
    return it.labels, it.min_sq_dist, sums, weights, info


def block_meta(kind, dtype):
    """An empty 1-D block of the blocks' library (a dask array's meta)."""
    return _cupy().empty((0,), dtype=dtype) if kind == "cupy" else np.empty((0,), dtype=dtype)


def _reduce_block(xb, lb, wb, k, kind, name, max_memory):
    backend = _local_backend(kind, name, max_memory)
    xp = _block_xp(xb)
    if kind == "cupy":
        lb, wb = _like_block(lb, kind), _like_block(wb, kind)
    sums, weights = backend.reduce(xb, lb, wb, k, xp=xp)
    return _host64(sums), _host64(weights)


def _partial(out):
    """The (sums, weights, timing) of a block's output, taken where the block lives, so only
    k x d numbers leave the worker."""
    return out[2], out[3], out[4]


def add_parts(parts):
    """(sums, weights) of a list of (sums, weights[, ...]) in list order."""
    sums = parts[0][0].copy()
    weights = parts[0][1].copy()
    for p in parts[1:]:
        sums += p[0]
        weights += p[1]
    return sums, weights


def _second(xb, ab):
    """`ab`, computed where X's block `xb` lives (places a per-sample block next to X's)."""
    return ab


def _check_finite_block(xb):
    """The block, after the core's NaN/inf check (its error message, raised on the worker
    and re-raised on the client)."""
    from kmeans_xp.validation import check_finite
    check_finite(xb, _block_xp(xb), "X")
    return xb


def _finite_flag(xb):
    _check_finite_block(xb)
    return np.ones((1, 1), dtype=bool)


def _is_materialized(X) -> bool:
    """Whether X's graph holds just its blocks (persisted, or small in-memory data): nothing
    to compute, so persisting again would only copy it."""
    from dask.core import istask
    graph = dict(X.__dask_graph__())
    if len(graph) != X.npartitions:
        return False
    for value in graph.values():
        if istask(value) or type(value).__module__.startswith("dask"):
            return False  # a task (or an alias): something still to compute
    return True  # arrays in the graph (local) or futures (distributed)


def _row_keys(a):
    """The keys of a dask array's row blocks, in order (its first column block for 2-D)."""
    keys = a.__dask_keys__()
    return [k[0] if isinstance(k, list) else k for k in keys]


def block_futures(client, a):
    """The futures of `a`'s row blocks in order when `a` is persisted on this client (its
    graph holds just them), else None."""
    from distributed import Future
    graph = dict(a.__dask_graph__())
    out = []
    for key in _row_keys(a):
        f = graph.get(key)
        if not isinstance(f, Future) or f.client is not client:
            return None
        out.append(f)
    if len(graph) != len(out):
        return None
    return out


def _tree_layer(layer, keys, prefix, split_every):
    """Add to `layer` the tasks adding the (sums, weights) at `keys`, `split_every` at a time
    level by level (at least one level); return the key of the total."""
    depth = 0
    while True:
        keys_next = []
        for j, start in enumerate(range(0, len(keys), split_every)):
            key = (prefix, depth, j)
            layer[key] = (add_parts, list(keys[start:start + split_every]))
            keys_next.append(key)
        keys, depth = keys_next, depth + 1
        if len(keys) == 1:
            return keys[0]


# -- the namespace the driver uses -----------------------------------------------------------
class DaskNamespace:
    """The namespace the driver uses on a dask X: dask for per-sample arrays, the blocks'
    own library (NumPy or CuPy, through array-api-compat) for small ones.

    - An array whose leading dimension is n_samples is a dask array chunked like X's rows,
      so sample weights, distances and labels line up block for block; a constant one (unit
      sample weights) is created on the workers instead of shipped from the client.
    - Anything else (centers, sums, the mean, k-means++ candidates) is an ordinary NumPy or
      CuPy array on the client: a function given no dask array runs eagerly there, so the
      driver's per-iteration work on k x d arrays costs no scheduler round trip; a function
      given a dask array runs in dask, with the small arrays lifted into one-block arrays.
    """

    def __init__(self, base, n_samples, row_chunks, kind):
        self._base = base                     # array-api-compat's dask namespace
        self._eager = _eager_namespace(kind)  # array-api-compat's numpy or cupy namespace
        self._n = int(n_samples)
        self._row_chunks = tuple(row_chunks)
        self._kind = kind
        self.__name__ = base.__name__  # array-api-compat's is_dask_namespace() checks this

    def __repr__(self):
        return f"<kmeans_xp DaskNamespace: dask per sample, {self._kind} for small arrays>"

    # -- dispatch -------------------------------------------------------------------------
    def __getattr__(self, name):
        attr = getattr(self._base, name)
        if not callable(attr) or isinstance(attr, type) or name.startswith("_"):
            return attr  # dtypes, constants, classes

        def dispatch(*args, **kwargs):
            if _has_dask(args) or _has_dask(kwargs.values()):
                args = [self._lift_any(a) for a in args]
                kwargs = {k: self._lift_any(v) for k, v in kwargs.items()}
                kwargs.pop("device", None)
                return attr(*args, **kwargs)
            if "device" in kwargs:
                kwargs["device"] = None
            return getattr(self._eager, name)(*args, **kwargs)

        dispatch.__name__ = name
        return dispatch

    def _per_sample(self, shape):
        return len(shape) >= 1 and shape[0] == self._n

    def _chunks(self, shape):
        return (self._row_chunks,) + tuple((s,) for s in shape[1:])

    def _lift(self, a):
        """A NumPy/CuPy array as a dask array (one block, or X's row blocks if per-sample)."""
        import dask.array as da
        shape = tuple(a.shape)
        return da.from_array(a, chunks=self._chunks(shape) if self._per_sample(shape)
                             else (shape or ()), asarray=False)

    def _lift_any(self, v):
        if isinstance(v, (list, tuple)):
            return type(v)(self._lift_any(x) for x in v)
        if _is_eager_array(v):
            return self._lift(v)
        return v

    def _blocks(self, arr):
        if self._kind == "cupy" and block_kind(arr) == "numpy":
            cp = _cupy()
            return arr.map_blocks(cp.asarray, dtype=arr.dtype,
                                  meta=cp.empty((0,) * arr.ndim, dtype=arr.dtype))
        return arr

    # -- creation: per-sample arrays are dask, chunked like X --------------------------------
    def asarray(self, obj, /, *, dtype=None, device=None, copy=None):
        import dask.array as da
        if isinstance(obj, da.Array):
            if not self._per_sample(obj.shape):
                return self._eager.asarray(to_numpy(obj) if self._kind == "numpy"
                                           else obj.compute(), dtype=dtype)
            out = self._base.asarray(obj, dtype=dtype, copy=copy)
            if out.chunks[0] != self._row_chunks:
                out = out.rechunk({0: self._row_chunks})
            return self._blocks(out)
        shape = getattr(obj, "shape", None)
        if shape is None:
            obj = np.asarray(obj)
            shape = obj.shape
        if not self._per_sample(shape):
            return self._eager.asarray(obj, dtype=dtype, copy=copy)
        host = np.asarray(to_numpy(obj) if namespace_name(obj) != "list" else obj, dtype=dtype)
        if host.ndim == 1 and self._n > 1 and host[0] == host[-1] and np.all(host == host[0]):
            out = da.full(host.shape, host[0], dtype=host.dtype, chunks=self._chunks(host.shape))
        else:
            out = da.from_array(host, chunks=self._chunks(host.shape))
        return self._blocks(out)

    def _create(self, fname, shape, *args, dtype=None):
        import dask.array as da
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if not self._per_sample(shape):
            return getattr(self._eager, fname)(shape, *args, dtype=dtype)
        return self._blocks(getattr(da, fname)(shape, *args, dtype=dtype,
                                               chunks=self._chunks(shape)))

    def zeros(self, shape, *, dtype=None, device=None):
        return self._create("zeros", shape, dtype=dtype)

    def ones(self, shape, *, dtype=None, device=None):
        return self._create("ones", shape, dtype=dtype)

    def empty(self, shape, *, dtype=None, device=None):
        return self._create("empty", shape, dtype=dtype)

    def full(self, shape, fill_value, *, dtype=None, device=None):
        return self._create("full", shape, fill_value, dtype=dtype)


def _eager_namespace(kind):
    if kind == "cupy":
        import array_api_compat.cupy as xp
    else:
        import array_api_compat.numpy as xp
    return xp


def _is_eager_array(v):
    return isinstance(v, np.ndarray) or (
        "cupy" in sys.modules and isinstance(v, sys.modules["cupy"].ndarray))


def _has_dask(values):
    import dask.array as da
    for v in values:
        if isinstance(v, da.Array):
            return True
        if isinstance(v, (list, tuple)) and _has_dask(v):
            return True
    return False


# -- the backend -----------------------------------------------------------------------------
class DaskBackend(KMeansBackend):
    """Exact Lloyd on a dask array with NumPy or CuPy blocks, on dask's current scheduler.

    backend_options:
      scheduler      a distributed scheduler address ("tcp://host:8786"); default: the
                     current distributed Client if there is one, else dask's local
                     (threaded) scheduler.
      block_backend  the backend that computes each block (default: "numpy" for NumPy blocks,
                     the first of cupy-fused, cupy-chunked, cupy-kernels for CuPy blocks).
      split_every    partial sums added per task in the reduction tree (default 8).
      reduce         on a distributed cluster: "auto" (default: the client adds the blocks'
                     partial sums when they are CLIENT_REDUCE_BYTES or less in all, else a
                     tree of tasks on the workers), "client" or "tree".
      direct_gather  the client fetches the partial sums straight from the workers (default
                     True; False: through the scheduler, for clients that cannot reach the
                     workers).
      timings        record per-iteration timings in `last_iter_timings` (worker-side block
                     times with a device sync, client-side phases); default False.
      engine         "auto" (default): "actors" on a distributed cluster, "graph" on dask's
                     local scheduler.
                     "graph": each iteration is a task graph sent to the scheduler.
                     "actors": on a distributed cluster, one dask Actor per worker holds the
                     worker's blocks of X and of the weights (created once per fit, after
                     they are persisted); an iteration is one client -> worker message per
                     worker (through the scheduler only with direct_gather=False), with no
                     task graph. See `_dask_actors`. Same blocks, same local
                     backend, partial sums added on the client in block order: the same
                     labels and sums as "graph". Labels stay in the actors; the fit loop
                     (`kmeans_single`) asks them only for the number of changed labels, and
                     fetches labels as a dask array only when a cluster is empty and at the
                     end. A lazy X (the fit's centered X) is persisted once for the actors.
    max_memory applies to each block's local backend (per worker thread).

    With the graph engine on a distributed cluster each iteration is one small task graph
    sent once (a task per
    block, and one per block that takes its k x d partial sums), built on the futures of the
    persisted X and weights; labels and distances stay on the workers as the blocks' results.
    """

    name = "dask"
    namespaces = frozenset({"dask.array"})
    device = "any"

    def __init__(self, max_memory="auto", scheduler=None, block_backend=None,
                 split_every=SPLIT_EVERY, reduce="auto", direct_gather=True, timings=False,
                 engine="auto"):
        super().__init__(max_memory)
        if engine not in ("auto", "graph", "actors"):
            raise ValueError(f"engine must be 'auto', 'graph' or 'actors', got {engine!r}")
        self.engine = engine
        self._actors = ActorEngine(self)
        if reduce not in ("auto", "client", "tree"):
            raise ValueError(f"reduce must be 'auto', 'client' or 'tree', got {reduce!r}")
        self.reduce_mode = reduce
        self.direct_gather = bool(direct_gather)
        self.timings = bool(timings)
        self.last_iter_timings = None
        self._inflight = None  # the previous iteration's futures, released after the next submit
        if isinstance(split_every, bool) or not isinstance(split_every, int) or split_every < 2:
            raise ValueError(f"split_every must be an int >= 2, got {split_every!r}")
        if block_backend is not None and not isinstance(block_backend, str):
            raise TypeError(f"block_backend must be a backend name, got {block_backend!r}")
        self.scheduler = scheduler
        self.block_backend = block_backend
        self.split_every = split_every
        self._client = self._connect(scheduler) if scheduler is not None else None
        self._X = None
        self._aligned = None  # (source array, the same rechunked like X's rows, persisted)

    # -- scheduler ------------------------------------------------------------------------
    @staticmethod
    def _connect(scheduler):
        """A distributed Client for this address, made dask's default scheduler (so the
        driver's own computations run there too); one per address per process."""
        if not isinstance(scheduler, str):
            raise TypeError(f"backend_options['scheduler'] must be a scheduler address such "
                            f"as 'tcp://host:8786', got {scheduler!r}. To use a Client you "
                            f"created, just leave it current (the default): the backend "
                            f"uses the current client.")
        try:
            from distributed import Client
        except ImportError as exc:
            raise ImportError("backend_options={'scheduler': ...} needs dask.distributed: "
                              "pip install 'kmeans_xp[dask]'") from exc
        client = _clients.get(scheduler)
        if client is None or client.status not in ("running", "connecting"):
            client = _clients[scheduler] = Client(scheduler, set_as_default=True)
        return client

    def uses_actors(self) -> bool:
        """Whether iterations go to actors: engine "actors", or "auto" on a distributed
        cluster."""
        if self.engine == "auto":
            return self._client is not None or self._dask_uses_client()
        return self.engine == "actors"

    def _dask_uses_client(self) -> bool:
        """Whether dask computes on a distributed client now (not, say, inside
        `dask.config.set(scheduler="threads")` while a client exists)."""
        client = self.current_client()
        if client is None:
            return False
        from dask.base import get_scheduler
        return getattr(get_scheduler(), "__self__", None) is client

    @property
    def kmeans_single(self):
        """The actors engine's fit loop when iterations go to actors; else None (the
        driver's own loop, one graph per iteration)."""
        return self._actors.kmeans_single if self.uses_actors() else None

    @staticmethod
    def current_client():
        """The distributed Client dask computes on now, or None (local scheduler)."""
        if "distributed" not in sys.modules:
            return None  # no client can exist without distributed imported
        try:
            from distributed import default_client
            return default_client()
        except (ImportError, ValueError):
            return None

    def scheduler_info(self) -> str:
        client = self._client or self.current_client()
        if client is None:
            import dask
            return f"local dask scheduler ({dask.config.get('scheduler', 'threads')})"
        workers = client.scheduler_info().get("workers", {})
        return f"distributed scheduler {client.scheduler.address} with {len(workers)} workers"

    def _persist(self, *collections):
        import dask
        if self._client is not None:
            out = self._client.persist(list(collections))
            return tuple(out)
        return dask.persist(*collections)

    # -- capability -----------------------------------------------------------------------
    def reject_reason(self, X, *, n_clusters, sample_weight=None):
        ns = namespace_name(X)
        if ns in ("numpy", "list"):
            return None  # wrapped into a dask array by to_backend
        if ns != "dask.array":
            return (f"it computes on dask arrays, not {ns}; wrap X with "
                    f"dask.array.from_array(X, chunks=...)")
        if X.ndim != 2:
            return f"X must be 2-D, got {X.ndim}-D"
        if any(c != c for c in X.chunks[0]) or any(c != c for c in X.chunks[1]):
            return "X has unknown chunk sizes; call X.compute_chunk_sizes() first"
        kind = block_kind(X)
        if kind not in ("numpy", "cupy"):
            return f"its blocks are {kind} arrays; it computes on NumPy or CuPy blocks"
        return None

    def converts_from(self, namespace):
        return namespace in ("numpy", "list")

    # -- data movement --------------------------------------------------------------------
    def to_backend(self, X):
        """X as a dask array with whole rows per block, checked for NaN/inf block by block
        while it is persisted (once) on the workers."""
        import dask.array as da
        if not isinstance(X, da.Array):
            X = np.asarray(X) if namespace_name(X) == "list" else X
            X = da.from_array(X, chunks=("auto", -1))
        if X.numblocks[1] > 1:
            X = X.rechunk({1: -1})
        if _is_materialized(X) and self._in_place(X):
            # already in memory (persisted by the user): check it in place, no second copy
            X.map_blocks(_finite_flag, dtype=bool, chunks=((1,) * X.numblocks[0], (1,)),
                         meta=np.empty((0, 0), dtype=bool)).compute()
        else:
            X = X.map_blocks(_check_finite_block, dtype=X.dtype, meta=X._meta)
            (X,) = self._persist(X)
            self._wait(X)
        self._X = X
        return X

    def _in_place(self, X):
        """Whether X's blocks are where the tasks run: futures on a distributed cluster, or any
        in-memory blocks on the local scheduler. In-memory NumPy/CuPy blocks in the graph of a
        distributed computation would travel client -> scheduler -> workers every iteration;
        they are persisted (sent once) instead."""
        if (self._client or self.current_client()) is None:
            return True
        from distributed import Future
        return all(isinstance(v, Future) for v in dict(X.__dask_graph__()).values())

    def _wait(self, arr):
        """Block until `arr` is computed; re-raise a worker's error (e.g. NaN in X) here."""
        client = self._client or self.current_client()
        if client is None:
            return  # the local scheduler computed it in persist
        from distributed import futures_of, wait
        futures = futures_of(arr)
        wait(futures)
        for f in futures:
            if f.status == "error":
                f.result()  # raises the worker's exception

    def from_backend(self, arr, like):
        """Per-sample results (labels_, transform) stay dask arrays laid out like X; small
        ones (cluster_centers_) are computed. With non-dask input, everything is computed."""
        import dask.array as da
        if not isinstance(arr, da.Array):
            return arr
        if (isinstance(like, da.Array) and arr.ndim >= 1 and like.ndim >= 1
                and arr.shape[0] == like.shape[0] and arr.chunks[0] == like.chunks[0]):
            return arr
        out = arr.compute()
        return out if isinstance(like, da.Array) or namespace_name(like) == "cupy" \
            else to_numpy(out)

    def array_namespace(self, X):
        from array_api_compat import array_namespace
        base = array_namespace(X)
        return DaskNamespace(base, X.shape[0], X.chunks[0], block_kind(X))

    def persist(self, x):
        """Per-sample dask arrays: persisted on the workers, chunked like X's rows. Small
        ones (the mean, centers): computed to a NumPy/CuPy array on the client."""
        import dask.array as da
        if not isinstance(x, da.Array):
            return x
        if self._X is None or x.ndim == 0 or x.shape[0] != self._X.shape[0]:
            return x.compute()
        if x.chunks[0] != self._X.chunks[0]:
            x = x.rechunk({0: self._X.chunks[0]})
        (x,) = self._persist(self._colocated(x, self._X))
        return x

    def _colocated(self, a, X):
        """On a distributed cluster: `a` (per-sample, chunked like X's rows) with each block
        made by a task that depends on X's block, so it is computed (or, persisted, copied
        once) on the worker that holds X's block: the iteration's tasks then find both
        there and move no per-sample data. Unchanged on the local scheduler."""
        if ((self._client or self.current_client()) is None or a.chunks[0] != X.chunks[0]
                or a.ndim not in (1, 2) or (a.ndim == 2 and a.numblocks[1] != 1)):
            return a
        import dask.array as da
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph
        name = f"kmeans-colocated-{tokenize(a.name, X.name)}"
        layer = {((name, i) if a.ndim == 1 else (name, i, 0)): (_second, xk, ak)
                 for i, (xk, ak) in enumerate(zip(_row_keys(X), _row_keys(a)))}
        graph = HighLevelGraph.merge(
            HighLevelGraph({name: layer}, {name: set(X.__dask_layers__()) | set(
                a.__dask_layers__())}), X.__dask_graph__(), a.__dask_graph__())
        return da.Array(graph, name, chunks=a.chunks, dtype=a.dtype, meta=a._meta)

    def finish(self):
        """After a fit: drop this backend's handles on the persisted X and weights, so the
        workers can free them (labels_ stays, as the user holds it)."""
        self._X = None
        self._aligned = None
        self._inflight = None
        self._actors.reset()

    def driver_rows(self, n_samples, n_features, dtype) -> int:
        return max(int(n_samples), 1)  # dask chunks the driver's passes itself

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto", block_rows=None):
        """Cluster-wide bytes with the actors engine (the default on a cluster): X persisted,
        its centered copy (the actors hold X - mean persisted; the graph engine centers each
        block in every iteration instead), the labels and distances of the last KEEP calls,
        partial sums, and one block's working memory in its local (numpy) backend per worker
        thread."""
        from kmeans_xp_backends.numpy_ import NumpyBackend

        from ._dask_actors import KEEP
        rows = int(block_rows or min(n_samples, max(1, (128 << 20) // (n_features * itemsize))))
        blocks = -(-n_samples // rows)
        local = NumpyBackend.estimate_memory(rows, n_features, n_clusters, itemsize=itemsize,
                                             max_memory=max_memory, n_threads=1)
        parts = {"data": n_samples * n_features * itemsize,
                 "centered_copy": n_samples * n_features * itemsize,
                 "labels_and_distances": KEEP * n_samples * (8 + itemsize),
                 "partial_sums": blocks * n_clusters * (n_features + 1) * 8,
                 "block_working_memory": local.total}
        return MemoryEstimate(parts, sum(parts.values()), rows)

    # -- the heavy primitives -------------------------------------------------------------
    def _aligned_like(self, a, X):
        """`a` (n,) chunked like X's rows, in X's block library (CuPy weights for CuPy X: no
        host-to-device copy per iteration), persisted once: cached for the fit's sample
        weights, so every iteration reads the same blocks and recomputes nothing."""
        import dask.array as da
        if isinstance(a, da.Array) and a.chunks[0] == X.chunks[0] and \
                block_kind(a) == block_kind(X) and _is_materialized(a) and self._in_place(a):
            return a  # already persisted, laid out like X
        cached = self._aligned
        if cached is not None and cached[0] is a and cached[1].chunks[0] == X.chunks[0]:
            return cached[1]
        xp = self.array_namespace(X)
        aligned = xp.asarray(a)  # dask, rechunked like X's rows, CuPy blocks for CuPy X
        if aligned.chunks[0] != X.chunks[0]:
            aligned = aligned.rechunk({0: X.chunks[0]})
        (aligned,) = self._persist(self._colocated(aligned, X))
        self._wait(aligned)
        self._aligned = (a, aligned)
        return aligned

    @staticmethod
    def _host_centers(centers):
        import dask.array as da
        if isinstance(centers, da.Array):
            centers = centers.compute()  # small; persisted by the driver
        return np.ascontiguousarray(to_numpy(centers))

    @staticmethod
    def _whole_rows(X):
        return X.rechunk({1: -1}) if X.numblocks[1] > 1 else X

    def _graph(self, X, columns, task, args, *, outputs=(), reduce_from=None):
        """Build one graph over X's row blocks: `task(x_block, *column_blocks, *args)` per
        block; `outputs` = ((index in the task's result, dtype), ...) become (n,) dask arrays
        laid out like X's rows; `reduce_from` (an index of the (sums, weights) pair in the
        result, or "all") adds a tree reduction. Raw graph layers, not Delayed objects: graph
        building stays O(blocks) with no per-block tokenizing."""
        import operator

        import dask.array as da
        from dask.base import tokenize
        from dask.delayed import Delayed
        from dask.highlevelgraph import HighLevelGraph

        kind = block_kind(X)
        tok = tokenize(X.name, [c.name for c in columns], args, outputs, reduce_from,
                       self.split_every, kind)
        name = f"kmeans-{task.__name__.strip('_')}-{tok}"
        xkeys = [row[0] for row in X.__dask_keys__()]
        ckeys = [c.__dask_keys__() for c in columns]
        layer = {}
        for i, xk in enumerate(xkeys):
            layer[(name, i)] = (task, xk, *(ck[i] for ck in ckeys), *args)
        layers = {name: layer}
        deps = {name: set().union(*(c.__dask_layers__() for c in (X, *columns)))}
        arrays = []
        for j, (index, dtype) in enumerate(outputs):
            out = f"{name}-out{j}"
            layers[out] = {(out, i): (operator.getitem, (name, i), index)
                           for i in range(len(xkeys))}
            deps[out] = {name}
            arrays.append((out, dtype))
        total_key = None
        if reduce_from is not None:
            red = f"{name}-sum"
            red_layer = {}
            keys = [(name, i) for i in range(len(xkeys))]
            if reduce_from != "all":
                for i in range(len(xkeys)):
                    red_layer[(red + "-part", i)] = (_partial, (name, i))
                keys = [(red + "-part", i) for i in range(len(xkeys))]
            total_key = _tree_layer(red_layer, keys, red, self.split_every)
            layers[red] = red_layer
            deps[red] = {name}
        graph = HighLevelGraph.merge(HighLevelGraph(layers, deps), X.__dask_graph__(),
                                     *(c.__dask_graph__() for c in columns))
        meta = (lambda dt: _cupy().empty((0,), dtype=dt)) if kind == "cupy" else (
            lambda dt: np.empty((0,), dtype=dt))
        results = [da.Array(graph, out, chunks=(X.chunks[0],), dtype=dtype, meta=meta(dtype))
                   for out, dtype in arrays]
        if total_key is not None:
            results.append(Delayed(total_key, graph, layer=f"{name}-sum"))
        return results

    def _persist_all(self, *collections):
        import dask
        if self._client is not None:
            return tuple(self._client.persist(list(collections), optimize_graph=False))
        return dask.persist(*collections, optimize_graph=False)

    def lloyd_iter(self, X, sample_weight, centers, *, xp=None, update_centers=True):
        """Per-block labels, distances and partial sums (local backend); labels and distances
        stay on the workers, the k x d sums are added up and come back to the client."""
        X = self._whole_rows(X)
        kind = block_kind(X)
        centers = self._host_centers(centers)
        w = self._aligned_like(sample_weight, X) if update_centers else None
        client = self._client or self.current_client()
        if self.uses_actors() and (update_centers or self._actors.holds(X)):
            return self._actors.lloyd_iter(X, sample_weight, centers, update_centers, xp)
        if client is not None:
            xf = block_futures(client, X)
            wf = block_futures(client, w) if update_centers else [None] * len(xf or ())
            if xf is not None and wf is not None:
                return self._lloyd_iter_futures(client, X, xf, wf, centers, kind,
                                                update_centers, xp)
        args = (centers, kind, self.block_backend, self.max_memory)
        outputs = ((0, np.dtype(np.int64)), (1, X.dtype))
        if not update_centers:
            labels, min_sq = self._persist_all(*self._graph(
                X, [], _assign_block, args, outputs=outputs))
            return IterResult(labels, min_sq, None, None)
        labels, min_sq, total = self._persist_all(*self._graph(
            X, [w], _iter_block, args, outputs=outputs, reduce_from=2))
        sums, weights = total.compute()
        xp = xp or self.array_namespace(X)
        return IterResult(labels, min_sq, xp.asarray(sums), xp.asarray(weights))

    def _lloyd_iter_futures(self, client, X, xf, wf, centers, kind, update, xp):
        """One iteration on a distributed cluster: one graph, sent once, of a task per block
        on the futures of the persisted X and weights (each task runs where its blocks are)
        and, with `update`, a task per block taking its partial sums out of the block's
        result; the client gathers those (k x d each) and adds them in block order, or, when
        they are large, a tree of tasks adds them on the workers. The keys are new each call:
        an iteration whose centers repeat does not reuse keys the scheduler is releasing."""
        import operator

        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph
        from distributed import wait

        t0 = time.perf_counter()
        nb = len(xf)
        k, d = centers.shape
        name = f"kmeans-{'iter' if update else 'assign'}-{next(_ids)}-{uuid.uuid4().hex[:16]}"
        args = (centers, kind, self.block_backend, self.max_memory, update, self.timings)
        dsk = {(name, i): (_iter_block, xf[i], wf[i], *args) for i in range(nb)}
        block_keys = [(name, i) for i in range(nb)]
        want = list(block_keys)
        on_client = update and (self.reduce_mode == "client" or (
            self.reduce_mode == "auto" and nb * k * (d + 1) * 8 <= CLIENT_REDUCE_BYTES))
        if update:
            part_keys = [(name + "-part", i) for i in range(nb)]
            dsk.update({pk: (_partial, bk) for pk, bk in zip(part_keys, block_keys)})
            if on_client:
                want += part_keys
            else:
                want.append(_tree_layer(dsk, part_keys, name + "-sum", self.split_every))
        t1 = time.perf_counter()
        submitted_at = time.time()
        futures = client.get(dsk, want, sync=False)
        t2 = time.perf_counter()
        # release the previous iteration's futures only now: a release sent just before the
        # graph would hold the graph in the client's batched stream (10 ms interval)
        self._inflight = futures
        blocks = futures[:nb]
        outs = []
        for j, dtype in enumerate((np.dtype(np.int64), X.dtype)):
            out = f"{name}-out{j}"
            graph = HighLevelGraph(
                {name: dict(zip(block_keys, blocks)),
                 out: {(out, i): (operator.getitem, bk, j) for i, bk in enumerate(block_keys)}},
                {name: set(), out: {name}})
            outs.append(da.Array(graph, out, chunks=(X.chunks[0],), dtype=dtype,
                                 meta=block_meta(kind, dtype)))
        labels, min_sq = outs
        if not update:
            return IterResult(labels, min_sq, None, None)
        rest = futures[nb:]
        wait(rest)
        t3 = time.perf_counter()
        received_at = time.time()
        got = client.gather(rest, direct=self.direct_gather or None)
        t4 = time.perf_counter()
        sums, weights = add_parts(got)
        t5 = time.perf_counter()
        if self.timings:
            self.last_iter_timings = {
                "blocks": nb, "reduce": "client" if on_client else "tree",
                "build_s": t1 - t0, "submit_s": t2 - t1, "wait_s": t3 - t2,
                "gather_s": t4 - t3, "add_s": t5 - t4, "total_s": t5 - t0,
                "submitted_at": submitted_at, "received_at": received_at,
                "block_times": [p[2] for p in got] if on_client else []}
        xp = xp or self.array_namespace(X)
        return IterResult(labels, min_sq, xp.asarray(sums), xp.asarray(weights))

    def assign(self, X, centers, *, xp=None):
        it = self.lloyd_iter(X, None, centers, xp=xp, update_centers=False)
        return AssignResult(it.labels, it.min_sq_dist)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        X = self._whole_rows(X)
        w = self._aligned_like(sample_weight, X)
        lab = self._aligned_like(labels, X)
        (total,) = self._graph(X, [lab, w], _reduce_block,
                               (int(n_clusters), block_kind(X), self.block_backend,
                                self.max_memory), reduce_from="all")
        sums, weights = total.compute(optimize_graph=False)
        xp = xp or self.array_namespace(X)
        return ReduceResult(xp.asarray(sums), xp.asarray(weights))
