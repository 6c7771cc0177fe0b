"""`cupy-fused`: the speed engine. Hand-written CUDA (fused_kernels.cu) through cupy.RawModule.

One pass per Lloyd iteration: distance + argmin with the centers streamed through shared
memory, and for small d the per-cluster sums accumulated in the same pass (shared-memory
privatisation). `kmeans_single` keeps the whole loop on the device: per iteration one 64-byte
device-to-host copy (labels-changed count, empty clusters, inertia, the previous center shift),
empty clusters relocated on the device with the driver's semantics, no host round trip of
centers. Nothing of size n x k exists anywhere; working memory is O(k d + blocks).

Paths (chosen per problem, see `_plan`):
  small  d <= 16: d is a template parameter, P points per thread, centers in shared memory,
         sums fused into the same kernel when k*(d+1) fits in shared memory next to them.
  gemm   d > 16: register-blocked SIMT GEMM tile (128 points x 128 centers per block, 8x8 per
         thread in float32, 4x8 in float64; double-buffered shared tiles, 16-byte loads) with
         the argmin in its epilogue; sums in a second kernel.
  tf32   backend_options={"precision": "tf32", "tf32_kernel": "cublas"}, float32 only: cuBLAS
         GEMM under CuPy's TF32 compute type (cupy._core._routines_linalg.COMPUTE_TYPE_TF32,
         set for the call and restored) per row chunk + a warp-per-row argmin kernel that
         reads the chunk once. Faster for large d, NOT bit-exact FP32 (products are
         rounded to TF32's 10-bit mantissa), so partitions can differ from the numpy
         backend near ties. Needs compute capability >= 8.0.
  tf32mma  backend_options={"precision": "tf32"} (tf32_kernel "fused", the default): our
         own tensor-core kernel (mma.sync m16n8k8 TF32, FP32 accumulation) with the argmin in
         its epilogue, so the n x k distances never go through device memory (the cuBLAS path
         writes and reads them once per iteration). On the H200 at n=1M, d=128, k=4096:
         11.5 ms per iteration against 13.3 ms for the cuBLAS path and 29.4 ms exact FP32.

Determinism: the same input gives bit-identical labels, centers, inertia and history run to
run on the same GPU. Per-cluster sums are accumulated in 64-bit fixed point (two words per
value, so about 90 bits: as exact as float64 accumulation), and integer atomics commute;
inertia and center shift are fixed-order trees over per-block partials. There is no fallback
to float atomics anywhere, so there is no non-reproducible case; the partials depend on the
grid size, which depends on the GPU model, so two different GPUs may differ in the last bits
of the inertia (never in labels or sums).

Exactness against the numpy backend: a distance is fma-chain(x_j * -2c_j) + ||c||^2, the
rounding OpenBLAS gives numpy's GEMM (also for the augmented [x, 1] @ [-2C^T; ||c||^2] form:
its last step fma(1, ||c||^2, acc) is the same single rounding); ||c||^2 is summed in the
order np.einsum("ij,ij->i") uses, which depends on numpy's SIMD baseline and is detected once
from numpy itself (`_einsum_norm_mode`: 16-byte vectors, no FMA, pairwise horizontal sum on
x86-64 builds). So the float32 GEMM path gives numpy's labels bit for bit wherever OpenBLAS's
kernel is a plain in-order FMA chain (d up to its K block). Relocation and inertia distances
reproduce numpy's pairwise summation exactly.
"""
from __future__ import annotations

import contextlib
import functools
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kmeans_xp.backend import AssignResult, IterResult, ReduceResult
from kmeans_xp.lloyd import LloydResult
from kmeans_xp.memory import KMeansMemoryError, MemoryEstimate, format_bytes, resolve_budget

from ._cupy_common import CupyBackendBase, cupy

#: threads per block of the point-parallel kernels (BLOCK in fused_kernels.cu)
BLOCK = 256
#: largest d compiled as a template parameter (one module per (dtype, d))
SMALL_D_MAX = 16
#: shared memory given to one tile of centers in the small-d kernel
CENTER_TILE_BYTES = 32 * 1024
#: "auto" fuses the sums into the small-d pass while the block's shared memory (center tile +
#: privatised sums) stays under this, i.e. at least two blocks per SM
FUSE_SMEM_MAX = 96 * 1024
#: (TM, TN) outputs per thread of the GEMM-like kernel; a block is (16 TM) x (16 TN)
GEMM_TILES = {"float32": (8, 8), "float64": (4, 8)}
#: TF32 path: largest distance chunk (rows x k x 4 bytes); bigger stops paying
TF32_CHUNK_CAP = 1 << 30
#: points per block of the fused TF32 kernel (assign_tf32's BM) and its dynamic shared memory
#: (two A tiles 128 x 20 words, two B tiles 16 x 136 words, 2 x 128 x 20 words of best/index)
TF32_MMA_ROWS = 128
TF32_MMA_SMEM = (2 * 128 * 20 + 2 * 16 * 136 + 2 * 128 * 20) * 4
#: stats slots (float64 words; 0 and 1 are uint64 counters)
CHANGED, N_EMPTY, INERTIA, SHIFT, FINAL_INERTIA = range(5)
#: `done` counters of the kernels that finish with a last-block reduction
DONE_UPDATE, DONE_RELOCATE, DONE_INERTIA = range(3)

NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")
KERNEL_SOURCE = Path(__file__).with_name("fused_kernels.cu")
_CTYPE = {"float32": "float", "float64": "double"}
_OPTIONS = ("precision", "tf32_kernel", "fuse", "points_per_thread")


# -- kernel names (shared with tests/test_cuda_compile.py) ---------------------------------------
def points_per_thread(dtype_name: str, d: int) -> int:
    """Points per thread of the small-d kernel: 4 while their coordinates take <= 32 bytes of
    registers, else 2 (keeps the kernel near 64 registers, 4+ blocks per SM)."""
    itemsize = 4 if dtype_name == "float32" else 8
    return 4 if d * itemsize <= 32 else 2


def ops_stride(dtype_name: str, d: int) -> int:
    """Row stride of the packed small-d centers: (d + 1) values rounded up to 16 bytes."""
    itemsize = 4 if dtype_name == "float32" else 8
    return ((d + 1) * itemsize + 15) // 16 * 16 // itemsize


def small_kernel_names(dtype_name: str, d: int, P: int) -> tuple:
    t = _CTYPE[dtype_name]
    return (f"assign_small<{t},{d},{P},true>", f"assign_small<{t},{d},{P},false>")


def gemm_kernel_name(dtype_name: str, vec: bool) -> str:
    """The GEMM-like assignment kernel; vec: 16-byte global loads of X (d a multiple of the
    16-byte vector, X aligned)."""
    tm, tn = GEMM_TILES[dtype_name]
    return f"assign_gemm<{_CTYPE[dtype_name]},{tm},{tn},{'true' if vec else 'false'}>"


def common_kernel_names(dtype_name: str) -> tuple:
    t = _CTYPE[dtype_name]
    tf32 = (("argmin_rows<float>", "assign_tf32<true>", "assign_tf32<false>")
            if dtype_name == "float32" else ())
    return (gemm_kernel_name(dtype_name, True), gemm_kernel_name(dtype_name, False), *tf32,
            f"accumulate_shared<{t}>", f"accumulate_global<{t}>", "finalize_sums",
            f"pack_centers<{t}>", f"update_centers<{t}>", "list_empty_clusters",
            f"relocation_keys<{t}>", f"relocate_farthest<{t}>", f"direct_inertia<{t}>",
            f"column_absmax<{t}>")


def all_kernel_names() -> list:
    """Every template instance the backend can ask NVRTC for."""
    names = []
    for dt in _CTYPE:
        names += common_kernel_names(dt)
        for d in range(1, SMALL_D_MAX + 1):
            names += small_kernel_names(dt, d, points_per_thread(dt, d))
    return names


# -- compilation and device facts (memoized) ----------------------------------------------------
@functools.lru_cache(maxsize=1)
def _source() -> str:
    return KERNEL_SOURCE.read_text()


@functools.lru_cache(maxsize=None)
def _module(names: tuple):
    """One RawModule per set of instances; NVRTC runs on first use (and CuPy caches on disk)."""
    cp = cupy()
    return cp.RawModule(code=_source(), options=NVRTC_OPTIONS, name_expressions=list(names))


@functools.lru_cache(maxsize=None)
def _kernel(names: tuple, name: str):
    return _module(names).get_function(name)


def common_instance(dtype_name, name):
    """The full instance name in the common module of `name`: a full instance name, or a
    template name that has exactly one instance for this dtype."""
    names = common_kernel_names(dtype_name)
    matches = [n for n in names if n == name or n.startswith(name + "<")]
    if len(matches) != 1:
        raise KeyError(f"{name!r} names {len(matches)} kernels for {dtype_name}: {matches}")
    return matches[0]


def _common(dtype_name, name):
    return _kernel(common_kernel_names(dtype_name), common_instance(dtype_name, name))


# -- numpy's summation order for ||c||^2 (np.einsum("ij,ij->i", C, C)) ---------------------------
#: (vector bytes, fused multiply-add, horizontal sum) candidates, most likely first: x86-64
#: baseline (SSE: no FMA, hadd pairs), aarch64 (NEON: FMA, pairwise), AVX2 and AVX-512
#: baselines. Horizontal sum: 0 adjacent pairs, 1 halves folded, 2 folded to 16 bytes then pairs.
_EINSUM_CANDIDATES = ((16, False, 0), (16, True, 0), (32, True, 0), (32, True, 2),
                      (32, False, 0), (32, False, 2), (64, True, 1), (64, True, 2),
                      (64, True, 0), (64, False, 1), (64, False, 2), (64, False, 0))


def _emulate_einsum_sq_norm(C, vec_bytes, fused, hmode):
    """np.einsum("ij,ij->i", C, C) for float32 C as numpy's SIMD loop would sum it with
    vectors of vec_bytes (the loop of einsum_sq_norm in fused_kernels.cu, row-parallel)."""
    C = np.asarray(C, dtype=np.float32)
    k, d = C.shape
    L = vec_bytes // 4

    def muladd(v, acc):
        if fused:  # the product is exact in float64; one more rounding (to float32) is rare
            return (v.astype(np.float64) * v.astype(np.float64) + acc).astype(np.float32)
        return v * v + acc

    acc = np.zeros((k, L), dtype=np.float32)
    p, cnt = 0, d
    while cnt >= 4 * L:
        t = muladd(C[:, p + 3 * L:p + 4 * L], acc)
        t = muladd(C[:, p + 2 * L:p + 3 * L], t)
        t = muladd(C[:, p + L:p + 2 * L], t)
        acc = muladd(C[:, p:p + L], t)
        p, cnt = p + 4 * L, cnt - 4 * L
    while cnt > 0:
        v = np.zeros((k, L), dtype=np.float32)
        v[:, :min(cnt, L)] = C[:, p:p + min(cnt, L)]
        acc = muladd(v, acc)
        p, cnt = p + L, cnt - L
    w = L
    while w > 1:
        fold = hmode == 1 or (hmode == 2 and w > 4)
        acc = acc[:, :w // 2] + acc[:, w // 2:w] if fold else acc[:, 0:w:2] + acc[:, 1:w:2]
        w //= 2
    return np.float32(0) + acc[:, 0]


@functools.lru_cache(maxsize=1)
def _einsum_order():
    """(vector bytes, fused, horizontal mode) of this numpy's einsum, or None when no candidate
    reproduces it (the kernels then sum ||c||^2 sequentially)."""
    rng = np.random.default_rng(20240611)
    tests = [(rng.standard_normal((48, d)) * rng.uniform(0.1, 30.0, d)).astype(np.float32)
             for d in (5, 7, 9, 13, 17, 33, 67, 130, 261)]
    refs = [np.einsum("ij,ij->i", C, C) for C in tests]
    for cand in _EINSUM_CANDIDATES:
        if all(np.array_equal(_emulate_einsum_sq_norm(C, *cand), r)
               for C, r in zip(tests, refs)):
            return cand
    return None


def _einsum_norm_mode(dtype_name: str) -> int:
    """The `norm_mode` argument of pack_centers/update_centers for this dtype."""
    order = _einsum_order()
    if order is None:
        return 0
    vec_bytes, fused, hmode = order
    lanes = vec_bytes // (4 if dtype_name == "float32" else 8)
    return lanes | (int(fused) << 8) | (hmode << 9)


class _Device(NamedTuple):
    sms: int
    smem_block: int   # opt-in shared memory per block
    smem_sm: int      # shared memory per multiprocessor


@functools.lru_cache(maxsize=None)
def _device(device_id: int) -> _Device:
    rt = cupy().cuda.runtime
    get = rt.deviceGetAttribute
    return _Device(get(rt.cudaDevAttrMultiProcessorCount, device_id),
                   get(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id),
                   get(rt.cudaDevAttrMaxSharedMemoryPerMultiprocessor, device_id))


#: a nominal device for estimate_memory, which runs before any device is touched (H200)
_NOMINAL = _Device(132, 227 * 1024, 228 * 1024)


#: largest dynamic shared memory opted in per kernel (RawKernel takes no new attributes)
_SMEM_OPTED = {}


def _opt_in(fn, shared_mem):
    """A block gets more than 48 KB of dynamic shared memory only after an opt-in."""
    if shared_mem > 48 * 1024 and _SMEM_OPTED.get(id(fn), 0) < shared_mem:
        fn.max_dynamic_shared_size_bytes = int(shared_mem)
        _SMEM_OPTED[id(fn)] = shared_mem


def _launch(fn, grid, args, shared_mem=0, block=BLOCK):
    _opt_in(fn, shared_mem)
    fn((int(max(grid, 1)),), (block,), args, shared_mem=int(shared_mem))


def _blocks_per_sm(fn, shared_mem, block=BLOCK):
    """Resident blocks per SM (registers and shared memory), so that a grid-stride kernel's
    grid is exactly one wave: no second, partial wave."""
    _opt_in(fn, shared_mem)
    try:
        n = cupy().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            fn.kernel.ptr, block, int(shared_mem))
    except Exception:  # fall back on the register count alone
        regs = (fn.num_regs + 7) // 8 * 8
        n = min(2048 // block, 65536 // max(regs * block, 1))
    return max(1, int(n))


def _i32(v):
    return np.int32(v)


def _cdiv(a, b):
    return -(-a // b)


# -- the plan: which kernels, how many blocks, how much memory ----------------------------------
class _Plan(NamedTuple):
    path: str          # "small", "gemm", "tf32" (cuBLAS + argmin) or "tf32mma"
    fuse: bool         # sums accumulated inside the small-d assignment pass
    P: int             # points per thread (small)
    tc: int            # centers per shared-memory tile (small)
    assign_smem: int
    assign_grid: int
    layout: int        # 0: ops (k, S); 1: -2C^T (d, kpad) + ||c||^2 (kpad)
    S: int
    kpad: int
    acc_mode: str      # "fused", "shared" or "global"
    acc_smem: int
    acc_grid: int
    n_partials: int    # per-block inertia partials of one assignment pass
    chunk_rows: int    # tf32: rows per GEMM chunk (n otherwise)
    fixed_bytes: dict  # working memory by part


def _plan(n, d, k, dtype_name, dev, *, precision="fp32", fuse="auto", P=None,
          budget=None, tf32_kernel="fused") -> _Plan:
    itemsize = 4 if dtype_name == "float32" else 8
    sums_smem = k * (d + 1) * 16 + (d + 1) * 8
    if precision == "tf32" or d > SMALL_D_MAX:
        if precision == "tf32":
            path = "tf32mma" if tf32_kernel == "fused" else "tf32"
        else:
            path = "gemm"
        layout, S = 1, 0
        tm, tn = GEMM_TILES[dtype_name]
        kpad = _cdiv(k, 16 * tn) * 16 * tn   # a multiple of 128 (both GEMM kernels' BN)
        fused, P, tc, assign_smem = False, 1, 0, 0
        assign_grid = {"gemm": _cdiv(n, 16 * tm), "tf32mma": _cdiv(n, TF32_MMA_ROWS),
                       "tf32": dev.sms * 8}[path]
    else:
        path, layout, S, kpad = "small", 0, ops_stride(dtype_name, d), k
        P = P or points_per_thread(dtype_name, d)
        tc = max(1, min(k, CENTER_TILE_BYTES // (S * itemsize)))
        tile = tc * S * itemsize
        can_fuse = tile + sums_smem <= dev.smem_block - 2048
        fused = bool(can_fuse and (fuse is True or (fuse == "auto"
                                                    and tile + sums_smem <= FUSE_SMEM_MAX)))
        assign_smem = tile + (sums_smem if fused else 0)
        per_sm = max(1, min(2048 // BLOCK, dev.smem_sm // (assign_smem + 1024)))
        assign_grid = max(1, min(_cdiv(n, BLOCK * P), dev.sms * per_sm))
    if fused:
        acc_mode, acc_smem, acc_grid = "fused", 0, 0
    elif sums_smem <= min(dev.smem_block - 2048, 160 * 1024):
        per_sm = max(1, min(2048 // BLOCK, dev.smem_sm // (sums_smem + 1024)))
        acc_mode, acc_smem = "shared", sums_smem
        acc_grid = max(1, min(_cdiv(n, BLOCK), dev.sms * per_sm))
    else:
        acc_mode, acc_smem = "global", 0
        acc_grid = max(1, min(_cdiv(n * (d + 1), BLOCK), dev.sms * 16))
    chunk_rows = n
    n_chunks = 1
    if path == "tf32":
        per_row = kpad * 4
        room = TF32_CHUNK_CAP if budget is None else min(TF32_CHUNK_CAP, budget // 2)
        chunk_rows = int(max(1, min(n, room // per_row)))
        n_chunks = _cdiv(n, chunk_rows)
    n_partials = assign_grid * n_chunks
    ops = (k * S if layout == 0 else d * kpad + kpad) * itemsize
    parts = {
        "sum_accumulators": k * (d + 1) * 16,
        "sums_and_weights": k * (d + 1) * 8,
        "centers": 2 * k * d * itemsize,
        "center_operands": ops,
        "block_partials": 8 * (n_partials + _cdiv(k, BLOCK) + 2 * dev.sms * 8) + 64,
        "relocation": k * 20,
        "relocation_keys": n * itemsize,
        "labels_int32": n * 4,
        "labels_int64_output": n * 8,
    }
    if path == "tf32":
        parts["tf32_distance_chunk"] = chunk_rows * kpad * 4
    return _Plan(path, fused, P, tc, assign_smem, assign_grid, layout, S, kpad, acc_mode,
                 acc_smem, acc_grid, n_partials, chunk_rows, parts)


def _one_wave(plan, n, d, dtype_name, dev):
    """Grid-stride grids sized to what is resident at once on this GPU (compiles the kernel)."""
    if plan.path == "small":
        names = small_kernel_names(dtype_name, d, plan.P)
        fn = _kernel(names, names[0] if plan.fuse else names[1])
        per_sm = _blocks_per_sm(fn, plan.assign_smem)
        grid = max(1, min(_cdiv(n, BLOCK * plan.P), dev.sms * per_sm))
        plan = plan._replace(assign_grid=grid, n_partials=grid)
    if plan.acc_mode == "shared":
        per_sm = _blocks_per_sm(_common(dtype_name, "accumulate_shared"), plan.acc_smem)
        plan = plan._replace(acc_grid=max(1, min(_cdiv(n, BLOCK), dev.sms * per_sm)))
    return plan


def _tf32_api(cp):
    """(get_compute_type, set_compute_type, COMPUTE_TYPE_TF32) of CuPy's matmul. They live in
    cupy._core._routines_linalg (CuPy 8 to 14 at least; cupy._core re-exports only the two
    functions, not the constants); a clear error where this CuPy lacks them."""
    try:
        from cupy._core import _routines_linalg as linalg
        return linalg.get_compute_type, linalg.set_compute_type, linalg.COMPUTE_TYPE_TF32
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(
            f"precision='tf32' needs CuPy's TF32 compute type "
            f"(cupy._core._routines_linalg.COMPUTE_TYPE_TF32 with get/set_compute_type), "
            f"which CuPy {getattr(cp, '__version__', '?')} does not provide ({exc}). Use "
            f"precision='fp32'.") from exc


@contextlib.contextmanager
def _tf32_matmul(cp):
    """CuPy's float32 matmul on TF32 tensor cores inside the block (the previous compute type
    restored after). CuPy keeps the compute type per process, so a float32 matmul on another
    thread meanwhile would also run in TF32."""
    get, set_, tf32 = _tf32_api(cp)
    old = get(cp.float32)
    set_(cp.float32, tf32)
    try:
        yield
    finally:
        set_(cp.float32, old)


def _fixed_point_scales(absmax, w_total, n):
    """Power-of-two scale per feature (and for the weights, last) such that every cluster's
    fixed-point hi word stays below 2^62, and the lo word's 2^L for n points."""
    bounds = list(np.asarray(absmax, dtype=np.float64) * w_total) + [w_total]
    scales = []
    for b in bounds:
        if not (b > 0 and math.isfinite(b)):
            scales.append(1.0)
            continue
        e = math.frexp(b)[1]          # b < 2^e
        scales.append(2.0 ** max(-1000, min(1000, 61 - e)))
    L = max(1, 63 - int(n).bit_length())
    return np.array(scales), 2.0 ** L


# -- device state of one problem -------------------------------------------------------------
class _State:
    """The buffers one fit (or one primitive call) works in, allocated once."""

    def __init__(self, cp, plan, X, w, k, dtype_name):
        n, d = X.shape
        self.cp, self.plan, self.X, self.w, self.n, self.d, self.k = cp, plan, X, w, n, d, k
        self.dtype_name = dtype_name
        self.T = X.dtype
        self.acc = cp.zeros(k * (d + 1) * 2, dtype=cp.uint64)
        self.sums = cp.zeros((k, d), dtype=cp.float64)
        self.weights = cp.zeros(k, dtype=cp.float64)
        if plan.layout == 0:
            self.ops = cp.zeros(k * plan.S, dtype=self.T)
            self.cnorm = cp.zeros(1, dtype=self.T)
        else:
            self.ops = cp.zeros(d * plan.kpad, dtype=self.T)
            self.cnorm = cp.full(plan.kpad, np.inf, dtype=self.T)  # padding never wins
        self.n_partials = plan.n_partials   # grows if an OOM halves the tf32 chunk
        self.chunk_rows = plan.chunk_rows
        self.partials = cp.zeros(max(plan.n_partials, 1), dtype=cp.float64)
        self.shift_partials = cp.zeros(_cdiv(k, BLOCK), dtype=cp.float64)
        self.stats = cp.zeros(8, dtype=cp.float64)
        self.done = cp.zeros(4, dtype=cp.uint32)
        self.labels = cp.full(n, -1, dtype=cp.int32)
        self.gbuf = None
        self.keys = None        # relocation keys (n values), allocated on the first relocation
        self._scales = None

    # fixed-point scales need max|x| per feature and the total weight: one sync, once
    def scales(self):
        if self._scales is None:
            cp, n, d = self.cp, self.n, self.d
            bits = cp.zeros(d, dtype=cp.uint64)
            dev = _device(cp.cuda.Device().id)
            grid = max(_cdiv(d, BLOCK), min(_cdiv(n * d, BLOCK), dev.sms * 8))
            _launch(_common(self.dtype_name, "column_absmax"), grid,
                    (self.X, np.int64(n * d), _i32(d), bits))
            w_total = float(cp.sum(self.w, dtype=cp.float64))
            absmax = bits.get().view(np.float64)
            scale, two_l = _fixed_point_scales(absmax, w_total, n)
            self._scales = (cp.asarray(scale), cp.asarray(1.0 / scale), float(two_l))
        return self._scales


class CupyFusedBackend(CupyBackendBase):
    """Fused RawKernel backend; options: precision ("fp32" or "tf32"), tf32_kernel ("cublas"
    or "fused", with tf32), fuse ("auto", True, False: sums inside the small-d assignment
    pass), points_per_thread (small-d kernel)."""

    name = "cupy-fused"

    def __init__(self, max_memory="auto", precision="fp32", fuse="auto",
                 points_per_thread=None, tf32_kernel="fused", **options):
        if options:
            raise TypeError(f"backend {self.name!r} takes no options {sorted(options)}; "
                            f"backend_options it knows: {list(_OPTIONS)}")
        if precision not in ("fp32", "tf32"):
            raise ValueError(f"precision={precision!r}: use 'fp32' (exact, default) or 'tf32' "
                             f"(tensor cores, float32 input, not bit-exact)")
        if tf32_kernel not in ("cublas", "fused"):
            raise ValueError(f"tf32_kernel={tf32_kernel!r}: use 'fused' (default: tensor-core "
                             f"kernel with the argmin fused) or 'cublas' (cuBLAS GEMM per "
                             f"chunk + argmin)")
        if fuse not in ("auto", True, False):
            raise ValueError(f"fuse={fuse!r}: use 'auto', True or False")
        if points_per_thread not in (None, 1, 2, 4, 8):
            raise ValueError(f"points_per_thread={points_per_thread!r}: use 1, 2, 4 or 8")
        super().__init__(max_memory)
        self.precision, self.fuse, self.points_per_thread = precision, fuse, points_per_thread
        self.tf32_kernel = tf32_kernel

    # -- capability -----------------------------------------------------------------------------
    def reject_reason(self, X, *, n_clusters, sample_weight=None):
        reason = super().reject_reason(X, n_clusters=n_clusters, sample_weight=sample_weight)
        if reason is not None:
            return reason
        dtype = str(getattr(X, "dtype", "float64"))
        if getattr(X, "dtype", None) is not None and dtype not in _CTYPE:
            return f"it computes in float32 or float64, not {dtype}"
        if self.precision == "tf32" and dtype != "float32":
            return "precision='tf32' needs float32 input"
        if self.precision == "tf32":
            cc = int(self._cp.cuda.Device().compute_capability)
            if cc < 80:
                return f"precision='tf32' needs TF32 tensor cores (compute capability >= 8.0, " \
                       f"this GPU has {cc // 10}.{cc % 10})"
            if self.tf32_kernel == "cublas":
                try:
                    _tf32_api(self._cp)
                except RuntimeError as exc:
                    return str(exc)
        n = len(X)
        if n >= 2 ** 31:
            return f"n_samples={n} >= 2^31; the kernels index rows with 32-bit integers"
        return None

    # -- memory ---------------------------------------------------------------------------------
    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto", precision="fp32", tf32_kernel="fused", **_):
        dtype_name = "float32" if itemsize == 4 else "float64"
        budget = None if max_memory == "auto" else resolve_budget(max_memory, 0)
        plan = _plan(n_samples, n_features, n_clusters, dtype_name, _NOMINAL,
                     precision=precision, budget=budget, tf32_kernel=tf32_kernel)
        parts = dict(plan.fixed_bytes)
        return MemoryEstimate(parts, sum(parts.values()), plan.chunk_rows)

    def _plan_for(self, X, k):
        n, d = X.shape
        dev = _device(self._cp.cuda.Device().id)
        budget = self.budget()
        plan = _plan(n, d, k, str(X.dtype), dev, precision=self.precision, fuse=self.fuse,
                     P=self.points_per_thread, budget=budget, tf32_kernel=self.tf32_kernel)
        plan = _one_wave(plan, n, d, str(X.dtype), dev)
        fixed = sum(v for p, v in plan.fixed_bytes.items() if not p.startswith("labels"))
        if fixed > budget:
            free, total = self._free()
            raise KMeansMemoryError(
                f"cupy-fused needs {format_bytes(fixed)} of working memory for k={k}, d={d} "
                f"({', '.join(f'{p} {format_bytes(v)}' for p, v in plan.fixed_bytes.items())}) "
                f"but max_memory allows {format_bytes(budget)} ({format_bytes(free)} free of "
                f"{format_bytes(total)}). Raise max_memory or use fewer clusters.")
        return plan

    def _free(self):
        from ._cupy_common import free_device_memory
        return free_device_memory()

    # -- input preparation ------------------------------------------------------------------------
    def _prepare(self, X, sample_weight, k):
        cp = self._cp
        X = cp.ascontiguousarray(X)
        if sample_weight is None:
            w = cp.ones(X.shape[0], dtype=X.dtype)
        else:
            w = cp.ascontiguousarray(cp.asarray(sample_weight).astype(X.dtype, copy=False))
        plan = self._plan_for(X, k)
        return _State(cp, plan, X, w, k, str(X.dtype)), X, w

    # -- kernels, one small method each ----------------------------------------------------------
    def _pack(self, st, centers):
        c = self._cp.ascontiguousarray(centers.astype(st.T, copy=False))
        p = st.plan
        _launch(_common(st.dtype_name, "pack_centers"), _cdiv(st.k, BLOCK),
                (c, _i32(st.k), _i32(st.d), _i32(p.layout), _i32(p.S), _i32(p.kpad),
                 _i32(_einsum_norm_mode(st.dtype_name)), st.ops, st.cnorm))
        return c

    def _assign_pass(self, st, *, min_sq=None, count_changed=False, accumulate=False):
        """Labels (into st.labels), optional min_sq, per-block inertia partials, labels-changed
        count; with accumulate, the fixed-point sums too (fused or by a second kernel)."""
        p, X, w = st.plan, st.X, st.w
        want_min = min_sq is not None
        msq = min_sq if want_min else st.partials  # any pointer: never written
        common = (st.labels, msq, _i32(want_min), _i32(count_changed))
        if p.path == "small":
            fuse = accumulate and p.fuse
            names = small_kernel_names(st.dtype_name, st.d, p.P)
            fn = _kernel(names, names[0] if fuse else names[1])
            scale, _, two_l = st.scales() if fuse else (st.partials, None, 1.0)
            smem = p.assign_smem if fuse else p.tc * p.S * st.T.itemsize
            _launch(fn, p.assign_grid,
                    (X, w, st.ops, _i32(st.n), _i32(st.k), _i32(p.tc), *common, st.partials,
                     st.stats, st.acc, scale, np.float64(two_l)), shared_mem=smem)
        elif p.path in ("gemm", "tf32mma"):
            vec = st.d % (16 // st.T.itemsize) == 0 and X.data.ptr % 16 == 0
            name = (gemm_kernel_name(st.dtype_name, vec) if p.path == "gemm"
                    else f"assign_tf32<{'true' if vec else 'false'}>")
            _launch(_common(st.dtype_name, name), p.assign_grid,
                    (X, w, st.ops, st.cnorm, _i32(st.n), _i32(st.d), _i32(p.kpad), *common,
                     st.partials, st.stats),
                    shared_mem=TF32_MMA_SMEM if p.path == "tf32mma" else 0)
        else:
            self._assign_tf32(st, common)
        if accumulate and not (p.path == "small" and p.fuse):
            self._accumulate(st)

    def _assign_tf32(self, st, common):
        cp, p = self._cp, st.plan
        m2ct = st.ops.reshape(st.d, p.kpad)
        fn = _common(st.dtype_name, "argmin_rows")

        def run(rows):
            if st.gbuf is None or st.gbuf.shape[0] < min(rows, st.n):
                st.gbuf = None
                st.gbuf = cp.empty((min(rows, st.n), p.kpad), dtype=cp.float32)
            st.n_partials = _cdiv(st.n, rows) * p.assign_grid
            if st.n_partials > st.partials.size:
                st.partials = cp.zeros(st.n_partials, dtype=cp.float64)
            with _tf32_matmul(cp):
                for c, r0 in enumerate(range(0, st.n, rows)):
                    r1 = min(r0 + rows, st.n)
                    g = st.gbuf[: r1 - r0]
                    cp.matmul(st.X[r0:r1], m2ct, out=g)
                    part = st.partials[c * p.assign_grid:]
                    _launch(fn, p.assign_grid,
                            (g, st.cnorm, _i32(r1 - r0), _i32(p.kpad), _i32(st.k),
                             np.int64(r0), st.X, _i32(st.d), st.w, *common, part, st.stats))
            return rows

        def halved(rows):
            st.gbuf = None
            return run(rows)

        try:
            run(st.chunk_rows)
        except cp.cuda.memory.OutOfMemoryError:
            st.chunk_rows = self.with_oom_retry(halved, max(1, st.chunk_rows // 2),
                                                what="cupy-fused tf32 distance chunk")

    def _accumulate(self, st):
        p = st.plan
        scale, _, two_l = st.scales()
        if p.acc_mode == "shared":
            _launch(_common(st.dtype_name, "accumulate_shared"), p.acc_grid,
                    (st.X, st.w, st.labels, _i32(st.n), _i32(st.d), _i32(st.k), st.acc, scale,
                     np.float64(two_l)), shared_mem=p.acc_smem)
        else:
            _launch(_common(st.dtype_name, "accumulate_global"), p.acc_grid,
                    (st.X, st.w, st.labels, _i32(st.n), _i32(st.d), st.acc, scale,
                     np.float64(two_l)))

    def _finalize(self, st, *, inertia=True):
        """Fixed point -> float64 sums/weights, empty count into stats, inertia into stats."""
        _, inv_scale, two_l = st.scales()
        total = st.k * (st.d + 1)
        dev = _device(self._cp.cuda.Device().id)
        grid = max(1, min(_cdiv(total, BLOCK), dev.sms * 8))
        _launch(_common(st.dtype_name, "finalize_sums"), grid,
                (st.acc, _i32(st.k), _i32(st.d), inv_scale, np.float64(1.0 / two_l), st.sums,
                 st.weights, st.partials, _i32(st.n_partials if inertia else 0),
                 st.stats))

    def _update(self, st, c_old, c_new):
        p = st.plan
        _launch(_common(st.dtype_name, "update_centers"), _cdiv(st.k, BLOCK),
                (st.sums, st.weights, c_old, c_new, _i32(st.k), _i32(st.d), _i32(p.layout),
                 _i32(p.S), _i32(p.kpad), _i32(_einsum_norm_mode(st.dtype_name)), st.ops,
                 st.cnorm, st.shift_partials, st.stats, st.done[DONE_UPDATE:]))

    def _relocate(self, st, centers, m):
        """The driver's relocate_empty on the device: one pass over X computes every point's
        key (distance to its own center, -1 without weight), then m passes over the n keys,
        each picking the next farthest point (key descending, index ascending) and moving
        it, in the driver's order."""
        cp = self._cp
        k, n = st.k, st.n
        dev = _device(cp.cuda.Device().id)
        if st.keys is None:
            st.keys = cp.empty(n, dtype=st.T)
        _launch(_common(st.dtype_name, "relocation_keys"), self._rows_grid(st, dev),
                (st.X, st.w, st.labels, centers, _i32(n), _i32(st.d), st.keys))
        empty_ids = cp.empty(k, dtype=cp.int32)
        far_dist = cp.empty(m, dtype=cp.float64)
        far_idx = cp.empty(m, dtype=cp.int64)
        grid = max(1, min(_cdiv(n, BLOCK), dev.sms * 4))
        part_d = cp.empty(grid, dtype=cp.float64)
        part_i = cp.empty(grid, dtype=cp.int64)
        _launch(_common(st.dtype_name, "list_empty_clusters"), 1,
                (st.weights, _i32(k), empty_ids), block=1024)
        fn = _common(st.dtype_name, "relocate_farthest")
        for p in range(m):
            _launch(fn, grid, (st.X, st.w, st.labels, st.keys, _i32(n), _i32(st.d), _i32(p),
                               empty_ids, far_dist, far_idx, st.sums, st.weights, part_d,
                               part_i, st.done[DONE_RELOCATE:]))

    @staticmethod
    def _rows_grid(st, dev):
        """Grid of the (grid-stride) kernels built on for_each_direct_sq_dist: eight lanes per
        row from d = 16 on, one thread per row below; at most 8 blocks per SM."""
        lanes = 8 if st.d >= 16 else 1
        return max(1, min(_cdiv(st.n * lanes, BLOCK), dev.sms * 8))

    def _direct_inertia(self, st, centers):
        cp = self._cp
        dev = _device(cp.cuda.Device().id)
        grid = self._rows_grid(st, dev)
        partials = cp.empty(grid, dtype=cp.float64)
        _launch(_common(st.dtype_name, "direct_inertia"), grid,
                (st.X, st.w, st.labels, centers, _i32(st.n), _i32(st.d), partials, st.stats,
                 _i32(FINAL_INERTIA), st.done[DONE_INERTIA:]))
        return float(st.stats[FINAL_INERTIA:FINAL_INERTIA + 1].get()[0])

    # -- the contract's primitives ----------------------------------------------------------------
    def assign(self, X, centers, *, xp=None):
        with self.stage("assign"):
            st, X, _ = self._prepare(X, None, centers.shape[0])
            self._pack(st, centers)
            min_sq = self._cp.empty(st.n, dtype=st.T)
            self._assign_pass(st, min_sq=min_sq)
            return AssignResult(st.labels.astype(self._cp.int64), min_sq)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        with self.stage("update"):
            st, X, w = self._prepare(X, sample_weight, n_clusters)
            st.labels = self._cp.ascontiguousarray(self._cp.asarray(labels).astype(
                self._cp.int32))
            self._accumulate(st)
            self._finalize(st, inertia=False)
            return ReduceResult(st.sums, st.weights)

    def lloyd_iter(self, X, sample_weight, centers, *, xp=None, update_centers=True):
        with self.stage("assign" if not update_centers else "lloyd"):
            st, X, w = self._prepare(X, sample_weight, centers.shape[0])
            self._pack(st, centers)
            min_sq = self._cp.empty(st.n, dtype=st.T)
            self._assign_pass(st, min_sq=min_sq, accumulate=update_centers)
            labels = st.labels.astype(self._cp.int64)
            if not update_centers:
                return IterResult(labels, min_sq, None, None)
            self._finalize(st, inertia=False)
            return IterResult(labels, min_sq, st.sums, st.weights)

    # -- the whole Lloyd loop on the device ------------------------------------------------------
    def kmeans_single(self, X, sample_weight, centers_init, *, xp=None, max_iter=300, tol=0.0,
                      verbose=0):
        """kmeans_xp.lloyd.kmeans_single_lloyd's semantics, one sync per iteration.

        The shift test of iteration i is read with iteration i+1's statistics: the pass that
        runs meanwhile is exactly the final assignment the driver does when it stops there."""
        with self.stage("lloyd"):
            st, X, w = self._prepare(X, sample_weight, centers_init.shape[0])
            centers = self._pack(st, centers_init).copy()
            spare = self._cp.empty_like(centers)
            st.scales()
            return self._lloyd_loop(st, centers, spare, max_iter, tol, verbose)

    def _lloyd_loop(self, st, centers, spare, max_iter, tol, verbose):
        history = {"inertia": [], "center_shift": []}
        i, pending = 0, False
        passes = relocated = 0
        while True:
            self._assign_pass(st, count_changed=True, accumulate=True)
            self._finalize(st)
            passes += 1
            raw = st.stats.get()                       # the one transfer of the iteration
            changed, n_empty = (int(v) for v in raw[:2].view(np.uint64))
            if pending:                                # iteration i-1 is complete now
                shift = float(raw[SHIFT])
                self._record(history, i - 1, shift, verbose)
                if shift <= tol or i == max_iter:
                    if verbose and shift <= tol:
                        print(f"Converged at iteration {i - 1}: center shift {shift:.3g} "
                              f"within tolerance {tol:.3g}.")
                    n_iter = i                         # labels: assignment to `centers`
                    break
            history["inertia"].append(float(raw[INERTIA]))
            if n_empty:
                self._relocate(st, centers, n_empty)
                relocated += n_empty
            self._update(st, centers, spare)
            centers, spare = spare, centers
            pending = True
            if i > 0 and changed == 0:                 # strict convergence
                shift = float(st.stats[SHIFT:SHIFT + 1].get()[0])
                self._record(history, i, shift, verbose)
                if verbose:
                    print(f"Converged at iteration {i}: strict convergence.")
                n_iter = i + 1                         # labels: those of iteration i
                break
            i += 1
        inertia = self._direct_inertia(st, centers)
        labels = st.labels.astype(self._cp.int64)
        #: what the last kmeans_single did (the timing probe prints it)
        self.last_loop = {"assignment_passes": passes, "relocated_clusters": relocated}
        return LloydResult(labels, inertia, centers, n_iter, history)

    @staticmethod
    def _record(history, i, shift, verbose):
        history["center_shift"].append(shift)
        if verbose:
            print(f"Iteration {i}, inertia {history['inertia'][i]:.6g}, "
                  f"center shift {shift:.3g}")
