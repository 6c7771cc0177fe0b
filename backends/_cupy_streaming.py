"""Host streaming: X stays in host memory (a NumPy array or a `numpy.memmap`) and goes through
the GPU in chunks on every pass, for data larger than the device (or when asked).

The pieces, all driven by `CupyBackendBase` (a mode of cupy-kernels and cupy-chunked, through
their per-chunk primitive `assign_chunk`):

- `HostRows`: X seen mean-centered without a centered copy. The estimator's `center` hook
  returns it instead of `X - mean` (which would copy all of X, or all of a memmap): the
  driver's own host passes (init, relocation of empty clusters, score) read centered row
  chunks from it, and the device subtracts the mean from each streamed chunk, with the same
  IEEE rounding as NumPy's `X - mean`.
- `plan_stream`: rows per chunk, slots in flight, and where the per-point label store lives,
  from the device budget (`max_memory`, "auto": free device memory and the pool limit).
- `StreamEngine`: the pipeline. Each of `STREAM_SLOTS` slots owns pinned host buffers
  (cupy.cuda.alloc_pinned_memory) and device buffers. For chunk c in slot s the host stages
  X's rows into the slot's pinned buffer (several threads: NumPy releases the GIL in copies;
  skipped when X's own pages could be page-locked with cudaHostRegister, see `pin_input`),
  the copy stream moves them to the device, the compute stream (waiting on that copy's
  event) centers the chunk and runs the backend's primitive, per-cluster float64 sums
  accumulate on the device across chunks, and the results the host asked for (labels,
  distances) come back on a third stream into pinned buffers. All three streams are
  non-blocking, so chunk c's copy overlaps chunk c-1's compute and chunk c-2's copy back;
  the host only waits before it reuses a slot. One pass ends with one synchronisation.
- `stream_lloyd`: the driver's Lloyd run (`kmeans_xp.lloyd`; `_device_loop` is the same
  loop for device-resident X) with its O(n) bookkeeping done on the device during the pass:
  inertia from the streamed distances, labels changed against a per-point label store
  (uint8/uint16/int32 as k needs; on the device when it fits in half the budget, else in
  pinned host memory, copied with each chunk). Labels reach the host only at the end, or
  when an empty cluster must be relocated (the driver's `relocate_empty`, on `HostRows`).

Exact Lloyd: the same labels, centers and iterations as the numpy backend from the same
initial centers (cupy-kernels: the same arithmetic; cupy-chunked: up to cuBLAS near-ties).
The mean and tol come from one streamed pass (float64 sums; tol's variance is computed in
float64 about a shift, not in X's dtype as np.var does, so tol may differ in its last bits).
"""
from __future__ import annotations

import functools
import mmap
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from kmeans_xp.lloyd import LloydResult, new_centers, relocate_empty, stop_reason
from kmeans_xp.memory import KMeansMemoryError, format_bytes, host_available_memory

from . import _cupy_kmeans_kernels as kernels

#: chunks in flight (copy in, compute, copy out); the host waits before reusing a slot
STREAM_SLOTS = 3
#: bytes of X per chunk when the budget allows: large enough that the per-chunk Python work
#: (tens of microseconds) is small against its copy (~5 ms at 50 GB/s), small enough that
#: filling and draining the pipeline costs a few percent of a pass
TARGET_CHUNK_BYTES = 256 << 20
#: fewer rows per chunk than this and streaming gives up (KMeansMemoryError)
MIN_STREAM_ROWS = 1024
#: host threads copying X into the pinned buffers (and back out): on the H200 host (16
#: cores) the copy rate grows up to about this many (benchmarks/streaming_probe.py measures it)
STAGING_THREADS = max(1, min(16, os.cpu_count() or 2))
#: a memmap is page-locked in place (read into RAM once, then copied at the full DMA rate)
#: when it takes at most this share of the host's available memory; a larger one is staged
MEMMAP_LOCK_SHARE = 0.5
#: rows per staging thread below which fewer threads are used
STAGING_MIN_ROWS = 1 << 16
#: centers, sums, operands and scalars on the device besides the per-row buffers
FIXED_SLACK = 64 << 10


class HostRows:
    """X on the host seen mean-centered (X - mean), without a centered copy of X.

    Row selections (`X[rows]`, `X[rows, ...]`, `X[rows, :]`, `np.take(X, idx, axis=0)`) give
    centered NumPy arrays, as `X - mean` would, row for row and bit for bit; `np.asarray`
    makes the full centered copy (transform does, its output is n x k anyway). The streaming
    backend reads `data` and `mean` and centers each chunk on the device."""

    ndim = 2
    device = "cpu"

    def __init__(self, data, mean):
        self.data = data
        self.mean = np.asarray(mean, dtype=data.dtype)
        self.shape = data.shape
        self.dtype = data.dtype

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, tuple):
            if len(key) == 2 and (key[1] is Ellipsis or key[1] == slice(None)):
                key = key[0]
            else:
                raise TypeError(f"HostRows selects whole rows, not {key!r}")
        return np.subtract(self.data[key], self.mean)

    def take(self, indices, axis=None, out=None, mode="raise"):
        if axis != 0 or out is not None:
            raise TypeError("HostRows.take gathers rows: axis=0, no out")
        return np.subtract(np.take(self.data, indices, axis=0, mode=mode), self.mean)

    def __array__(self, dtype=None, copy=None):
        centered = np.subtract(self.data, self.mean)
        return centered if dtype is None else centered.astype(dtype, copy=False)

    def __repr__(self):
        return f"HostRows(shape={self.shape}, dtype={self.dtype})"


def is_memmap(X) -> bool:
    """Whether X's memory is a mapped file (np.memmap or a view of an mmap)."""
    a = X
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


#: the host's available memory (MemAvailable), or None where it cannot be read
available_host_bytes = functools.partial(host_available_memory, default=None)


def lockable(X) -> bool:
    """Whether pin_input="auto" page-locks X: an in-memory array always (its pages are
    resident already; locking only keeps them so), a memmap when it fits comfortably in the
    available memory (locking reads it in and keeps it resident for the fit)."""
    if not is_memmap(X):
        return True
    avail = available_host_bytes()
    return avail is not None and X.nbytes <= MEMMAP_LOCK_SHARE * avail


class StreamPlan(NamedTuple):
    rows: int              # rows per chunk
    slots: int             # chunks in flight
    store_dtype: np.dtype  # per-point label store
    store_on_device: bool  # else in pinned host memory, copied with each chunk
    parts: dict            # bytes per part (device parts, then *_host parts)

    @property
    def device_bytes(self):
        return sum(v for k, v in self.parts.items() if not k.endswith("_host"))

    @property
    def host_bytes(self):
        return sum(v for k, v in self.parts.items() if k.endswith("_host"))


def plan_stream(n, d, k, itemsize, budget, *, work_bytes, weighted=True, rows=None,
                slots=STREAM_SLOTS, what="streaming"):
    """Rows per chunk and where the label store lives, so that the device buffers fit in
    `budget` bytes. work_bytes(rows, share) -> bytes of the backend's own per-chunk working
    memory (cupy-chunked's GEMM blocks) planned within `share` bytes.

    Device: the label store (n values; on the device when it takes at most half of what is
    left), per slot X, weights (or one shared block of ones when all weights are 1), int64
    labels and distances of one chunk (and the chunk's label store copy when the store is on
    the host), the backend's working memory, centers and sums. Host: per slot pinned X and
    weights (staging), labels and distances (copy out), and the store when it lives there.
    """
    store_dtype = kernels.label_store_dtype(k)
    store_bytes = n * store_dtype.itemsize
    stride = kernels.ops_stride(d, itemsize)
    fixed = 2 * k * (d + 1) * 8 + 2 * k * stride * itemsize + FIXED_SLACK
    room = budget - fixed
    store_on_device = store_bytes <= room // 2
    if store_on_device:
        room -= store_bytes
    x_row = d * itemsize
    w_row = itemsize if weighted else 0
    per_row = slots * (x_row + w_row + 8 + itemsize
                       + (0 if store_on_device else store_dtype.itemsize))
    per_row += 0 if weighted else itemsize  # the shared block of ones
    floor = min(n, MIN_STREAM_ROWS)
    want = int(min(n, rows or max(floor, TARGET_CHUNK_BYTES // x_row)))
    try:
        work = int(work_bytes(max(want, floor), max(room // 4, 0)))
    except KMeansMemoryError as exc:
        raise KMeansMemoryError(
            f"{what}: the per-chunk working memory does not fit ({exc})",
            needed=fixed + floor * per_row + (exc.needed or 0), allowed=budget) from exc
    got = (room - work) // per_row
    if got < floor:
        needed = fixed + work + floor * per_row + (store_bytes if store_on_device else 0)
        raise KMeansMemoryError(
            f"{what} needs at least {format_bytes(needed)} of device memory (chunks of "
            f"{floor} rows in {slots} slots, {format_bytes(work)} of working memory, "
            f"centers and sums), but max_memory allows {format_bytes(budget)}",
            needed=needed, allowed=budget)
    rows = int(min(want, got))
    parts = {
        "label_store": store_bytes if store_on_device else 0,
        "stream_buffers": rows * per_row,
        "chunk_buffers": work,
        "centers_and_sums": fixed,
        "pinned_host": slots * rows * (x_row + w_row + 8 + itemsize),
        "label_store_host": 0 if store_on_device else store_bytes,
    }
    return StreamPlan(rows, slots, store_dtype, store_on_device, parts)


def copy_to_device(dst, src, stream):
    """Asynchronous host -> device copy on `stream` (src pinned or registered)."""
    dst.set(src, stream=stream)


def copy_to_host(dst, src, stream):
    """Asynchronous device -> host copy on `stream` into pinned `dst`."""
    src.get(stream=stream, out=dst, blocking=False)


class PassResult(NamedTuple):
    sums: object       # (k, d) float64 host, or None
    weights: object    # (k,) float64 host, or None
    inertia: float     # sum of w * distance (the streamed distances, or direct ones)
    changed: int       # labels that differ from the store (store="update")
    labels: object     # (n,) int64 host, or None
    min_sq: object     # (n,) host, or None


class _Pinned:
    """A pinned host buffer viewed as a NumPy array (the allocation kept alive with it)."""

    def __init__(self, cp, shape, dtype):
        count = int(np.prod(shape))
        self.mem = cp.cuda.alloc_pinned_memory(max(count * np.dtype(dtype).itemsize, 1))
        self.array = np.frombuffer(self.mem, dtype=dtype, count=count).reshape(shape)
        self.nbytes = count * np.dtype(dtype).itemsize


class StreamEngine:
    """Streams a host X (and its weights) through one CuPy backend, pass after pass.

    backend: a CupyBackendBase with `chunk_centers(centers, dtype)` and
    `assign_chunk(X, state, labels, min_sq)` (the per-chunk primitive) and
    `stream_work_bytes(rows, d, k, itemsize, share)`. Buffers are allocated once, on the
    first pass that needs them, and kept until `close`."""

    def __init__(self, backend, X, *, pin_input="auto"):
        # a weak reference: the backend owns the engine, and an engine that outlives its
        # backend (predict's backend is never finished) must be freed, X's pages unlocked
        self.backend, self.cp = weakref.proxy(backend), backend._cp
        self.X = X
        self.n, self.d = X.shape
        self.dtype = X.dtype
        cp = self.cp
        self.copy_in = cp.cuda.Stream(non_blocking=True)
        self.compute = cp.cuda.Stream(non_blocking=True)
        self.copy_out = cp.cuda.Stream(non_blocking=True)
        self._dev, self._pinned = {}, {}
        self._registered = []
        self._pool = None
        self._store = None
        self._mean = None
        self.k = self.sw = self.plan = self._rows = None
        self.unit_weights = True
        self._direct = {}  # host inputs whose own pages are page-locked (no staging)
        self._pin_input = pin_input
        if pin_input is True or (pin_input == "auto" and lockable(X)):
            self._register(X)

    def configure(self, k, sample_weight=None, rows=None):
        """Plan the chunks for k clusters and these weights (None: all ones, as for the
        column statistics); buffers of an earlier plan are dropped when the plan changes."""
        same_w = sample_weight is self.sw or (sample_weight is None and self.unit_weights)
        if self.plan is not None and self.k == k and same_w and rows == self._rows:
            return self
        unit = sample_weight is None or (sample_weight is self.sw and self.unit_weights) \
            or _all_ones(sample_weight)
        # drop the old plan's device buffers first: the new plan may use their memory
        self.synchronize()
        self._dev, self._store, self.plan = {}, None, None
        self.backend.drop_work_buffers()
        backend, (n, d), itemsize = self.backend, self.X.shape, self.dtype.itemsize
        what = f"{backend.name} streaming X (n={n}, d={d}, {self.dtype}) from the host"
        with backend.explain_device_budget(what, 0, "nothing else: X stays on the host",
                                           hint=backend.STREAM_HINT):
            plan = plan_stream(
                n, d, int(k), itemsize, backend.budget(), weighted=not unit, rows=rows,
                what=what, work_bytes=lambda r, share: backend.stream_work_bytes(
                    r, d, int(k), itemsize, share))
        self.k, self.plan, self._rows = int(k), plan, rows
        self.sw = sample_weight
        self.unit_weights = unit
        if (not unit and id(sample_weight) not in self._direct and id(self.X) in self._direct):
            self._register(sample_weight)
        S = plan.slots
        cp = self.cp
        self.ev_in = [cp.cuda.Event(disable_timing=True) for _ in range(S)]
        self.ev_compute = [cp.cuda.Event(disable_timing=True) for _ in range(S)]
        self.ev_out = [cp.cuda.Event(disable_timing=True) for _ in range(S)]
        return self

    def synchronize(self):
        for stream in (self.copy_in, self.compute, self.copy_out):
            stream.synchronize()

    # -- buffers ----------------------------------------------------------------------------
    def _register(self, a):
        """Page-lock a's own memory so copies read it directly; False where CUDA refuses
        (a memmap, read-only pages without driver support, memory already registered)."""
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
            buf = self._dev[key] = self.backend.device_empty(shape, dtype, f"the streamed {name}")
        return buf

    def _pinned_buf(self, name, slot, shape, dtype):
        key = (name, slot)
        buf = self._pinned.get(key)
        if buf is None or buf.array.shape != shape or buf.array.dtype != dtype:
            buf = self._pinned[key] = _Pinned(self.cp, shape, dtype)
        return buf.array

    @property
    def pinned_bytes(self):
        """Pinned host bytes held now (staging and copy-out buffers, a host label store)."""
        store = self._store.nbytes if isinstance(self._store, _Pinned) else 0
        return sum(b.nbytes for b in self._pinned.values()) + store

    def _ones(self):
        buf = self._dev.get(("ones", 0))
        if buf is None:
            with self.compute:
                buf = self._dev[("ones", 0)] = self.cp.ones(self.plan.rows, dtype=self.dtype)
        return buf

    def _label_store(self):
        if self._store is None:
            p = self.plan
            if p.store_on_device:
                self._store = self.backend.device_empty((self.n,), p.store_dtype,
                                                         "per-point label store")
            else:
                self._store = _Pinned(self.cp, (self.n,), p.store_dtype)
        return self._store

    def _mean_on_device(self, mean):
        if mean is None:
            return None
        if self._mean is None or not np.array_equal(self._mean[0], mean):
            self._mean = (np.array(mean, copy=True), self.cp.asarray(mean, dtype=self.dtype))
        return self._mean[1]

    def _threads(self):
        if self._pool is None:
            self._pool = ThreadPoolExecutor(STAGING_THREADS, thread_name_prefix="kmeans-stage")
        return self._pool

    def _parallel_copy(self, dst, src):
        """dst[...] = src with several threads for large chunks (copies release the GIL)."""
        m = dst.shape[0]
        parts = min(STAGING_THREADS, max(1, m // STAGING_MIN_ROWS))
        if parts == 1:
            np.copyto(dst, src, casting="unsafe")
            return
        bounds = [m * i // parts for i in range(parts + 1)]
        list(self._threads().map(
            lambda i: np.copyto(dst[bounds[i]:bounds[i + 1]], src[bounds[i]:bounds[i + 1]],
                                casting="unsafe"), range(parts)))

    def _source(self, name, a, slot, c0, c1):
        """Rows c0:c1 of host array `a` as a copy source: a itself when registered, else
        staged into the slot's pinned buffer."""
        if id(a) in self._direct:
            return a[c0:c1]
        buf = self._pinned_buf(name, slot, (self.plan.rows,) + a.shape[1:], a.dtype)
        view = buf[: c1 - c0]
        self._parallel_copy(view, a[c0:c1])
        return view

    # -- one pass ---------------------------------------------------------------------------
    def run(self, centers=None, *, mean=None, accumulate=False, store=None, labels_in=None,
            direct_inertia=False, distance_inertia=False, labels_out=False, min_out=False,
            column_stats=False):
        """Stream X once. centers: host (k, d) for the assignment (the backend primitive);
        mean: subtracted from every chunk on the device. labels_in: host int64 labels
        instead of an assignment; store="read": the label store's labels instead. Then:
        accumulate: per-cluster float64 sums and weights; store="update": count labels that
        changed against the store and write them; distance_inertia: sum of w times the
        assignment's distances; direct_inertia: sum of w times ||x - c_label||^2 by
        differences; labels_out/min_out: labels (int64) / distances back on the host;
        column_stats: (float64 column sums, float64 sums of squares about the first chunk's
        mean, that mean) instead of all of that."""
        cp, p, b = self.cp, self.plan, self.backend
        n, d, rows, S = self.n, self.d, p.rows, p.slots
        assign = centers is not None and labels_in is None and store != "read"
        need_w = accumulate or direct_inertia or distance_inertia
        need_x = assign or accumulate or direct_inertia or column_stats
        store_buf = self._label_store() if store else None
        labels = np.empty(n, dtype=np.int64) if labels_out else None
        mins = np.empty(n, dtype=self.dtype) if min_out else None
        # uploads on the compute stream: the chunks' kernels are ordered after them (the
        # streams do not synchronise with the default stream)
        with self.compute:
            state = b.chunk_centers(centers, self.dtype) if assign else None
            C_dev = cp.asarray(centers, dtype=self.dtype) if direct_inertia else None
            mean_dev = self._mean_on_device(mean)
            sums = cp.zeros((self.k, d), dtype=cp.float64) if accumulate else None
            weights = cp.zeros(self.k, dtype=cp.float64) if accumulate else None
            inertia = cp.zeros((), dtype=cp.float64)
            changed = cp.zeros(1, dtype=cp.uint64)
            col_sum = cp.zeros(d, dtype=cp.float64) if column_stats else None
            col_sq = cp.zeros(d, dtype=cp.float64) if column_stats else None
        shift = None
        pending = [None] * S
        for c, c0 in enumerate(range(0, n, rows)):
            s = c % S
            c1 = min(c0 + rows, n)
            m = c1 - c0
            if pending[s] is not None:  # the slot's previous chunk must be done with it
                self._drain(pending[s], labels, mins)
                pending[s] = None
            # host -> device
            Xd = self._device("X", s, (rows, d), self.dtype)[:m]
            src_x = self._source("X", self.X, s, c0, c1) if need_x else None
            wd = None
            if need_w:
                if self.unit_weights:
                    wd = self._ones()[:m]
                else:
                    wd = self._device("w", s, (rows,), self.dtype)[:m]
                    src_w = self._source("w", self.sw, s, c0, c1)
            lab = self._device("labels", s, (rows,), np.int64)[:m]
            dist = self._device("dist", s, (rows,), self.dtype)[:m]
            if labels_in is not None:
                src_l = self._source("labels_in", labels_in, s, c0, c1)
            store_dev = None
            if store_buf is not None:
                if p.store_on_device:
                    store_dev = store_buf[c0:c1]
                else:
                    store_dev = self._device("store", s, (rows,), p.store_dtype)[:m]
            with self.copy_in:
                if need_x:
                    copy_to_device(Xd, src_x, self.copy_in)
                if wd is not None and not self.unit_weights:
                    copy_to_device(wd, src_w, self.copy_in)
                if labels_in is not None:
                    copy_to_device(lab, src_l, self.copy_in)
                if store_dev is not None and not p.store_on_device:
                    copy_to_device(store_dev, store_buf.array[c0:c1], self.copy_in)
                self.ev_in[s].record(self.copy_in)
            # compute
            self.compute.wait_event(self.ev_in[s])
            with self.compute:
                if column_stats:
                    col_sum += Xd.sum(axis=0, dtype=cp.float64)
                    if shift is None:
                        shift = col_sum / m  # the first chunk's mean: sums of squares about it
                    col_sq += kernels.reduction("shifted_sq")(Xd, shift, axis=0)
                else:
                    if mean_dev is not None and need_x:
                        Xd -= mean_dev
                    if assign:
                        b.assign_chunk(Xd, state, lab, dist)
                    elif store == "read":
                        lab[...] = store_dev
                    if accumulate:
                        kernels.cluster_sums(Xd, lab, wd, sums, weights)
                    if distance_inertia:
                        inertia += kernels.DeviceReductions.weighted_sum(dist, wd)
                    if store == "update":
                        kernels.update_label_store(lab, store_dev, changed)
                    if direct_inertia:
                        kernels.labelled_sq_dist(Xd, C_dev, lab, dist)
                        inertia += kernels.DeviceReductions.weighted_sum(dist, wd)
                self.ev_compute[s].record(self.compute)
            # device -> host
            outs = []
            if labels_out:
                outs.append((labels, self._pinned_buf("labels_out", s, (rows,), np.int64),
                             lab))
            if min_out:
                outs.append((mins, self._pinned_buf("dist_out", s, (rows,), self.dtype), dist))
            write_back = store == "update" and not p.store_on_device
            if outs or write_back:
                self.copy_out.wait_event(self.ev_compute[s])
                with self.copy_out:
                    for _, pinned, dev in outs:
                        copy_to_host(pinned[:m], dev, self.copy_out)
                    if write_back:
                        copy_to_host(store_buf.array[c0:c1], store_dev, self.copy_out)
                    self.ev_out[s].record(self.copy_out)
                pending[s] = (self.ev_out[s], c0, c1, outs)
            else:
                pending[s] = (self.ev_compute[s], c0, c1, outs)
        for s in range(S):
            if pending[s] is not None:
                self._drain(pending[s], labels, mins)
        self.compute.synchronize()
        if column_stats:
            return (cp.asnumpy(col_sum), cp.asnumpy(col_sq),
                    None if shift is None else cp.asnumpy(shift))
        scalars = cp.asnumpy(cp.stack([inertia, changed[0].astype(cp.float64)]))
        return PassResult(None if sums is None else cp.asnumpy(sums),
                          None if weights is None else cp.asnumpy(weights),
                          float(scalars[0]), int(scalars[1]), labels, mins)

    def _drain(self, pending, labels, mins):
        """Wait for a chunk's last event and copy its pinned outputs into the host arrays."""
        event, c0, c1, outs = pending
        event.synchronize()
        for host, pinned, _ in outs:
            self._parallel_copy(host[c0:c1], pinned[: c1 - c0])

    # -- what the Lloyd loop asks for -------------------------------------------------------
    def stats(self, need_var):
        """(float64 per-feature mean, per-feature variance or None) of X in one pass."""
        if self.plan is None:
            self.configure(1)
        col_sum, col_sq, shift = self.run(column_stats=True)
        mean64 = col_sum / self.n
        if not need_var:
            return mean64, None
        # sum (x - s)^2 = sum (x - mean)^2 + n (mean - s)^2
        var = np.maximum(col_sq / self.n - (mean64 - shift) ** 2, 0.0)
        return mean64, var

    def store_labels(self):
        """The label store as host int64 labels (the last pass with store="update")."""
        store = self._label_store()
        if not self.plan.store_on_device:
            return store.array.astype(np.int64)
        return self.run(store="read", labels_out=True).labels

    def __del__(self):
        try:  # a fit that failed never reached finish(): X's pages must not stay locked
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, CUDA gone
            pass

    def close(self):
        """Wait for the streams, unregister X's pages, drop every buffer (pinned blocks go
        back to CuPy's pinned pool). Safe to call twice."""
        self.synchronize()
        rt = self.cp.cuda.runtime
        for ptr in self._registered:
            try:
                rt.hostUnregister(ptr)
            except Exception:  # noqa: BLE001 - nothing more to do for it
                pass
        self._registered, self._direct = [], {}
        self._dev, self._pinned, self._store, self._mean = {}, {}, None, None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _all_ones(w, rows=1 << 24):
    """Whether every weight is 1, without an n-sized temporary."""
    for s in range(0, w.shape[0], rows):
        if not np.all(w[s:s + rows] == 1):
            return False
    return True


def stream_lloyd(engine, mean, sample_weight, centers, *, max_iter, tol, rows,
                 verbose=0) -> LloydResult:
    """The driver's Lloyd run (kmeans_xp.lloyd.kmeans_single_lloyd, as `_device_loop` does
    it for device-resident X), with every O(n) step done by streamed passes: one pass per
    iteration gives the sums, the inertia of the streamed distances and the count of changed
    labels; the final pass gives the labels and the inertia by direct differences."""
    from array_api_compat import numpy as xp  # the driver's helpers take a namespace

    X = HostRows(engine.X, mean)
    history = {"inertia": [], "center_shift": []}
    strict = False
    for i in range(max_iter):
        r = engine.run(centers, mean=mean, accumulate=True, store="update",
                       distance_inertia=True)
        sums, weights = r.sums, r.weights
        if np.any(weights == 0):  # relocation reads the labels: only now do they come back
            sums, weights = relocate_empty(X, sample_weight, centers, engine.store_labels(),
                                           sums, weights, xp, rows)
        centers_new = new_centers(sums, weights, centers, xp)
        shift = float(np.sum((centers_new.astype(np.float64)
                              - centers.astype(np.float64)) ** 2))
        history["inertia"].append(r.inertia)
        history["center_shift"].append(shift)
        if verbose:
            print(f"Iteration {i}, inertia {r.inertia:.6g}, center shift {shift:.3g}")
        centers = centers_new
        stop = stop_reason(i, i > 0 and r.changed == 0, shift, tol, verbose)
        if stop:
            strict = stop == "strict"
            break
    if strict:  # the last iteration's labels, inertia against the updated centers
        final = engine.run(centers, mean=mean, store="read", direct_inertia=True,
                           labels_out=True)
    else:       # a final assignment, so that labels_ matches predict
        final = engine.run(centers, mean=mean, direct_inertia=True, labels_out=True)
    return LloydResult(final.labels, max(final.inertia, 0.0), centers, i + 1, history)


def mean_and_tol(engine, tol):
    """(mean in X's dtype, absolute tol) from one streamed pass (see the module's note)."""
    mean64, var = engine.stats(need_var=tol != 0)
    mean = mean64.astype(engine.dtype)
    if tol == 0:
        return mean, 0.0
    return mean, float(np.mean(var)) * tol


