"""cupy-fused's kernel paths: which assignment kernel a problem (device, d, k, dtype, precision,
options) runs, and why. Two tables:

`PATHS`, the decision: rows of conditions -> path, each with its reason, read top to bottom;
the first row whose conditions all hold is the path (`choose` returns that row, `explain`
prints it). No row depends on k today; k is in the question for the rows that may.

`VARIANTS`, the kernels: what the plan needs of each path's assignment kernel (its file,
template instances, shared memory, grid, the layout of the centers' operands).

A new CUDA variant is its .cu file, a `Variant` and a row here, and a test: the plan
(`fused_plan.plan`), the launch (`CupyFusedBackend`), the compile-ahead list and the compile
check read these tables.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from kmeans_xp.contract.precision import HALF_STORAGE

#: largest d of the small-d kernel, d a template parameter (cuda/fused_small.cu)
SMALL_D_MAX = 16
#: gemm_kernel="auto" takes 3xTF32 up to this d (measured on the H200 at d = 64, 128: 1.6x the
#: SIMT kernel, the same labels; at d = 1024 its FP32 accumulation on the tensor cores gives
#: min_sq_dist looser than 16 eps of numpy's, so larger d keeps the SIMT kernel)
MMA3_AUTO_MAX_D = 160
#: values of the tf32_kernel option ("auto": the first tensor-core row that fits) and of
#: gemm_kernel (the exact d > 16 path on float32)
TF32_KERNELS = ("auto", "wgmma", "fused", "fused-v1", "cublas")
GEMM_KERNELS = ("auto", "simt", "3xtf32")
#: values of half_kernel (fp16/bf16 on the wgmma kernel): X's rows in shared memory ("shared")
#: or each thread's A fragments in registers ("registers", d <= WGMMA_MAX_D_AREG)
HALF_KERNELS = ("auto", "shared", "registers")
_CTYPE = {"float32": "float", "float64": "double"}
#: the estimator's compute precisions (`kmeans_xp.contract.precision`) this backend runs, and
#: the `precision` of the PATHS rows each maps to; fp16/bf16 run on the wgmma kernel only
#: (compute capability 9.0, d <= WGMMA_MAX_D_HALF): elsewhere the fit is refused before any
#: work, naming cupy-chunked (their semantics on any GPU)
PRECISIONS = {"exact": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16"}
#: the wgmma kernel's operand format of each precision (its template parameter FMT)
HALF_FORMATS = {"fp16": 1, "bf16": 2}


def cdiv(a, b):
    return -(-a // b)


# -- the SIMT GEMM-like kernel (cuda/fused_gemm.cu) ---------------------------------------------
#: (TM, TN) outputs per thread of the GEMM-like kernel; a block is (16 TM) x (16 TN)
GEMM_TILES = {"float32": (8, 8), "float64": (4, 8)}


def gemm_kernel_name(dtype_name: str, vec: bool) -> str:
    """The GEMM-like assignment kernel; vec: 16-byte global loads of X (d a multiple of the
    16-byte vector, X aligned)."""
    tm, tn = GEMM_TILES[dtype_name]
    return f"assign_gemm<{_CTYPE[dtype_name]},{tm},{tn},{'true' if vec else 'false'}>"


# -- the first tensor-core kernel (cuda/fused_tf32.cu) ------------------------------------------
#: points per block of the fused TF32 kernel and its dynamic shared memory (two A tiles
#: 128 x 20 words, two B tiles 16 x 136 words, 2 x 128 x 20 words of best/index)
TF32_MMA_ROWS = 128
TF32_MMA_SMEM = (2 * 128 * 20 + 2 * 16 * 136 + 2 * 128 * 20) * 4


# -- the v2 tensor-core kernel (cuda/fused_mma.cu) ----------------------------------------------
#: points per block, centers per column block, pipeline stages
MMA_ROWS, MMA_COLS, MMA_STAGES = 256, 128, 3


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


def mma_kernel_name(split: bool, resident: bool, vec: bool) -> str:
    """An instance of assign_mma: 3xTF32 or TF32, X resident or K-streamed, 16-byte loads."""
    b = {True: "true", False: "false"}
    return f"assign_mma<{int(split)},{b[resident]},{b[vec]}>"


# -- the wgmma kernel (cuda/fused_wgmma.cu, compute capability 9.0) -----------------------------
#: its tile (m64 row tiles a warpgroup, of 2: 128 * MT points; centers a column block) for TF32
#: (X in shared memory) and for 3xTF32 (X's parts in registers: on the H200 10.8 ms a W5 pass
#: against mma.sync's 17.5, 5.9 against 9.3 at d = 64), its stages of centers and the largest
#: d it takes
WGMMA_TILES = {False: (2, 64), True: (1, 64)}
WGMMA_STAGES, WGMMA_MAX_D = 3, 128
#: the largest d of the half formats' wgmma kernel: an atom of K holds 64 halves, so d = 256
#: takes the shared memory of TF32's d = 128
WGMMA_MAX_D_HALF = 256
#: the largest d of its A-in-registers form (AREG): two row tiles' fragments of d = 128 halves
#: take 64 registers a thread, 234 in all; at d = 256 ptxas spilled
WGMMA_MAX_D_AREG = 128


def wgmma_tile(split: bool) -> tuple:
    """(m64 row tiles a warpgroup, centers a column block) of the wgmma kernel."""
    return WGMMA_TILES[bool(split)]


def half_dk(d: int) -> int:
    """Row stride (values) of the half formats' operands: d padded to the k16 step."""
    return (d + 15) // 16 * 16


def wgmma_atoms(d: int, fmt: int = 0) -> int:
    """128-byte atoms of K in the wgmma kernel's shared tiles (its template parameter NAT):
    32 TF32 values, or 64 of a half format (fmt 1, 2)."""
    return -(-half_dk(d) // 64) if fmt else -(-mma_dk(d) // 32)


def wgmma_smem(d: int, split: bool = False, fmt: int = 0, areg: bool = False) -> int:
    """Dynamic shared memory (bytes) of assign_wgmma (the formula in cuda/fused_wgmma.cu): X's
    rows (not with the split or areg: their A is in registers) and the centers' stages in
    32-word atoms of K (two parts each with the 3xTF32 split), and 1024 bytes to align the
    atoms."""
    mt, bn = wgmma_tile(split)
    stages = WGMMA_STAGES * bn
    words = 2 * stages if split else stages if areg else 128 * mt + stages
    return 1024 + 4 * wgmma_atoms(d, fmt) * 32 * words


def wgmma_fits(d, dev, split=False, fmt=0, areg=False) -> bool:
    """The wgmma kernel runs here: compute capability 9.0 (sm_90a) and its shared memory."""
    top = WGMMA_MAX_D_AREG if areg else WGMMA_MAX_D_HALF if fmt else WGMMA_MAX_D
    return (dev.cc == 90 and d <= top
            and wgmma_smem(d, split, fmt, areg) <= dev.smem_block - 1024)


#: a half dtype's storage type in the kernels (cuda/formats.cuh): X in that format
X_STORAGE = {"float16": "xhalf", "bfloat16": "xbf16"}
#: the half dtype that stores each half format's data (fmt 1 fp16, 2 bf16)
FORMAT_DTYPES = {fmt: HALF_STORAGE[name] for name, fmt in HALF_FORMATS.items()}


def wgmma_kernel_name(d: int, vec: bool, split: bool = False, fmt: int = 0,
                      areg: bool = False, x_dtype: str = "float32") -> str:
    """An instance of assign_wgmma: 3xTF32 or TF32 (or, fmt 1 / 2, fp16 / bf16, with areg
    X's fragments in registers), row tiles, column block, atoms of K, 16-byte loads of X;
    x_dtype: X's (a half dtype: X stored in format fmt, `X_STORAGE`)."""
    mt, bn = wgmma_tile(split)
    xs = X_STORAGE.get(x_dtype)
    tail = (f",{fmt},{'true' if areg else 'false'},{xs}>" if xs else
            f",{fmt},true>" if areg else f",{fmt}>" if fmt else ">")
    return (f"assign_wgmma<{int(split)},{mt},{bn},{wgmma_atoms(d, fmt)},"
            f"{'true' if vec else 'false'}" + tail)


def _wgmma_instances(split, fmt=0, areg=False, x_dtype="float32"):
    # (d up to the largest d: one instance per atom count)
    per_atom = 64 if fmt else 32
    top = wgmma_atoms(WGMMA_MAX_D_AREG if areg else WGMMA_MAX_D_HALF if fmt
                      else WGMMA_MAX_D, fmt)
    return tuple(wgmma_kernel_name(per_atom * a, v, split, fmt, areg, x_dtype)
                 for a in range(1, top + 1) for v in (True, False))


def _half_dtypes(fmt):
    """X's dtypes of a half format's wgmma kernel: float32, and the format's own dtype
    (float16 for fp16, bfloat16 for bf16), read as it is: the fit's data stored in the
    format it computes at."""
    return ("float32", FORMAT_DTYPES[fmt])


def _mma_instances(split):
    return tuple(mma_kernel_name(split, r, v) for r in (True, False) for v in (True, False))


# -- the kernels ----------------------------------------------------------------------------------
class Variant(NamedTuple):
    """What the plan and the launch need of one path's assignment kernel."""
    kind: str       # "small" (fused_plan's small-d kernel), "tile" (one kernel, the argmin in
                    # its epilogue: launched alike) or "rows" (cuBLAS GEMM per row chunk + the
                    # argmin_rows kernel)
    file: str       # its source under cuda/
    dtypes: tuple   # the dtypes it has instances for
    layout: int     # the centers' operands (pack_centers, centers.cu; `operand_sizes`)
    grid: Callable  # (n, dtype name, device facts) -> blocks of the assignment pass
    fit: Callable   # (d, device facts) -> (X resident in shared memory, dynamic shared
                    # bytes), or None where it cannot run on that device
    instance: Callable  # (dtype name, d, vec, resident) -> the template instance launched
    instances: Callable  # dtype name -> every instance (compile check, compile ahead)
    compile_ahead: bool = True  # compiled with the fit's other kernels while X moves


VARIANTS = {
    "small": Variant("small", "fused_small.cu", ("float32", "float64"), 0, None, None, None,
                     lambda dt: ()),   # (fused_plan: its instances depend on d and P)
    "gemm": Variant(
        "tile", "fused_gemm.cu", ("float32", "float64"), 1,
        lambda n, dt, dev: cdiv(n, 16 * GEMM_TILES[dt][0]),
        lambda d, dev: (False, 0),
        lambda dt, d, vec, res: gemm_kernel_name(dt, vec),
        lambda dt: (gemm_kernel_name(dt, True), gemm_kernel_name(dt, False))),
    "tf32": Variant(
        "rows", "fused_tf32.cu", ("float32",), 1,
        lambda n, dt, dev: dev.sms * 8,
        lambda d, dev: (False, 0),
        lambda dt, d, vec, res: "argmin_rows<float>",
        lambda dt: ("argmin_rows<float>",), compile_ahead=False),
    "tf32mma": Variant(
        "tile", "fused_tf32.cu", ("float32",), 1,
        lambda n, dt, dev: cdiv(n, TF32_MMA_ROWS),
        lambda d, dev: (False, TF32_MMA_SMEM),
        lambda dt, d, vec, res: f"assign_tf32<{'true' if vec else 'false'}>",
        lambda dt: ("assign_tf32<true>", "assign_tf32<false>"), compile_ahead=False),
    "mma": Variant(
        "tile", "fused_mma.cu", ("float32",), 3,
        lambda n, dt, dev: cdiv(n, MMA_ROWS),
        lambda d, dev: mma_fit(d, False, dev),
        lambda dt, d, vec, res: mma_kernel_name(False, res, vec),
        lambda dt: _mma_instances(False)),
    "mma3": Variant(
        "tile", "fused_mma.cu", ("float32",), 4,
        lambda n, dt, dev: cdiv(n, MMA_ROWS),
        lambda d, dev: mma_fit(d, True, dev),
        lambda dt, d, vec, res: mma_kernel_name(True, res, vec),
        lambda dt: _mma_instances(True)),
    "wgmma": Variant(
        "tile", "fused_wgmma.cu", ("float32",), 3,
        lambda n, dt, dev: cdiv(n, 128 * wgmma_tile(False)[0]),
        lambda d, dev: (True, wgmma_smem(d)) if wgmma_fits(d, dev) else None,
        lambda dt, d, vec, res: wgmma_kernel_name(d, vec),
        lambda dt: _wgmma_instances(False)),
    **{f"wgmma-{name}": Variant(
        "tile", "fused_wgmma.cu", _half_dtypes(fmt), 4 + fmt,
        lambda n, dt, dev: cdiv(n, 128 * wgmma_tile(False)[0]),
        lambda d, dev, fmt=fmt: (True, wgmma_smem(d, False, fmt))
        if wgmma_fits(d, dev, False, fmt) else None,
        lambda dt, d, vec, res, fmt=fmt: wgmma_kernel_name(d, vec, False, fmt,
                                                           x_dtype=dt),
        lambda dt, fmt=fmt: _wgmma_instances(False, fmt, x_dtype=dt))
       for name, fmt in HALF_FORMATS.items()},
    **{f"wgmma-{name}r": Variant(
        "tile", "fused_wgmma.cu", _half_dtypes(fmt), 4 + fmt,
        lambda n, dt, dev: cdiv(n, 128 * wgmma_tile(False)[0]),
        lambda d, dev, fmt=fmt: (True, wgmma_smem(d, False, fmt, True))
        if wgmma_fits(d, dev, False, fmt, True) else None,
        lambda dt, d, vec, res, fmt=fmt: wgmma_kernel_name(d, vec, False, fmt, True, dt),
        lambda dt, fmt=fmt: _wgmma_instances(False, fmt, True, dt))
       for name, fmt in HALF_FORMATS.items()},
    "wgmma3": Variant(
        "tile", "fused_wgmma.cu", ("float32",), 4,
        lambda n, dt, dev: cdiv(n, 128 * wgmma_tile(True)[0]),
        lambda d, dev: (True, wgmma_smem(d, True)) if wgmma_fits(d, dev, True) else None,
        lambda dt, d, vec, res: wgmma_kernel_name(d, vec, True),
        lambda dt: _wgmma_instances(True)),
}


# -- the decision ---------------------------------------------------------------------------------
class Query(NamedTuple):
    """One problem as the table sees it; dev: device facts (fused_plan.DeviceFacts: cc,
    smem_block, ...)."""
    d: int
    k: int
    dtype: str
    precision: str
    dev: object
    tf32_kernel: str = "auto"
    gemm_kernel: str = "auto"
    half_kernel: str = "auto"


class Row(NamedTuple):
    """A row of PATHS: when every condition holds, `path`, because `why`. Conditions: a
    Query field (precision, dtype, tf32_kernel, gemm_kernel, half_kernel) equal to the value or in the
    tuple; d_max / d_min: d at most / at least; fits: True, the path's kernel runs on the
    device (`Variant.fit`)."""
    path: str
    when: dict
    why: str


PATHS = (
    *(Row(f"wgmma-{name}r", {"precision": name, "half_kernel": "registers", "fits": True},
          f"{name} with half_kernel='registers': the wgmma kernel with each thread's A "
          f"fragments of X in registers (d <= {WGMMA_MAX_D_AREG}), shared memory for the "
          f"centers alone") for name in HALF_FORMATS),
    Row("wgmma-fp16", {"precision": "fp16", "fits": True},
        "fp16 on Hopper's asynchronous tensor cores (the wgmma kernel's half format, compute "
        "capability 9.0, d <= 256): X rounded to fp16 in shared memory, FP32 accumulation"),
    Row("wgmma-bf16", {"precision": "bf16", "fits": True},
        "bf16 on Hopper's asynchronous tensor cores (the wgmma kernel's half format, compute "
        "capability 9.0, d <= 256): X rounded to bf16 in shared memory, FP32 accumulation"),
    Row("wgmma", {"precision": "tf32", "tf32_kernel": ("auto", "wgmma"), "fits": True},
        "TF32 on Hopper's asynchronous tensor cores (cuda/fused_wgmma.cu, compute capability "
        "9.0, d <= 128): the fastest TF32 kernel where it runs"),
    Row("tf32", {"precision": "tf32", "tf32_kernel": "cublas"},
        "tf32_kernel='cublas': cuBLAS GEMM under TF32 per row chunk + a warp-per-row argmin"),
    Row("tf32mma", {"precision": "tf32", "tf32_kernel": "fused-v1"},
        "tf32_kernel='fused-v1': the first tensor-core kernel (cuda/fused_tf32.cu), kept to "
        "compare"),
    Row("mma", {"precision": "tf32", "fits": True},
        "TF32 on mma.sync (cuda/fused_mma.cu, v2: X rows in shared memory, cp.async stages): "
        "tf32_kernel='fused', or 'auto' and 'wgmma' where the wgmma kernel does not run"),
    Row("tf32mma", {"precision": "tf32"},
        "the v2 kernel's shared memory does not fit this GPU: the first tensor-core kernel, "
        "same semantics"),
    Row("small", {"precision": "fp32", "d_max": SMALL_D_MAX},
        "d <= 16: d a template parameter, centers in shared memory, the sums fused into the "
        "pass where they fit (cuda/fused_small.cu)"),
    Row("gemm", {"precision": "fp32", "dtype": "float64"},
        "float64: the SIMT FMA GEMM tile with the argmin in its epilogue (no tensor-core "
        "split for float64)"),
    Row("gemm", {"precision": "fp32", "gemm_kernel": "simt"},
        "gemm_kernel='simt': the SIMT FMA GEMM tile with the argmin in its epilogue"),
    Row("gemm", {"precision": "fp32", "gemm_kernel": "auto", "d_min": MMA3_AUTO_MAX_D + 1},
        "d > 160: 3xTF32's FP32 accumulation would loosen min_sq_dist; the SIMT FMA kernel"),
    Row("wgmma3", {"precision": "fp32", "gemm_kernel": ("auto", "3xtf32"),
                   "tf32_kernel": ("auto", "wgmma"), "fits": True},
        "exact float32 in split precision (3xTF32) on Hopper's wgmma, X's parts in registers "
        "(compute capability 9.0, d <= 128): FP32-accurate, labels = the SIMT kernel's up to "
        "near ties, 1.6x faster"),
    Row("mma3", {"precision": "fp32", "gemm_kernel": ("auto", "3xtf32"), "fits": True},
        "exact float32 in split precision (3xTF32) on mma.sync (cuda/fused_mma.cu): "
        "FP32-accurate, labels = the SIMT kernel's up to near ties"),
    Row("gemm", {"precision": "fp32"},
        "no tensor-core kernel runs on this GPU (compute capability < 8.0 or its shared "
        "memory): the SIMT FMA kernel, same semantics"),
)


def _holds(row: Row, q: Query) -> bool:
    for key, want in row.when.items():
        if key == "d_max":
            ok = q.d <= want
        elif key == "d_min":
            ok = q.d >= want
        elif key == "fits":
            ok = (VARIANTS[row.path].fit(q.d, q.dev) is not None) == want
        else:
            have = getattr(q, key)
            ok = have in want if isinstance(want, tuple) else have == want
        if not ok:
            return False
    return True


def choose(d, k, dtype, precision, dev, *, tf32_kernel="auto", gemm_kernel="auto",
           half_kernel="auto") -> Row:
    """The row of PATHS a problem takes: its path and why."""
    q = Query(int(d), int(k), str(dtype), precision, dev, tf32_kernel, gemm_kernel,
              half_kernel)
    for row in PATHS:
        if _holds(row, q):
            return row
    raise ValueError(f"no kernel path for {q}")


def explain(d, k, dtype, precision, dev, **options) -> str:
    """One line: the path a problem takes and why (for the bench's results)."""
    row = choose(d, k, dtype, precision, dev, **options)
    return f"{row.path}: {row.why}"

