"""The CPU reference backend: BLAS GEMM per row chunk, argmin, per-cluster sums in float64.

Work is split in two levels, both sized from `max_memory`:

- a *block* of rows is one task for the thread pool (one per thread when n allows: a fixed,
  even split). After the assignment each thread reduces its whole block at once into its own
  float64 accumulators (`numpy_blocks`: label-grouped rows and one flat reduceat on many
  threads, a bincount per feature on one);
- a *sub-chunk* of the block is one GEMM whose (rows, k) result is reused while hot: argmin,
  and in `assign` a flat take of each row's minimum. The GEMM is ``[x, 1] @ [-2 C^T;
  ||c||^2]`` (the augmented row folds ``+ ||c||^2`` into the GEMM: one call, not two).

Each NumPy call takes the GIL for its setup, so many short calls from many threads queue on
it: the kernels make few, long calls whose loops release it (`numpy_blocks` says which do).
BLAS is held to one thread inside the pool (threadpoolctl, a dependency; without it BLAS
threads would run inside each pool thread). All buffers are allocated once per job of a pass
(`numpy_blocks.BufferSets`: as many sets as jobs run at once) and reused across iterations,
so an iteration allocates only its labels and a few k-sized arrays.

Labels: an iteration's in the smallest type that holds k (`compact_labels_dtype`: 1 byte a
row up to 256 clusters), so the driver's two generations take 2 n bytes, not 16 n; `assign`
and the final pass (`labels_inertia`) write int32, the user's type. The final pass keeps no
distances: its inertia, by differences, is summed per block as it labels.
"""
from __future__ import annotations

import contextlib
import numbers
import threading
import warnings

import numpy as np

from kmeans_xp.contract.backend import (
    AssignResult,
    IterStats,
    KMeansBackend,
    Option,
    Placement,
    ReduceResult,
    compact_labels_dtype,
)
from kmeans_xp.contract.chunks import mean_of_sums, spawn, tolerance
from kmeans_xp.contract.memory import MemoryEstimate, chunk_rows, host_available_memory, resolve_budget
from kmeans_xp.contract.namespaces import DLPACK_FOREIGN, dlpack_source, foreign_device_type
from kmeans_xp.contract.rows import HostRows, is_memmap
from kmeans_xp.contract.constraints import Interval

from kmeans_xp_backends.numpy import blocks as blocks
from kmeans_xp_backends.numpy import bounded as bounded
from kmeans_xp_backends.numpy import emulated as emulated
from kmeans_xp_backends.numpy import pool as numpy_pool, shm as numpy_shm
from kmeans_xp_backends.numpy import stats as stats
from kmeans_xp_backends.cpu_threads import (
    BLAS_ONE_THREAD,
    PASS_THREADS,
    blas_controller,
    thread_count,
)

#: Rows per GEMM sub-chunk. Each NumPy call takes the GIL for its setup and hands it over
#: to the next waiting thread, so on T threads a sub-chunk carries about
#: T * SUB_NS_PER_THREAD of work, by the estimate k * (ENTRY_NS + FEATURE_NS * d) per row;
#: on one thread its (rows, k) result stays within SUB_BYTES_PER_THREAD (L2); never past
#: TARGET_BLOCK_BYTES, nor below MIN_ROWS rows (a GEMM of fewer rows packs the centers for
#: little work). Figures: benchmarks/test_bench_numpy.py, kept in benchmarks/results/<kind>.md
TARGET_BLOCK_BYTES = 8 << 20
SUB_BYTES_PER_THREAD = 512 << 10
SUB_NS_PER_THREAD = 40_000
ENTRY_NS, FEATURE_NS = 0.5, 0.02
MIN_ROWS = 512
#: rows and buffer bytes per thread task at most (one task per thread when n allows: a
#: fixed, even split)
TARGET_TASK_ROWS = 1 << 18
TARGET_TASK_BYTES = 32 << 20
#: from this many features the per-cluster sums group the rows by label and add them in one
#: flat reduceat (`numpy_blocks.sorted_sums`, no GIL), below it one np.bincount per feature
#: (cheaper for few features, but part of each holds the GIL). The two add a cluster's
#: values in different orders (pairwise, sequential): the split is the one all backends'
#: agreement tests were written against
SORTED_SUMS_MIN_D = 16
#: the label-grouped sums cast and transpose this many features at a time into float64
#: columns (a group's columns stay in cache for the dot and the reduceat, and the buffer is
#: block x group, not block x d). Same sums, bit for bit, whatever the group (figure at
#: d=128: benchmarks/test_bench_numpy.py, kept in benchmarks/results/<kind>.md)
SORTED_SUMS_GROUP = 16
#: bytes of one thread's x - c_label pieces in the final pass (`numpy_blocks.sq_dist_block`):
#: at least a GEMM sub-chunk's rows, more where the budget allows (each piece is four NumPy
#: calls, and on many threads every call queues for the GIL)
DIFF_BYTES = 2 << 20
#: a Lloyd run's passes go to the worker processes (`numpy_pool`: one GIL each, so GEMM
#: sub-chunks of one thread's size) when a pass is estimated at this many nanoseconds of one
#: thread's work (k * (ENTRY_NS + FEATURE_NS * d) per row); the first such pass of a process
#: starts them (in the background: a few hundred milliseconds of each core)
PROCESS_MIN_NS = 50e6
#: ... with fewer features than this ('auto': below SORTED_SUMS_MIN_D the threads' sums hold
#: the GIL; from it, workers and threads take about as long: benchmarks/test_bench_numpy.py,
#: kept in benchmarks/results/<kind>.md)
PROCESS_MAX_D = 16
#: seconds a fit that will use the worker processes waits for a pool still starting
WORKERS_WAIT_S = 2.0
#: the fit's centered copy of X goes to shared memory (the workers read it) from this size
SHARED_MIN_BYTES = 1 << 20
#: a worker's GEMM sub-chunks are sized as for this many threads sharing a GIL (1: in L2)
PROCESS_SUB_THREADS = 1
#: bytes of Python objects a call creates (thread pool, futures, thread-local dicts)
PYTHON_OVERHEAD = 48 << 10


class _Plan:
    """Rows per GEMM sub-chunk and per thread task, the kernels' choices, and the bytes they
    need."""

    __slots__ = ("sub", "block", "threads", "budget", "per_thread", "shared", "k", "d",
                 "itemsize", "sorted_sums", "group", "diff_rows", "sub_alone",
                 "n_ns")

    def __init__(self, n, d, k, itemsize, max_memory, threads):
        self.k, self.d, self.itemsize = k, d, itemsize
        self.group = min(d, SORTED_SUMS_GROUP)
        self.budget = resolve_budget(max_memory, host_available_memory(), cap=1 << 30)
        cache_rows = _sub_rows(d, k, itemsize, threads)
        # shared by all threads: the centers' operands and float64 copy, the summed result
        # (k, d) + (k,), and Python objects (pool, futures)
        shared_fixed = 3 * k * (d + 1) * 8 + PYTHON_OVERHEAD
        thread_fixed = _thread_fixed_bytes(k, d)
        # GEMM result row, its flat index and row offset, and x - c_label in X's dtype and
        # in float64 (final pass)
        sub_row = (k + d) * itemsize + (8 * d if itemsize != 8 else 0) + 16
        self.sorted_sums = d >= SORTED_SUMS_MIN_D
        block_row = blocks.block_row_bytes(d, itemsize, sorted_sums=self.sorted_sums,
                                           group=self.group)
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
        cap = max(1, min((per_thread - sub * sub_row) // block_row, TARGET_TASK_ROWS,
                         max(sub, TARGET_TASK_BYTES // block_row)))
        if -(-n // t) > cap:
            # equal blocks over all of X: the same ones (and so the same sums, bit for bit)
            # for any thread count, and a short last block cannot leave a thread waiting
            self.block = -(-n // -(-n // cap))
        else:  # one block per thread, at least one sub-chunk's rows, all alike
            self.block = min(max(sub, -(-n // t)), n)
            if self.block:
                self.block = -(-n // -(-n // self.block))
        self.sub = max(1, min(sub, self.block))
        # a worker process's sub-chunks: one thread's (it shares no GIL), never more rows
        self.sub_alone = max(1, min(_sub_rows(d, k, itemsize, PROCESS_SUB_THREADS),
                                    self.sub))
        self.n_ns = _pass_ns(n, d, k)
        self.shared = shared_fixed
        self.per_thread = thread_fixed + self.sub * sub_row + self.block * block_row
        # the final pass's pieces: past the sub-chunk's rows (counted in sub_row) out of
        # what the budget leaves this thread
        diff_row = d * itemsize + (8 * d if itemsize != 8 else 0)
        spare = max(0, (self.budget - shared_fixed) // t - self.per_thread)
        self.diff_rows = min(self.block, max(self.sub, min(DIFF_BYTES, spare) // diff_row))
        self.per_thread += (self.diff_rows - self.sub) * diff_row

    @property
    def total(self):
        return self.shared + self.threads * self.per_thread


def _sub_rows(d, k, itemsize, threads):
    """Rows per GEMM sub-chunk before the budget (see SUB_NS_PER_THREAD)."""
    row_bytes = max(k * itemsize, 1)
    cache = SUB_BYTES_PER_THREAD // row_bytes
    work = int(max(1, threads) * SUB_NS_PER_THREAD / (k * (ENTRY_NS + FEATURE_NS * d)))
    return max(MIN_ROWS, cache, min(work, TARGET_BLOCK_BYTES // row_bytes))


def _pass_ns(n, d, k):
    """A pass's estimated nanoseconds of one thread's work."""
    return n * k * (ENTRY_NS + FEATURE_NS * d)


def _wants_workers(processes, d, n_ns=None):
    """Whether a Lloyd pass (d features, n_ns nanoseconds of one thread's work, `_pass_ns`;
    None: not known yet, as when X is centered) goes to the worker processes
    (`numpy_pool`): asked for, or 'auto' with few features (PROCESS_MAX_D) and a pass long
    enough (PROCESS_MIN_NS)."""
    return processes is True or (processes == "auto" and numpy_pool.available() and
                                 d < PROCESS_MAX_D and (n_ns is None or
                                                        n_ns >= PROCESS_MIN_NS))


def _thread_fixed_bytes(k, d):
    # the thread's float64 accumulators (k, d) + (k,), and per block: reduceat's (k, d)
    # result with its transposed and gathered copies, and a few (k,) label arrays
    return 4 * k * (d + 1) * 8 + 6 * k * 8


class NumpyPlacement(Placement):
    """NumPy X as it is; lists as NumPy; a CPU torch tensor or JAX array shared through
    DLPack (no copy), the results going back in its library (`Placement.from_backend`). A
    memory-mapped X is centered block by block as it is read (`HostRows`), not copied: the
    fit holds in memory its buffers and O(n) arrays, and reads the file once per pass."""

    def finish(self, kept=None):
        """The fit is over: the backend's per-fit buffers and its run on the worker
        processes go (a fitted model holds no scratch memory), and the BLAS thread limit its
        passes left lingering is restored (the user's BLAS threads are back when the fit
        returns)."""
        release = getattr(self.backend, "finish", None)
        if release is not None:
            release()
        BLAS_ONE_THREAD.settle()
        return kept

    def warm_up(self, X, n_clusters, seeding):
        """The worker processes of a fit that will use them (`NumpyBackend.warm_workers`)."""
        warm = getattr(self.backend, "warm_workers", None)   # (numba's: none)
        if warm is not None and getattr(X, "ndim", 0) == 2:
            warm(X.shape, n_clusters)

    def converts_from(self, namespace, X=None):
        return namespace == "list" or (namespace in DLPACK_FOREIGN and
                                       foreign_device_type(X) == "cpu")

    def to_backend(self, X):
        if foreign_device_type(X) == "cpu":
            # the array's memory (read-only: never written)
            return np.from_dlpack(dlpack_source(X))
        return X

    def namespace(self, X):
        return super().namespace(X.data if isinstance(X, HostRows) else X)

    def feature_stats(self, X, tol, *, xp):
        """The driver's mean and tol, bit for bit, on the backend's threads
        (`numpy_stats`)."""
        if not stats.parallel_columns(X):
            return super().feature_stats(X, tol, xp=xp)
        threads = self.backend.threads
        mean = mean_of_sums(stats.column_sums(X, spawn, threads), X.shape[0], X.dtype, xp)
        return mean, tolerance(X, mean, tol, xp, self.backend.driver_rows(X), chunk_sums=(
            lambda sl, mean64: stats.deviation_sums_by_columns(X, sl, mean64, spawn, threads)))

    def center(self, X, mean, *, xp, in_place=False):
        if mean is not None and not in_place and is_memmap(X):
            return HostRows(X, mean)
        if (mean is not None and type(X) is np.ndarray and X.flags.c_contiguous
                and X.shape[0] >= stats.MIN_PARALLEL_ROWS):
            out = X if in_place else None
            dtype = np.result_type(X, mean)
            shares = getattr(self.backend, "shares_memory", None)   # (numba's: no)
            if out is None and shares is not None and shares(X.size * dtype.itemsize,
                                                             X.shape[1]):
                out = numpy_shm.shared_empty(X.shape, dtype)
            return stats.centered(X, mean, spawn, self.backend.threads, out=out)
        return super().center(X, mean, xp=xp, in_place=in_place)


class NumpyBackend(KMeansBackend):
    name = "numpy"
    namespaces = frozenset({"numpy"})
    device = "cpu"
    options = {"n_threads": Option(None, None, Interval(numbers.Integral, 1),
                                   doc="threads over row blocks (default: usable cores)"),
               "processes": Option("auto", "auto", True, False, doc=(
                   "a Lloyd run's passes on worker processes, one per thread, reading the "
                   "fit's centered copy of X in shared memory (Linux); 'auto': where a "
                   "pass is long enough"))}
    placement_class = NumpyPlacement

    def __init__(self, max_memory="auto", **options):
        super().__init__(max_memory, **options)
        if self.processes is True and not numpy_pool.available():
            raise ValueError(f"backend_options={{'processes': True}}: the numpy backend's "
                             f"worker processes share memory as Linux does (this is "
                             f"{numpy_pool.sys.platform}); use 'auto' or False")
        self.threads = thread_count(self.n_threads)
        self._run_workers = numpy_pool.RunWorkers()
        self._sets = blocks.BufferSets()
        if self.threads > 1:
            blas_controller()  # once, before any fit is measured

    # -- memory -----------------------------------------------------------------------------
    def _plan(self, *shape):
        """The pass's `_Plan`, once per shape until `finish` (it reads the free host memory:
        psutil, 0.07-0.15 ms a read; a fit's passes would all read about the same)."""
        plans = self.__dict__.setdefault("_plans", {})
        return plans[shape] if shape in plans else plans.setdefault(shape, _Plan(*shape))

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize, max_memory="auto",
                        n_threads=None, processes="auto"):
        threads = thread_count(n_threads)
        plan = _Plan(n_samples, n_features, n_clusters, itemsize, max_memory, threads)
        # min_sq_dist: `assign`'s distances (k-means||, predict); a fit's final pass keeps
        # none. Labels are the driver's part (`memory.driver_bytes`)
        parts = {"chunk_buffers": plan.threads * plan.per_thread, "shared": plan.shared,
                 "min_sq_dist": n_samples * itemsize}
        if plan.threads > 1 and _wants_workers(processes, plan.d, plan.n_ns):
            # a run on the worker processes (`numpy_shm.RunBuffers`; their buffers are the
            # threads' above): labels, an accumulator slot per worker, the centers
            parts["worker_run"] = (
                n_samples * np.dtype(compact_labels_dtype(n_clusters)).itemsize
                + plan.threads * blocks.Acc.flat_size(plan.k, plan.d) * 8
                + plan.k * plan.d * itemsize)
        # chunk_rows: the rows one thread holds at a time (its task); the GEMM runs on
        # cache-sized sub-chunks of min(chunk_rows, plan.sub) rows within it
        return MemoryEstimate(parts, sum(parts.values()), plan.block)

    # -- threads and buffers ----------------------------------------------------------------
    def _spawn(self, job, threads, stop):
        """[job(0), ..., job(threads - 1)], on the process's pass threads (`PASS_THREADS`,
        shared by every backend: a fitted model holds no thread); `stop` is set when the
        caller stops waiting (Ctrl-C), and the jobs end within a sub-chunk."""
        if threads == 1:
            return [job(0)]
        return PASS_THREADS.run(job, threads, stop)

    # -- the contract -----------------------------------------------------------------------
    def _run(self, X, sample_weight, centers, *, labels_in=None, labels_old=None,
             mode="iter"):
        """One pass over X in blocks (`numpy_blocks.Pass` says what each mode does), on the
        run's worker processes where it has them (`numpy_pool.RunWorkers`), else on the pool's
        threads. X seen centered (`HostRows`: a memmap) is read and centered block by
        block. Thread t takes a fixed, contiguous run of blocks and adds them in order into
        its own accumulators, which are then added in thread order: the float64 sums do not
        depend on which thread ran when (deterministic), nor on threads or processes."""
        X, mean = (X.data, X.mean) if isinstance(X, HostRows) else (np.asarray(X), None)
        n, d = X.shape
        k = centers.shape[0]
        plan = self._plan(n, d, k, X.dtype.itemsize, self.max_memory, self.threads)
        w = None if sample_weight is None else np.asarray(sample_weight)
        n_tasks = -(-n // plan.block)
        threads = max(1, min(plan.threads, n_tasks))
        run = self._run_workers
        try:
            if run.pass_on_workers(X, mean, w, mode, plan, threads, n_tasks,
                                   _wants_workers(self.processes, plan.d, plan.n_ns)):
                self._sets.clear()   # (the threads' buffers: workers have theirs)
                return run.run(X, centers, mode, labels_in, labels_old, plan)
        except numpy_pool.WorkerEnded as exc:
            self.processes = False
            warnings.warn(f"{exc}; the numpy backend goes on with threads", RuntimeWarning,
                          stacklevel=2)
        assign = mode in ("assign", "iter", "final")
        ops = blocks.Operands(centers, X.dtype) if assign else None
        c = ops.c if assign else np.asarray(centers, dtype=X.dtype) if mode in (
            "final", "inertia", "stats") else None
        labels = min_sq = None
        if assign:
            labels = np.empty(n, dtype=compact_labels_dtype(k) if mode == "iter" else
                              np.int32)
            min_sq = np.empty(n, dtype=X.dtype) if mode == "assign" else None
        stop = threading.Event()
        p = blocks.Pass(mode, X, mean, w, plan, ops, c, labels=labels, min_sq=min_sq,
                        labels_in=None if labels_in is None else np.asarray(labels_in),
                        labels_old=labels_old, threads=threads, n_tasks=n_tasks,
                        sub=plan.sub, stop=stop)

        key = (plan.sub, plan.block, plan.k, plan.d, X.dtype.str, plan.sorted_sums,
               plan.group, plan.diff_rows)

        def job(t):
            bufs = self._sets.take(key, lambda: blocks.allocate(
                plan.block, plan.sub, plan.k, plan.d, X.dtype, sorted_sums=plan.sorted_sums,
                group=plan.group, diff_rows=plan.diff_rows))
            try:   # (the share's results, its accumulators, are not in its buffers)
                return blocks.run_share(p, t, bufs)
            finally:
                self._sets.give(key, bufs)

        # (BLAS held to one thread, shared by every fit of the process)
        with BLAS_ONE_THREAD if assign and threads > 1 else contextlib.nullcontext():
            accs = self._spawn(job, threads, stop)
        return labels, min_sq, blocks.merged(accs), ops

    def warm_workers(self, shape, k):
        """For a fit of X's shape that will run on the worker processes: start the pool in
        the background (passes run on threads until it is ready), or wait for one still
        starting, at most WORKERS_WAIT_S (less than a fit on threads costs)."""
        if self.threads > 1 and _wants_workers(self.processes, shape[1], _pass_ns(*shape, k)):
            numpy_pool.warm(self.threads, WORKERS_WAIT_S)

    def shares_memory(self, nbytes, d):
        """Whether the fit's centered copy of X (nbytes, d features) goes to shared memory,
        where the worker processes read it (`numpy_shm.shared_empty`)."""
        return (self.threads > 1 and nbytes >= SHARED_MIN_BYTES and
                _wants_workers(self.processes, d))

    #: "exact" in X's dtype; the reduced ones emulated (`emulated`, docs/precision.md)
    precisions = ("exact", "tf32", "fp16", "bf16")

    def assign(self, X, centers, *, xp=None):
        if self.compute_precision != "exact":
            return AssignResult(*emulated.assign(X, centers, self.compute_precision))
        labels, min_sq, _, _ = self._run(X, None, centers, mode="assign")
        return AssignResult(labels, min_sq)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        shape = np.empty((n_clusters, 0))
        _, _, acc, _ = self._run(X, sample_weight, shape, labels_in=labels, mode="reduce")
        return ReduceResult(acc.cluster_sums(), acc.weights)

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        old = None if labels_old is None else np.asarray(labels_old)
        if self.compute_precision != "exact":   # emulated labels, then one exact pass
            labels = emulated.assign(X, centers, self.compute_precision)[0]
            _, _, acc, _ = self._run(X, sample_weight, centers, labels_in=labels,
                                     mode="stats")
            changed = len(labels) if old is None else np.count_nonzero(labels != old)
            return IterStats(labels, acc.cluster_sums(), acc.weights, np.float64(acc.direct),
                             np.float64(changed))
        labels, _, acc, ops = self._run(X, sample_weight, centers, labels_old=old)
        changed = float(len(labels)) if old is None else float(acc.changed)
        inertia = acc.inertia(ops)
        return IterStats(labels, acc.cluster_sums(), acc.weights, np.float64(inertia),
                         np.float64(changed))

    def inertia(self, X, sample_weight, centers, labels, *, xp=None):
        """By differences, block by block (no n distances)."""
        _, _, acc, _ = self._run(X, sample_weight, centers, labels_in=labels, mode="inertia")
        return np.float64(acc.direct)

    def labels_inertia(self, X, sample_weight, centers, *, xp=None):
        """One pass: int32 labels, and their inertia by differences summed per block while
        labelling (no n distances: the final pass of a fit on a memmap stays in budget)."""
        if self.compute_precision != "exact":
            return emulated.labels_inertia(self, X, sample_weight, centers)
        labels, _, acc, _ = self._run(X, sample_weight, centers, mode="final")
        return labels, np.float64(acc.direct)

    def assign_bounded(self, X, centers, bounds, *, xp=None):
        """The contract's vectorised bounds, rows recomputed by this backend's augmented
        GEMM, near ties as `assign` breaks them (`numpy.bounded`)."""
        return bounded.assign_bounded(self, X, centers, bounds)

    def farthest(self, X, sample_weight, centers, labels, m, *, xp=None):
        """The default's points (`numpy_stats.farthest`), on the backend's threads."""
        return stats.farthest(X, sample_weight, np.asarray(centers), np.asarray(labels), m,
                              spawn, self.threads)

    def finish(self):
        """End of a fit (`NumpyPlacement.finish`): give the worker processes back and drop
        every job's buffers (a later call on this backend makes them again). The pass
        threads are the process's (`PASS_THREADS`): the backend holds none; nor plans."""
        self._run_workers.detach()
        self._sets.clear()
        self._plans = {}
