"""The graph engine: each call is one task graph over X's row blocks, sent once.

A call maps a block task (`blocks`) over X's row blocks and the matching blocks of per-sample
columns (weights, the last labels). Per-sample results (labels) stay where their block ran, as
the blocks of a new dask array; the small results (an iteration's stats vector, a block's
farthest points) come back to the client, in one scheduler round trip per call:

- on a distributed cluster, the graph is built on the futures of X's persisted blocks (each
  task runs where its blocks are; keys are new every call), plus a task per block that takes
  the small result out of the block's result; the client gathers those straight from the
  workers and adds them in block order, or, when they are large, a tree of tasks adds them
  `split_every` at a time on the workers;
- on dask's local scheduler, the graph is one `dask.compute` of every block's result.

Raw graph layers, not Delayed objects: building stays O(blocks) with no per-block tokenizing.
"""
from __future__ import annotations

import itertools
import time
import uuid
from typing import NamedTuple

import numpy as np

from kmeans_xp.contract.backend import LABELS_DTYPE, AssignResult, Farthest, IterStats, ReduceResult

from .blocks import (
    add_vectors,
    assign_block,
    block_meta,
    farthest_block,
    inertia_block,
    iterate_block,
    labels_out,
    merge_farthest,
    reduce_block,
    take,
)
from .cluster import row_keys, whole_rows

#: on a distributed cluster, small results up to this many bytes in all are gathered to the
#: client and added there (one hop less than a reduction task); more: a tree of tasks
CLIENT_REDUCE_BYTES = 64 << 20

_ids = itertools.count()


def unpack_stats(total, k, d):
    """(sums (k, d), weights (k,), inertia 0-d, n_changed 0-d), float64 NumPy, of a stats
    vector (`blocks`)."""
    return (total[:k * d].reshape(k, d), total[k * d:k * d + k],
            np.asarray(total[k * d + k]), np.asarray(total[k * d + k + 1]))


def host_centers(centers):
    from kmeans_xp.contract.namespaces import to_numpy
    return np.ascontiguousarray(to_numpy(centers))


def tree_layer(layer, keys, prefix, split_every):
    """Add to `layer` the tasks adding the vectors at `keys`, `split_every` at a time, level by
    level (at least one level); return the key of the total."""
    depth = 0
    while True:
        keys_next = []
        for j, start in enumerate(range(0, len(keys), split_every)):
            key = (prefix, depth, j)
            layer[key] = (add_vectors, list(keys[start:start + split_every]))
            keys_next.append(key)
        keys, depth = keys_next, depth + 1
        if len(keys) == 1:
            return keys[0]


class GraphEngine:
    """One task graph per call. `cluster` (a `cluster.Cluster`) says where it runs, `settings`
    (a `cluster.Settings`) how blocks are computed."""

    def __init__(self, cluster, settings):
        self.cluster, self.settings = cluster, settings
        self.last_timings = None
        self._inflight = None   # the last call's futures on the cluster

    def reset(self):
        self._inflight = None

    # -- the primitives ---------------------------------------------------------------------
    def lloyd_iter(self, X, sample_weight, centers, labels_old):
        centers = host_centers(centers)
        k, d = centers.shape
        (labels,), total = self.run(
            X, iterate_block, (centers, self.settings.spec(X), self.settings.timings),
            weights=sample_weight, labels=labels_old, outputs=((0, LABELS_DTYPE),), small=1,
            combine="add", size=k * (d + 1) + 2, timing=2 if self.settings.timings else None)
        return IterStats(labels, *unpack_stats(total, k, d))

    def assign(self, X, centers):
        arrays, _ = self.run(X, assign_block, (host_centers(centers), self.settings.spec(X)),
                             columns=False, outputs=((0, LABELS_DTYPE), (1, X.dtype)))
        return AssignResult(*arrays)

    def reduce(self, X, labels, sample_weight, n_clusters):
        k, d = int(n_clusters), X.shape[1]
        _, total = self.run(X, reduce_block, (k, self.settings.spec(X)),
                            weights=sample_weight, labels=labels, combine="add",
                            size=k * (d + 1))
        return ReduceResult(total[:k * d].reshape(k, d), total[k * d:])

    def inertia(self, X, sample_weight, centers, labels):
        _, total = self.run(X, inertia_block, (host_centers(centers), self.settings.spec(X)),
                            weights=sample_weight, labels=labels, combine="add", size=1)
        return np.float64(total[0])

    def farthest(self, X, sample_weight, centers, labels, m):
        X = whole_rows(X)
        offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(np.int64)
        spec = self.settings.spec(X)
        _, parts = self.run(X, farthest_block, (host_centers(centers), int(m)),
                            weights=sample_weight, labels=labels, combine="list",
                            per_block=lambda i: (int(offsets[i]), spec))
        return Farthest(*merge_farthest(parts, int(m)))

    # -- one graph --------------------------------------------------------------------------
    def run(self, X, task, args, *, columns=True, weights=None, labels=None, outputs=(),
            small=None, combine=None, size=0, per_block=None, timing=None):
        """Map `task(x_block, [w_block, labels_block,] *args, *per_block(i))` over X's row
        blocks (the weights' and labels' blocks: None for None). Returns (per-sample
        outputs, small result): `outputs` = ((index in the task's result, dtype), ...) become
        (n,) dask arrays laid out like X's rows; `small` is the index of the small result in
        the task's result (None: the result itself), combined over the blocks as `combine`
        says ("add": the sum of float64 vectors of `size` values, in block order; "list": the
        list; None: not fetched). `timing`: the index of a per-block timing dict, fetched
        with the small result when the client adds."""
        X, xf = self._where(X)
        name = _name(task)
        call = _Call(X, task, args, columns, weights, labels, outputs, small, combine, size,
                     per_block, timing, name)
        if xf is not None:
            return self._on_cluster(call, xf)
        return self._local(call)

    def _where(self, X):
        """(X of whole rows, the futures of its blocks, or None for dask's local scheduler):
        on a cluster dask computes on, a lazy X is persisted there first (once)."""
        X = whole_rows(X)
        cluster = self.cluster
        xf = None
        if cluster.client() is not None:
            xf = cluster.block_futures(X)
            if xf is None and cluster.in_use():
                X = cluster.rows_on_cluster(X)
                xf = cluster.block_futures(X)
        return X, xf

    def chain(self, X, task, start):
        """`task(x_block, running)` block after block in row order, from `running=start`;
        the last block's result (one graph; a pass over X, once per fit)."""
        import dask
        from dask.delayed import Delayed
        from dask.highlevelgraph import HighLevelGraph

        X, xf = self._where(X)
        name = _name(task)
        blocks = xf if xf is not None else row_keys(X)
        dsk, last = {}, start
        for i, xb in enumerate(blocks):
            dsk[(name, i)] = (task, xb, last)
            last = (name, i)
        if xf is not None:
            return self.cluster.client().get(dsk, last, sync=True)
        graph = HighLevelGraph.merge(HighLevelGraph({name: dsk}, {name: set(
            X.__dask_layers__())}), X.__dask_graph__())
        (out,) = dask.compute(Delayed(last, graph, layer=name), optimize_graph=False)
        return out

    @staticmethod
    def _task(call, i, x, cols):
        """Block i's task: x (X's block, a key or a future), then the i-th block of each
        column (None for a column that is None), the call's arguments, the block's own."""
        extra = call.per_block(i) if call.per_block else ()
        if not call.columns:
            return (call.task, x, *call.args, *extra)
        blocks = [None if c is None else c[i] for c in cols]
        return (call.task, x, *blocks, *call.args, *extra)

    def _local(self, call):
        import dask
        import dask.array as da
        from dask.delayed import Delayed
        from dask.highlevelgraph import HighLevelGraph

        X, name = call.X, call.name
        cols = [self.cluster.weights_like(call.weights, X), self._like_rows(call.labels, X)]
        ckeys = [None if c is None else row_keys(c) for c in cols]
        xkeys = row_keys(X)
        layer = {(name, i): self._task(call, i, xk, ckeys) for i, xk in enumerate(xkeys)}
        layer[(name, "all")] = (list, [(name, i) for i in range(len(xkeys))])
        present = [c for c in (X, *cols) if c is not None]
        graph = HighLevelGraph.merge(
            HighLevelGraph({name: layer}, {name: set().union(
                *(c.__dask_layers__() for c in present))}),
            *(c.__dask_graph__() for c in present))
        (results,) = dask.compute(Delayed((name, "all"), graph, layer=name),
                                  optimize_graph=False)
        kind = self.settings.spec(X)[0]
        arrays = []
        for j, (index, dtype) in enumerate(call.outputs):
            out = f"{name}-out{j}"
            blocks = {(out, i): labels_out(r) if index == 0 else r[index]
                      for i, r in enumerate(results)}
            arrays.append(da.Array(HighLevelGraph({out: blocks}, {out: set()}), out,
                                   chunks=(X.chunks[0],), dtype=dtype, meta=block_meta(kind,
                                                                                      dtype)))
        parts = [r if call.small is None else r[call.small] for r in results]
        return arrays, _combine(parts, call.combine)

    @staticmethod
    def _like_rows(col, X):
        if col is not None and col.chunks[0] != X.chunks[0]:
            col = col.rechunk({0: X.chunks[0]})
        return col

    def _column_futures(self, col, X, weights):
        """The futures of a column's blocks next to X's: the block results of one of this
        engine's own calls (the task takes their labels), a persisted column's blocks, or
        the column persisted now next to X's blocks (the weights: cached for the fit)."""
        if col is None:
            return None
        cluster = self.cluster
        if weights:
            got = cluster.block_futures(cluster.weights_like(col, X, on_cluster=True))
        else:
            got = self._own_blocks(col, X)
            if got is None:
                col = self._like_rows(col, X)
                got = cluster.block_futures(col)
            if got is None:
                got = cluster.block_futures(cluster.persist_like(col, X, on_cluster=True))
        if got is None:
            raise RuntimeError("could not persist a per-sample column on the cluster")
        return got

    def _own_blocks(self, col, X):
        """The block-result futures behind labels made by `_on_cluster`, or None."""
        from distributed import Future
        base, sep, j = col.name.rpartition("-out")
        if not sep or j != "0" or col.chunks[0] != X.chunks[0]:
            return None
        layer = getattr(col.dask, "layers", {}).get(base)
        if layer is None:
            return None
        got = [layer.get((base, i)) for i in range(col.numblocks[0])]
        client = self.cluster.client()
        if len(layer) != len(got) or not all(isinstance(f, Future) and f.client is client
                                             for f in got):
            return None
        return got

    def _on_cluster(self, call, xf):
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph
        from distributed import wait

        t0 = time.perf_counter()
        X, name, settings = call.X, call.name, self.settings
        client = self.cluster.client()
        nb = len(xf)
        cols = ([self._column_futures(call.weights, X, True),
                 self._column_futures(call.labels, X, False)] if call.columns else None)
        dsk = {(name, i): self._task(call, i, xf[i], cols) for i in range(nb)}
        block_keys = [(name, i) for i in range(nb)]
        want, on_client = list(block_keys), True
        if call.combine is not None:
            on_client = call.combine == "list" or settings.reduce == "client" or (
                settings.reduce == "auto" and nb * call.size * 8 <= CLIENT_REDUCE_BYTES)
            timed = call.timing is not None and on_client
            pick = slice(call.small, call.timing + 1) if timed else call.small
            part_keys = [(name + "-part", i) for i in range(nb)]
            dsk.update({pk: (take, bk, pick) if pick is not None else bk
                        for pk, bk in zip(part_keys, block_keys)})
            if on_client:
                want += part_keys
            else:
                want.append(tree_layer(dsk, part_keys, name + "-sum", settings.split_every))
        t1 = time.perf_counter()
        submitted_at = time.time()
        futures = client.get(dsk, want, sync=False)
        t2 = time.perf_counter()
        # the last call's futures are released only now: a release sent just before the
        # graph would hold the graph in the client's batched stream (10 ms interval)
        self._inflight = futures
        blocks = futures[:nb]
        kind = settings.spec(X)[0]
        arrays = []
        for j, (index, dtype) in enumerate(call.outputs):
            out = f"{name}-out{j}"
            graph = HighLevelGraph(
                {name: dict(zip(block_keys, blocks)),
                 out: {(out, i): (labels_out, bk) if index == 0 else (take, bk, index)
                       for i, bk in enumerate(block_keys)}},
                {name: set(), out: {name}})
            arrays.append(da.Array(graph, out, chunks=(X.chunks[0],), dtype=dtype,
                                   meta=block_meta(kind, dtype)))
        if call.combine is None:
            return arrays, None
        rest = futures[nb:]
        wait(rest)
        t3 = time.perf_counter()
        received_at = time.time()
        got = client.gather(rest, direct=settings.direct_gather or None)
        t4 = time.perf_counter()
        infos = []
        if call.timing is not None and on_client:
            infos, got = [g[1] for g in got], [g[0] for g in got]
        value = _combine(got, call.combine) if on_client else got[0]
        t5 = time.perf_counter()
        if settings.timings and call.timing is not None:
            self.last_timings = {
                "engine": "graph", "blocks": nb, "reduce": "client" if on_client else "tree",
                "build_s": t1 - t0, "submit_s": t2 - t1, "wait_s": t3 - t2,
                "gather_s": t4 - t3, "add_s": t5 - t4, "total_s": t5 - t0,
                "submitted_at": submitted_at, "received_at": received_at,
                "block_times": [i for i in infos if i is not None]}
        return arrays, value


class _Call(NamedTuple):
    X: object
    task: object
    args: tuple
    columns: bool
    weights: object
    labels: object
    outputs: tuple
    small: object
    combine: object
    size: int
    per_block: object
    timing: object
    name: str


def _name(task):
    """New keys every call: a call whose arguments repeat reuses none the scheduler is
    releasing."""
    return f"kmeans-{task.__name__.replace('_', '-')}-{next(_ids)}-{uuid.uuid4().hex[:16]}"


def _combine(parts, combine):
    if combine == "add":
        return add_vectors(parts)
    return parts if combine == "list" else None
