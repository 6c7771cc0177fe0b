"""The actors engine: one dask Actor per worker holds that worker's row blocks of X (and of the
weights), and a call is one direct client -> worker message per worker.

Why: the graph engine sends a task graph through the scheduler every iteration, and on fast
GPUs the scheduler's round trip (~20 ms) is as long as the work itself. Here an iteration is
one `actor_execute` message per worker, sent straight to the workers (the client already
talks to them for `gather`), all of them awaited together on the client's event loop; each
actor runs its blocks on the local backend (the same block step as the graph engine's tasks)
and answers with its blocks' stats vectors (partial sums, weights, inertia and changed labels,
computed where the labels live) in one device -> host transfer per worker.

Labels stay in the actors, one entry per call, and leave them only as dask arrays whose tasks
run on the actor's worker (to relocate an empty cluster, for labels_, and when asked). An
entry lives as long as a graph that can read it: a small token in those tasks tells the engine
when the last one is gone, and the next call tells the actors to drop it (as futures do).

Same blocks, same local backend, stats added on the client in block order: the same labels,
sums and statistics as the graph engine, bit for bit.

A lost worker takes its actor, blocks and labels with it (the graph engine recomputes lost
blocks; actors cannot): every call first looks at the actors' futures, and watches them while
it is in flight, so a lost worker raises `WorkerLostError` at once, saying which worker and
blocks and what to do, instead of a CommClosedError or the 30 s connect timeout.
"""
from __future__ import annotations

import collections
import itertools
import time
import uuid
import weakref

import numpy as np

from kmeans_xp.contract.backend import LABELS_DTYPE, AssignResult, Farthest, IterStats, WorkerLostError

from .blocks import (
    add_vectors,
    as_user_labels,
    assign_block,
    block_meta,
    cupy,
    farthest_block,
    inertia_step,
    iterate_step,
    merge_farthest,
)
from .graph import host_centers, unpack_stats

_generations = itertools.count()

#: seconds between looks at the actors' futures while a call is in flight: a lost worker's
#: actor future errs on the client within ~0.2 s, where a call to its address would wait
#: for the connect timeout (30 s)
WATCH_INTERVAL = 0.05


# -- on the workers ----------------------------------------------------------------------------
def host_vector(kind, parts):
    """Device vectors (or 0-d scalars) as one float64 NumPy vector, in one device -> host
    transfer for CuPy ones (each transfer synchronises the device)."""
    if not parts:
        return np.empty(0)
    if kind != "cupy":
        return np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in parts])
    cp = cupy()
    return cp.concatenate([cp.asarray(p, dtype=cp.float64).reshape(-1) for p in parts]).get()


class BlockActor:
    """Lives on one worker and holds its blocks of X and of the weights as local arrays, and
    the labels of the calls whose arrays the client still holds."""

    def __init__(self, indices, offsets, x_blocks, w_blocks, spec):
        self.indices, self.offsets = list(indices), list(offsets)
        self.x = list(x_blocks)
        self.w = list(w_blocks) if w_blocks is not None else [None] * len(self.x)
        self.spec = spec
        self.outputs = {}       # generation -> [(labels, min_sq or None) per local block]

    def _forget(self, release):
        for g in release:
            self.outputs.pop(g, None)

    def iterate(self, centers, generation, previous=-1, release=(), timed=False):
        """One Lloyd iteration on this actor's blocks: the blocks' stats vectors, one after
        the other in this actor's order, as one float64 array (one array, not a structure of
        them: each array or object in a message adds to its cost). Changed labels are
        counted against the labels of call `previous` (-1: none). With `timed`, also a dict:
        when the call entered and left this method (this host's clock) and each block's
        own timing."""
        entered = time.time()
        self._forget(release)
        old = self.labels(previous) if previous >= 0 else [None] * len(self.x)
        outs, stats, infos = [], [], []
        for xb, wb, lb in zip(self.x, self.w, old):
            labels, st, info = iterate_step(xb, wb, centers, lb, self.spec, timed)
            outs.append((labels, None))
            stats.append(st)
            infos.append(info)
        self.outputs[generation] = outs
        packed = host_vector(self.spec[0], stats)
        if timed:
            return packed, {"entered": entered, "left": time.time(), "blocks": infos}
        return packed

    def assign(self, centers, generation, release=()):
        """Labels and distances of the blocks against `centers`, kept as call `generation`."""
        self._forget(release)
        self.outputs[generation] = [assign_block(xb, centers, self.spec)[:2] for xb in self.x]
        return len(self.x)

    def inertia(self, centers, generation):
        """The blocks' inertia (by differences) with the labels of call `generation`."""
        return host_vector(self.spec[0], [
            inertia_step(xb, wb, centers, lb, self.spec)
            for xb, wb, lb in zip(self.x, self.w, self.labels(generation))])

    def farthest(self, centers, generation, m):
        """Each block's m farthest points (see `blocks.farthest_block`)."""
        return [farthest_block(xb, wb, lb, centers, m, off, self.spec) for xb, wb, lb, off in
                zip(self.x, self.w, self.labels(generation), self.offsets)]

    def ping(self, *payload):
        """Its arguments back: the round trip of a call, for latency probes."""
        return payload

    def labels(self, generation):
        return [out[0] for out in self._call(generation)]

    def _call(self, generation):
        try:
            return self.outputs[generation]
        except KeyError:
            raise RuntimeError(f"the labels of call {generation} are gone from the actor "
                               f"(it keeps a call's labels while the client holds an array "
                               f"of them)") from None

    def output(self, generation, j, which):
        """Block j's labels (which=0, as int32) or distances (1) of call `generation`."""
        out = self._call(generation)[j][which]
        return as_user_labels(out) if which == 0 else out


def actor_output(actor_key, address, generation, j, which):
    """A block of an actor's labels (which=0, int32) or distances (1). Scheduled on the
    actor's worker, where it reads the actor's array in place; anywhere else (a graph
    optimisation that dropped the worker restriction) it asks the actor over the network."""
    from distributed import get_worker
    from distributed.actor import Actor
    worker = get_worker()
    actors = worker.state.actors if hasattr(worker, "state") else worker.actors
    if actor_key in actors:
        return actors[actor_key].output(generation, j, which)
    return Actor(BlockActor, address, actor_key).output(generation, j, which).result()


def _lost_message(lost):
    where = "; ".join(f"worker {a['address']} with blocks {a['indices']} of X" for a in lost)
    return (f"dask worker lost during the fit: {where} (the actors engine held those blocks, "
            f"and their labels, in that worker's memory; they cannot be recomputed there). "
            f"Run the fit again once the cluster has its workers back, or use "
            f"backend_options={{'engine': 'graph'}}: it recomputes lost blocks from X's "
            f"graph and finishes with the same answer.")


class Hold:
    """Travels in the tasks of the arrays of one actor call (as the call's number): when the
    last graph holding it is gone, the number goes to `released`."""

    def __init__(self, generation, released):
        self.generation = generation
        weakref.finalize(self, released.append, generation)

    def __reduce__(self):
        return (int, (self.generation,))


# -- on the client -----------------------------------------------------------------------------
class ActorEngine:
    """The client side: creates the actors for a persisted X, calls them, and builds the
    label arrays. `cluster` (a `cluster.Cluster`) says where, `settings` (a
    `cluster.Settings`) how."""

    def __init__(self, cluster, settings):
        self.cluster, self.settings = cluster, settings
        #: actor methods run on the worker's actor thread (False: on its event loop, one
        #: thread hop less each way, the loop blocked meanwhile; for latency probes)
        self.separate_thread = True
        self.state = None              # the actors of the current X (see `actors`)
        self.names = {}                # name of an array of a call -> the call's number
        self.released = collections.deque()  # calls whose arrays are all gone
        self.last_timings = None

    def reset(self):
        self.state, self.names = None, {}

    def client(self):
        client = self.cluster.client()
        if client is None:
            raise RuntimeError("backend_options={'engine': 'actors'} needs a distributed "
                               "cluster (a current distributed.Client, or the 'scheduler' "
                               "option); dask's local scheduler has no actors. Use the "
                               "engine 'graph' there.")
        return client

    def holds(self, X) -> bool:
        """Whether the actors hold X's blocks (X or the persisted copy of X)."""
        return self.state is not None and self.state["x"] in (
            X.name, self.cluster.persisted.get(X.name, X).name)

    def call_of(self, arr):
        """The number of the call whose labels `arr` is (an array this engine made for the
        current actors), or None."""
        return None if arr is None or self.state is None else self.names.get(arr.name)

    def same_weights(self, w) -> bool:
        return self.state is not None and self.state["w"] == (None if w is None else w.name)

    # -- X and the actors -------------------------------------------------------------------
    def actors(self, client, X, w):
        """The actors holding X's (and w's) blocks: one per worker that holds blocks of X,
        in worker address order, created once (again only for another X or weights)."""
        want = (X.name, None if w is None else w.name)
        have = self.state
        if have is not None and (have["x"], have["w"]) == want:
            return have
        self.reset()  # the old ones go first (their blocks may be freed)
        xf = self.cluster.block_futures(X)
        wf = None if w is None else self.cluster.block_futures(w)
        who = client.who_has(xf)
        by_worker = {}
        for i, f in enumerate(xf):
            holders = sorted(who.get(f.key) or ())
            if not holders:
                raise RuntimeError(f"block {i} of X is on no worker (lost?)")
            by_worker.setdefault(holders[0], []).append(i)
        spec = self.settings.spec(X)
        placed = sorted(by_worker.items())
        offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(int).tolist()
        futures = [client.submit(
            BlockActor, idx, [offsets[i] for i in idx], [xf[i] for i in idx],
            None if wf is None else [wf[i] for i in idx], spec, actor=True, workers=[addr],
            allow_other_workers=False, pure=False) for addr, idx in placed]
        actors = []
        for (addr, idx), fut in zip(placed, futures):
            handle = fut.result()
            actors.append({"address": addr, "actor": handle, "future": fut, "key": handle.key,
                           "indices": idx})
        self.state = {"x": want[0], "w": want[1], "actors": actors, "n_blocks": len(xf),
                      "chunks": X.chunks[0], "dtype": X.dtype, "kind": spec[0]}
        return self.state

    def prepare(self, X, sample_weight, need_weights=True):
        """(client, actors) for X persisted on the cluster (and its weights)."""
        client = self.client()
        X = self.cluster.rows_on_cluster(X)
        if not need_weights and self.holds(X):
            return client, self.state
        w = self.cluster.weights_like(sample_weight, X, on_cluster=True)
        return client, self.actors(client, X, w)

    def call(self, client, actors, method, *args, **options):
        """`method(*args, **options)` on every actor, concurrently; their answers in order
        (the options travel as plain message fields: Python scalars and lists only). Sent
        straight to each actor's worker (one message each, all awaited together on the
        client's event loop) unless `direct_gather` is off: then through the actor handles,
        which go through the scheduler when the client does not connect to workers."""
        self.check_alive(actors)
        try:
            if not self.settings.direct_gather:
                calls = [getattr(a["actor"], method)(*args, **options) for a in actors]
                return [c.result() for c in calls]
            return self._direct(client, actors, method, args, options)
        except WorkerLostError:
            raise
        except Exception as exc:  # CommClosedError, a connect timeout, an actor's error on
            # a dying worker: a lost worker when one of the actors' futures says so
            self.check_alive(actors, wait=1.0, cause=exc)
            raise

    def _direct(self, client, actors, method, args, options):
        """The call sent straight to each actor's worker, raced against a watch on the
        actors' futures (client-side state: no message), so a lost worker ends the call at
        once instead of after the connect timeout."""
        import asyncio

        from distributed.protocol import to_serialize

        async def watch():
            while all(a["future"].status == "finished" for a in actors):
                await asyncio.sleep(WATCH_INTERVAL)

        async def call_all():
            calls = asyncio.ensure_future(asyncio.gather(*(client.rpc(
                a["address"]).actor_execute(
                function=method, actor=a["key"], args=[to_serialize(x) for x in args],
                kwargs=dict(options, separate_thread=self.separate_thread))
                for a in actors)))
            watcher = asyncio.ensure_future(watch())
            await asyncio.wait([calls, watcher], return_when=asyncio.FIRST_COMPLETED)
            if not calls.done():
                calls.cancel()
                return None
            watcher.cancel()
            return calls.result()

        replies = client.sync(call_all)
        if replies is None:
            self.check_alive(actors)
        for reply in replies:
            if reply["status"] != "OK":
                raise reply["exception"]
        return [reply["result"] for reply in replies]

    def check_alive(self, actors=None, wait=0.0, cause=None):
        """Raise WorkerLostError when an actor's worker is gone (its future no longer
        finished); with `wait`, give the client that long to hear of it (after a comm
        error, the news can trail it)."""
        actors = self.state["actors"] if actors is None and self.state else actors or []
        deadline = time.monotonic() + wait
        while True:
            lost = [a for a in actors if a["future"].status != "finished"]
            if lost or time.monotonic() >= deadline:
                break
            time.sleep(WATCH_INTERVAL)
        if lost:
            self.reset()  # these actors are gone: a new fit makes new ones
            raise WorkerLostError(_lost_message(lost)) from cause

    def _release(self):
        """Calls whose arrays are gone (the actors drop them with this call)."""
        out = []
        while self.released:
            out.append(int(self.released.popleft()))
        if out:
            gone = set(out)
            self.names = {k: g for k, g in self.names.items() if g not in gone}
        return out

    # -- the primitives ---------------------------------------------------------------------
    def lloyd_iter(self, X, sample_weight, centers, labels_old):
        t0 = time.perf_counter()
        client, state = self.prepare(X, sample_weight)
        centers = host_centers(centers)
        k, d = centers.shape
        previous = self.call_of(labels_old)
        gen = next(_generations)
        timed = self.settings.timings
        t1 = time.perf_counter()
        submitted_at = time.time()
        results = self.call(client, state["actors"], "iterate", centers, generation=gen,
                            previous=-1 if previous is None else previous,
                            release=self._release(), timed=timed)
        t2 = time.perf_counter()
        received_at = time.time()
        calls = [r[1] for r in results] if timed else []
        packed = [r[0] for r in results] if timed else results
        size = k * (d + 1) + 2
        parts = {}
        for a, arr in zip(state["actors"], packed):
            for i, row in zip(a["indices"], arr.reshape(len(a["indices"]), size)):
                parts[i] = row
        total = add_vectors([parts[i] for i in range(state["n_blocks"])])
        (labels,) = self.arrays(state, gen, (0,))
        sums, weights, inertia, changed = unpack_stats(total, k, d)
        if labels_old is not None and previous is None:  # not this engine's labels
            changed = np.asarray((labels != labels_old).sum().compute(), dtype=np.float64)
        t3 = time.perf_counter()
        if timed:
            self.last_timings = {
                "blocks": state["n_blocks"], "reduce": "actors", "engine": "actors",
                "build_s": t1 - t0, "submit_s": 0.0, "wait_s": t2 - t1, "gather_s": 0.0,
                "add_s": t3 - t2, "total_s": t3 - t0, "submitted_at": submitted_at,
                "received_at": received_at,
                "block_times": [i for c in calls for i in c["blocks"]], "actor_calls": calls}
        return IterStats(labels, sums, weights, inertia, changed)

    def assign(self, X, centers):
        client, state = self.prepare(X, None, need_weights=False)
        gen = next(_generations)
        self.call(client, state["actors"], "assign", host_centers(centers), generation=gen,
                  release=self._release())
        return AssignResult(*self.arrays(state, gen, (0, 1)))

    def inertia(self, X, sample_weight, centers, labels):
        """The inertia from the actors, or None when they cannot tell (other X, weights or
        labels than theirs)."""
        gen = self.call_of(labels)
        if gen is None or not self.holds(X) or not self.same_weights(sample_weight):
            return None
        state = self.state
        parts = self.call(self.client(), state["actors"], "inertia", host_centers(centers),
                          generation=gen)
        return np.float64(add_vectors([np.reshape(v, 1) for v in self._in_block_order(
            state, parts)])[0])

    def farthest(self, X, sample_weight, centers, labels, m):
        """The m farthest points from the actors, or None (as `inertia`)."""
        gen = self.call_of(labels)
        if gen is None or not self.holds(X) or not self.same_weights(sample_weight):
            return None
        answers = self.call(self.client(), self.state["actors"], "farthest",
                            host_centers(centers), generation=gen, m=int(m))
        return Farthest(*merge_farthest([p for a in answers for p in a], int(m)))

    @staticmethod
    def _in_block_order(state, per_actor):
        """The actors' per-block values as a list in block order."""
        out = [None] * state["n_blocks"]
        for a, values in zip(state["actors"], per_actor):
            for i, v in zip(a["indices"], values):
                out[i] = v
        return out

    def arrays(self, state, gen, which):
        """The arrays (labels: 0, distances: 1) of call `gen`, laid out like X's rows: one
        task per block, restricted to the actor's worker, hands out the actor's array there
        (no transfer). The call's labels stay in the actors while one of these lives."""
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
        hold = Hold(gen, self.released)
        tag = f"{gen}-{uuid.uuid4().hex[:12]}"
        out = []
        for w in which:
            dtype = LABELS_DTYPE if w == 0 else state["dtype"]
            name = f"kmeans-actor-{'labels' if w == 0 else 'min-sq'}-{tag}"
            layer, where = {}, {}
            for a in state["actors"]:
                for j, i in enumerate(a["indices"]):
                    layer[(name, i)] = (actor_output, a["key"], a["address"], hold, j, w)
                    where[(name, i)] = [a["address"]]
            graph = HighLevelGraph({name: MaterializedLayer(layer, annotations={
                "workers": where.__getitem__, "allow_other_workers": False})}, {name: set()})
            out.append(da.Array(graph, name, chunks=(state["chunks"],), dtype=dtype,
                                meta=block_meta(state["kind"], dtype)))
            self.names[name] = gen
        return out
