"""The CPU reference backend: BLAS GEMM per row chunk, argmin, bincount sums.

Work is split in two levels, both sized from `max_memory`:

- a *block* of rows is one task for the thread pool. Each thread copies its block once into a
  preallocated augmented buffer ``[x, 1]``, and after the assignment reduces the whole block at
  once (one ``np.bincount`` per feature, in float64, into per-thread accumulators);
- a *sub-chunk* of the block is one GEMM ``[x, 1] @ [-2 C^T; ||c||^2]`` whose (rows, k)
  result stays in the core's cache; ``argmin`` and a flat ``take`` of the minimum follow while
  it is hot. The augmented row folds the ``+ ||c||^2`` pass into the GEMM.

NumPy releases the GIL in matmul, argmin, take, copies and bincount's loop, so blocks run on
all cores; BLAS is held to one thread inside the pool (threadpoolctl, a dependency; without
it BLAS threads would run inside each pool thread), since a GEMM with K = d + 1 gains nothing
from BLAS threads. All buffers
are allocated once per thread and reused across iterations, so an iteration allocates only
its outputs (labels, min_sq_dist) and a few k-sized vectors.
"""
from __future__ import annotations

import contextlib
import numbers
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kmeans_xp.backend import (
    AssignResult,
    IterStats,
    KMeansBackend,
    Option,
    Placement,
    ReduceResult,
)
from kmeans_xp.memory import MemoryEstimate, chunk_rows, host_available_memory, resolve_budget
from kmeans_xp.namespaces import DLPACK_FOREIGN, dlpack_source, foreign_device_type
from kmeans_xp.validation import Interval

#: GEMM result per sub-chunk: SUB_BYTES_PER_THREAD per thread, at most TARGET_BLOCK_BYTES.
#: Each NumPy call takes the GIL, and many short calls from many threads queue on it, so the
#: work per call grows with the threads. Measured at W1 (n=2M, k=200): on 16 cores (H200
#: host, 2026-12-02, cpu_probe.json) 176 ms per iteration with 512 KiB (L2-sized) sub-chunks,
#: 76 ms with 8 MiB; on one thread (2-core VM) 215 ms with 512 KiB, 389 ms with 8 MiB
TARGET_BLOCK_BYTES = 8 << 20
SUB_BYTES_PER_THREAD = 512 << 10
#: rows per thread task at most (one task per thread when n allows: a fixed, even split)
TARGET_TASK_ROWS = 1 << 18
#: from this many features the per-cluster sums group the rows by label (a radix argsort, a
#: gather, np.add.reduceat) instead of one np.bincount per feature: bincount holds the GIL,
#: so d of them per block run one thread at a time
SORTED_SUMS_MIN_D = 16
MIN_ROWS = 64
#: bytes of Python objects a call creates (thread pool, futures, thread-local dicts)
PYTHON_OVERHEAD = 48 << 10


def _n_threads(requested):
    if requested is not None:
        return max(1, int(requested))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def _blas_controller():
    """threadpoolctl's controller, else False (a library it cannot introspect).
    Made once per process: it imports and inspects the loaded BLAS libraries."""
    global _CONTROLLER
    if _CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
            _CONTROLLER = ThreadpoolController()
        except Exception:  # not installed, or a library it cannot introspect
            _CONTROLLER = False
    return _CONTROLLER


class _BlasOneThread:
    """BLAS held to one thread while any pass of any fit needs it, restored when the last one
    ends. threadpoolctl's limits are process-wide, and since 3.8 only the thread that set a
    limit may change it again (others silently do nothing): so one thread of ours sets and
    restores it, counting the passes in between. Two fits in two threads, each entering and
    leaving its own limit, left BLAS at one thread for good."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._limit = None
        self._thread = None

    def _on_own_thread(self, fn):
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="kmeans_xp-blas")
        return self._thread.submit(fn).result()

    def __enter__(self):
        with self._lock:
            if self._users == 0:
                controller = _blas_controller()
                if controller:
                    def limit():
                        lim = controller.limit(limits=1, user_api="blas")
                        lim.__enter__()   # owns the limit until __exit__ (threadpoolctl 3.8)
                        return lim
                    self._limit = self._on_own_thread(limit)
            self._users += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._limit is not None:
                lim, self._limit = self._limit, None
                self._on_own_thread(lambda: lim.__exit__(None, None, None))


_BLAS_ONE_THREAD = _BlasOneThread()


_CONTROLLER = None


class _Plan:
    """Rows per GEMM sub-chunk and per thread task, and the bytes they need."""

    __slots__ = ("sub", "block", "threads", "budget", "per_thread", "shared", "k", "d",
                 "itemsize")

    def __init__(self, n, d, k, itemsize, max_memory, threads):
        self.k, self.d, self.itemsize = k, d, itemsize
        self.budget = resolve_budget(max_memory, host_available_memory(), cap=1 << 30)
        target = min(TARGET_BLOCK_BYTES, SUB_BYTES_PER_THREAD * max(1, threads))
        cache_rows = max(MIN_ROWS, target // max(k * itemsize, 1))
        # shared by all threads: the augmented centers [-2 C^T; ||c||^2] and the centers'
        # conversion, the summed result (k, d) + (k,), and Python objects (pool, futures)
        shared_fixed = 3 * k * (d + 1) * 8 + PYTHON_OVERHEAD
        thread_fixed = NumpyBackend._thread_fixed_bytes(k, d)
        sub_row = NumpyBackend._sub_row_bytes(k, itemsize)
        block_row = NumpyBackend._block_row_bytes(d, itemsize)
        # fewer threads when the budget cannot hold one row per thread
        for t in range(max(1, threads), 0, -1):
            per_thread = (self.budget - shared_fixed) // t - thread_fixed
            if per_thread >= sub_row + block_row or t == 1:
                break
        self.threads = t
        # the most rows one thread can hold when sub-chunk == block
        rows = chunk_rows(self.budget, t * (sub_row + block_row),
                          shared_fixed + t * thread_fixed, n_samples=n, floor=1,
                          what=f"the numpy backend (k={k}, d={d}, {t} thread(s))")
        sub = min(rows, cache_rows)
        block = (per_thread - sub * sub_row) // block_row
        # at least one task per thread so all cores work
        block = min(block, TARGET_TASK_ROWS, max(sub, -(-n // t)), n)
        self.block = max(block, 1)
        self.sub = max(1, min(sub, self.block))
        self.shared = shared_fixed
        self.per_thread = thread_fixed + self.sub * sub_row + self.block * block_row

    @property
    def total(self):
        return self.shared + self.threads * self.per_thread


class _Acc:
    """One thread's float64 accumulators of a pass: sums, weights, inertia, changed labels."""

    __slots__ = ("sums", "weights", "inertia", "changed")

    def __init__(self, k, d):
        self.sums = np.zeros((k, d), dtype=np.float64)
        self.weights = np.zeros(k, dtype=np.float64)
        self.inertia = 0.0
        self.changed = 0

    def add_stats(self, min_sq, labels, labels_old, s0, e0, bufs, w):
        m64 = bufs["m64"][:e0 - s0]
        np.copyto(m64, min_sq, casting="unsafe")
        if w is None:
            self.inertia += float(m64.sum())
        else:
            w64 = bufs["w64"][:e0 - s0]   # this block's weights, copied by _reduce_block
            self.inertia += float(np.dot(m64, w64))
        if labels_old is not None:
            self.changed += int(np.count_nonzero(labels != labels_old[s0:e0]))

    def merge(self, other):
        self.sums += other.sums
        self.weights += other.weights
        self.inertia += other.inertia
        self.changed += other.changed
        return self


class NumpyPlacement(Placement):
    """NumPy X as it is; lists as NumPy; a CPU torch tensor or JAX array shared through
    DLPack (no copy), the results going back in its library (`Placement.from_backend`)."""

    def converts_from(self, namespace, X=None):
        return namespace == "list" or (namespace in DLPACK_FOREIGN and
                                       foreign_device_type(X) == "cpu")

    def to_backend(self, X):
        if foreign_device_type(X) == "cpu":
            # the array's memory (read-only: never written)
            return np.from_dlpack(dlpack_source(X))
        return X


class NumpyBackend(KMeansBackend):
    name = "numpy"
    namespaces = frozenset({"numpy"})
    device = "cpu"
    options = {"n_threads": Option(None, None, Interval(numbers.Integral, 1),
                                   doc="threads over row blocks (default: usable cores)")}
    placement_class = NumpyPlacement

    def __init__(self, max_memory="auto", **options):
        super().__init__(max_memory, **options)
        self.threads = _n_threads(self.n_threads)
        self._pool = None
        self._pool_threads = 0
        self._local = threading.local()
        if self.threads > 1:
            _blas_controller()  # once, before any fit is measured

    # -- memory -----------------------------------------------------------------------------
    @staticmethod
    def _sub_row_bytes(k, itemsize):
        # GEMM result row (rows, k), the flat index of its minimum (intp), and the row
        # offsets (intp, shared by the threads but counted once per thread)
        return k * itemsize + 16

    @staticmethod
    def _block_row_bytes(d, itemsize):
        # augmented copy [x, 1], ||x||^2, and three float64 columns (w and x_j * w for
        # bincount's weights, the distances in float64 for the inertia)
        return (d + 1) * itemsize + itemsize + 24

    @staticmethod
    def _thread_fixed_bytes(k, d):
        # per-thread float64 accumulators (k, d) + (k,), and bincount's two (k,) results alive
        return k * (d + 1) * 8 + 2 * k * 8

    @classmethod
    def _plan(cls, n, d, k, itemsize, max_memory, threads):
        return _Plan(n, d, k, itemsize, max_memory, threads)

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize, max_memory="auto",
                        n_threads=None):
        threads = _n_threads(n_threads)
        plan = cls._plan(n_samples, n_features, n_clusters, itemsize, max_memory, threads)
        parts = {"chunk_buffers": plan.threads * plan.per_thread, "shared": plan.shared,
                 "min_sq_dist": n_samples * itemsize}
        # chunk_rows: the rows one thread holds at a time (its task); the GEMM runs on
        # cache-sized sub-chunks of min(chunk_rows, plan.sub) rows within it
        return MemoryEstimate(parts, sum(parts.values()), plan.block)

    # -- threads and buffers ----------------------------------------------------------------
    def _spawn(self, job, threads):
        """[job(0), ..., job(threads - 1)], run on `threads` pool threads."""
        if threads == 1:
            return [job(0)]
        if self._pool is None or self._pool_threads != threads:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kmeans_xp")
            self._pool_threads = threads
        futures = [self._pool.submit(job, t) for t in range(threads)]
        return [f.result() for f in futures]

    def _buffers(self, plan, dtype):
        """This thread's buffers for `plan`, allocated once and reused across iterations."""
        key = (plan.sub, plan.block, plan.k, plan.d, np.dtype(dtype).str)
        bufs = getattr(self._local, "bufs", None)
        if bufs is None or bufs["key"] != key:
            self._local.bufs = None  # drop the old ones before allocating
            Xa = np.empty((plan.block, plan.d + 1), dtype=dtype)
            Xa[:, plan.d] = 1
            bufs = {"key": key, "Xa": Xa,
                    "D": np.empty((plan.sub, plan.k), dtype=dtype),
                    "idx": np.empty(plan.sub, dtype=np.intp),
                    "xnorm": np.empty(plan.block, dtype=dtype),
                    "w64": np.empty(plan.block, dtype=np.float64),
                    "xw64": np.empty(plan.block, dtype=np.float64),
                    "m64": np.empty(plan.block, dtype=np.float64)}
            self._local.bufs = bufs
        return bufs

    # -- kernels ----------------------------------------------------------------------------
    @staticmethod
    def _operands(centers, dtype):
        """[-2 C^T; ||c||^2] of shape (d + 1, k), in X's dtype. ||c||^2 is summed in X's dtype
        as scikit-learn does (``row_norms``), so near-ties break the same way."""
        c = np.asarray(centers, dtype=dtype)
        aug = np.empty((c.shape[1] + 1, c.shape[0]), dtype=dtype)
        np.multiply(c.T, -2, out=aug[:-1])
        np.einsum("ij,ij->i", c, c, out=aug[-1])
        return aug

    @staticmethod
    def _assign_block(X, s0, e0, aug, offs, labels, min_sq, bufs, sub):
        """Labels and squared distances of rows [s0, e0), written into the outputs."""
        r0 = e0 - s0
        d = X.shape[1]
        Xa, D, idx, xnorm = bufs["Xa"], bufs["D"], bufs["idx"], bufs["xnorm"]
        Dflat = D.reshape(-1)
        Xa[:r0, :d] = X[s0:e0]
        for s in range(0, r0, sub):
            e = min(s + sub, r0)
            r = e - s
            Dv, lab = D[:r], labels[s0 + s:s0 + e]
            np.matmul(Xa[s:e], aug, out=Dv)             # ||c||^2 - 2 x.c
            Dv.argmin(axis=1, out=lab)
            np.add(lab, offs[:r], out=idx[:r])
            Dflat.take(idx[:r], out=min_sq[s0 + s:s0 + e], mode="clip")  # no take_along_axis
        m = min_sq[s0:e0]
        xn = xnorm[:r0]
        np.einsum("ij,ij->i", X[s0:e0], X[s0:e0], out=xn)
        m += xn
        np.maximum(m, 0, out=m)

    @staticmethod
    def _reduce_block(X, s0, e0, labels, sample_weight, bufs, k, acc):
        """Add the block's weighted sums and weights into `acc`. Weights go to bincount as
        contiguous float64 (it would copy anything else); the casts are plain copies, so no
        ufunc cast buffers are needed. Unit weights (None): counts."""
        r0 = e0 - s0
        lab = labels[s0:e0]
        xw = bufs["xw64"][:r0]
        counts = None
        if sample_weight is None:
            w64 = None
            counts = np.bincount(lab, minlength=k)
            acc.weights += counts
        else:
            w64 = bufs["w64"][:r0]
            np.copyto(w64, sample_weight[s0:e0], casting="unsafe")
            acc.weights += np.bincount(lab, weights=w64, minlength=k)
        if X.shape[1] >= SORTED_SUMS_MIN_D:
            NumpyBackend._sorted_sums(X[s0:e0], lab, w64, k, acc, counts)
            return
        for j in range(X.shape[1]):
            np.copyto(xw, X[s0:e0, j], casting="unsafe")
            if w64 is not None:
                xw *= w64
            acc.sums[:, j] += np.bincount(lab, weights=xw, minlength=k)

    @staticmethod
    def _sorted_sums(Xb, lab, w64, k, acc, counts=None):
        """acc.sums += per-cluster sums of the rows Xb (times w64), rows grouped by label in
        row order and added in float64 (np.add's pairwise order within a cluster: fixed for
        a given block, so the result does not depend on the threads either). counts: the
        block's labels counted, when the caller has them (unit weights)."""
        if len(lab) == 0:
            return
        small = np.uint8 if k <= 1 << 8 else np.uint16 if k <= 1 << 16 else None
        keys = lab if small is None else lab.astype(small)  # NumPy radix-sorts small ints
        order = np.argsort(keys, kind="stable")
        if counts is None:
            counts = np.bincount(lab, minlength=k)
        filled = counts > 0
        starts = (np.cumsum(counts) - counts)[filled]
        rows = np.take(Xb, order, axis=0)
        if w64 is None:
            acc.sums[filled] += np.add.reduceat(rows, starts, axis=0, dtype=np.float64)
        else:
            rows = rows.astype(np.float64)
            rows *= np.take(w64, order)[:, None]
            acc.sums[filled] += np.add.reduceat(rows, starts, axis=0)

    # -- the contract -----------------------------------------------------------------------
    def _run(self, X, sample_weight, centers, *, labels_in=None, labels_old=None, assign=True,
             reduce=True):
        """One pass over X in blocks. Thread t takes a fixed, contiguous run of blocks and
        adds them in order into its own accumulators, which are then added in thread order:
        the float64 sums do not depend on which thread ran when (deterministic)."""
        X = np.asarray(X)
        n, d = X.shape
        k = centers.shape[0]
        plan = self._plan(n, d, k, X.dtype.itemsize, self.max_memory, self.threads)
        if assign:
            aug = self._operands(centers, X.dtype)
            offs = np.arange(plan.sub, dtype=np.intp) * k
            labels = np.empty(n, dtype=np.intp)
            min_sq = np.empty(n, dtype=X.dtype)
        else:
            labels, min_sq = np.asarray(labels_in, dtype=np.intp), None
        w = None if sample_weight is None else np.asarray(sample_weight)
        n_tasks = -(-n // plan.block)
        threads = max(1, min(plan.threads, n_tasks))

        def job(t):
            bufs = self._buffers(plan, X.dtype)
            acc = _Acc(k, d) if reduce else None
            for i in range(t * n_tasks // threads, (t + 1) * n_tasks // threads):
                s0, e0 = i * plan.block, min((i + 1) * plan.block, n)
                if assign:
                    self._assign_block(X, s0, e0, aug, offs, labels, min_sq, bufs, plan.sub)
                if reduce:
                    self._reduce_block(X, s0, e0, labels, w, bufs, k, acc)
                    if assign:
                        acc.add_stats(min_sq[s0:e0], labels[s0:e0], labels_old, s0, e0,
                                      bufs, w)
            return acc

        # (BLAS held to one thread, shared by every fit of the process)
        with _BLAS_ONE_THREAD if assign and threads > 1 else contextlib.nullcontext():
            accs = self._spawn(job, threads)
        total = None
        for a in accs:  # thread order
            total = a if total is None else total.merge(a)
        return labels, min_sq, total

    def assign(self, X, centers, *, xp=None):
        labels, min_sq, _ = self._run(X, None, centers, reduce=False)
        return AssignResult(labels.astype(np.int64, copy=False), min_sq)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        shape = np.empty((n_clusters, 0))
        _, _, acc = self._run(X, sample_weight, shape, labels_in=labels, assign=False)
        return ReduceResult(acc.sums, acc.weights)

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        old = None if labels_old is None else np.asarray(labels_old)
        labels, _, acc = self._run(X, sample_weight, centers, labels_old=old)
        changed = float(len(labels)) if old is None else float(acc.changed)
        return IterStats(labels.astype(np.int64, copy=False), acc.sums, acc.weights,
                         np.float64(acc.inertia), np.float64(changed))

    def finish(self):
        """End of a fit: drop every thread's buffers and stop the pool (a later call on this
        backend makes them again)."""
        self._local = threading.local()  # the old one, and all threads' buffers, go with it
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool, self._pool_threads = None, 0

    def __del__(self):
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=False)
