"""cupy-fused's plan: with which grids, shared memory and working memory a problem (n, d, k,
dtype, options) runs the path that the table of kernel paths (`paths.PATHS`) chooses for it;
the small-d kernel's parameters; the kernel instance names (shared with the compile check);
device facts. What each path is, and why a problem takes it: `paths`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

from . import common, paths
from .common import BLOCK, cupy
from .paths import GEMM_TILES, SMALL_D_MAX, VARIANTS, cdiv, mma_dk

#: centers per group of the small-d kernel's argmin (common.cuh NEAREST_GROUP): a minimum per
#: pair, the index per group; 1 is the per-center compare-and-select loop
CENTER_GROUP = 8
#: shared memory given to one tile of centers in the small-d kernel
CENTER_TILE_BYTES = 32 * 1024
#: "auto" fuses the sums into the small-d pass while the block's shared memory (center tile +
#: privatised sums) stays under this, i.e. at least two blocks per SM
FUSE_SMEM_MAX = 96 * 1024
#: TF32 path: largest distance chunk (rows x k x 4 bytes); bigger stops paying
TF32_CHUNK_CAP = 1 << 30
_CTYPE = {"float32": "float", "float64": "double"}
#: X's dtypes the plan takes: half X (precision="fp16" / "bf16", the wgmma kernel's formats)
#: is read as its format (`xhalf`, `xbf16`) and computed on in float32
X_DTYPES = (*_CTYPE, "float16", "bfloat16")


def compute_name(dtype_name: str) -> str:
    """The dtype the kernels compute in for X of `dtype_name` (`common.compute_dtype`)."""
    return str(common.compute_dtype(dtype_name))


def x_types(dtype_name: str) -> str:
    """Template arguments (T[, XT]) of a kernel reading X of `dtype_name` (`common.xtypes`)."""
    return common.xtypes(dtype_name)


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


def vector_width(dtype_name: str) -> int:
    """Values of X's dtype in a 16-byte vector."""
    return 16 // {"float16": 2, "bfloat16": 2, "float32": 4}.get(dtype_name, 8)


def vector_rows(dtype_name: str, d: int) -> bool:
    """Rows of X fill whole 16-byte vectors (the GEMM-like kernels' VEC loads, with X's
    pointer 16-byte aligned)."""
    return d % vector_width(dtype_name) == 0


def _variant_files() -> dict:
    files = {"assign_small": VARIANTS["small"].file}
    for v in VARIANTS.values():
        files.update({n.split("<")[0]: v.file for dt in v.dtypes for n in v.instances(dt)})
    return files


#: file of each kernel template: the paths' assignment kernels (`paths.VARIANTS`) and the rest
KERNEL_FILES = {
    **_variant_files(),
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
    t, xt = _CTYPE[compute_name(dtype_name)], x_types(dtype_name)
    assign = tuple(n for v in VARIANTS.values() if dtype_name in v.dtypes
                   for n in v.instances(dtype_name))
    return (*assign,
            f"accumulate_shared<{xt}>", f"accumulate_global<{xt}>",
            sorted_kernel_name(dtype_name, 1),
            sorted_kernel_name(dtype_name, vector_width(dtype_name)),
            "sort_count", "sort_offsets", "sort_place",
            "finalize_sums",
            f"pack_centers<{t}>", f"column_absmax<{xt}>", "fixed_point_scales",
            f"weighted_total<{t}>", f"direct_inertia<{xt}>", f"relocation_keys<{xt}>")


def sorted_kernel_name(dtype_name: str, vec: int) -> str:
    """accumulate_sorted's instance for X of `dtype_name`, `vec` values a load."""
    t, _, xt = x_types(dtype_name).partition(",")
    return f"accumulate_sorted<{t},{vec}{',' + xt if xt else ''}>"


def fit_kernel_names(p, dtype_name: str, d: int) -> list:
    """(file, instance) of the kernels a fit with plan p launches besides the statistics and
    the inertia every CuPy backend's fit launches (a path's kernel unless its variant is left
    to compile on first use: tf32's v1 and cuBLAS ones). The workspace looks up both small-d
    kernels: the fused pass and the bare one."""
    t = _CTYPE[compute_name(dtype_name)]
    if p.path == "small":
        names = list(small_kernel_names(dtype_name, d, p.P, p.G))
    elif VARIANTS[p.path].compile_ahead:
        # vectorised loads when d fills 16-byte vectors (X is aligned)
        names = [assign_kernel_name(p, dtype_name, d, vector_rows(dtype_name, d))]
    else:
        names = []
    if p.acc_mode == "sorted":   # (its group: the counting sort's kernels too)
        names.append(sorted_kernel_name(dtype_name, sorted_vector(dtype_name, d)))
    names += ["finalize_sums", f"pack_centers<{t}>", f"column_absmax<{x_types(dtype_name)}>"]
    return [(KERNEL_FILES[n.split("<")[0]], n) for n in names]


def assign_kernel_name(p, dtype_name: str, d: int, vec: bool) -> str:
    """The assignment kernel of a path other than small (`paths.VARIANTS`); vec: X's rows are
    16-byte vectors and X is aligned."""
    return VARIANTS[p.path].instance(dtype_name, d, vec, p.resident)


def all_kernel_names() -> list:
    """Every template instance the backend can ask NVRTC for."""
    names = []
    for dt in X_DTYPES:
        names += common_kernel_names(dt)
    for dt in _CTYPE:
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


# -- the plan -----------------------------------------------------------------------------------
class Plan(NamedTuple):
    path: str          # the kernel path (a row of paths.PATHS, a key of paths.VARIANTS)
    fuse: bool         # sums accumulated inside the small-d assignment pass
    P: int             # points per thread (small)
    G: int             # centers per argmin group (small)
    tc: int            # centers per shared-memory tile (small)
    assign_smem: int
    assign_grid: int
    layout: int        # 0: ops (k, S); 1: -2C^T (d, kpad) + ||c||^2 (kpad); 3/4: tf32(-2C)
                       # (kpad, S) [+ its small part], ||c||^2 (kpad); 5/6: fp16/bf16(-C)
                       # (kpad, S halves), ||c||^2 / 2 (kpad) (pack_centers)
    S: int
    kpad: int
    acc_mode: str      # "fused", "shared", "sorted" (d > 16: 0.37 against 0.77 ms a W5 sum
                       # on the H200) or "global"
    acc_smem: int
    acc_grid: int
    n_partials: int    # per-block inertia partials of one assignment pass
    chunk_rows: int    # tf32: rows per GEMM chunk (n otherwise)
    fixed_bytes: dict  # working memory by part
    resident: bool = False  # X's rows resident in shared memory (else K-streamed): mma, mma3
    acc_rows: int = 0       # sorted: sorted positions per block of accumulate_sorted


def operand_sizes(layout, k, d, S, kpad) -> tuple:
    """(ops, cnorm) values of the centers' operands in a layout (pack_centers, centers.cu):
    0 rows of S (no cnorm: one unused value), 1 -2C^T (d, kpad), 3 tf32(-2C) (kpad, S),
    4 the same and its small part, 5 / 6 fp16 / bf16 -C (kpad, S): two halves a value."""
    return {0: (k * S, 1), 1: (d * kpad, kpad), 3: (kpad * S, kpad),
            4: (2 * kpad * S, kpad), 5: (kpad * S // 2, kpad),
            6: (kpad * S // 2, kpad)}[layout]


def plan(n, d, k, dtype_name, dev, *, precision="fp32", fuse="auto", P=None, G=None,
         budget=None, tf32_kernel="auto", gemm_kernel="auto", half_kernel="auto") -> Plan:
    """The path and the grids and buffers of a fit of n rows of X of `dtype_name` (float16,
    bfloat16: read in that format, computed on in float32) against k centers."""
    itemsize = 4 if compute_name(dtype_name) == "float32" else 8
    sums_smem = sums_shared_bytes(k, d)
    path = paths.choose(d, k, dtype_name, precision, dev, tf32_kernel=tf32_kernel,
                        gemm_kernel=gemm_kernel, half_kernel=half_kernel).path
    variant = VARIANTS[path]
    if variant.kind != "small":
        resident, assign_smem = variant.fit(d, dev)
        layout = variant.layout
        # (the tensor-core kernels' operands: rows of TF32 words or of halves)
        S = mma_dk(d) if layout in (3, 4) else paths.half_dk(d) if layout in (5, 6) else 0
        tn = GEMM_TILES[compute_name(dtype_name)][1]
        kpad = cdiv(k, 16 * tn) * 16 * tn   # a multiple of 128 (every GEMM kernel's BN)
        fused, P, tc = False, 1, 0
        assign_grid = variant.grid(n, dtype_name, dev)
    else:
        layout, S, kpad, resident = 0, ops_stride(dtype_name, d), k, False
        P = P or points_per_thread(dtype_name, d)
        tc = max(1, min(k, CENTER_TILE_BYTES // (S * itemsize)))
        tile = tc * S * itemsize
        can_fuse = tile + sums_smem <= dev.smem_block - 2048
        fused = bool(can_fuse and (fuse is True or (fuse == "auto"
                                                    and tile + sums_smem <= FUSE_SMEM_MAX)))
        assign_smem = tile + (sums_smem if fused else 0)
        per_sm = max(1, min(2048 // BLOCK, dev.smem_sm // (assign_smem + 1024)))
        assign_grid = max(1, min(cdiv(n, BLOCK * P), dev.sms * per_sm))
    if fused:
        acc_mode, acc_smem, acc_grid, acc_rows = "fused", 0, 0, 0
    else:
        acc_mode, acc_smem, acc_grid, acc_rows = update_plan(n, d, k, dtype_name, dev)
    chunk_rows = n
    n_chunks = 1
    if variant.kind == "rows":   # a GEMM per row chunk: its distances take memory
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
    if variant.kind == "rows":
        parts["tf32_distance_chunk"] = chunk_rows * kpad * 4
    return Plan(path, fused, P, G or CENTER_GROUP, tc, assign_smem, assign_grid, layout, S,
                kpad, acc_mode, acc_smem, acc_grid, n_partials, chunk_rows, parts, resident,
                acc_rows)


def sums_shared_bytes(k, d) -> int:
    """Shared memory of k clusters' fixed-point sums and weights, and the d + 1 scales."""
    return k * (d + 1) * 16 + (d + 1) * 8


def update_plan(n, d, k, dtype_name, dev) -> tuple:
    """(acc_mode, acc_smem, acc_grid, acc_rows) of the sums' own kernel for n rows and k
    clusters (a pass that does not fuse them); a batch's update runs it on all its rows and
    clusters at once."""
    sums_smem = sums_shared_bytes(k, d)
    if sums_smem <= min(dev.smem_block - 2048, 160 * 1024):
        per_sm = max(1, min(2048 // BLOCK, dev.smem_sm // (sums_smem + 1024)))
        return "shared", sums_smem, max(1, min(cdiv(n, BLOCK), dev.sms * per_sm)), 0
    if d > SMALL_D_MAX:  # rows counting-sorted by cluster, summed in registers
        acc_rows = sorted_rows(d, sorted_vector(dtype_name, d))
        return "sorted", 0, cdiv(n, acc_rows), acc_rows
    # few features: n*(d+1)*2 atomics are few (0.06 ms at n=2M, d=3, k=100k on the H200,
    # where the sort alone took 0.5: a cluster of ~20 rows ends at every step)
    return "global", 0, global_acc_grid(n, d, dev), 0


#: clusters up to which the counting sort of the sorted sums counts each block's rows in
#: shared memory (4 bytes a cluster) before one global atomic per cluster and block: one
#: global atomic per row on k counters contends (F1, n=8M k=1024)
SORT_HIST_K = 16384


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
        per_sm = blocks_per_sm(kernel(f"accumulate_shared<{x_types(dtype_name)}>"), p.acc_smem)
        p = p._replace(acc_grid=max(1, min(cdiv(n, BLOCK), dev.sms * per_sm)))
    return p


def fixed_point_lo(n) -> float:
    """2^L of the fixed point's lo word for n points (the hi words' scales are per feature)."""
    return 2.0 ** max(1, 63 - int(n).bit_length())
