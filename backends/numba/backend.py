"""The numba backend: the numpy backend's answers from compiled kernels, one pass over X per
call (`numba_kernels`): nearest center, float64 per-cluster sums, inertia and changed labels
fused, on numba's threads, X read once per iteration (whose inertia comes from the sums and
the fit's sum w ||x||^2, as the numpy backend's; the final pass's by differences).

An optional extra (``pip install 'kmeans_xp[numba]'``: numba, and SciPy for numba's BLAS);
``backend="auto"`` takes it for NumPy input when numba is installed. Its kernels compile the
first time they run and are cached on disk (numba's ``cache=True``), so a later process loads
them.

Work split (`_Plan`): X is cut into at most MAX_TASKS contiguous tasks, each with its own
float64 accumulators, added in task order after the pass; the split depends on n, k, d and
max_memory, never on the thread count, so a fit's sums (and so its centers) are the same bit
for bit on 2 cores as on 16. Within a task, tiles of rows: NARROW_TILE rows for d <= 8
(distances in registers, X padded to 4 or 8 features), else as many rows as keep a tile's
(k, rows) distances within WIDE_TILE_BYTES (one BLAS GEMM per tile; BLAS held to one thread
while numba's threads run).
Distances are the numpy backend's ``||c||^2 - 2 x.c`` bit for bit on the narrow path and
where BLAS sums in feature order, so both backends break near-ties alike.
"""
from __future__ import annotations

import contextlib
import importlib.util
import numbers
import threading

import numpy as np

from kmeans_xp.contract.backend import (
    LABELS_DTYPE,
    AssignResult,
    IterStats,
    KMeansBackend,
    Option,
    ReduceResult,
    compact_labels_dtype,
)
from kmeans_xp.contract.chunks import inertia_of_sums, mean_of_sums, spawn, tolerance
from kmeans_xp.contract.memory import MemoryEstimate, chunk_rows, host_available_memory, resolve_budget
from kmeans_xp.contract.rows import HostRows, is_memmap
from kmeans_xp.contract.constraints import Interval

from kmeans_xp_backends.numpy import stats as numpy_stats
from kmeans_xp_backends.cpu_threads import BLAS_ONE_THREAD, thread_count
from kmeans_xp_backends.numpy.backend import NumpyPlacement

#: features the narrow kernel holds in registers (X padded with zero features up to it)
NARROW_D = 4
#: the register kernels' widths (numba_kernels._make_nearest_register): X padded with zero
#: features up to the first that holds d; past the last, GEMM tiles. Width 8 against GEMM
#: tiles, one Xeon thread, float32, an iteration: 0.58-0.71x at k 64-4096 for d 5 and 8,
#: about even at k=8; width 16 (d 12 and 16) lost at k=8 and k >= 1024, and won by under
#: 20% elsewhere, so it is not kept (`python benchmarks/time_kernels.py --backends numba
#: --numba-widths none`, against the default)
REGISTER_WIDTHS = (NARROW_D, 8)
#: rows per narrow tile: its transposed rows, minima and labels stay in L1
NARROW_TILE = 256
#: a wide tile's (k, rows) GEMM result at most this large (L2), MIN..MAX_TILE rows
WIDE_TILE_BYTES = 1 << 20
MIN_TILE, MAX_TILE = 16, 1024
#: with few centers, a tile's GEMM at most SMALL_GEMM_OUT outputs and SMALL_GEMM_WORK
#: multiply-adds: OpenBLAS's small-matrix kernels (AVX-512) take such products without
#: packing, 2-5x faster than its packed path at k <= 16 (d=128, k=8: 21-24 ps per
#: multiply-add at 64-128 rows, 50-54 at 256-1024; one thread of a Xeon, float32); outside
#: those kernels' bounds (k=64) tiles of 128 rows cost 0-10% more than tiles of 1024
SMALL_GEMM_MAX_K, SMALL_GEMM_MIN_D = 16, 32
SMALL_GEMM_OUT, SMALL_GEMM_WORK = 1024, 1 << 20
#: centers of at least BIG_CENTERS_BYTES are packed by BLAS anew for every tile: tiles of at
#: least BIG_CENTERS_MIN_TILE rows then, whatever WIDE_TILE_BYTES says (d=128, k=4096: 64-row
#: tiles 301-311 ms an iteration at n=50k, 256 rows 257-268, on 1 and 2 Xeon cores; at
#: d <= 32, k=1024, centers of 128 KB, larger tiles were 8-35% slower)
BIG_CENTERS_BYTES, BIG_CENTERS_MIN_TILE = 1 << 20, 256
#: tasks: at most MAX_TASKS, of at least MIN_TASK_ROWS rows, their float64 accumulators
#: within ACCUMULATOR_BYTES (and a quarter of max_memory)
MAX_TASKS = 64
MIN_TASK_ROWS = 1024
ACCUMULATOR_BYTES = 32 << 20
#: bytes of Python and numba objects a call creates
OVERHEAD = 64 << 10
#: what a pass computes (numba_kernels' flags, repeated here so that planning and the
#: module's import need no numba)
ASSIGN, MIN_SQ, SUMS, INERTIA, CHANGED = 1, 2, 4, 8, 16

_LAUNCH = threading.Lock()


def _kernels():
    """numba_kernels, imported on first use (numba is imported then, not with kmeans_xp)."""
    from kmeans_xp_backends.numba import kernels as numba_kernels
    return numba_kernels


_wide_ready = False


def _workers():
    """numba's threads now (inside `_launch`): the pass's workers, each with its scratch."""
    import numba
    return int(numba.get_num_threads())


def _load_blas():
    """SciPy's BLAS (what numba's np.dot calls) loaded (the BLAS thread limit sees it: it
    looks again after an import)."""
    global _wide_ready
    if not _wide_ready:
        import scipy.linalg.cython_blas  # noqa: F401 - loads the library numba calls
        _wide_ready = True


class _Plan:
    """Tasks, tiles and threads of a pass, and the bytes they need."""

    __slots__ = ("wide", "width", "tile", "threads", "n_tasks", "task_rows", "shared",
                 "scratch", "accumulators")

    def __init__(self, n, d, k, itemsize, max_memory, threads):
        # (the register kernel's padded features; None: GEMM tiles)
        self.width = next((wd for wd in REGISTER_WIDTHS if d <= wd), None)
        self.wide = self.width is None
        budget = resolve_budget(max_memory, host_available_memory(), cap=1 << 30)
        # centers as the kernels take them (the GEMM operand, ||c||^2, float64 copy), the
        # merged sums and weights, and what a call creates
        self.shared = (k * (max(d, self.width or 0) + 1) * itemsize + 2 * k * (d + 1) * 8
                       + OVERHEAD)
        acc = k * (d + 1) * 8 + 16
        if self.wide:  # a tile's rows, GEMM result, minima and labels
            row = (d + k + 1) * itemsize + 4
            ideal = min(MAX_TILE, max(MIN_TILE, WIDE_TILE_BYTES // (k * itemsize)))
            if k <= SMALL_GEMM_MAX_K and d >= SMALL_GEMM_MIN_D:
                ideal = min(ideal, _small_gemm_rows(k, d))
            if k * d * itemsize >= BIG_CENTERS_BYTES:
                ideal = max(ideal, BIG_CENTERS_MIN_TILE)
        else:          # the transposed rows, the rows (a copy, where not read in place),
            row = (self.width + d + 1) * itemsize + 4   # minima and labels
            ideal = NARROW_TILE
        # the least it can run in: one thread, one task, one row per tile
        rows = chunk_rows(budget, row, self.shared + acc, n_samples=n, floor=1,
                          what=f"the numba backend (k={k}, d={d})")
        self.tile = max(1, min(ideal, rows, n))
        scratch = self.tile * row
        # the tasks first, from the budget left beside one thread: the split (and so the
        # sums' bits) never depends on the thread count; threads take what is left
        room = (budget - self.shared - scratch) // acc
        limit = max(1, min(MAX_TASKS, room, min(budget // 4, ACCUMULATOR_BYTES) // acc))
        n_tasks = max(1, min(limit, -(-n // MIN_TASK_ROWS)))
        self.task_rows = -(-n // n_tasks)
        self.n_tasks = -(-n // self.task_rows)
        self.accumulators = self.n_tasks * acc
        self.threads = max(1, min(threads, (budget - self.shared - self.accumulators)
                                  // scratch))
        self.scratch = self.threads * scratch

    @property
    def total(self):
        return self.shared + self.scratch + self.accumulators


def _small_gemm_rows(k, d):
    """Tile rows (a power of two, at least MIN_TILE) whose (k, rows, d) GEMM stays within
    SMALL_GEMM_OUT outputs and SMALL_GEMM_WORK multiply-adds."""
    rows = max(MIN_TILE, min(SMALL_GEMM_OUT // k, SMALL_GEMM_WORK // (k * d)))
    return 1 << (rows.bit_length() - 1)


@contextlib.contextmanager
def _launch(threads, blas):
    """numba's threads at `threads` for this call (restored after), BLAS held to one thread
    when the kernels call it from many; one launch at a time (numba's workqueue threading
    layer cannot take two, and two would share the same cores anyway)."""
    import numba
    with _LAUNCH:
        before = numba.get_num_threads()
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        try:
            with BLAS_ONE_THREAD if blas else contextlib.nullcontext():
                yield
        finally:
            numba.set_num_threads(before)


class _Partials:
    """The tasks' accumulators, allocated once and reused while the shape holds."""

    def __init__(self):
        self.key = None
        self.arrays = None

    def get(self, n_tasks, k, d):
        if self.key != (n_tasks, k, d):
            self.arrays = None  # the old ones go first
            self.arrays = (np.empty((n_tasks, k, d)), np.empty((n_tasks, k)),
                           np.empty((n_tasks, 2)))
            self.key = (n_tasks, k, d)
        return self.arrays


class NumbaPlacement(NumpyPlacement):
    """NumpyPlacement, and a head start: the kernels a fit will run compiled (or loaded from
    numba's cache) on another thread while X is validated, centered and seeded."""

    def warm_up(self, X, n_clusters, seeding):
        if not isinstance(X, np.ndarray) or X.ndim != 2 or X.shape[0] == 0:
            return
        rows = X[:64]
        # what the fit computes on, typed alike: a memmap's own rows, or a centered copy of
        # X (in X's layout: numba compiles one version per layout)
        if is_memmap(X):
            sample = HostRows(rows, rows[0])
        elif X.flags.c_contiguous or X.flags.f_contiguous:
            sample = np.asarray(rows - rows[0], order="F" if X.flags.f_contiguous else "C")
        else:
            return
        centers = np.ascontiguousarray(rows[:max(1, min(n_clusters, rows.shape[0]))])
        # (not a daemon: the interpreter waits for a compile rather than stop it midway)
        threading.Thread(target=self._compile, args=(sample, centers, n_clusters),
                         name="kmeans_xp-numba-compile").start()

    def feature_stats(self, X, tol, *, xp):
        """The driver's mean and tol, NumPy's bits (`NumpyPlacement.feature_stats`): the
        column sums (the deviation sums at a zero mean) and the tol's deviation sums each in
        one compiled pass (`numba_kernels.deviation_sums`; at n=100k, d=128, 2 threads, 14
        and 30 ms through NumPy's blocks and the kernel before it vectorized, 3-4 ms each
        now)."""
        if not numpy_stats.parallel_columns(X):
            return super().feature_stats(X, tol, xp=xp)
        threads = self.backend.threads
        d = X.shape[1]
        groups = np.array(numpy_stats.column_groups(d, max(1, min(threads, d // 2))),
                          dtype=np.int64)
        sums, sq = np.empty(d), np.empty(d)
        with _launch(threads, False):   # (x - 0 is x: the column sums, the same adds)
            _kernels().deviation_sums(X, 0, X.shape[0], np.zeros(d), groups, sq, sums)
        mean = mean_of_sums(sums, X.shape[0], X.dtype, xp)

        def chunk_sums(sl, mean64):
            sq, shift = np.empty(d), np.empty(d)
            with _launch(threads, False):
                _kernels().deviation_sums(X, sl.start or 0, sl.stop, mean64, groups, sq,
                                          shift)
            return sq, shift

        return mean, tolerance(X, mean, tol, xp, self.backend.driver_rows(X),
                               chunk_sums=chunk_sums)

    def _compile(self, sample, centers, n_clusters):
        b = self.backend
        try:  # (the labels' dtype is n_clusters', which the sample's few centers may not hold)
            b._pass(sample, None, centers, ASSIGN | SUMS | INERTIA,
                    store=compact_labels_dtype(n_clusters))
        except Exception:  # noqa: BLE001 - only a head start: the fit compiles what it runs
            pass


class NumbaBackend(KMeansBackend):
    name = "numba"
    namespaces = frozenset({"numpy"})
    device = "cpu"
    options = {"n_threads": Option(None, None, Interval(numbers.Integral, 1),
                                   doc="numba threads over row tasks (default: usable cores)")}
    placement_class = NumbaPlacement

    def __init__(self, max_memory="auto", **options):
        super().__init__(max_memory, **options)
        self.threads = thread_count(self.n_threads)
        self.finish()   # (the per-fit state, empty)

    def _plan(self, n, d, k, itemsize):
        """The pass's `_Plan`, made once per shape until `finish`: it reads the free host
        memory (psutil: 0.15 ms, a tenth of a small iteration) and the fit's passes would
        all read about the same."""
        key = (n, d, k, itemsize)
        if key not in self._plans:
            self._plans[key] = _Plan(n, d, k, itemsize, self.max_memory, self.threads)
        return self._plans[key]

    def reject_reason(self, X, *, n_clusters, sample_weight=None):
        reason = super().reject_reason(X, n_clusters=n_clusters, sample_weight=sample_weight)
        if reason is not None:
            return reason
        dtype = str(getattr(X, "dtype", "float64"))
        if not dtype.endswith(("float32", "float64")):
            return f"it computes on float32 and float64, not {dtype}"
        shape = getattr(X, "shape", None)
        most = max(REGISTER_WIDTHS, default=0)
        wide = shape is not None and len(shape) == 2 and shape[1] > most
        if wide and importlib.util.find_spec("scipy") is None:
            return (f"with more than {most} features it calls SciPy's BLAS (numba's "
                    f"np.dot), and SciPy is not installed")
        return None

    def finish(self):
        """End of a fit (`NumpyPlacement.finish`): the tasks' accumulators go (a fitted model
        holds no scratch memory; numba's threads are the process's) and the plans with
        them (the next fit sees the free memory of its time)."""
        self._partials = _Partials()
        self._plans = {}
        self._sq_norms = (None, 0.0)   # ((X, mean, weights), their sum w ||x||^2)

    # -- memory -----------------------------------------------------------------------------
    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize, max_memory="auto",
                        n_threads=None):
        plan = _Plan(n_samples, n_features, n_clusters, itemsize, max_memory,
                     thread_count(n_threads))
        parts = {"task_buffers": plan.scratch, "task_sums": plan.accumulators,
                 "shared": plan.shared, "min_sq_dist": n_samples * itemsize}
        return MemoryEstimate(parts, sum(parts.values()), plan.task_rows)

    # -- one pass ---------------------------------------------------------------------------
    def _pass(self, X, sample_weight, centers, flags, *, labels=None, labels_old=None,
              store=None):
        """(labels, min_sq, sums, weights, inertia, changed) of one pass over X (see
        `numba_kernels.pass_narrow`); what `flags` does not ask for is None. Labels, new and
        given, are of dtype `store` (default: the smallest type that holds k,
        `compact_labels_dtype`), those given cast to it where they are not: the kernels
        compile once per labels dtype, so a fit's passes, its final one included, compile
        once (4-5 s at d=3), not once for the iterations and again for the int32 labels."""
        K = _kernels()
        data, mean = (X.data, X.mean) if isinstance(X, HostRows) else (X, None)
        data = np.asarray(data)   # (a memmap as a plain view of its pages: read as touched)
        n, d = data.shape
        dtype = data.dtype
        k = centers.shape[0]
        plan = self._plan(n, d, k, dtype.itemsize)
        empty = np.empty(0, dtype)
        # (a tile's rows are read in place where X is C-contiguous and not centered on the fly)
        in_place = mean is None and data.flags.c_contiguous
        Xc = data if in_place else np.empty((0, d), dtype)
        mean = empty if mean is None else np.ascontiguousarray(mean, dtype=dtype)
        w = empty if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=dtype)
        C = np.ascontiguousarray(centers, dtype=dtype)
        cn = np.einsum("ij,ij->i", C, C)  # in X's dtype, as the numpy backend's
        if plan.wide:
            g = np.multiply(C, -2)
        else:
            g = np.zeros((plan.width, k), dtype=dtype)
            np.multiply(C.T, -2, out=g[:d])
        c64 = C.astype(np.float64)
        store = compact_labels_dtype(k) if store is None else store
        if flags & ASSIGN:
            labels = np.empty(n, dtype=store)
        else:
            labels = np.ascontiguousarray(labels, dtype=store)
        old = (np.empty(0, dtype=store) if not flags & CHANGED
               else np.ascontiguousarray(labels_old, dtype=store))
        min_sq = np.empty(n, dtype=dtype) if flags & MIN_SQ else empty
        part_sums, part_w, part_stats = self._partials.get(plan.n_tasks, k, d)
        kernel = K.pass_wide if plan.wide else K.pass_narrow
        if plan.wide:
            _load_blas()
        sums = weights = None
        inertia = changed = 0.0
        with _launch(plan.threads, plan.wide and plan.threads > 1 and flags & ASSIGN):
            kernel(data, Xc, mean, w, g, cn, c64, labels, old, min_sq, part_sums, part_w,
                   part_stats, flags, plan.task_rows, plan.tile, _workers())
            if flags & SUMS:
                sums = np.empty((k, d))
                weights = np.empty(k)
                K.merge_partials(part_sums, part_w, sums, weights)
            for t in range(plan.n_tasks):  # task order (read before another call reuses them)
                inertia += float(part_stats[t, 0])
                changed += float(part_stats[t, 1])
        return labels, (min_sq if flags & MIN_SQ else None), sums, weights, inertia, changed

    # -- the contract -----------------------------------------------------------------------
    def assign(self, X, centers, *, xp=None):
        labels, min_sq, *_ = self._pass(X, None, centers, ASSIGN | MIN_SQ)
        return AssignResult(labels.astype(LABELS_DTYPE), min_sq)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        no_centers = np.zeros((n_clusters, X.shape[1]), dtype=X.dtype)
        _, _, sums, weights, _, _ = self._pass(X, sample_weight, no_centers, SUMS,
                                               labels=labels)
        return ReduceResult(sums, weights)

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        """One pass: labels, float64 sums and changed labels; the inertia from the sums and
        the fit's sum w ||x||^2 (`_sq_norm_total`), as the numpy backend's iteration takes
        it: a second float64 loop over each row (x - c) cost about what the sums do (n=100k,
        d=128, k=8, 2 threads: 1.1 of a 5.9 ms pass)."""
        flags = ASSIGN | SUMS | (0 if labels_old is None else CHANGED)
        labels, _, sums, weights, _, changed = self._pass(
            X, sample_weight, centers, flags, labels_old=labels_old)
        if labels_old is None:
            changed = float(labels.shape[0])
        inertia = inertia_of_sums(self._sq_norm_total(X, sample_weight, labels.dtype),
                                  centers, sums, weights)
        return IterStats(labels, sums, weights, np.float64(inertia), np.float64(changed))

    def _sq_norm_total(self, X, sample_weight, store):
        """sum w ||x||^2 in float64 (rows centered as the passes see them), once per X and
        weights until `finish`: one pass against a zero center, with labels of dtype `store`
        (the iterations': no compile of its own)."""
        data = (X.data, X.mean) if isinstance(X, HostRows) else (X, None)
        key = self._sq_norms[0]
        if key is None or not (key[0] is data[0] and key[1] is data[1]
                               and key[2] is sample_weight):
            n, d = data[0].shape   # (the pass casts the center to X's dtype)
            total = self._pass(X, sample_weight, np.zeros((1, d)), INERTIA,
                               labels=np.zeros(n, dtype=store), store=store)[4]
            # (the arrays themselves, held: an id could be reused by the next X)
            self._sq_norms = ((data[0], data[1], sample_weight), total)
        return self._sq_norms[1]

    def inertia(self, X, sample_weight, centers, labels, *, xp=None):
        return np.float64(self._pass(X, sample_weight, centers, INERTIA, labels=labels)[4])

    def labels_inertia(self, X, sample_weight, centers, *, xp=None):
        labels, _, _, _, inertia, _ = self._pass(X, sample_weight, centers, ASSIGN | INERTIA)
        return labels.astype(LABELS_DTYPE), np.float64(inertia)

    def assign_bounded(self, X, centers, bounds, *, xp=None):
        """The contract's bounds with the row test and the recomputed rows' bounds compiled
        (`numba.bounded`)."""
        from kmeans_xp_backends.numba import bounded
        return bounded.assign_bounded(self, X, centers, bounds, launch=_launch)

    def farthest(self, X, sample_weight, centers, labels, m, *, xp=None):
        """The default's points on all cores (`numpy_stats.farthest`, the numpy backend's)."""
        return numpy_stats.farthest(X, sample_weight, np.asarray(centers), np.asarray(labels),
                                    m, spawn, self.threads)
