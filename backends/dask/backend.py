"""The `dask` backend: X as a dask array (NumPy or CuPy blocks), exact Lloyd across blocks,
workers and machines.

Every iteration computes each row block's labels and its statistics (partial sums and
weights, weighted inertia, labels changed since the last iteration) with the best local
backend for the block (the numpy backend on NumPy blocks; cupy-fused, else cupy-chunked,
else cupy-kernels on CuPy blocks); labels stay on the workers, and only the blocks' k x d
statistics come back to the client, in one round trip, where the driver (`kmeans_xp.algorithms.lloyd`)
updates the small centers in NumPy. Two engines carry a call: "graph" (`graph`: one task
graph per call) and "actors" (`actors`: one dask Actor per worker, one message each way per
worker and call), the default on a distributed cluster. The final inertia and the farthest
points (empty clusters) are computed the same way, block by block where the labels live.

The scheduler is dask's current one: the active `distributed.Client` when there is one
(`LocalCluster`, dask-cuda's `LocalCUDACluster`, any scheduler address), else the local
threaded scheduler. `backend_options={"scheduler": "tcp://host:8786"}` connects to (and makes
current) a client for that address.
"""
from __future__ import annotations

import numbers
from typing import ClassVar

import numpy as np

from kmeans_xp.contract.backend import KMeansBackend, Option
from kmeans_xp.contract.memory import MemoryEstimate
from kmeans_xp.contract.namespaces import namespace_name
from kmeans_xp.contract.constraints import Interval

from .actors import ActorEngine
from .blocks import block_kind, first_cupy_backend
from .cluster import Cluster, Settings, whole_rows
from .graph import GraphEngine
from .placement import DaskPlacement


def _short(chunks, most=6):
    """A tuple of chunk sizes, cut after `most` of them (there can be millions)."""
    head = ", ".join(str(c) for c in chunks[:most])
    return f"({head}{', ...' if len(chunks) > most else ''})"


class DaskBackend(KMeansBackend):
    """Exact Lloyd on a dask array with NumPy or CuPy blocks, on dask's current scheduler.

    backend_options:
      scheduler      a distributed scheduler address ("tcp://host:8786"); default: the
                     current distributed Client if there is one, else dask's local
                     (threaded) scheduler.
      block_backend  the backend that computes each block (default: "numpy" for NumPy blocks,
                     the first of cupy-fused, cupy-chunked, cupy-kernels for CuPy blocks).
      split_every    partial results added per task in the reduction tree (default 8).
      reduce         graph engine on a distributed cluster: "auto" (default: the client adds
                     the blocks' statistics when they are CLIENT_REDUCE_BYTES or less in all,
                     else a tree of tasks on the workers), "client" or "tree".
      direct_gather  the client fetches results straight from the workers (default True;
                     False: through the scheduler, for clients that cannot reach workers).
      timings        record per-iteration timings in `last_iter_timings` (worker-side block
                     times with a device sync, client-side phases); default False.
      engine         "auto" (default): "actors" on a distributed cluster dask computes on,
                     "graph" elsewhere.
                     "graph": each call is a task graph sent to the scheduler, built on the
                     futures of the persisted X and weights; labels stay on the workers as
                     the blocks' results.
                     "actors": one dask Actor per worker holds the worker's blocks of X and
                     of the weights (created once per fit); a call is one client -> worker
                     message per worker (through the scheduler only with
                     direct_gather=False), with no task graph. Same blocks, same local
                     backend, statistics added on the client in block order: the same
                     labels and statistics as "graph". Labels stay in the actors while the
                     client holds an array of them.
    max_memory applies to each block's local backend (per worker thread).
    """

    name = "dask"
    namespaces = frozenset({"dask.array"})
    device = "any"
    options: ClassVar[dict] = {
        "scheduler": Option(None, None, str, doc="distributed scheduler address"),
        "block_backend": Option(None, None, str, doc="backend name for each block"),
        "split_every": Option(8, Interval(numbers.Integral, 2, None),
                              doc="partial results added per reduction task"),
        "reduce": Option("auto", "auto", "client", "tree",
                         doc="where the graph engine adds the blocks' statistics",
                         attr="reduce_mode"),
        "direct_gather": Option(True, bool, doc="fetch results straight from the workers"),
        "timings": Option(False, bool, doc="record per-iteration timings"),
        "engine": Option("auto", "auto", "graph", "actors", doc="how iterations run"),
    }
    placement_class = DaskPlacement

    def __init__(self, max_memory="auto", **options):
        super().__init__(max_memory, **options)
        self.cluster = Cluster(self.scheduler)
        settings = Settings(self.block_backend, self.max_memory, self.split_every,
                            self.reduce_mode, self.direct_gather, self.timings)
        self.graph = GraphEngine(self.cluster, settings)
        self.actors = ActorEngine(self.cluster, settings)
        self._last = None  # the engine of the last iteration (for last_iter_timings)

    def uses_actors(self) -> bool:
        """Whether iterations go to actors: engine "actors", or "auto" on a distributed
        cluster that dask computes on now."""
        if self.engine == "auto":
            return self.cluster.in_use()
        return self.engine == "actors"

    @property
    def last_iter_timings(self):
        return None if self._last is None else self._last.last_timings

    def scheduler_info(self) -> str:
        return self.cluster.describe()

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
            return (f"X has unknown chunk sizes (shape {tuple(X.shape)}, row chunks "
                    f"{_short(X.chunks[0])}), as a boolean filter leaves them; call "
                    f"X.compute_chunk_sizes() first (a dask dataframe: "
                    f"to_dask_array(lengths=True))")
        kind = block_kind(X)
        if kind not in ("numpy", "cupy"):
            return f"its blocks are {kind} arrays; it computes on NumPy or CuPy blocks"
        return None

    def batch_backend(self, X):
        """MiniBatchKMeans's batches are gathered on the client and computed there by the
        backend of X's blocks (block_backend, else numpy or the first CuPy backend), with
        all the client's threads: a batch is a few thousand rows."""
        from kmeans_xp.contract.registry import get_backend
        kind = block_kind(X) if namespace_name(X) == "dask.array" else "numpy"
        name = self.block_backend or ("numpy" if kind == "numpy" else first_cupy_backend())
        return get_backend(name)(max_memory=self.max_memory)

    def driver_rows(self, X) -> int:
        return max(int(X.shape[0]), 1)  # dask chunks the driver's passes itself

    # -- the primitives -------------------------------------------------------------------
    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        """One iteration in one round trip: per block, labels (kept where the block is) and
        the stats vector; the client adds the vectors in block order (NumPy results)."""
        engine = self.actors if self.uses_actors() else self.graph
        self._last = engine
        return engine.lloyd_iter(whole_rows(X), sample_weight, centers, labels_old)

    def assign(self, X, centers, *, xp=None):
        X = whole_rows(X)
        if self.uses_actors() and self.actors.holds(X):
            return self.actors.assign(X, centers)
        return self.graph.assign(X, centers)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        return self.graph.reduce(whole_rows(X), labels, sample_weight, n_clusters)

    def inertia(self, X, sample_weight, centers, labels, *, xp=None):
        """0-d float64 NumPy: the blocks' sums of w * ||x - c_label||^2 (by differences),
        added in block order; computed by the actors when they hold X and the labels."""
        X = whole_rows(X)
        value = self.actors.inertia(X, sample_weight, centers, labels)
        if value is None:
            value = self.graph.inertia(X, sample_weight, centers, labels)
        return np.asarray(value, dtype=np.float64)

    def farthest(self, X, sample_weight, centers, labels, m, *, xp=None):
        """Each block's m farthest points (its local backend's `farthest`), merged on the
        client: only m rows per block travel."""
        X = whole_rows(X)
        far = self.actors.farthest(X, sample_weight, centers, labels, m)
        return far if far is not None else self.graph.farthest(X, sample_weight, centers,
                                                               labels, m)

    # -- memory -----------------------------------------------------------------------------
    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto", block_rows=None, engine="auto"):
        """Cluster-wide bytes of the backend's own parts (the driver's, such as the centered
        copy of X and the labels, are added by `kmeans_xp.estimate_memory`): X persisted on
        the workers, the blocks' stats vectors (on the workers and gathered on the client),
        one block's working memory in its local (numpy) backend per worker thread, and, with
        the actors engine, labels_ copied out of the actors at the end of the fit."""
        from kmeans_xp.contract.registry import get_backend
        n, d, k = int(n_samples), int(n_features), int(n_clusters)
        rows = int(block_rows or min(n, max(1, (128 << 20) // (d * itemsize))))
        blocks = -(-n // rows)
        local = get_backend("numpy").estimate_memory(rows, d, k, itemsize=itemsize,
                                                     max_memory=max_memory, n_threads=1)
        parts = {"data": n * d * itemsize,
                 "block_statistics": 2 * blocks * (k * (d + 1) + 2) * 8,
                 "block_working_memory": local.total,
                 "labels_out": 0 if engine == "graph" else n * 8}
        return MemoryEstimate(parts, sum(parts.values()), rows)
