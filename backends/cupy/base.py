"""CupyBackendBase: what the three CuPy backends share. Placement and memory are the
collaborators `CupyPlacement` and `CupyBudget`; the primitives of cupy-kernels and
cupy-chunked are built on one per-chunk assignment (`chunk_centers` + `assign_chunk`, also
what host streaming runs on each chunk); statistics, the direct inertia and the farthest
points are kernels (`reductions`). Host-streamed X (`streaming.HostRows`) goes through the
streaming engine, one streamed pass per primitive.
"""
from __future__ import annotations

import types
from typing import ClassVar

import numpy as np

from kmeans_xp.contract.backend import (
    AssignResult,
    IterStats,
    KMeansBackend,
    Option,
    Placement,
    ReduceResult,
)
from kmeans_xp.contract.memory import MemoryEstimate, compute_itemsize

from . import nearest, reductions
from .budget import CupyBudget, NominalBudget, centered_copy_error, host_x_error
from .common import STREAM_HINT, compute_dtype, ctype, cupy, device_empty, out_of_memory_error, xtypes
from .placement import CupyPlacement


def _positive_int_or_none(v):
    return v is None or (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1)


#: the options of every CuPy backend
BASE_OPTIONS = {
    "free_memory": Option(False, bool, doc="hand the pool's cached blocks (and CuPy's cached "
                          "pinned host blocks) back when a fit ends"),
}
#: the options of the backends that stream X (from the host, or a device X centered chunk by
#: chunk)
STREAM_OPTIONS = {
    "stream": Option("auto", "auto", bool, doc='"auto": a NumPy X whose fit does not fit in '
                     "the device memory usable now is streamed through the GPU every pass, "
                     "and a CuPy X whose centered copy does not fit beside it is centered "
                     "chunk by chunk as it streams; True: always; False: never"),
    "stream_rows": Option(None, _positive_int_or_none, doc="rows per streamed chunk (default: "
                          "~256 MiB of X, within the budget)"),
    "pin_input": Option("auto", "auto", bool, doc='"auto": page-lock an in-memory X (and a '
                        "memmap taking at most half the available host memory) for the fit; "
                        "True: try for any memmap; False: always stage through pinned buffers"),
}


class CupyBackendBase(KMeansBackend):
    namespaces = frozenset({"cupy"})
    device = "gpu"
    options: ClassVar[dict] = BASE_OPTIONS
    placement_class = CupyPlacement
    budget_class = CupyBudget
    #: True for backends that define `chunk_centers`, `assign_chunk` and `stream_work_bytes`
    supports_streaming: ClassVar[bool] = False
    stream, stream_rows, pin_input = False, None, "auto"

    def __init__(self, max_memory="auto", **options):
        self._cp = cupy()
        super().__init__(max_memory, **options)
        self._engine = None    # streaming.StreamEngine of the fit, when X is streamed
        self._scratch = None   # reductions.Scratch, made on first use

    @classmethod
    def planner(cls, max_memory="auto"):
        """An instance for `estimate_memory`: the backend itself where CuPy imports, else one
        that only plans (no CuPy, no device: a GPU fit planned from a laptop), whose "auto"
        budget is a share of an empty device of NOMINAL_DEVICE_BYTES."""
        try:
            return cls(max_memory=max_memory)
        except ImportError:
            pass
        inst = cls.__new__(cls)
        # the host Placement and a nominal budget in place of the two that need CuPy
        inst.placement_class, inst.budget_class = Placement, NominalBudget
        KMeansBackend.__init__(inst, max_memory)
        return inst

    def check_memory(self, X, plan, options=None):
        """A NumPy X that is streamed must fit its chunks; one that is copied must fit on the
        device; a device X that a backend without streaming centers on a copy (plan.copy_x)
        must have room for the copy; then the backend's estimate (its chunk plan) must fit.
        With max_memory="auto" the error states the device's side (free, total, the pool
        limit, what to change)."""
        place = self.placement
        if isinstance(X, np.ndarray):
            n, d = X.shape
            itemsize = compute_itemsize(X.dtype)
            if place.streams(X, plan.k):
                self.stream_estimate(n, d, plan.k, itemsize, weighted=True)
                return
            # X once and the driver's arrays, or the fit would die copying or centering X
            if place.fit_state_bytes(n, d, plan.k, itemsize,
                                     place.host_x_bytes(X)) > self.memory.available():
                raise host_x_error(X, self.supports_streaming)
        elif (plan.copy_x and (not self.supports_streaming or place.half_dtype() is not None)
              and not place.copy_fits(X)):
            # (a half-data fit centers device X into a half copy: never chunk by chunk)
            raise centered_copy_error(self.name, X, place.copy_bytes(X))
        super().check_memory(X, plan, options)

    # -- shared helpers ---------------------------------------------------------------------
    def stage(self, name):
        return self.memory.stage(name)

    @property
    def scratch(self):
        if self._scratch is None:
            self._scratch = reductions.Scratch()
        return self._scratch

    def contiguous(self, a, dtype=None):
        """a as a C-contiguous CuPy array of dtype (a no-op when it already is one)."""
        cp = self._cp
        a = cp.asarray(a)
        if dtype is not None and a.dtype != dtype:
            a = a.astype(dtype)
        return a if a.flags.c_contiguous else cp.ascontiguousarray(a)

    def weights(self, sample_weight, dtype):
        """Device weights in the dtype X computes in (half X: float32), or None (unit
        weights: the kernels take a null)."""
        return None if sample_weight is None else self.contiguous(sample_weight,
                                                                  compute_dtype(dtype))

    def driver_rows_for(self, n, d, itemsize) -> int:
        """`driver_rows` for an X of this shape, before there is one (estimates)."""
        like = types.SimpleNamespace(shape=(n, d), dtype="float64" if itemsize == 8 else "float32")
        return self.driver_rows(like)

    def labels32(self, labels):
        return self.contiguous(labels, np.int32)

    @staticmethod
    def is_streamed(X) -> bool:
        from .streaming import HostRows
        return isinstance(X, HostRows)  # (a DeviceRows is one too)

    def release_buffers(self):
        """Drop per-fit buffers (backends that keep more extend this): the streaming engine
        and its pinned and device buffers, X's page lock, the reductions' scratch."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._scratch = None

    def drop_work_buffers(self):
        """Hook: free the per-chunk working buffers of the streamed primitive (re-planning)."""

    def fit_kernels(self, n, d, k, dtype, *, seeding=None):
        """(file, instance) of the kernels a fit of this shape launches, compiled ahead by
        the placement (`CupyPlacement.warm_up`): the statistics, the inertia and, where
        k-means++'s steps run on the device, theirs in `seeding`'s dtype (None: they do not);
        each backend adds its assignment's."""
        t = ctype(compute_dtype(dtype))
        out = [("stats.cu", f"weighted_total<{t}>"),
               ("direct.cu", f"direct_inertia<{xtypes(dtype)}>")]
        if seeding is not None:
            out.append(("seeding.cu", f"seeding_potentials<{xtypes(seeding)}>"))
        return out

    # -- the per-chunk assignment (cupy-kernels, cupy-chunked) --------------------------------
    def chunk_centers(self, centers, dtype):
        raise NotImplementedError

    def assign_chunk(self, X, state, labels, min_sq):
        raise NotImplementedError

    def _assign(self, X, centers):
        X = self.contiguous(X)
        n = X.shape[0]
        labels = device_empty((n,), np.int32, "labels")
        min_sq = device_empty((n,), X.dtype, "squared distances")
        self.assign_chunk(X, self.chunk_centers(centers, X.dtype), labels, min_sq)
        return X, labels, min_sq

    def assign(self, X, centers, *, xp=None) -> AssignResult:
        if self.is_streamed(X):
            return self.stream_engine(X.data, centers.shape[0]).assign(X, centers)
        with self.stage("assign"):
            _, labels, min_sq = self._assign(X, centers)
        return AssignResult(labels, min_sq)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None) -> ReduceResult:
        """Per-cluster float64 sums of w * x and w (shared-memory privatised atomics)."""
        if self.is_streamed(X):
            engine = self.stream_engine(X.data, n_clusters, sample_weight)
            return engine.reduce(X, labels)
        X = self.contiguous(X)
        with self.stage("update"):
            return self._reduce(X, self.labels32(labels), self.weights(sample_weight, X.dtype),
                                n_clusters)

    def _reduce(self, X, labels, w, k):
        cp = self._cp
        sums = cp.zeros((k, X.shape[1]), dtype=cp.float64)
        weights = cp.zeros((k,), dtype=cp.float64)
        nearest.cluster_sums(X, labels, w, sums, weights)
        return ReduceResult(sums, weights)

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None) -> IterStats:
        """One assignment, the sums, then the inertia of the assignment's distances and the
        labels changed: four launches and no host synchronisation."""
        if self.is_streamed(X):
            engine = self.stream_engine(X.data, centers.shape[0], sample_weight)
            return engine.lloyd_iter(X, centers, labels_old)
        with self.stage("assign"):
            X, labels, min_sq = self._assign(X, centers)
        w = self.weights(sample_weight, X.dtype)
        with self.stage("update"):
            sums, weights = self._reduce(X, labels, w, centers.shape[0])
        stats = self._cp.empty(2, dtype=np.float64)
        reductions.weighted_total(min_sq, w, stats[0:1], self.scratch)
        reductions.count_changed(labels, None if labels_old is None
                                 else self.labels32(labels_old), stats[1:2], self.scratch)
        return IterStats(labels, sums, weights, stats[0], stats[1])

    def inertia(self, X, sample_weight, centers, labels, *, xp=None):
        """0-d float64 sum of w * ||x - c_label||^2 by direct differences (numpy's rounding)."""
        if self.is_streamed(X):
            engine = self.stream_engine(X.data, centers.shape[0], sample_weight)
            return engine.inertia(X, centers, labels)
        X = self.contiguous(X)
        out = self._cp.empty(1, dtype=np.float64)
        reductions.direct_inertia(X, self.weights(sample_weight, X.dtype), self.labels32(labels),
                                  self.contiguous(centers, compute_dtype(X.dtype)), out,
                                  self.scratch)
        return out[0]

    def labels_inertia(self, X, sample_weight, centers, *, xp=None):
        """A streamed X: labels and direct inertia in one streamed pass, no distances
        brought back; else `assign` then `inertia`."""
        if self.is_streamed(X):
            engine = self.stream_engine(X.data, centers.shape[0], sample_weight)
            return engine.labels_inertia(X, centers)
        return super().labels_inertia(X, sample_weight, centers, xp=xp)

    def farthest(self, X, sample_weight, centers, labels, m, *, xp=None):
        """The m points farthest from their own centers (kmeans_xp.contract.backend.Farthest)."""
        if self.is_streamed(X):
            engine = self.stream_engine(X.data, centers.shape[0], sample_weight)
            return engine.farthest(X, centers, labels, m)
        X = self.contiguous(X)
        return reductions.farthest(X, self.weights(sample_weight, X.dtype), self.labels32(labels),
                                   self.contiguous(centers, compute_dtype(X.dtype)), m)

    def farthest_many(self, problems, *, xp=None):
        """`farthest` of a batch's device problems of one shape ranked together
        (`reductions.farthest_many`: a few launches for all); streamed or mixed problems, and
        those longer than a `farthest` chunk (the (P, n) keys and their sort would be large),
        problem by problem."""
        cp = self._cp
        Xs = [X for X, *_ in problems]
        if (len(problems) < 2 or len({(X.shape, str(X.dtype)) for X in Xs}) > 1
                or any(self.is_streamed(X) or not isinstance(X, cp.ndarray) for X in Xs)
                or Xs[0].shape[0] > reductions.FARTHEST_ROWS):
            return super().farthest_many(problems, xp=xp)
        return reductions.farthest_many(
            [(self.contiguous(X), self.weights(w, X.dtype), self.labels32(labels),
              self.contiguous(C, compute_dtype(X.dtype)), int(m))
             for X, w, C, labels, m in problems])

    def seeding(self, X, sample_weight, n_local_trials, *, xp=None):
        """k-means++'s steps in kernels (`seeding.DeviceSeeding`) on a device X, else None."""
        from .seeding import device_seeding
        return device_seeding(X, sample_weight, n_local_trials)

    @classmethod
    def seeding_bytes(cls, n_samples, n_features, n_clusters, itemsize, stream="auto"):
        """`seeding.device_seeding_bytes`; None for a fit streamed from the host (its
        k-means++ runs in xp code on the host rows)."""
        if stream is True:
            return None
        from .seeding import device_seeding_bytes
        return device_seeding_bytes(n_samples, n_features, n_clusters, itemsize)

    # -- host streaming ---------------------------------------------------------------------
    def stream_engine(self, X, n_clusters, sample_weight=None):
        """The fit's StreamEngine for X streamed from the host or the device (built on first
        use, kept until finish: X's page lock and the pinned buffers outlive a pass), planned
        for n_clusters."""
        from .streaming import StreamEngine
        cp = self._cp
        with self.stage("stream"):
            try:
                if self._engine is None or self._engine.X is not X:
                    self.release_buffers()
                    self._engine = StreamEngine(self, X, pin_input=self.pin_input)
                sw = sample_weight
                if sw is not None and isinstance(X, np.ndarray):
                    sw = np.asarray(sw)  # host X, host weights (a device X: device ones)
                return self._engine.configure(n_clusters, sw, self.stream_rows)
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise out_of_memory_error(f"{self.name} setting up host streaming", exc) from exc

    def stream_pass(self, engine, run):
        """run() (a streamed pass), its device peak recorded as the "stream" stage and its
        pinned host bytes as "pinned_host"; OOM becomes KMeansMemoryError."""
        cp = self._cp
        with self.stage("stream"):
            try:
                return run()
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise out_of_memory_error(
                    f"{self.name} streaming X (n={engine.n}, d={engine.d}) in chunks of "
                    f"{engine.plan.rows} rows", exc,
                    " Give a smaller backend_options['stream_rows'].") from exc
            finally:
                self.memory.record("pinned_host", engine.pinned_bytes)

    def stream_estimate(self, n, d, k, itemsize, *, weighted=False) -> MemoryEstimate:
        """Bytes of a fit streamed from the host, part by part (see `streaming.plan_stream`):
        device parts (their sum is `total`), then host parts (ending in _host)."""
        from .streaming import plan_stream
        what = f"{self.name} streaming X (n={n}, d={d}) from the host"
        with self.memory.explain(what, 0, "nothing else: X stays on the host", hint=STREAM_HINT):
            plan = plan_stream(
                n, d, k, itemsize, self.memory.bytes(), weighted=weighted, rows=self.stream_rows,
                what=what, work_bytes=lambda r, share: self.stream_work_bytes(
                    r, d, k, itemsize, share))
        self.drop_work_buffers()
        return MemoryEstimate(dict(plan.parts), plan.device_bytes, plan.rows)

    def stream_work_bytes(self, rows, d, k, itemsize, budget):
        raise NotImplementedError(f"{self.name} does not stream")
