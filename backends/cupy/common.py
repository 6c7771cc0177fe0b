"""What the CuPy backends share below the backend classes: the lazy CuPy import, free device
memory and the errors that quote it, the CUDA sources (read from `cuda/`, headers inlined,
compiled by NVRTC through cupy.RawModule one template instance at a time, memoized), and the
TF32 compute-type switch of CuPy's matmul.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
import re
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from kmeans_xp.contract.memory import KMeansMemoryError, format_bytes
from kmeans_xp.contract.namespaces import dtype_name
from kmeans_xp.contract.precision import compute_dtype as precision_compute_dtype
from kmeans_xp.contract.threads import ThreadPool

#: the CUDA sources (one helper header, cuda/common.cuh, included by every .cu file)
CUDA_DIR = Path(__file__).with_name("cuda")
#: options every module is compiled with: no a * b + c is contracted (numpy's rounding)
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")
#: threads per block of the point-parallel kernels (BLOCK in cuda/common.cuh)
BLOCK = 256
#: a null pointer as a kernel argument (unit weights, no old labels): 8 zero bytes
NULL = np.uint64(0)
#: fraction of (free device memory + pool free blocks) that max_memory="auto" uses
DEVICE_AUTO_FRACTION = 0.8
#: the device max_memory="auto" is planned for where CuPy is missing (estimate_memory on a
#: laptop): an empty H200, as fused_plan.NOMINAL; give max_memory to plan for another GPU
NOMINAL_DEVICE_BYTES = 141 * 10**9
#: below this many rows a chunked stage gives up halving and raises KMeansMemoryError
MIN_CHUNK_ROWS = 1024
#: what to change when the device is what is short
DEVICE_HINT = (
    "Raise or remove the pool limit (cupy.get_default_memory_pool().set_limit(size=0)), "
    "free device memory held by other arrays or processes, give an explicit max_memory, use "
    "float32, stream X from the host (NumPy input; backend_options={'stream': True}), or "
    "use the numpy backend.")
#: what to change when streaming itself does not fit
STREAM_HINT = (
    "Raise or remove the pool limit (cupy.get_default_memory_pool().set_limit(size=0)), "
    "free device memory held by other arrays or processes, give an explicit max_memory, "
    "or use the numpy backend.")
CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def cupy():
    return importlib.import_module("cupy")


def ctype(dtype) -> str:
    return CTYPE[np.dtype(dtype)]


#: the template arguments of a kernel that reads X of a dtype (by name): its arithmetic type,
#: and for half data (precision="fp16" / "bf16": the fit's data in that format) float
#: arithmetic on `xhalf` / `xbf16` storage (cuda/formats.cuh), whose values widen exactly
X_TYPES = {"float32": "float", "float64": "double", "float16": "float,xhalf",
           "bfloat16": "float,xbf16"}


def xtypes(dtype) -> str:
    return X_TYPES[dtype_name(dtype)]


def compute_dtype(dtype):
    """The NumPy dtype kernels compute in for X of `dtype` (`precision.compute_dtype`:
    half X in float32), and of the centers, weights and distances that go with it. (A
    dtype or its name: NumPy names bfloat16 only where ml_dtypes is imported.)"""
    return np.dtype(precision_compute_dtype(dtype, np))


def device_ptr(a) -> int:
    """The address of a's first element (CuPy's data.ptr; a NumPy stand-in's in tests, whose
    `data`, a buffer, NumPy refuses for ml_dtypes' bfloat16)."""
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.ctypes.data)


# -- device memory ------------------------------------------------------------------------------
def free_device_memory() -> tuple[int, int]:
    """(free bytes usable now, total bytes): the driver's free memory plus the blocks the CuPy
    pool caches but does not use, capped by the pool's limit when one is set."""
    cp = cupy()
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    usable = free + pool.free_bytes()
    limit = pool.get_limit()
    if limit:
        usable = min(usable, max(limit - pool.used_bytes(), 0))
    return int(usable), int(total)


def device_memory_state() -> str:
    """'X free of Y' (and the pool limit when one is set), for error messages."""
    free, total = free_device_memory()
    limit = cupy().get_default_memory_pool().get_limit()
    text = f"{format_bytes(free)} free of {format_bytes(total)}"
    return text + (f" under a pool limit of {format_bytes(limit)}" if limit else "")


def out_of_memory_error(what, exc, hint=""):
    """KMeansMemoryError saying what was asked, what is free, and what to change."""
    asked = getattr(exc, "_size", None) or getattr(exc, "size", None) or 0
    return KMeansMemoryError(
        f"{what}: out of device memory (asked {format_bytes(asked)}; "
        f"{device_memory_state()}).{hint} Lower max_memory, use float32, stream X from the "
        f"host, or use the numpy backend.")


def device_empty(shape, dtype, what):
    """An output array that cannot be chunked; OOM becomes a KMeansMemoryError."""
    cp = cupy()
    try:
        return cp.empty(shape, dtype=dtype)
    except cp.cuda.memory.OutOfMemoryError as exc:
        raise out_of_memory_error(f"allocating {what} {tuple(shape)}", exc) from exc


def with_oom_retry(fn, rows, *, what, on_halve=None):
    """fn(rows); on OutOfMemoryError free the pool's cached blocks, halve rows, retry. Below
    MIN_CHUNK_ROWS raise KMeansMemoryError saying what was asked and what to do."""
    cp = cupy()
    while True:
        try:
            return fn(rows)
        except cp.cuda.memory.OutOfMemoryError as exc:
            if on_halve is not None:
                on_halve(rows)  # drop chunk buffers before freeing the pool
            cp.get_default_memory_pool().free_all_blocks()
            if rows <= MIN_CHUNK_ROWS:
                raise out_of_memory_error(
                    f"{what}", exc, f" A chunk of {rows} rows was tried, the smallest "
                    f"allowed.") from exc
            rows = max(MIN_CHUNK_ROWS, rows // 2)


# -- CUDA sources and kernels -------------------------------------------------------------------
_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.M)


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """cuda/<name> with its local headers inlined (each once), so that CuPy's cache key, which
    hashes the source text, changes whenever a header does."""
    seen = set()

    def inline(fname):
        if fname in seen:
            return ""
        seen.add(fname)
        text = (CUDA_DIR / fname).read_text()
        return _INCLUDE.sub(lambda m: inline(m.group(1)), text)

    return inline(name)


def cuda_files() -> list[str]:
    return sorted(p.name for p in CUDA_DIR.glob("*.cu"))


#: kernels compiled together, in one NVRTC run per group, file and value type T, because a
#: fit that launches one of a group launches most of the others (each NVRTC run costs about
#: 0.3 s the first time on the H200 host); any other instance is compiled alone. The sums in
#: cluster order are a group of their own: only fits with d > 16 and many clusters run them
TOGETHER = {
    "stats.cu": (("weighted_total<{t}>", "count_changed", "column_absmax<{t}>",
                  "fixed_point_scales", "count_labels", "column_moments<{t}>"),),
    "direct.cu": (("direct_inertia<{t}>", "labelled_sq_dist<{t}>", "relocation_keys<{t}>"),),
    "seeding.cu": (("seeding_draw", "seeding_potentials<{t}>", "seeding_update<{t}>"),),
    "fused_sums.cu": (("accumulate_shared<{t}>", "accumulate_global<{t}>", "finalize_sums"),
                      ("accumulate_sorted<{t},1>", "accumulate_sorted<{t},{v}>", "sort_count",
                       "sort_offsets", "sort_place")),
}
_TYPE_ARG = re.compile(r"<(float|double)[,>]")
#: {(file, instances): Future of the loaded cupy.RawModule}, compiled or being compiled
_MODULES = {}
_MODULES_LOCK = threading.Lock()
#: NVRTC runs at once in the background (`prefetch`): NVRTC releases the GIL, and a cold
#: fit's first launches each waited for a compile of 0.1-0.3 s in turn
COMPILE_THREADS = max(1, min(8, os.cpu_count() or 1))


def together(file: str, name: str) -> tuple:
    """The instances compiled with `name`: its group in TOGETHER for its value type (float
    for an untyped one), or itself alone."""
    m = _TYPE_ARG.search(name)
    t = m.group(1) if m else "float"
    v = 4 if t == "float" else 2   # values in 16 bytes
    for group in TOGETHER.get(file, ()):
        names = tuple(g.format(t=t, v=v) for g in group)
        if name in names:
            return names
    return (name,)


def _compile(file, names, device_id):
    """cuda/`file` compiled for `names` and loaded on device `device_id` (in this thread)."""
    cp = cupy()
    with cp.cuda.Device(device_id):
        arch = arch_target(file)
        if arch is not None:
            return _ArchModule(file, names, arch)
        module = cp.RawModule(code=source(file), options=NVRTC_OPTIONS,
                              name_expressions=list(names))
        module.get_function(names[0])  # RawModule compiles and loads on first use
    return module


_ARCH_LINE = re.compile(r"^// nvrtc-arch: (\S+)\s*$", re.M)


@functools.lru_cache(maxsize=None)
def arch_target(file: str):
    """The architecture-specific target cuda/`file` names in a `// nvrtc-arch: sm_90a` line
    (wgmma exists on sm_90a only, and CuPy's RawModule compiles for the plain sm_XX of the
    device), or None: the device's own."""
    m = _ARCH_LINE.search((CUDA_DIR / file).read_text())
    return m.group(1) if m else None


class _ArchModule:
    """cuda/`file` compiled by NVRTC for `arch` (its cubin kept on disk beside CuPy's, keyed
    by the source, options, names and NVRTC version), loaded as a cupy.RawModule."""

    def __init__(self, file, names, arch):
        cp = cupy()
        options = (*NVRTC_OPTIONS, f"-arch={arch}")
        text = source(file)
        key = hashlib.sha256(repr((text, options, sorted(names),
                                   cp.cuda.nvrtc.getVersion())).encode()).hexdigest()[:32]
        root = Path(os.environ.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))
        cubin, meta = root / f"kmeans_xp_{key}.cubin", root / f"kmeans_xp_{key}.json"
        if not (cubin.exists() and meta.exists()):
            program = getattr(cp.cuda.compiler, "_NVRTCProgram", None)
            if program is None:  # (CuPy's NVRTC wrapper is not public API)
                raise RuntimeError(
                    f"CuPy {cp.__version__} has no cupy.cuda.compiler._NVRTCProgram, with which "
                    f"kmeans_xp compiles {file} for {arch}: pass backend_options="
                    f"{{'tf32_kernel': 'fused'}} (the mma.sync kernels) or use CuPy 14.")
            prog = program(text, file, name_expressions=list(names), method="cubin")
            binary, mapping = prog.compile(options)
            root.mkdir(parents=True, exist_ok=True)
            for path, data in ((cubin, binary), (meta, json.dumps(mapping).encode())):
                tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
                tmp.write_bytes(data)
                os.replace(tmp, path)  # (atomic: a concurrent reader sees all or nothing)
        self.lowered = json.loads(meta.read_text())
        self.module = cp.RawModule(path=str(cubin))

    def get_function(self, name):
        return self.module.get_function(self.lowered[name])


@functools.lru_cache(maxsize=1)
def _compile_pool():
    return ThreadPool(COMPILE_THREADS, "kmeans_xp-nvrtc")


def _module(file, name, background=False):
    """The Future of the module holding instance `name`: an untyped instance already compiled
    in another group comes from there; else its group (`together`) is compiled, here or, with
    background, on the compile threads."""
    device_id = cupy().cuda.Device().id
    with _MODULES_LOCK:
        key = next((k for k in _MODULES if k[0] == file and name in k[1]), None)
        if key is not None:
            return _MODULES[key]
        key = (file, together(file, name))
        if background:
            fut = _MODULES[key] = _compile_pool().submit(_compile, *key, device_id)
            return fut
        fut = _MODULES[key] = Future()
    try:
        fut.set_result(_compile(*key, device_id))
    except BaseException as exc:  # the next call tries again
        with _MODULES_LOCK:
            _MODULES.pop(key, None)
        fut.set_exception(exc)
    return fut


def prefetch(instances):
    """Start compiling these (file, instance) pairs on the compile threads, so that their
    first launches find them ready (a fit's kernels are known before its data arrives)."""
    for file, name in instances:
        _module(file, name, background=True)


@functools.lru_cache(maxsize=None)
def raw_kernel(file: str, name: str):
    """The template instance `name` of cuda/`file`, compiled on first use with its group
    (`together`), unless `prefetch` started it: a fit compiles only the few groups it
    launches; CuPy keeps binaries on disk."""
    return _module(file, name).result().get_function(name)


#: largest dynamic shared memory opted in per kernel (keyed by id of the function)
_SMEM_OPTED = {}


def opt_in(fn, shared_mem):
    """A block gets more than 48 KB of dynamic shared memory only after an opt-in."""
    if shared_mem > 48 * 1024 and _SMEM_OPTED.get(id(fn), 0) < shared_mem:
        fn.max_dynamic_shared_size_bytes = int(shared_mem)
        _SMEM_OPTED[id(fn)] = shared_mem


def launch(fn, grid, args, shared_mem=0, block=BLOCK):
    """fn on `grid` blocks (an int, or (x, y): a batch's problems along y) of `block` threads."""
    opt_in(fn, shared_mem)
    grid = tuple(int(max(g, 1)) for g in (grid if isinstance(grid, tuple) else (grid,)))
    fn(grid, (int(block),), args, shared_mem=int(shared_mem))


@functools.lru_cache(maxsize=None)
def multiprocessors() -> int:
    cp = cupy()
    rt = cp.cuda.runtime
    return int(rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, cp.cuda.Device().id))


def grid(work_items, per_block, blocks_per_sm=4):
    """Blocks for a grid-stride kernel: enough for the work, at most a few waves' worth."""
    return int(max(1, min(-(-int(work_items) // per_block), multiprocessors() * blocks_per_sm)))


# -- TF32: the compute-type switch of CuPy's matmul ---------------------------------------------
def tf32_api(cp):
    """(get_compute_type, set_compute_type, COMPUTE_TYPE_TF32) of CuPy's matmul, from
    cupy._core._routines_linalg; a clear error where this CuPy lacks them."""
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
def tf32_matmul(cp):
    """CuPy's float32 matmul on TF32 tensor cores inside the block (the previous compute type
    restored after). CuPy keeps the compute type per process."""
    get, set_, tf32 = tf32_api(cp)
    old = get(cp.float32)
    set_(cp.float32, tf32)
    try:
        yield
    finally:
        set_(cp.float32, old)
