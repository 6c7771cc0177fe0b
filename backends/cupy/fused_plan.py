"""cupy-fused's plan: which kernels a problem (n, d, k, dtype, options) runs, with which grids
and shared memory, and the working memory it takes; the kernel instance names (shared with
the compile check); device facts.

Paths:
  small  d <= 16: d a template parameter, P points per thread, centers in shared memory, sums
         fused into the same kernel when k*(d+1) fits in shared memory next to them.
  gemm   d > 16: register-blocked SIMT GEMM tile with the argmin in its epilogue; sums in a
         second kernel.
  tf32   precision="tf32", tf32_kernel="cublas": cuBLAS GEMM under TF32 per row chunk + a
         warp-per-row argmin. tf32mma (tf32_kernel="fused-v1"): our first tensor-core kernel
         (cuda/fused_tf32.cu) with the argmin in its epilogue. Not bit-exact FP32.
  mma    precision="tf32", tf32_kernel="fused": the v2 tensor-core kernel (cuda/fused_mma.cu:
         X rows resident in shared memory, operands pre-rounded, cp.async stages; mma.sync).
  wgmma  precision="tf32", tf32_kernel "auto" (the default) or "wgmma", compute capability
         9.0: the same on Hopper's asynchronous wgmma (cuda/fused_wgmma.cu, for sm_90a).
  mma3   precision="fp32", float32, d > 16, gemm_kernel "3xtf32" or "auto" (the default, up to
         d = MMA3_AUTO_MAX_D): the v2 kernel in split precision (3xTF32), FP32-accurate
         (labels agree with the SIMT kernel's up to near ties); wgmma3 the wgmma kernel so
         (tf32_kernel "auto" or "wgmma", compute capability 9.0, d <= WGMMA_MAX_D).
Where the v2 kernel's shared memory does not fit the GPU (or it lacks TF32 tensor cores), mma
falls back on tf32mma and mma3 on gemm: same semantics, another speed.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

from . import common
from .common import BLOCK, cupy

#: largest d compiled as a template parameter (one module per (dtype, d))
SMALL_D_MAX = 16
#: centers per group of the small-d kernel's argmin (common.cuh NEAREST_GROUP): a minimum per
#: pair, the index per group; 1 is the per-center compare-and-select loop
CENTER_GROUP = 8
#: shared memory given to one tile of centers in the small-d kernel
CENTER_TILE_BYTES = 32 * 1024
#: "auto" fuses the sums into the small-d pass while the block's shared memory (center tile +
#: privatised sums) stays under this, i.e. at least two blocks per SM
FUSE_SMEM_MAX = 96 * 1024
#: (TM, TN) outputs per thread of the GEMM-like kernel; a block is (16 TM) x (16 TN)
GEMM_TILES = {"float32": (8, 8), "float64": (4, 8)}
#: TF32 path: largest distance chunk (rows x k x 4 bytes); bigger stops paying
TF32_CHUNK_CAP = 1 << 30
#: points per block of the fused TF32 kernel and its dynamic shared memory (two A tiles
#: 128 x 20 words, two B tiles 16 x 136 words, 2 x 128 x 20 words of best/index)
TF32_MMA_ROWS = 128
TF32_MMA_SMEM = (2 * 128 * 20 + 2 * 16 * 136 + 2 * 128 * 20) * 4
#: the v2 tensor-core kernel (cuda/fused_mma.cu): points per block, centers per column block,
#: pipeline stages, rows of the running best
MMA_ROWS, MMA_COLS, MMA_STAGES = 256, 128, 3
#: the wgmma kernel (cuda/fused_wgmma.cu, compute capability 9.0): its tile (m64 row tiles a
#: warpgroup, of 2: 128 * MT points; centers a column block) for TF32 (X in shared memory)
#: and for 3xTF32 (X's parts in registers: on the H200 10.8 ms a W5 pass against mma.sync's
#: 17.5, 5.9 against 9.3 at d = 64), its stages of centers and the largest d it takes
WGMMA_TILES = {False: (2, 64), True: (1, 64)}
WGMMA_STAGES, WGMMA_MAX_D = 3, 128
#: gemm_kernel="auto" takes 3xTF32 up to this d (measured on the H200 at d = 64, 128: 1.6x the
#: SIMT kernel, the same labels; at d = 1024 its FP32 accumulation on the tensor cores gives
#: min_sq_dist looser than 16 eps of numpy's, so larger d keeps the SIMT kernel)
MMA3_AUTO_MAX_D = 160
_CTYPE = {"float32": "float", "float64": "double"}


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


def small_kernel_names(dtype_name: str, d: int, P: int, G: int = None) -> tuple:
    """(fused sums, assignment only) instances of assign_small (cuda/fused_small.cu)."""
    t, G = _CTYPE[dtype_name], G or CENTER_GROUP
    return (f"assign_small<{t},{d},{P},true,{G}>", f"assign_small<{t},{d},{P},false,{G}>")


def gemm_kernel_name(dtype_name: str, vec: bool) -> str:
    """The GEMM-like assignment kernel; vec: 16-byte global loads of X (d a multiple of the
    16-byte vector, X aligned)."""
    tm, tn = GEMM_TILES[dtype_name]
    return f"assign_gemm<{_CTYPE[dtype_name]},{tm},{tn},{'true' if vec else 'false'}>"


def vector_width(dtype_name: str) -> int:
    """Values of X's dtype in a 16-byte vector."""
    return 16 // (4 if dtype_name == "float32" else 8)


def vector_rows(dtype_name: str, d: int) -> bool:
    """Rows of X fill whole 16-byte vectors (the GEMM-like kernels' VEC loads, with X's
    pointer 16-byte aligned)."""
    return d % vector_width(dtype_name) == 0


def mma_dk(d: int) -> int:
    """Row stride (words) of the v2 kernel's centers' operands: d padded to the mma's K of 8."""
    return (d + 7) // 8 * 8


def mma_smem(d: int, split: bool, resident: bool) -> int:
    """Dynamic shared memory (bytes) of assign_mma (the formula in cuda/fused_mma.cu): the
    centers' stages, X's rows (resident) or stages, the running best and its index."""
    bk = 16 if split else 32
    sb = bk + 4
    b_words = MMA_STAGES * (2 if split else 1) * MMA_COLS * sb
    a_words = MMA_ROWS * (mma_dk(d) + 4) if resident else MMA_STAGES * MMA_ROWS * sb
    return 4 * (b_words + a_words + 2 * MMA_ROWS * 8)


def wgmma_tile(split: bool) -> tuple:
    """(m64 row tiles a warpgroup, centers a column block) of the wgmma kernel."""
    return WGMMA_TILES[bool(split)]


def wgmma_smem(d: int, split: bool = False) -> int:
    """Dynamic shared memory (bytes) of assign_wgmma (the formula in cuda/fused_wgmma.cu): X's
    rows and the centers' stages in 32-word atoms of K (two parts each with the 3xTF32
    split), and 1024 bytes to align the atoms."""
    mt, bn = wgmma_tile(split)
    stages = WGMMA_STAGES * bn
    return 1024 + 4 * wgmma_atoms(d) * 32 * (2 * stages if split else 128 * mt + stages)


def wgmma_atoms(d: int) -> int:
    """32-word atoms of K in the wgmma kernel's shared tiles (its template parameter NAT)."""
    return -(-mma_dk(d) // 32)


def wgmma_kernel_name(d: int, vec: bool, split: bool = False) -> str:
    """An instance of assign_wgmma: 3xTF32 or TF32, row tiles, column block, atoms of K,
    16-byte loads of X."""
    mt, bn = wgmma_tile(split)
    return (f"assign_wgmma<{int(split)},{mt},{bn},{wgmma_atoms(d)},"
            f"{'true' if vec else 'false'}>")


def mma_kernel_name(split: bool, resident: bool, vec: bool) -> str:
    """An instance of assign_mma: 3xTF32 or TF32, X resident or K-streamed, 16-byte loads."""
    b = {True: "true", False: "false"}
    return f"assign_mma<{int(split)},{b[resident]},{b[vec]}>"


#: file of each kernel template
KERNEL_FILES = {
    "assign_small": "fused_small.cu", "assign_gemm": "fused_gemm.cu",
    "assign_tf32": "fused_tf32.cu", "argmin_rows": "fused_tf32.cu",
    "assign_mma": "fused_mma.cu", "assign_wgmma": "fused_wgmma.cu",
    "accumulate_shared": "fused_sums.cu", "accumulate_global": "fused_sums.cu",
    "accumulate_sorted": "fused_sums.cu", "sort_count": "fused_sums.cu",
    "sort_offsets": "fused_sums.cu", "sort_place": "fused_sums.cu",
    "finalize_sums": "fused_sums.cu", "pack_centers": "centers.cu",
    "column_absmax": "stats.cu", "fixed_point_scales": "stats.cu",
    "weighted_total": "stats.cu", "direct_inertia": "direct.cu",
    "relocation_keys": "direct.cu",
}


def kernel(name: str):
    """The compiled instance `name` (a full instance name) from its file."""
    return common.raw_kernel(KERNEL_FILES[name.split("<")[0]], name)


def common_kernel_names(dtype_name: str) -> tuple:
    t = _CTYPE[dtype_name]
    mma = tuple(mma_kernel_name(s, r, v) for s in (False, True) for r in (True, False)
                for v in (True, False))
    # (d up to WGMMA_MAX_D: one instance per atom count)
    wgmma = tuple(wgmma_kernel_name(32 * a, v, s) for s in (False, True)
                  for a in range(1, wgmma_atoms(WGMMA_MAX_D) + 1) for v in (True, False))
    tf32 = (("argmin_rows<float>", "assign_tf32<true>", "assign_tf32<false>", *mma, *wgmma)
            if dtype_name == "float32" else ())
    return (gemm_kernel_name(dtype_name, True), gemm_kernel_name(dtype_name, False), *tf32,
            f"accumulate_shared<{t}>", f"accumulate_global<{t}>",
            f"accumulate_sorted<{t},1>", f"accumulate_sorted<{t},{vector_width(dtype_name)}>",
            "sort_count", "sort_offsets", "sort_place",
            "finalize_sums",
            f"pack_centers<{t}>", f"column_absmax<{t}>", "fixed_point_scales",
            f"weighted_total<{t}>", f"direct_inertia<{t}>", f"relocation_keys<{t}>")


def fit_kernel_names(p, dtype_name: str, d: int) -> list:
    """(file, instance) of the kernels a fit with plan p launches besides the statistics and
    the inertia every CuPy backend's fit launches (tf32's v1 and cuBLAS paths are left to
    compile on first use). The workspace looks up both small-d kernels: the fused pass and the
    bare one."""
    t = _CTYPE[dtype_name]
    if p.path == "small":
        names = list(small_kernel_names(dtype_name, d, p.P, p.G))
    elif p.path in ("gemm", "mma", "mma3", "wgmma", "wgmma3"):
        # vectorised loads when d fills 16-byte vectors (X is aligned)
        names = [assign_kernel_name(p, dtype_name, d, vector_rows(dtype_name, d))]
    else:
        names = []
    if p.acc_mode == "sorted":   # (its group: the counting sort's kernels too)
        names.append(f"accumulate_sorted<{t},{sorted_vector(dtype_name, d)}>")
    names += ["finalize_sums", f"pack_centers<{t}>", f"column_absmax<{t}>"]
    return [(KERNEL_FILES[n.split("<")[0]], n) for n in names]


def assign_kernel_name(p, dtype_name: str, d: int, vec: bool) -> str:
    """The assignment kernel of a GEMM-like path (gemm, tf32mma, mma, mma3, wgmma, wgmma3);
    vec: X's rows are 16-byte vectors and X is aligned."""
    if p.path == "gemm":
        return gemm_kernel_name(dtype_name, vec)
    if p.path == "tf32mma":
        return f"assign_tf32<{'true' if vec else 'false'}>"
    if p.path in ("wgmma", "wgmma3"):
        return wgmma_kernel_name(d, vec, p.path == "wgmma3")
    return mma_kernel_name(p.path == "mma3", p.resident, vec)


def all_kernel_names() -> list:
    """Every template instance the backend can ask NVRTC for."""
    names = []
    for dt in _CTYPE:
        names += common_kernel_names(dt)
        for d in range(1, SMALL_D_MAX + 1):
            names += small_kernel_names(dt, d, points_per_thread(dt, d))
    return list(dict.fromkeys(names))


def kernel_instances():
    """(file, instance) of every kernel cupy-fused can launch (the compile check)."""
    return [(KERNEL_FILES[n.split("<")[0]], n) for n in all_kernel_names()]


# -- device facts -------------------------------------------------------------------------------
class DeviceFacts(NamedTuple):
    sms: int
    smem_block: int   # opt-in shared memory per block
    smem_sm: int      # shared memory per multiprocessor
    cc: int = 90      # compute capability, 10 * major + minor


@functools.lru_cache(maxsize=None)
def device_facts(device_id: int) -> DeviceFacts:
    rt = cupy().cuda.runtime
    get = rt.deviceGetAttribute
    return DeviceFacts(get(rt.cudaDevAttrMultiProcessorCount, device_id),
                       get(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id),
                       get(rt.cudaDevAttrMaxSharedMemoryPerMultiprocessor, device_id),
                       int(cupy().cuda.Device(device_id).compute_capability))


#: a nominal device for estimate_memory, which runs before any device is touched (H200)
NOMINAL = DeviceFacts(132, 227 * 1024, 228 * 1024)


def blocks_per_sm(fn, shared_mem, block=BLOCK):
    """Resident blocks per SM (registers and shared memory), so that a grid-stride kernel's
    grid is exactly one wave: no second, partial wave."""
    common.opt_in(fn, shared_mem)
    try:
        n = cupy().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            fn.kernel.ptr, block, int(shared_mem))
    except Exception:  # fall back on the register count alone
        regs = (fn.num_regs + 7) // 8 * 8
        n = min(2048 // block, 65536 // max(regs * block, 1))
    return max(1, int(n))


def cdiv(a, b):
    return -(-a // b)


# -- the plan -----------------------------------------------------------------------------------
class Plan(NamedTuple):
    path: str          # "small", "gemm", "tf32" (cuBLAS + argmin), "tf32mma", "mma", "mma3",
                       # "wgmma", "wgmma3"
    fuse: bool         # sums accumulated inside the small-d assignment pass
    P: int             # points per thread (small)
    G: int             # centers per argmin group (small)
    tc: int            # centers per shared-memory tile (small)
    assign_smem: int
    assign_grid: int
    layout: int        # 0: ops (k, S); 1: -2C^T (d, kpad) + ||c||^2 (kpad); 3/4: tf32(-2C)
                       # (kpad, S) [+ its small part], ||c||^2 (kpad) (pack_centers)
    S: int
    kpad: int
    acc_mode: str      # "fused", "shared", "sorted" (d > 16: 0.37 against 0.77 ms a W5 sum
                       # on the H200) or "global"
    acc_smem: int
    acc_grid: int
    n_partials: int    # per-block inertia partials of one assignment pass
    chunk_rows: int    # tf32: rows per GEMM chunk (n otherwise)
    fixed_bytes: dict  # working memory by part
    resident: bool = False  # mma, mma3: X's rows resident in shared memory (else K-streamed)
    acc_rows: int = 0       # sorted: sorted positions per block of accumulate_sorted


def operand_sizes(layout, k, d, S, kpad) -> tuple:
    """(ops, cnorm) values of the centers' operands in a layout (pack_centers, centers.cu):
    0 rows of S (no cnorm: one unused value), 1 -2C^T (d, kpad), 3 tf32(-2C) (kpad, S),
    4 the same and its small part."""
    return {0: (k * S, 1), 1: (d * kpad, kpad), 3: (kpad * S, kpad),
            4: (2 * kpad * S, kpad)}[layout]


def mma_fit(d, split, dev):
    """(resident, shared bytes) of the v2 kernel on this GPU, or None where it cannot run:
    no TF32 tensor cores, or not even the K-streamed variant's shared memory fits."""
    if dev.cc < 80:
        return None
    room = dev.smem_block - 1024  # the kernel's static shared memory, with a margin
    for resident in (True, False):
        smem = mma_smem(d, split, resident)
        if smem <= room:
            return resident, smem
    return None


def wgmma_fits(d, dev, split=False) -> bool:
    """The wgmma kernel runs here: compute capability 9.0 (sm_90a) and its shared memory."""
    return (dev.cc == 90 and d <= WGMMA_MAX_D
            and wgmma_smem(d, split) <= dev.smem_block - 1024)


def tf32_path(tf32_kernel, d, dev, split=False) -> str:
    """The tensor-core path of precision="tf32" (split: of the exact 3xTF32 one): "auto" takes
    the wgmma kernel where it runs, else v2 (mma.sync)."""
    if tf32_kernel in ("wgmma", "auto") and wgmma_fits(d, dev, split):
        return "wgmma3" if split else "wgmma"
    if split:
        return "mma3"
    return {"fused-v1": "tf32mma", "cublas": "tf32"}.get(tf32_kernel, "mma")


def plan(n, d, k, dtype_name, dev, *, precision="fp32", fuse="auto", P=None, G=None,
         budget=None, tf32_kernel="auto", gemm_kernel="auto") -> Plan:
    itemsize = 4 if dtype_name == "float32" else 8
    sums_smem = k * (d + 1) * 16 + (d + 1) * 8
    resident = False
    if precision == "tf32" or d > SMALL_D_MAX:
        if precision == "tf32":
            path = tf32_path(tf32_kernel, d, dev)
        else:  # 3xTF32 applies to float32 (float64 has no tensor-core split here)
            split = gemm_kernel == "3xtf32" or (gemm_kernel == "auto" and d <= MMA3_AUTO_MAX_D)
            path = tf32_path(tf32_kernel, d, dev, True) if split and \
                dtype_name == "float32" else "gemm"
        fit = mma_fit(d, path == "mma3", dev) if path in ("mma", "mma3") else None
        if path in ("mma", "mma3") and fit is None:  # same semantics, the older kernel
            path = "tf32mma" if path == "mma" else "gemm"
        layout, S = 1, 0
        tm, tn = GEMM_TILES[dtype_name]
        kpad = cdiv(k, 16 * tn) * 16 * tn   # a multiple of 128 (every GEMM kernel's BN)
        fused, P, tc, assign_smem = False, 1, 0, 0
        if fit is not None and path in ("mma", "mma3"):
            resident, assign_smem = fit
            layout, S = (4 if path == "mma3" else 3), mma_dk(d)
        if path in ("wgmma", "wgmma3"):  # the v2 kernel's operands (layouts 3, 4)
            split = path == "wgmma3"
            resident, assign_smem = True, wgmma_smem(d, split)
            layout, S = (4 if split else 3), mma_dk(d)
        assign_grid = {"gemm": cdiv(n, 16 * tm), "tf32mma": cdiv(n, TF32_MMA_ROWS),
                       "tf32": dev.sms * 8, "mma": cdiv(n, MMA_ROWS),
                       "mma3": cdiv(n, MMA_ROWS),
                       "wgmma": cdiv(n, 128 * wgmma_tile(False)[0]),
                       "wgmma3": cdiv(n, 128 * wgmma_tile(True)[0])}[path]
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
        assign_grid = max(1, min(cdiv(n, BLOCK * P), dev.sms * per_sm))
    acc_rows = 0
    if fused:
        acc_mode, acc_smem, acc_grid = "fused", 0, 0
    elif sums_smem <= min(dev.smem_block - 2048, 160 * 1024):
        per_sm = max(1, min(2048 // BLOCK, dev.smem_sm // (sums_smem + 1024)))
        acc_mode, acc_smem = "shared", sums_smem
        acc_grid = max(1, min(cdiv(n, BLOCK), dev.sms * per_sm))
    elif d > SMALL_D_MAX:  # rows counting-sorted by cluster, summed in registers
        acc_mode, acc_smem = "sorted", 0
        acc_rows = sorted_rows(d, sorted_vector(dtype_name, d))
        acc_grid = cdiv(n, acc_rows)
    else:  # few features: n*(d+1)*2 atomics are few (0.06 ms at n=2M, d=3, k=100k on the
        # H200, where the sort alone took 0.5: a cluster of ~20 rows ends at every step)
        acc_mode, acc_smem, acc_grid = "global", 0, global_acc_grid(n, d, dev)
    chunk_rows = n
    n_chunks = 1
    if path == "tf32":
        per_row = kpad * 4
        room = TF32_CHUNK_CAP if budget is None else min(TF32_CHUNK_CAP, budget // 2)
        chunk_rows = int(max(1, min(n, room // per_row)))
        n_chunks = cdiv(n, chunk_rows)
    n_partials = assign_grid * n_chunks
    ops = sum(operand_sizes(layout, k, d, S, kpad)) * itemsize
    parts = {
        "sum_accumulators": k * (d + 1) * 16,
        "center_operands": ops,
        "block_partials": 8 * (n_partials + 2 * 1024) + 64,
        "scales": 4 * (d + 1) * 8,
    }
    if acc_mode == "sorted":  # rows' order, counts, starts and insertion points
        parts["sort_buffers"] = 4 * n + 4 * (3 * k + 1)
    if path == "tf32":
        parts["tf32_distance_chunk"] = chunk_rows * kpad * 4
    return Plan(path, fused, P, G or CENTER_GROUP, tc, assign_smem, assign_grid, layout, S,
                kpad, acc_mode, acc_smem, acc_grid, n_partials, chunk_rows, parts, resident,
                acc_rows)


def sorted_vector(dtype_name, d) -> int:
    """Features a thread of accumulate_sorted loads at once: a 16-byte vector where rows fill
    them (X aligned: the host checks), else 1."""
    return vector_width(dtype_name) if vector_rows(dtype_name, d) else 1


def global_acc_grid(n, d, dev) -> int:
    """accumulate_global's grid: a thread an element, at most 16 blocks a multiprocessor."""
    return max(1, min(cdiv(n * (d + 1), BLOCK), dev.sms * 16))


def sorted_rows(d, vec=1) -> int:
    """accumulate_sorted's positions per block: each of its threads walks 64 (a thread
    `vec` features, BLOCK // (d / vec) rows at a time)."""
    return BLOCK // min(d // vec, BLOCK) * 64


def one_wave(p: Plan, n, d, dtype_name, dev) -> Plan:
    """Grid-stride grids sized to what is resident at once on this GPU (compiles the kernel)."""
    if p.path == "small":
        names = small_kernel_names(dtype_name, d, p.P, p.G)
        fn = kernel(names[0] if p.fuse else names[1])
        per_sm = blocks_per_sm(fn, p.assign_smem)
        grid = max(1, min(cdiv(n, BLOCK * p.P), dev.sms * per_sm))
        p = p._replace(assign_grid=grid, n_partials=grid)
    if p.acc_mode == "shared":
        per_sm = blocks_per_sm(kernel(f"accumulate_shared<{_CTYPE[dtype_name]}>"), p.acc_smem)
        p = p._replace(acc_grid=max(1, min(cdiv(n, BLOCK), dev.sms * per_sm)))
    return p


def fixed_point_lo(n) -> float:
    """2^L of the fixed point's lo word for n points (the hi words' scales are per feature)."""
    return 2.0 ** max(1, 63 - int(n).bit_length())
