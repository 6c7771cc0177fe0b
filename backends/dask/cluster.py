"""The client side of the dask backend's plumbing: which scheduler computes, persisting arrays
where their blocks will be used, and the futures behind persisted arrays.

`Cluster` is the one object the placement and both engines share; it holds no array of a fit
except the caches `finish` drops (X persisted for the engines, the weights laid out like X).
"""
from __future__ import annotations

import sys
from typing import NamedTuple

from .blocks import block_kind, empty_rows, same, second

_clients = {}  # scheduler address -> Client, one per address per process


def current_client():
    """The distributed Client dask computes on now, or None (local scheduler)."""
    if "distributed" not in sys.modules:
        return None  # no client can exist without distributed imported
    try:
        from distributed import default_client
        return default_client()
    except (ImportError, ValueError):
        return None


def connect(address):
    """A distributed Client for this address, made dask's default scheduler (so the driver's
    own computations run there too); one per address per process."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise ImportError("backend_options={'scheduler': ...} needs dask.distributed: "
                          "pip install 'kmeans_xp[dask]'") from exc
    client = _clients.get(address)
    if client is None or client.status not in ("running", "connecting"):
        client = _clients[address] = Client(address, set_as_default=True)
    return client


def close_clients():
    """Close the clients `connect` opened (tests, and programs that are done)."""
    for c in list(_clients.values()):
        c.close()
    _clients.clear()


def row_keys(a):
    """The keys of a dask array's row blocks, in order (its first column block for 2-D)."""
    return [k[0] if isinstance(k, list) else k for k in a.__dask_keys__()]


def whole_rows(X):
    return X.rechunk({1: -1}) if X.ndim == 2 and X.numblocks[1] > 1 else X


def nonempty_rows(X):
    """X without its 0-row blocks (a boolean filter and `compute_chunk_sizes()` leave them):
    every block task, local backend and dask reduction then sees rows (dask's own cumsum
    fails on an empty block). The blocks are X's own (a persisted X stays persisted: its
    futures or arrays are reused as they are)."""
    if all(X.chunks[0]) or X.ndim != 2 or X.numblocks[1] != 1:
        return X
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    graph = dict(X.__dask_graph__())
    materialized = is_materialized(X)
    name = f"kmeans-nonempty-{tokenize(X.name)}"
    keep = [key for key, rows in zip(row_keys(X), X.chunks[0]) if rows]
    layer = {(name, j, 0): graph[key] if materialized else (same, key)
             for j, key in enumerate(keep)}
    deps = set() if materialized else set(X.__dask_layers__())
    hlg = HighLevelGraph({name: layer}, {name: deps})
    if not materialized:
        hlg = HighLevelGraph.merge(hlg, X.__dask_graph__())
    rows = tuple(r for r in X.chunks[0] if r)
    return da.Array(hlg, name, chunks=(rows, X.chunks[1]), dtype=X.dtype, meta=X._meta)


def restore_rows(a, row_chunks):
    """A per-sample result `a` computed on `nonempty_rows(X)`, laid out like X's rows again
    (`row_chunks`, with its 0-row blocks): labels_ and predict's labels line up with X."""
    if a.chunks[0] == tuple(row_chunks) or a.chunks[0] != tuple(r for r in row_chunks if r):
        return a
    import itertools

    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    name = f"kmeans-rows-{tokenize(a.name, row_chunks)}"
    rest = [range(n) for n in a.numblocks[1:]]
    kind, layer, j = block_kind(a), {}, 0
    for i, rows in enumerate(row_chunks):
        for idx in itertools.product(*rest):
            if rows:
                layer[(name, i, *idx)] = (same, (a.name, j, *idx))
            else:
                shape = tuple(a.chunks[ax + 1][b] for ax, b in enumerate(idx))
                layer[(name, i, *idx)] = (empty_rows, kind, a.dtype, shape)
        j += bool(rows)
    hlg = HighLevelGraph.merge(HighLevelGraph({name: layer}, {name: set(a.__dask_layers__())}),
                               a.__dask_graph__())
    return da.Array(hlg, name, chunks=(tuple(row_chunks), *a.chunks[1:]), dtype=a.dtype,
                    meta=a._meta)


def is_materialized(a) -> bool:
    """Whether a's graph holds just its blocks (persisted, or small in-memory data): nothing
    to compute, so persisting again would only copy it."""
    from dask.core import istask
    graph = dict(a.__dask_graph__())
    if len(graph) != a.npartitions:
        return False
    for value in graph.values():
        if istask(value) or type(value).__module__.startswith("dask"):
            return False  # a task (or an alias): something still to compute
    return True  # arrays in the graph (local) or futures (distributed)


class Cluster:
    """Where a dask backend computes: the client of the `scheduler` option, else the current
    distributed client, else dask's local scheduler."""

    def __init__(self, scheduler=None):
        self.fixed = connect(scheduler) if scheduler is not None else None
        self.persisted = {}   # a lazy X's name -> X persisted (one entry: the fit's X)
        self.aligned = None   # (source array, the same laid out like X's rows, persisted)

    def client(self):
        return self.fixed or current_client()

    def in_use(self) -> bool:
        """Whether computations go to a distributed client now (not, say, inside
        `dask.config.set(scheduler="threads")` while a client exists)."""
        if self.fixed is not None:
            return True
        client = current_client()
        if client is None:
            return False
        from dask.base import get_scheduler
        return getattr(get_scheduler(), "__self__", None) is client

    def describe(self) -> str:
        client = self.client()
        if client is None:
            import dask
            return f"local dask scheduler ({dask.config.get('scheduler', 'threads')})"
        workers = client.scheduler_info().get("workers", {})
        return f"distributed scheduler {client.scheduler.address} with {len(workers)} workers"

    def reset(self):
        self.persisted, self.aligned = {}, None

    # -- persisting -------------------------------------------------------------------------
    def persist(self, *collections, optimize=True, on_cluster=False):
        """The collections persisted by dask's current scheduler (`on_cluster`: by the
        client, whatever dask's configured scheduler)."""
        import dask
        client = self.fixed or (self.client() if on_cluster else None)
        if client is not None:
            return tuple(client.persist(list(collections), optimize_graph=optimize))
        return dask.persist(*collections, optimize_graph=optimize)

    def wait(self, arr):
        """Block until `arr` is computed; re-raise a worker's error (e.g. NaN in X) here."""
        if self.client() is None:
            return  # the local scheduler computed it in persist
        from distributed import futures_of, wait
        futures = futures_of(arr)
        wait(futures)
        for f in futures:
            if f.status == "error":
                f.result()  # raises the worker's exception

    def in_place(self, a) -> bool:
        """Whether a's blocks are where tasks run: futures on a distributed cluster, or any
        in-memory blocks on the local scheduler. In-memory blocks in the graph of a distributed
        computation would travel client -> scheduler -> workers every time; they are
        persisted (sent once) instead."""
        if self.client() is None:
            return True
        from distributed import Future
        return all(isinstance(v, Future) for v in dict(a.__dask_graph__()).values())

    def colocated(self, a, X):
        """On a distributed cluster: `a` (per-sample, chunked like X's rows) with each block
        made by a task that depends on X's block, so it is computed (or, persisted, copied
        once) on the worker that holds X's block: the iteration's tasks then find both there
        and move no per-sample data. Unchanged on the local scheduler."""
        if (self.client() is None or a.chunks[0] != X.chunks[0] or a.ndim not in (1, 2)
                or (a.ndim == 2 and a.numblocks[1] != 1)):
            return a
        import dask.array as da
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph
        name = f"kmeans-colocated-{tokenize(a.name, X.name)}"
        layer = {((name, i) if a.ndim == 1 else (name, i, 0)): (second, xk, ak)
                 for i, (xk, ak) in enumerate(zip(row_keys(X), row_keys(a)))}
        graph = HighLevelGraph.merge(
            HighLevelGraph({name: layer}, {name: set(X.__dask_layers__()) | set(
                a.__dask_layers__())}), X.__dask_graph__(), a.__dask_graph__())
        return da.Array(graph, name, chunks=a.chunks, dtype=a.dtype, meta=a._meta)

    def persist_like(self, a, X, on_cluster=False):
        """`a` laid out like X's rows, persisted next to X's blocks, computed."""
        if a.chunks[0] != X.chunks[0]:
            a = a.rechunk({0: X.chunks[0]})
        (a,) = self.persist(self.colocated(a, X), on_cluster=on_cluster)
        self.wait(a)
        return a

    def block_futures(self, a):
        """The futures of a's row blocks in order when `a` is persisted on this session's
        client (its graph holds just them), else None."""
        client = self.client()
        if client is None:
            return None
        from distributed import Future
        graph = dict(a.__dask_graph__())
        out = []
        for key in row_keys(a):
            f = graph.get(key)
            if not isinstance(f, Future) or f.client is not client:
                return None
            out.append(f)
        return out if len(graph) == len(out) else None

    def rows_on_cluster(self, X):
        """X (whole rows) with its blocks persisted on the client: X itself when it is, else
        persisted once (cached by its name for the fit)."""
        X = whole_rows(X)
        if self.block_futures(X) is not None:
            return X
        got = self.persisted.get(X.name)
        if got is None:
            (got,) = self.persist(X, on_cluster=True)
            self.wait(got)
            if self.block_futures(got) is None:
                raise RuntimeError("could not persist X's row blocks on the cluster")
            self.persisted = {X.name: got}
        return got

    def weights_like(self, w, X, on_cluster=False):
        """The sample weights (n,) laid out like X's rows in X's block library (CuPy weights
        for CuPy X: no host-to-device copy per iteration), persisted once next to X's blocks
        and cached for the fit, so every iteration reads the same blocks. None: None."""
        if w is None:
            return None
        import dask.array as da

        def placed(a):
            return (self.block_futures(a) is not None if on_cluster else self.in_place(a))

        if (isinstance(w, da.Array) and w.chunks[0] == X.chunks[0] and block_kind(w) ==
                block_kind(X) and is_materialized(w) and placed(w)):
            return w  # already persisted, laid out like X
        cached = self.aligned
        if (cached is not None and cached[0] is w and cached[1].chunks[0] == X.chunks[0]
                and placed(cached[1])):
            return cached[1]
        a = w
        if not isinstance(a, da.Array) or block_kind(a) != block_kind(X):
            from .namespace import DaskNamespace
            a = DaskNamespace.for_array(X).asarray(a)  # dask, CuPy blocks for CuPy X
        aligned = self.persist_like(a, X, on_cluster=on_cluster)
        self.aligned = (w, aligned)
        return aligned


class Settings(NamedTuple):
    """What both engines need to know of the backend's options."""
    block_backend: str | None   # the local backend of a block (None: by the blocks' kind)
    max_memory: object          # the local backend's max_memory (per worker thread)
    split_every: int            # partial results added per task in a reduction tree
    reduce: str                 # "auto", "client" or "tree" (graph engine on a cluster)
    direct_gather: bool         # the client talks to the workers directly
    timings: bool               # record per-iteration timings

    def spec(self, X):
        """How X's blocks are computed: (kind, backend name or None, max_memory)."""
        return (block_kind(X), self.block_backend, self.max_memory)
