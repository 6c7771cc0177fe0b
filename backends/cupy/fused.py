"""`cupy-fused`: the speed engine. Hand-written CUDA (cuda/fused_*.cu) through cupy.RawModule.

One Lloyd iteration (`lloyd_iter`, called by the driver) is a few launches and no host
synchronisation: pack_centers (-2c and ||c||^2 for the distance expansion, in numpy's
rounding), one assignment pass (distance + argmin with the centers streamed through shared
memory; for small d the per-cluster sums accumulated in the same pass, else a second kernel,
after a counting sort of the rows by label where d > 16 and the sums miss shared memory),
and finalize_sums (fixed-point sums to float64, the assignment's inertia, labels changed).
Nothing of size n x k exists anywhere; working memory is O(k d + blocks), + n words to sort.
The driver (kmeans_xp.algorithms.lloyd) updates the centers, relocates empty clusters (`farthest`) and
reads one small array per iteration, which it fetches while the next iteration runs.

Paths: which assignment kernel a problem runs (small d, the SIMT GEMM tile, tensor-core
kernels in TF32 or in split precision, 3xTF32; options precision, tf32_kernel, gemm_kernel,
half_kernel),
and why, is the table `paths.PATHS` (`paths.explain` says it for a problem); `fused_plan.plan`
sizes the chosen path's grids and buffers.

Determinism: the same input gives bit-identical labels, centers, inertia and history run to
run on the same GPU. Per-cluster sums are accumulated in 64-bit fixed point (two words per
value: as exact as float64 accumulation) and integer atomics commute; inertia is a fixed-order
tree over per-block partials (which depend on the grid, i.e. on the GPU model).

Exactness against the numpy backend: a distance is fma-chain(x_j * -2c_j) + ||c||^2, the
rounding OpenBLAS gives numpy's GEMM; ||c||^2 is summed in the order np.einsum uses
(`einsum_order`), so the float32 paths give numpy's labels bit for bit wherever OpenBLAS's
kernel is a plain in-order FMA chain. The final inertia and the relocation distances
reproduce numpy's pairwise summation (cuda/direct.cu).
"""
from __future__ import annotations

import warnings

import numpy as np

from kmeans_xp.contract.backend import AssignResult, IterStats, Option, ReduceResult
from kmeans_xp.contract.memory import KMeansMemoryError, MemoryEstimate, format_bytes, resolve_budget
from kmeans_xp.contract.namespaces import dtype_name as float_dtype_name
from kmeans_xp.contract.precision import HALF_STORAGE, half_kind

from . import common, fused_batch, fused_sums, paths
from . import fused_plan as fp
from .base import BASE_OPTIONS, CupyBackendBase
from .common import BLOCK, NULL, device_ptr, free_device_memory, launch, with_oom_retry
from .host_centers import HostCenters
from .workspace import CTYPE as _CTYPE, Workspace
from .placement import CupyPlacement

_i32 = np.int32


class FusedPlacement(CupyPlacement):
    """Centers on the host when the assignment pass is short. Measured on the H200: W1
    (n=2M, k=200) ran 1.23 ms per iteration with the driver's center math on the device (a
    dozen CuPy launches outlast the 0.2 ms pass) and 0.60 ms with it on the host; W3 (n=20M,
    k=1000) ran 8.72 ms on the device, where the next pass issued ahead hides that math, and
    9.35 ms on the host, where the device waits for it."""
    small_on_host = 1 << 16
    #: n * k under which a pass is short enough (about 1 ms) for the host to pay
    SHORT_PASS = 2 * 10**9

    def small(self, x, plan=None):
        """On the device when the fit's pass (plan.n rows against these k centers) is long;
        without a plan, by size alone (`CupyPlacement.small`)."""
        k = x.shape[0] if getattr(x, "ndim", 1) > 1 else 1
        if plan is not None and plan.n * k >= self.SHORT_PASS:
            return x if isinstance(x, self._cp.ndarray) else self._cp.asarray(x)
        return super().small(x, plan)


class CupyFusedBackend(CupyBackendBase):
    """Fused RawKernel backend; options: precision ("fp32" or "tf32"), tf32_kernel ("auto",
    "wgmma", "fused", "fused-v1" or "cublas", with tf32), gemm_kernel ("auto", "simt" or
    "3xtf32": the exact d > 16 path on float32), half_kernel ("auto", "shared" or
    "registers": fp16/bf16 on the wgmma kernel), fuse ("auto", True, False: sums inside the
    small-d assignment pass), points_per_thread and center_group (small-d kernel),
    free_memory."""

    name = "cupy-fused"
    placement_class = FusedPlacement
    options = {
        **BASE_OPTIONS,
        "precision": Option("fp32", "fp32", "tf32", doc="'fp32' (exact, default) or 'tf32' "
                            "(tensor cores, float32 input, not bit-exact)"),
        "tf32_kernel": Option("auto", *paths.TF32_KERNELS,
                              doc="with tf32: our tensor-core kernel with the argmin fused "
                              "('wgmma': Hopper's asynchronous one; 'fused': mma.sync, v2; "
                              "'fused-v1' the first one; 'auto': wgmma on compute capability "
                              "9.0, else v2), or cuBLAS GEMM per chunk + argmin; also which "
                              "tensor-core kernel the exact 3xTF32 path runs ('auto', "
                              "'wgmma' or 'fused')"),
        "gemm_kernel": Option("auto", *paths.GEMM_KERNELS, doc="precision='fp32', "
                              "d > 16, float32: the SIMT FMA kernel, or the tensor cores in "
                              "split precision (3xTF32: FP32-accurate, labels equal up to near "
                              "ties); 'auto': 3xTF32 up to d=160; float64 and GPUs before "
                              "compute capability 8.0 use the SIMT kernel"),
        "half_kernel": Option("auto", *paths.HALF_KERNELS, doc="precision='fp16' or "
                              "'bf16' (the wgmma kernel): X's rows rounded into shared memory "
                              "('shared'; 'auto') or each thread's fragments of X in registers "
                              "('registers', d <= 128)"),
        "fuse": Option("auto", "auto", True, False, doc="sums inside the small-d pass"),
        "points_per_thread": Option(None, None, 1, 2, 4, 8, doc="small-d kernel"),
        "center_group": Option(None, None, 1, 8, 16, 32, doc="small-d kernel: centers per "
                               "argmin group (1: compare and select per center)"),
    }

    #: the fit's precisions its kernel paths run (`paths.PRECISIONS`)
    precisions = tuple(paths.PRECISIONS)
    #: the half formats' wgmma kernels read data in their format as it is (float16 at fp16,
    #: bfloat16 at bf16 where CuPy holds it: `paths._half_dtypes`): a 16-byte chunk of X is
    #: its shared tile's chunk, and the update step reads half the bytes
    half_data = ("fp16", "bf16")

    def __init__(self, max_memory="auto", **options):
        super().__init__(max_memory, **options)
        self._ws = None
        self._batch_ws = None   # a batch's workspaces, by run (fused_batch)
        self._batch_bits = None   # its problems' max |x| (fused_batch._problem_bits)

    def use_precision(self, precision):
        """The fit's precision picks the kernel paths' (`paths.PRECISIONS`). The older
        backend_options={'precision': 'tf32'} still runs TF32 under precision='exact', with a
        DeprecationWarning: KMeans(precision='tf32') says it once for every backend."""
        super().use_precision(precision)
        given = self.__dict__.setdefault("_precision_option", self.precision)  # the user's
        self.precision = paths.PRECISIONS[precision] if precision != "exact" else given
        if precision == "exact" and given == "tf32":
            warnings.warn("backend_options={'precision': 'tf32'} is deprecated; pass "
                          "KMeans(precision='tf32') instead (docs/precision.md).",
                          DeprecationWarning, stacklevel=2)
            self.compute_precision = "tf32"

    def release_buffers(self):
        super().release_buffers()
        self._ws = None
        self._batch_ws = None
        self._batch_bits = None

    # -- capability -----------------------------------------------------------------------------
    def reject_reason(self, X, *, n_clusters, sample_weight=None):
        reason = super().reject_reason(X, n_clusters=n_clusters, sample_weight=sample_weight)
        if reason is not None:
            return reason
        dtype = float_dtype_name(getattr(X, "dtype", "float64"))  # "float32" of torch.float32 too
        half = half_kind(dtype) == self.compute_precision and self._stores_half()
        if getattr(X, "dtype", None) is not None and dtype not in _CTYPE and not half:
            return f"it computes in float32 or float64, not {dtype}"
        if self.precision != "fp32" and dtype != "float32" and not half:
            return f"precision={self.compute_precision!r} needs float32 input"
        if self.precision in paths.HALF_FORMATS:   # (a path of the table, or none)
            d = X.shape[1] if getattr(X, "ndim", 2) > 1 else 1
            dev = fp.device_facts(self._cp.cuda.Device().id)
            try:
                paths.choose(d, n_clusters, "float32", self.precision, dev,
                             half_kernel=self.half_kernel)
            except ValueError:
                return (f"precision={self.precision!r} runs on its wgmma kernel, which needs "
                        f"compute capability 9.0 and d <= {paths.WGMMA_MAX_D_HALF} (this GPU "
                        f"{dev.cc // 10}.{dev.cc % 10}, d={d}); cupy-chunked computes it on any "
                        f"GPU")
        if self.precision == "tf32":
            cc = int(self._cp.cuda.Device().compute_capability)
            if cc < 80:
                return f"precision='tf32' needs TF32 tensor cores (compute capability >= 8.0, " \
                       f"this GPU has {cc // 10}.{cc % 10})"
            if self.tf32_kernel == "cublas":
                try:
                    common.tf32_api(self._cp)
                except RuntimeError as exc:
                    return str(exc)
        if len(X) >= 2 ** 31:
            return f"n_samples={len(X)} >= 2^31; the kernels index rows with 32-bit integers"
        return None

    # -- memory ---------------------------------------------------------------------------------
    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto", precision="fp32", tf32_kernel="auto",
                        gemm_kernel="auto", half_kernel="auto", **_):
        """Device bytes of the backend's own part of a fit (the driver's arrays are counted by
        the core): X on the device (`data`), the plan's working buffers, and the chunk of
        relocation keys `farthest` ranks when a cluster is empty."""
        from .reductions import FARTHEST_ROWS
        dtype_name = "float32" if itemsize == 4 else "float64"
        budget = None if max_memory == "auto" else resolve_budget(max_memory, 0)
        plan = fp.plan(n_samples, n_features, n_clusters, dtype_name, fp.NOMINAL,
                       precision=precision, budget=budget, tf32_kernel=tf32_kernel,
                       gemm_kernel=gemm_kernel, half_kernel=half_kernel)
        parts = {"data": n_samples * n_features * itemsize, **plan.fixed_bytes,
                 "relocation": min(n_samples, FARTHEST_ROWS) * (2 * itemsize + 24)}
        return MemoryEstimate(parts, sum(parts.values()), plan.chunk_rows)

    def _shape_plan(self, n, d, k, dtype_name):
        """The plan from the shape alone (`_plan_for` fits its grids to the kernels)."""
        return fp.plan(n, d, k, dtype_name, fp.device_facts(self._cp.cuda.Device().id),
                       precision=self.precision, fuse=self.fuse, P=self.points_per_thread,
                       G=self.center_group, budget=self.memory.bytes(),
                       tf32_kernel=self.tf32_kernel, gemm_kernel=self.gemm_kernel,
                       half_kernel=self.half_kernel)

    def _stores_half(self) -> bool:
        """Whether this fit's data is in its half format: a precision of `half_data` whose
        dtype CuPy holds here (bfloat16 needs CuPy 14 with ml_dtypes)."""
        return self.placement.half_dtype() is not None

    def fit_kernels(self, n, d, k, dtype, *, seeding=None):
        # (a fit at a precision of half_data computes on data in that format: the placement's)
        half = self._stores_half()
        name = HALF_STORAGE[self.compute_precision] if half else str(np.dtype(dtype))
        seeding = name if half and seeding is not None else seeding
        return (super().fit_kernels(n, d, k, dtype, seeding=seeding) +
                fp.fit_kernel_names(self._shape_plan(n, d, k, name), name, d))

    def _plan_for(self, X, k):
        (n, d), budget = X.shape, self.memory.bytes()
        plan = fp.one_wave(self._shape_plan(n, d, k, str(X.dtype)), n, d, str(X.dtype),
                           fp.device_facts(self._cp.cuda.Device().id))
        fixed = sum(plan.fixed_bytes.values())
        if fixed > budget:
            free, total = free_device_memory()
            raise KMeansMemoryError(
                f"cupy-fused needs {format_bytes(fixed)} of working memory for k={k}, d={d} "
                f"({', '.join(f'{p} {format_bytes(v)}' for p, v in plan.fixed_bytes.items())}) "
                f"but max_memory allows {format_bytes(budget)} ({format_bytes(free)} free of "
                f"{format_bytes(total)}). Raise max_memory or use fewer clusters.")
        return plan

    # -- the workspace of a problem ---------------------------------------------------------------
    def _workspace(self, X, k, sample_weight=None):
        """(workspace, X contiguous, weights in X's dtype or None): cached for the same X, k
        and weights, so an iteration allocates only its outputs."""
        cp = self._cp
        ws = self._ws
        if ws is not None and ws.X is X and ws.k == k and ws.w_in is sample_weight:
            return ws
        if not (isinstance(X, cp.ndarray) and X.flags.c_contiguous):
            X = cp.ascontiguousarray(cp.asarray(X))
            if ws is not None and ws.X.shape == X.shape and ws.k == k and ws.w_in is \
                    sample_weight and device_ptr(ws.X) == device_ptr(X):
                return ws
        w = None if sample_weight is None else self.weights(sample_weight, X.dtype)
        if ws is not None and ws.X is X and ws.k == k:   # new weights only
            ws.w, ws.w_in, ws.scales = w, sample_weight, None
            return ws
        if ws is not None and ws.fits(X, k, w):
            # another X of the same shape (a mini-batch step's batch): the plan, buffers and
            # pinned centers are the last one's (re-planning, five zero fills and a pinned
            # allocation per step cost as much as a step's pass)
            ws.rebind(X, w, sample_weight)
            return ws
        self._ws = None  # release the old buffers before asking for new ones
        ws = Workspace(cp, self._plan_for(X, k), X, w, k,
                        fp.device_facts(cp.cuda.Device().id))
        ws.w_in = sample_weight
        self._ws = ws
        return ws

    # -- kernels, one small method each ----------------------------------------------------------
    def _host_centers(self, ws):
        if ws.host is None:
            host_pack = ws.plan.layout == 0 and ws.pack_args[5] != 0  # numpy's order known
            ws.host = HostCenters(self._cp, ws.k, ws.d, ws.T, ws.plan.S if host_pack else None)
        return ws.host

    def _pack(self, ws, centers):
        cp = self._cp
        if isinstance(centers, np.ndarray) and not isinstance(centers, cp.ndarray):
            host = self._host_centers(ws)
            if host.ops_in is not None:
                host.upload_operands(cp, centers, ws.ops)
                return
            c = host.upload(cp, centers)
        elif centers.dtype == ws.T and centers.flags.c_contiguous:
            c = centers
        else:
            c = cp.ascontiguousarray(centers.astype(ws.T, copy=False))
        launch(ws.fn_pack, ws.pack_grid, (c, *ws.pack_args))

    def _assign_pass(self, ws, labels, *, labels_old=None, min_sq=None, accumulate=False,
                     skip=None):
        """Labels (int32) into `labels`, optional min_sq, per-block inertia partials, labels
        changed against labels_old into the counter; with accumulate, the fixed-point sums
        too (fused into the pass or by a second kernel). `skip`: a one-element device bool;
        where it holds at run time the kernels return at once (see `lloyd_iter`)."""
        p, X = ws.plan, ws.X
        w = NULL if ws.w is None else ws.w
        tail = (NULL if labels_old is None else labels_old, labels,
                NULL if min_sq is None else min_sq, ws.partials, ws.counter,
                NULL if skip is None else skip)
        if p.path == "small":
            fuse = accumulate and p.fuse
            if fuse:
                scale = fused_sums.scales(ws, self.scratch)[0]
                extra, smem = (ws.acc, scale, np.float64(ws.two_l)), p.assign_smem
            else:
                extra = (NULL, NULL, np.float64(1.0))
                smem = p.tc * p.S * ws.T.itemsize
            launch(ws.fn_fused if fuse else ws.fn_assign, p.assign_grid,
                   (X, w, ws.ops, _i32(ws.rows), _i32(ws.k), _i32(p.tc), *tail, *extra),
                   shared_mem=smem)
        elif paths.VARIANTS[p.path].kind == "tile":   # (the argmin in the kernel)
            vec = fp.vector_rows(ws.x_name, ws.d) and device_ptr(X) % 16 == 0
            name = fp.assign_kernel_name(p, ws.x_name, ws.d, vec)
            # (a batch: its problems along the grid's y, `fused_batch`)
            launch(fp.kernel(name), (p.assign_grid, ws.problems),
                   (X, w, ws.ops, ws.cnorm, _i32(ws.rows), _i32(ws.d), _i32(p.kpad), *tail,
                    np.int64(ws.ops_b)), shared_mem=p.assign_smem)
        else:
            self._assign_tf32(ws, w, tail)
        if accumulate and not p.fuse:
            fused_sums.accumulate(ws, labels, self.scratch, skip=skip)

    def _assign_tf32(self, ws, w, tail):
        cp, p = self._cp, ws.plan
        m2ct = ws.ops.reshape(ws.d, p.kpad)
        fn = fp.kernel("argmin_rows<float>")

        def run(rows):
            if ws.gbuf is None or ws.gbuf.shape[0] < min(rows, ws.n):
                ws.gbuf = None
                ws.gbuf = cp.empty((min(rows, ws.n), p.kpad), dtype=cp.float32)
            n_partials = fp.cdiv(ws.n, rows) * p.assign_grid
            if n_partials > ws.partials.size:
                ws.partials = cp.zeros(n_partials, dtype=cp.float64)
            ws.n_partials = n_partials
            lo, lab, msq, _, counter, skip = tail
            with common.tf32_matmul(cp):
                for c, r0 in enumerate(range(0, ws.n, rows)):
                    r1 = min(r0 + rows, ws.n)
                    g = ws.gbuf[: r1 - r0]
                    cp.matmul(ws.X[r0:r1], m2ct, out=g)
                    launch(fn, p.assign_grid,
                           (g, ws.cnorm, _i32(r1 - r0), _i32(p.kpad), _i32(ws.k), np.int64(r0),
                            ws.X, _i32(ws.d), w, lo, lab, msq,
                            ws.partials[c * p.assign_grid:], counter, skip))
            return rows

        def halved(rows):
            ws.gbuf = None

        try:
            run(ws.chunk_rows)
        except cp.cuda.memory.OutOfMemoryError:
            halved(ws.chunk_rows)
            ws.chunk_rows = with_oom_retry(run, max(1, ws.chunk_rows // 2),
                                           what="cupy-fused tf32 distance chunk",
                                           on_halve=halved)

    # -- the contract's primitives ----------------------------------------------------------------
    def assign(self, X, centers, *, xp=None):
        cp = self._cp
        with self.stage("assign"):
            ws = self._workspace(X, centers.shape[0])
            self._pack(ws, centers)
            labels = cp.empty(ws.n, dtype=cp.int32)
            min_sq = cp.empty(ws.n, dtype=ws.T)
            self._assign_pass(ws, labels, min_sq=min_sq)
        return AssignResult(labels, min_sq)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        cp = self._cp
        with self.stage("update"):
            ws = self._workspace(X, n_clusters, sample_weight)
            k, d = ws.k, ws.d
            fused_sums.accumulate(ws, self.labels32(labels), self.scratch)
            out = cp.empty(k * (d + 1), dtype=cp.float64)
            fused_sums.finalize(ws, out, self.scratch)
        return ReduceResult(out[: k * d].reshape(k, d), out[k * d:])

    def batch_lloyd_iter(self, X, sample_weight, centers, labels_old, active, *, xp=None):
        """A dense batch on the device in one launch per step (`fused_batch`); a ragged
        batch, or a path without a batched kernel, each problem's `lloyd_iter`."""
        return fused_batch.batch_lloyd_iter(self, X, sample_weight, centers, labels_old, active)

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None, skip=None):
        """pack_centers, one assignment pass (+ the sums when not fused into it), finalize:
        new labels, sums, weights and the 0-d inertia and changed count, all on the device;
        nothing waits for the device. `skip` (taking it makes the backend `ahead_gate`): a
        one-element device bool; where it holds when the pass runs, the assignment and the
        sums return at once and the statistics are meaningless (the driver drops that
        iteration), so a dropped iteration costs a few launches."""
        cp = self._cp
        ws = self._workspace(X, centers.shape[0], sample_weight)
        k, d = ws.k, ws.d
        self._pack(ws, centers)
        labels = cp.empty(ws.n, dtype=cp.int32)
        old = None if labels_old is None else (
            labels_old if labels_old.dtype == np.int32 else self.labels32(labels_old))
        self._assign_pass(ws, labels, labels_old=old, accumulate=True, skip=skip)
        on_host = isinstance(centers, np.ndarray) and not isinstance(centers, cp.ndarray)
        # (centers on the host: the statistics are read below, their device buffer reused)
        out = self._host_centers(ws).stats_dev if on_host else cp.empty(
            k * (d + 1) + 2, dtype=cp.float64)
        fused_sums.finalize(ws, out, self.scratch, stats=True,
                       changed_if_none=float(ws.n) if labels_old is None else -1.0)
        kd = k * d
        if on_host:
            out = self._host_centers(ws).read(cp, out)  # small centers live on the host
        return IterStats(labels, out[:kd].reshape(k, d), out[kd:kd + k], out[kd + k],
                         out[kd + k + 1])
