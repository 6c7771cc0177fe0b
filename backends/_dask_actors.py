"""The dask backend's actors engine: one dask Actor per worker holds that worker's row blocks
of X (and of the weights), and an iteration is one direct client -> worker call per worker.

Why: the graph engine sends a task graph through the scheduler every iteration, and on fast
GPUs the scheduler's round trip (~20 ms) is as long as the work itself. Here an iteration is
one `actor_execute` message per worker, sent straight to the workers (the client already
talks to them for `gather`), all of them awaited together on the client's event loop; each
actor runs its blocks on the local backend and answers with its k x d partial sums and two
statistics the fit loop needs (labels changed since the last call, weighted inertia),
computed where the labels live, all in one device -> host transfer per worker. Labels and
distances stay in the actors (the last `KEEP` calls) and leave them only as dask arrays whose
tasks run on the actor's worker: to relocate an empty cluster, and at the end of a fit.

Same blocks, same local backend, partial sums added on the client in block order: the same
labels and sums as the graph engine, bit for bit.
"""
from __future__ import annotations

import itertools
import time
import uuid

import numpy as np

#: calls whose labels an actor keeps (a fetch submitted after a call still finds them)
KEEP = 2

_generations = itertools.count()


# -- on the workers ----------------------------------------------------------------------------
def _reductions(kind):
    """The device loop's reductions for the blocks' library."""
    if kind == "cupy":
        from ._cupy_kmeans_kernels import DeviceReductions
        return DeviceReductions
    from ._device_loop import HostReductions
    return HostReductions


def flat_float64(kind, arrays):
    """The arrays (and 0-d scalars) flattened into one float64 NumPy array, in one device ->
    host transfer for CuPy ones (each transfer synchronises the device)."""
    if not arrays:
        return np.empty(0)
    if kind != "cupy":
        return np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays])
    import cupy as cp
    return cp.concatenate([cp.asarray(a, dtype=cp.float64).reshape(-1) for a in arrays]).get()


class BlockActor:
    """Lives on one worker and holds its blocks of X and of the weights as local arrays."""

    def __init__(self, indices, x_blocks, w_blocks, kind, name, max_memory, keep=KEEP):
        self.indices = list(indices)
        self.x = list(x_blocks)
        self.w = list(w_blocks) if w_blocks is not None else [None] * len(self.x)
        self.kind, self.name, self.max_memory = kind, name, max_memory
        self.keep = keep
        self.red = _reductions(kind)
        self.outputs = {}       # generation -> [(labels, min_sq) per local block]
        self.previous = None    # labels of the last update call (for the changed count)

    def iterate(self, centers, update=True, generation=0, timed=False, stats=True):
        """One float64 array: per block in this actor's order its sums (k x d) and weights
        (k) when `update`, then the labels changed since the last update call (-1: none, or
        without `stats`) and the blocks' weighted inertia (0.0 without `stats`). One array,
        not a structure of them: each array or object in a message adds to its cost. With
        `timed`, also a dict: when the call entered and left this method (this host's
        clock) and each block's own timing."""
        entered = time.time()
        from kmeans_xp_backends.dask_ import block_step
        red = self.red
        stats = stats and update
        compare = stats and self.previous is not None
        outs, infos, parts, inertias, changes = [], [], [], [], []
        for j, (xb, wb) in enumerate(zip(self.x, self.w)):
            it, info = block_step(xb, wb if update else None, centers, self.kind, self.name,
                                  self.max_memory, update, timed)
            outs.append((it.labels, it.min_sq_dist))
            infos.append(info)
            if update:
                parts += [it.weighted_sums, it.weight_in_clusters]
            if stats:
                inertias.append(red.weighted_sum(it.min_sq_dist, wb) if wb is not None
                                else it.min_sq_dist.sum(dtype=np.float64))
            if compare:
                changes.append(red.count_changed(it.labels, self.previous[j]))
        flat = flat_float64(self.kind, parts + inertias + changes)
        head = flat.size - len(inertias) - len(changes)
        inertia = float(flat[head:head + len(inertias)].sum())
        changed = float(flat[head + len(inertias):].sum()) if compare else -1.0
        if update:
            self.previous = [o[0] for o in outs]
        self.outputs[generation] = outs
        for g in sorted(self.outputs)[:-self.keep]:
            del self.outputs[g]
        packed = np.concatenate([flat[:head], [changed, inertia]])
        if timed:
            return packed, {"entered": entered, "left": time.time(), "blocks": infos}
        return packed

    def ping(self, *payload):
        """Its arguments back: the round trip of a call, for latency probes."""
        return payload

    def output(self, generation, j, which):
        try:
            out = self.outputs[generation][j][which]
        except KeyError:
            raise RuntimeError(f"the labels of iteration {generation} are gone from the actor "
                               f"(it keeps the last {self.keep}); fetch them before the next "
                               f"iterations") from None
        return out.astype(np.int64) if which == 0 and out.dtype != np.int64 else out


def actor_output(actor_key, address, generation, j, which):
    """A block of an actor's labels (which=0, int64) or distances (1). Scheduled on the
    actor's worker, where it reads the actor's array in place; anywhere else (a graph
    optimisation that dropped the worker restriction) it asks the actor over the network."""
    from distributed import get_worker
    from distributed.actor import Actor
    worker = get_worker()
    actors = worker.state.actors if hasattr(worker, "state") else worker.actors
    if actor_key in actors:
        return actors[actor_key].output(generation, j, which)
    return Actor(BlockActor, address, actor_key).output(generation, j, which).result()


# -- on the client -----------------------------------------------------------------------------
class ActorEngine:
    """The client side: creates the actors for a persisted X, calls them, builds the label
    arrays, and runs the driver's loop on them (`kmeans_single`)."""

    def __init__(self, backend):
        self.backend = backend
        #: actor methods run on the worker's actor thread (False: on its event loop, one
        #: thread hop less each way, the loop blocked meanwhile; for latency probes)
        self.separate_thread = True
        self.state = None       # the actors of the current X (see `actors`)
        self.persisted = {}     # lazy X's name -> X persisted (one entry, for the fit)

    def reset(self):
        self.state = None
        self.persisted = {}

    def client(self):
        b = self.backend
        client = b._client or b.current_client()
        if client is None:
            raise RuntimeError("backend_options={'engine': 'actors'} needs a distributed "
                               "cluster (a current distributed.Client, or the 'scheduler' "
                               "option); dask's local scheduler has no actors. Use the "
                               "default engine 'graph' there.")
        return client

    # -- X and the actors -------------------------------------------------------------------
    def persisted_rows(self, client, X):
        """X (whole rows) with its blocks persisted on this client: X itself when it is,
        else persisted once (cached by its name for the fit)."""
        from kmeans_xp_backends.dask_ import block_futures
        X = self.backend._whole_rows(X)
        if block_futures(client, X) is not None:
            return X
        got = self.persisted.get(X.name)
        if got is None:
            got = client.persist(X)  # on the cluster whatever dask's configured scheduler
            self.backend._wait(got)
            if block_futures(client, got) is None:
                raise RuntimeError("the actors engine could not persist X's row blocks on "
                                   "the cluster")
            self.persisted = {X.name: got}
        return got

    def holds(self, X):
        """Whether the actors hold X's blocks (X or the persisted copy of X)."""
        return self.state is not None and self.state["x"] in (
            X.name, self.persisted.get(X.name, X).name)

    def actors(self, client, X, w):
        """The actors holding X's (and w's) blocks: one per worker that holds blocks of X,
        in worker address order, created once (again only for another X or weights)."""
        from kmeans_xp_backends.dask_ import block_futures, block_kind
        want = (X.name, None if w is None else w.name)
        have = self.state
        if have is not None and have["x"] == want[0] and (w is None or have["w"] == want[1]):
            return have
        self.state = None  # the old ones go first (their blocks may be freed)
        xf = block_futures(client, X)
        wf = None if w is None else block_futures(client, w)
        if w is not None and wf is None:  # persisted by a local scheduler: send it once
            w = client.persist(self.backend._colocated(w, X))
            self.backend._wait(w)
            wf = block_futures(client, w)
        who = client.who_has(xf)
        by_worker = {}
        for i, f in enumerate(xf):
            holders = sorted(who.get(f.key) or ())
            if not holders:
                raise RuntimeError(f"block {i} of X is on no worker (lost?)")
            by_worker.setdefault(holders[0], []).append(i)
        kind, b = block_kind(X), self.backend
        futures = [client.submit(
            BlockActor, idx, [xf[i] for i in idx], None if wf is None else [wf[i] for i in idx],
            kind, b.block_backend, b.max_memory, actor=True, workers=[addr],
            allow_other_workers=False, pure=False) for addr, idx in sorted(by_worker.items())]
        actors = []
        for (addr, idx), fut in zip(sorted(by_worker.items()), futures):
            handle = fut.result()
            actors.append({"address": addr, "actor": handle, "future": fut, "key": handle.key,
                           "indices": idx})
        self.state = {"x": want[0], "w": want[1], "actors": actors, "n_blocks": len(xf),
                      "chunks": X.chunks[0], "dtype": X.dtype, "kind": kind}
        return self.state

    def call(self, client, actors, method, *args, **options):
        """`method(*args, **options)` on every actor, concurrently; their answers in order
        (the options travel as plain message fields: Python scalars only). Sent
        straight to each actor's worker (one message each, all awaited together on the
        client's event loop) unless the backend's `direct_gather` is off: then through the
        actor handles, which go through the scheduler when the client does not connect to
        workers directly."""
        if not self.backend.direct_gather:
            calls = [getattr(a["actor"], method)(*args, **options) for a in actors]
            return [c.result() for c in calls]
        import asyncio

        from distributed.protocol import to_serialize

        async def call_all():
            return await asyncio.gather(*(client.rpc(a["address"]).actor_execute(
                function=method, actor=a["key"], args=[to_serialize(x) for x in args],
                kwargs=dict(options, separate_thread=self.separate_thread))
                for a in actors))

        replies = client.sync(call_all)
        for reply in replies:
            if reply["status"] != "OK":
                raise reply["exception"]
        return [reply["result"] for reply in replies]

    # -- one iteration ----------------------------------------------------------------------
    def step(self, X, sample_weight, centers, update, stats=False):
        """Every actor's `iterate`, concurrently: (state, generation, sums, weights, changed
        labels (-1: no previous call), weighted inertia). Partial sums are added in block
        order, as the graph engine adds them."""
        from kmeans_xp_backends.dask_ import add_parts
        b = self.backend
        t0 = time.perf_counter()
        client = self.client()
        X = self.persisted_rows(client, X)
        w = b._aligned_like(sample_weight, X) if update else None
        state = self.actors(client, X, w)
        centers = b._host_centers(centers)
        gen = next(_generations)
        t1 = time.perf_counter()
        submitted_at = time.time()
        results = self.call(client, state["actors"], "iterate", centers,
                            update=bool(update), generation=gen, timed=b.timings,
                            stats=bool(stats))
        t2 = time.perf_counter()
        received_at = time.time()
        calls = [r[1] for r in results] if b.timings else []
        packed = [r[0] for r in results] if b.timings else results
        k, d = centers.shape
        parts, changed, inertia = [], 0, 0.0
        for a, arr in zip(state["actors"], packed):
            if update:
                rows = arr[:-2].reshape(len(a["indices"]), k * (d + 1))
                parts += [(i, row[:k * d].reshape(k, d), row[k * d:])
                          for i, row in zip(a["indices"], rows)]
            changed = -1 if changed < 0 or arr[-2] < 0 else changed + int(arr[-2])
            inertia += float(arr[-1])
        sums = weights = None
        if update:
            parts.sort(key=lambda p: p[0])
            sums, weights = add_parts([(p[1], p[2]) for p in parts])
        t3 = time.perf_counter()
        if b.timings:
            b.last_iter_timings = {
                "blocks": state["n_blocks"], "reduce": "actors", "engine": "actors",
                "build_s": t1 - t0, "submit_s": 0.0, "wait_s": t2 - t1, "gather_s": 0.0,
                "add_s": t3 - t2, "total_s": t3 - t0, "submitted_at": submitted_at,
                "received_at": received_at,
                "block_times": [i for c in calls for i in c["blocks"]],
                "actor_calls": calls}
        return state, gen, sums, weights, changed, inertia

    def arrays(self, state, gen):
        """(labels, min_sq) of call `gen` as lazy dask arrays laid out like X's rows: one
        task per block, restricted to the actor's worker, hands out the actor's array there
        (no transfer). Valid while the actor keeps that call (the next KEEP - 1 calls)."""
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
        from kmeans_xp_backends.dask_ import block_meta
        tag = f"{gen}-{uuid.uuid4().hex[:12]}"
        out = []
        for which, dtype in ((0, np.dtype(np.int64)), (1, state["dtype"])):
            name = f"kmeans-actor-{'labels' if which == 0 else 'min-sq'}-{tag}"
            layer, where = {}, {}
            for a in state["actors"]:
                for j, i in enumerate(a["indices"]):
                    layer[(name, i)] = (actor_output, a["key"], a["address"], gen, j, which)
                    where[(name, i)] = [a["address"]]
            graph = HighLevelGraph({name: MaterializedLayer(layer, annotations={
                "workers": where.__getitem__, "allow_other_workers": False})}, {name: set()})
            out.append(da.Array(graph, name, chunks=(state["chunks"],), dtype=dtype,
                                meta=block_meta(state["kind"], dtype)))
        return out

    def lloyd_iter(self, X, sample_weight, centers, update, xp):
        from kmeans_xp.backend import IterResult
        state, gen, sums, weights, _, _ = self.step(X, sample_weight, centers, update)
        labels, min_sq = self.arrays(state, gen)
        if not update:
            return IterResult(labels, min_sq, None, None)
        xp = xp or self.backend.array_namespace(X)
        return IterResult(labels, min_sq, xp.asarray(sums), xp.asarray(weights))

    # -- the fit loop -----------------------------------------------------------------------
    def kmeans_single(self, X, sample_weight, centers, *, xp=None, max_iter=300, tol=0.0,
                      verbose=0):
        """The driver's loop (`kmeans_xp.lloyd.kmeans_single_lloyd`, same semantics) on the
        actors: per iteration one call per worker, which also counts the changed labels;
        labels leave the actors only to relocate empty clusters and at the end (persisted:
        labels_ outlives the actors). The k x d center update runs in NumPy on the client
        (the sums arrive there as NumPy; CuPy would add kernel launches and transfers), and
        the centers go back to the driver's namespace at the end."""
        import array_api_compat.numpy as host

        from kmeans_xp.namespaces import to_numpy
        from kmeans_xp.lloyd import (
            LloydResult,
            inertia,
            new_centers,
            relocate_empty,
            stop_reason,
        )
        b = self.backend
        client = self.client()
        xp = xp or b.array_namespace(X)
        X = self.persisted_rows(client, X)
        rows = b.driver_rows(X.shape[0], X.shape[1], X.dtype)
        history = {"inertia": [], "center_shift": []}
        strict = False
        centers = to_numpy(centers)
        for i in range(max_iter):
            state, gen, sums, weights, changed, inert = self.step(
                X, sample_weight, centers, True, stats=True)
            if np.any(weights == 0):
                labels, _ = self.arrays(state, gen)
                sums, weights = (to_numpy(a) for a in relocate_empty(
                    X, sample_weight, xp.asarray(centers), labels, xp.asarray(sums),
                    xp.asarray(weights), xp, rows))
            centers_new = new_centers(sums, weights, centers, host)
            shift = float(np.sum((centers_new - centers) ** 2))
            history["inertia"].append(inert)
            history["center_shift"].append(shift)
            if verbose:
                print(f"Iteration {i}, inertia {inert:.6g}, center shift {shift:.3g}")
            centers = centers_new
            stop = stop_reason(i, i > 0 and changed == 0, shift, tol, verbose)
            if stop:
                strict = stop == "strict"
                break
        if not strict:
            state, gen, _, _, _, _ = self.step(X, None, centers, False)
        labels, _ = self.arrays(state, gen)
        (labels,) = client.persist([labels], optimize_graph=False)
        b._wait(labels)  # computed before the actors can go (finish releases them)
        centers = xp.asarray(centers)
        return LloydResult(labels, inertia(X, sample_weight, centers, labels, xp, rows),
                           centers, i + 1, history)
