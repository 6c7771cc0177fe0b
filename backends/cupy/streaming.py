"""Host streaming: X stays in host memory (a NumPy array or a `numpy.memmap`) and goes through
the GPU in chunks on every pass, for data larger than the device (or when asked). A mode of
cupy-kernels and cupy-chunked, through their per-chunk primitive `assign_chunk`. A CuPy X
whose centered copy would not fit beside it (`staging.DeviceRows`) goes through the same
pipeline from device memory: each chunk is copied device to device into a slot's buffer and
centered there, so the device holds X once.

- `plan_stream`: rows per chunk and slots in flight, from the device budget.
- `StreamEngine`: the pipeline. Each of `STREAM_SLOTS` slots owns device buffers (and pinned
  host buffers when X's own pages cannot be page-locked). For chunk c in slot s the host
  stages X's rows into the slot's pinned buffer (skipped when X is page-locked, `pin_input`),
  the copy stream moves them to the device, the compute stream (waiting on that copy's event)
  centers the chunk and runs the backend's primitive; per-cluster sums, the inertia and the
  labels changed accumulate on the device. Both streams are non-blocking, so chunk c's copy
  overlaps chunk c-1's compute; the host only waits before it reuses a slot. A pass starts
  after the work queued on the current stream (the driver's centers) and the current stream
  waits for its end: its results are device arrays, nothing is read back.
- Labels live on the device in the smallest type that holds k (uint8/uint16/int32), a new
  array per pass (the driver keeps three generations); the placement hands them to the user
  as int32.

Exact Lloyd: the same labels, centers and iterations as the numpy backend from the same
initial centers (cupy-kernels: the same arithmetic; cupy-chunked: up to cuBLAS near-ties).
The mean and tol come from one streamed pass (float64 sums; tol's variance is computed in
float64 about the first chunk's mean, so tol may differ from the driver's in its last bits).
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from kmeans_xp.contract.backend import AssignResult, IterStats, ReduceResult
from kmeans_xp.contract.chunks import tol_from_variances
from kmeans_xp.contract.memory import KMeansMemoryError, format_bytes

from . import common, nearest, reductions, staging
from .common import BLOCK, NULL, STREAM_HINT
from .staging import DeviceRows, HostRows, Pinned, all_ones

__all__ = ["DeviceRows", "HostRows", "StreamEngine", "plan_stream", "mean_and_tol"]

#: chunks in flight; the host waits before reusing a slot
STREAM_SLOTS = 3
#: bytes of X per chunk when the budget allows: large against the per-chunk Python work,
#: small enough that filling and draining the pipeline costs a few percent of a pass
TARGET_CHUNK_BYTES = 256 << 20
#: fewer rows per chunk than this and streaming gives up (KMeansMemoryError)
MIN_STREAM_ROWS = 1024
#: centers, sums, operands and scalars on the device besides the per-row buffers
FIXED_SLACK = 64 << 10


class StreamPlan(NamedTuple):
    rows: int              # rows per chunk
    slots: int             # chunks in flight
    store_dtype: np.dtype  # the per-point labels
    parts: dict            # bytes per part (device parts, then *_host parts)

    @property
    def device_bytes(self):
        return sum(v for k, v in self.parts.items() if not k.endswith("_host"))

    @property
    def host_bytes(self):
        return sum(v for k, v in self.parts.items() if k.endswith("_host"))


def plan_stream(n, d, k, itemsize, budget, *, work_bytes, weighted=True, rows=None,
                slots=STREAM_SLOTS, what="streaming"):
    """Rows per chunk so that the device buffers fit in `budget` bytes. work_bytes(rows,
    share) -> bytes of the backend's own per-chunk working memory (cupy-chunked's GEMM blocks)
    planned within `share` bytes. Device: per slot X, weights, int32 labels and distances of
    one chunk, the backend's working memory, centers and sums, and the labels of three
    iterations (the driver keeps the last, the one before and the next one issued ahead), in
    the smallest type that holds k. Host: per slot pinned X and weights (staging), and the
    distances an assignment returns (n values; only the final assignment and predict ask)."""
    store_dtype = nearest.label_store_dtype(k)
    stride = nearest.ops_stride(d, itemsize)
    fixed = 2 * k * (d + 1) * 8 + 2 * k * stride * itemsize + FIXED_SLACK
    labels = 3 * n * store_dtype.itemsize
    room = budget - fixed - labels
    x_row = d * itemsize
    w_row = itemsize if weighted else 0
    per_row = slots * (x_row + w_row + 4 + itemsize)
    floor = min(n, MIN_STREAM_ROWS)
    want = int(min(n, rows or max(floor, TARGET_CHUNK_BYTES // x_row)))
    try:
        work = int(work_bytes(max(want, floor), max(room // 4, 0)))
    except KMeansMemoryError as exc:
        raise KMeansMemoryError(
            f"{what}: the per-chunk working memory does not fit ({exc})",
            needed=fixed + labels + floor * per_row + (exc.needed or 0),
            allowed=budget) from exc
    got = (room - work) // per_row
    if got < floor:
        needed = fixed + labels + work + floor * per_row
        raise KMeansMemoryError(
            f"{what} needs at least {format_bytes(needed)} of device memory (chunks of "
            f"{floor} rows in {slots} slots, {format_bytes(work)} of working memory, three "
            f"iterations' labels, centers and sums), but max_memory allows "
            f"{format_bytes(budget)}", needed=needed, allowed=budget)
    rows = int(min(want, got))
    parts = {
        "stream_buffers": rows * per_row,
        "chunk_buffers": work,
        "centers_and_sums": fixed,
        "labels": labels,
        "pinned_host": slots * rows * (x_row + w_row),
        "assign_distances_host": n * itemsize,
    }
    return StreamPlan(rows, slots, store_dtype, parts)


class StreamEngine:
    """Streams a host X (and its weights) through one CuPy backend, pass after pass. Buffers
    are allocated on the first pass that needs them and kept until `close`."""

    def __init__(self, backend, X, *, pin_input="auto"):
        # a weak reference: the backend owns the engine; one that outlives its backend
        # (predict's backend is never finished) must be freed, X's pages unlocked
        self.backend, self.cp = weakref.proxy(backend), backend._cp
        self.X = X
        self.n, self.d = X.shape
        self.dtype = X.dtype
        cp = self.cp
        self.copy_in = cp.cuda.Stream(non_blocking=True)
        self.compute = cp.cuda.Stream(non_blocking=True)
        self._dev, self._pinned = {}, {}
        self._registered, self._direct = [], {}
        self._mean = None
        self.k = self.sw = self.plan = self._rows = None
        self.unit_weights = True
        self.running = False
        self.scratch = None
        if pin_input is True or (pin_input == "auto" and staging.lockable(X)):
            self._register(X)

    def configure(self, k, sample_weight=None, rows=None):
        """Plan the chunks for k clusters and these weights (None: unit weights); buffers
        of an earlier plan are dropped when the plan changes."""
        same_w = sample_weight is self.sw or (sample_weight is None and self.unit_weights)
        if self.plan is not None and self.k == k and same_w and rows == self._rows:
            return self
        unit = sample_weight is None or all_ones(sample_weight)
        self.synchronize()  # the old plan's buffers may be in use
        self._dev, self.plan = {}, None
        b, (n, d), itemsize = self.backend, self.X.shape, self.dtype.itemsize
        b.drop_work_buffers()
        what = f"{b.name} streaming X (n={n}, d={d}, {self.dtype}) from the host"
        with b.memory.explain(what, 0, "nothing else: X stays on the host", hint=STREAM_HINT):
            plan = plan_stream(n, d, int(k), itemsize, b.memory.bytes(), weighted=not unit,
                               rows=rows, what=what,
                               work_bytes=lambda r, share: b.stream_work_bytes(
                                   r, d, int(k), itemsize, share))
        self.k, self.plan, self._rows = int(k), plan, rows
        self.sw, self.unit_weights = sample_weight, unit
        if not unit and id(sample_weight) not in self._direct and id(self.X) in self._direct:
            self._register(sample_weight)
        cp = self.cp
        self.ev_in = [cp.cuda.Event(disable_timing=True) for _ in range(plan.slots)]
        self.ev_compute = [cp.cuda.Event(disable_timing=True) for _ in range(plan.slots)]
        self._slot_used = [False] * plan.slots
        if self.scratch is None:
            with self.compute:
                self.scratch = reductions.Scratch()
        return self

    def synchronize(self):
        for stream in (self.copy_in, self.compute):
            stream.synchronize()

    # -- buffers ----------------------------------------------------------------------------
    def _register(self, a):
        """Page-lock a's own memory so copies read it directly; False where CUDA refuses."""
        if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.nbytes):
            return False
        rt = self.cp.cuda.runtime
        flags = 0 if a.flags.writeable else 8  # cudaHostRegisterReadOnly
        try:
            rt.hostRegister(a.ctypes.data, a.nbytes, flags)
        except Exception:  # noqa: BLE001 - any refusal: stage through pinned buffers instead
            return False
        self._registered.append(a.ctypes.data)
        self._direct[id(a)] = True
        return True

    def _device(self, name, slot, shape, dtype):
        key = (name, slot)
        buf = self._dev.get(key)
        if buf is None:
            buf = self._dev[key] = common.device_empty(shape, dtype, f"the streamed {name}")
        return buf

    def _pinned_buf(self, name, slot, shape, dtype):
        key = (name, slot)
        buf = self._pinned.get(key)
        if buf is None or buf.array.shape != shape or buf.array.dtype != dtype:
            buf = self._pinned[key] = Pinned(self.cp, shape, dtype)
        return buf.array

    @property
    def pinned_bytes(self):
        return sum(b.nbytes for b in self._pinned.values())

    def _source(self, name, a, slot, c0, c1):
        """Rows c0:c1 of `a` as a copy source: a itself when registered or on the device,
        else staged into the slot's pinned buffer."""
        if id(a) in self._direct or not isinstance(a, np.ndarray):
            return a[c0:c1]
        buf = self._pinned_buf(name, slot, (self.plan.rows,) + a.shape[1:], a.dtype)
        view = buf[: c1 - c0]
        staging.parallel_copy(view, a[c0:c1], staging.copy_pool)
        return view

    def _mean_on_device(self, mean):
        if not isinstance(mean, np.ndarray):
            return mean  # a device X's (DeviceRows): on the device, in X's dtype
        if self._mean is None or not np.array_equal(self._mean[0], mean):
            with self.compute:
                self._mean = (np.array(mean, copy=True), self.cp.asarray(mean, dtype=self.dtype))
        return self._mean[1]

    # -- one pass ---------------------------------------------------------------------------
    def run(self, mean, *, centers=None, labels_in=None, labels_old=None, labels_new=None,
            accumulate=False, distance_inertia=False, direct_inertia=False, min_out=None,
            top=None, column_stats=None):
        """Stream X once, centering each chunk by `mean` on the device. centers (device):
        assign each chunk with the backend's primitive; or labels_in (device, n): use those.
        Then: labels_new (device, n): store the labels, counting those that differ from
        labels_old (into stats[1]); accumulate: float64 sums and weights; distance_inertia /
        direct_inertia: sum of w times the assignment's / the direct distances (stats[0]);
        min_out (host, n): the distances (copied chunk by chunk, synchronously);
        top (reductions.TopKeys): relocation keys; column_stats (a dict): column sums and
        squares of the raw chunks."""
        cp, p, b = self.cp, self.plan, self.backend
        n, d, rows, S = self.n, self.d, p.rows, p.slots
        assign = centers is not None and labels_in is None
        need_w = accumulate or distance_inertia or direct_inertia or top is not None
        n_chunks = -(-n // rows)
        start = cp.cuda.Event(disable_timing=True)
        start.record()  # after the work queued on the current stream (centers, old labels)
        self.compute.wait_event(start)
        with self.compute:
            state = b.chunk_centers(centers, self.dtype) if assign else None
            C = None if centers is None else cp.ascontiguousarray(cp.asarray(centers),
                                                                  dtype=self.dtype)
            mean_dev = None if column_stats is not None else self._mean_on_device(mean)
            sums = cp.zeros((self.k, d), dtype=cp.float64) if accumulate else None
            weights = cp.zeros(self.k, dtype=cp.float64) if accumulate else None
            inertia = cp.zeros(n_chunks, dtype=cp.float64)
            changed = cp.zeros(1, dtype=cp.uint64)
        self.running = True
        try:
            for c, c0 in enumerate(range(0, n, rows)):
                s = c % S
                c1 = min(c0 + rows, n)
                m = c1 - c0
                if self._slot_used[s]:
                    # the slot's previous chunk, of this pass or the one before, must be done
                    # with its buffers: a page-locked X is copied in at once, and overwrote a
                    # chunk the previous pass was still computing on (n=1e9: inertia 1.8x)
                    self.ev_compute[s].synchronize()
                Xd = self._device("X", s, (rows, d), self.dtype)[:m]
                src_x = self._source("X", self.X, s, c0, c1)
                wd = None
                if need_w and not self.unit_weights:
                    wd = self._device("w", s, (rows,), self.dtype)[:m]
                    src_w = self._source("w", self.sw, s, c0, c1)
                with self.copy_in:
                    staging.copy_to_device(Xd, src_x, self.copy_in)
                    if wd is not None:
                        staging.copy_to_device(wd, src_w, self.copy_in)
                    self.ev_in[s].record(self.copy_in)
                self.compute.wait_event(self.ev_in[s])
                with self.compute:
                    if column_stats is not None:
                        _column_stats(Xd, column_stats)
                    else:
                        self._chunk(Xd, wd, c, c0, c1, state, C, mean_dev, labels_in,
                                    labels_old, labels_new, sums, weights, inertia, changed,
                                    distance_inertia, direct_inertia, min_out, top)
                    self.ev_compute[s].record(self.compute)
                    self._slot_used[s] = True
        finally:
            self.running = False
        with self.compute:
            stats = cp.empty(2, dtype=cp.float64)
            stats[0] = inertia.sum()
            stats[1] = float(n) if labels_old is None else changed[0].astype(cp.float64)
            end = cp.cuda.Event(disable_timing=True)
            end.record(self.compute)
        cp.cuda.get_current_stream().wait_event(end)
        return sums, weights, stats

    def _chunk(self, Xd, wd, c, c0, c1, state, C, mean_dev, labels_in, labels_old,
               labels_new, sums, weights, inertia, changed, distance_inertia, direct_inertia,
               min_out, top):
        s, m = c % self.plan.slots, c1 - c0
        Xd -= mean_dev
        lab = self._device("labels", s, (self.plan.rows,), np.int32)[:m]
        dist = self._device("dist", s, (self.plan.rows,), self.dtype)[:m]
        if labels_in is not None:
            lab[...] = labels_in[c0:c1]
        else:
            self.backend.assign_chunk(Xd, state, lab, dist)
        if labels_new is not None:
            old = None if labels_old is None else labels_old[c0:c1]
            store_labels(lab, old, labels_new[c0:c1], changed)
        if min_out is not None:
            staging.copy_to_host_blocking(min_out[c0:c1], dist, self.compute)
        if sums is not None:
            nearest.cluster_sums(Xd, lab, wd, sums, weights)
        if direct_inertia or top is not None:
            reductions.labelled_sq_dist(Xd, lab, C, dist)
        if distance_inertia or direct_inertia:
            reductions.weighted_total(dist, wd, inertia[c:c + 1], self.scratch)
        if top is not None:
            keys = dist if wd is None else self.cp.where(wd > 0, dist, dist.dtype.type(-1))
            top.add(keys, c0)  # zero-weight points (key -1) are never relocated

    # -- what the driver asks for -----------------------------------------------------------
    def _labels(self, labels):
        cp = self.cp
        labels = cp.asarray(labels)
        dt = self.plan.store_dtype
        return labels if labels.dtype == dt else labels.astype(dt)

    def _new_labels(self):
        return common.device_empty((self.n,), self.plan.store_dtype, "labels")

    def lloyd_iter(self, X, centers, labels_old):
        labels = self._new_labels()
        old = None if labels_old is None else self._labels(labels_old)
        sums, weights, stats = self.backend.stream_pass(self, lambda: self.run(
            X.mean, centers=centers, labels_old=old, labels_new=labels, accumulate=True,
            distance_inertia=True))
        return IterStats(labels, sums, weights, stats[0], stats[1])

    def assign(self, X, centers):
        labels = self._new_labels()
        min_sq = np.empty(self.n, dtype=self.dtype)  # on the host: n values need not fit
        self.backend.stream_pass(self, lambda: self.run(X.mean, centers=centers,
                                                        labels_new=labels, min_out=min_sq))
        return AssignResult(labels, min_sq)

    def labels_inertia(self, X, centers):
        labels = self._new_labels()
        _, _, stats = self.backend.stream_pass(self, lambda: self.run(
            X.mean, centers=centers, labels_new=labels, direct_inertia=True))
        return labels, stats[0]

    def reduce(self, X, labels):
        sums, weights, _ = self.backend.stream_pass(self, lambda: self.run(
            X.mean, labels_in=self._labels(labels), accumulate=True))
        return ReduceResult(sums, weights)

    def inertia(self, X, centers, labels):
        _, _, stats = self.backend.stream_pass(self, lambda: self.run(
            X.mean, centers=centers, labels_in=self._labels(labels), direct_inertia=True))
        return stats[0]

    def farthest(self, X, centers, labels, m):
        top = reductions.TopKeys(m, weighted=not self.unit_weights)
        self.backend.stream_pass(self, lambda: self.run(
            X.mean, centers=centers, labels_in=self._labels(labels), top=top))
        cp = self.cp
        sw = self.sw if not self.unit_weights else None
        return reductions.gather_farthest(
            top, lambda idx: cp.asarray(X[cp.asnumpy(idx)]),
            lambda idx: None if sw is None else cp.asarray(sw[cp.asnumpy(idx)]),
            self._labels(labels))

    def stats(self, need_var):
        """(float64 per-feature mean, per-feature variance or None) of X in one pass."""
        acc = {}
        self.run(None, column_stats=acc)
        self.compute.synchronize()
        host = self.cp.asnumpy
        mean64 = host(acc["sum"]) / self.n
        if not need_var:
            return mean64, None
        shift = host(acc["shift"])
        # sum (x - s)^2 = sum (x - mean)^2 + n (mean - s)^2
        var = np.maximum(host(acc["sq"]) / self.n - (mean64 - shift) ** 2, 0.0)
        return mean64, var

    def __del__(self):
        try:  # a fit that failed never reached finish(): X's pages must not stay locked
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, CUDA gone
            pass

    def close(self):
        """Wait for the streams, unregister X's pages, drop every buffer. Safe twice."""
        self.synchronize()
        rt = self.cp.cuda.runtime
        for ptr in self._registered:
            try:
                rt.hostUnregister(ptr)
            except Exception:  # noqa: BLE001 - nothing more to do for it
                pass
        self._registered, self._direct = [], {}
        self._dev, self._pinned, self._mean = {}, {}, None


def store_labels(lab, old, out, changed):
    """out[:] = lab (int32 into out's compact type), changed += #(old != lab) (old None: 0)."""
    m = lab.shape[0]
    if m == 0:
        return
    fn = common.raw_kernel("stats.cu", f"store_labels<{nearest.LABEL_STORE_CTYPE[out.dtype]}>")
    common.launch(fn, common.grid(m, BLOCK * 8),
                  (lab, NULL if old is None else old, out, np.int64(m), changed))


def _column_stats(Xd, acc):
    """Column sums of the chunk, and squares about the first chunk's mean (its shift), kept
    on the device (no sync per chunk)."""
    cp = common.cupy()
    m, d = Xd.shape
    if m == 0:
        return
    if "shift" not in acc:
        part = reductions.moments_partials(Xd, None)
        acc["shift"] = part[0].reshape(-1, d).sum(axis=0) / m
        acc["sum"] = cp.zeros(d, dtype=cp.float64)
        acc["sq"] = cp.zeros(d, dtype=cp.float64)
    part = reductions.moments_partials(Xd, acc["shift"])
    acc["sum"] += part[0].reshape(-1, d).sum(axis=0)
    acc["sq"] += part[1].reshape(-1, d).sum(axis=0)


def mean_and_tol(engine, tol):
    """(mean in X's dtype, absolute tol) from one streamed pass (see the module's note)."""
    mean64, var = engine.stats(need_var=tol != 0)
    return mean64.astype(engine.dtype), tol_from_variances(var, tol)
