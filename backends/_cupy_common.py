"""What every CuPy backend shares: lazy import, host<->device movement, the memory budget from
free device memory, per-stage peak memory measured on the CuPy pool, and OOM recovery by
chunk halving. CuPy is imported only when a CuPy backend is instantiated.
"""
from __future__ import annotations

import contextlib
import importlib

from kmeans_xp.backend import KMeansBackend
from kmeans_xp.memory import KMeansMemoryError, format_bytes

#: fraction of (free device memory + pool free blocks) that max_memory="auto" uses
DEVICE_AUTO_FRACTION = 0.8
#: below this many rows a chunked stage gives up halving and raises KMeansMemoryError
MIN_CHUNK_ROWS = 1024


def cupy():
    return importlib.import_module("cupy")


def free_device_memory() -> tuple[int, int]:
    """(free bytes usable now, total bytes): the driver's free memory plus the blocks the CuPy
    pool caches but does not use (CuPy counts those as taken)."""
    cp = cupy()
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return free + pool.free_bytes(), total


class _PeakHook:
    """A CuPy memory hook that records the pool's peak used bytes."""

    def __init__(self):
        cp = cupy()
        base = cp.cuda.memory_hook.MemoryHook

        class Hook(base):
            name = "kmeans_xp_peak"

            def __init__(hook):
                hook.peak = 0

            def malloc_postprocess(hook, device_id, size, mem_size, mem_ptr, pmem_id):
                used = cp.get_default_memory_pool().used_bytes()
                if used > hook.peak:
                    hook.peak = used

        self.hook = Hook()


class CupyBackendBase(KMeansBackend):
    """Base of the CuPy backends: NumPy input is copied to the device once, results go back
    to NumPy; CuPy input stays where it is."""

    namespaces = frozenset({"cupy"})
    device = "gpu"

    def __init__(self, max_memory="auto", **options):
        super().__init__(max_memory, **options)
        self._cp = cupy()
        self._input_on_host = False

    def converts_from(self, namespace):
        return namespace in ("numpy", "list")

    def to_backend(self, X):
        cp = self._cp
        if isinstance(X, cp.ndarray):
            return X
        self._input_on_host = True
        with self.stage("transfer"):
            try:
                return cp.asarray(X)
            except cp.cuda.memory.OutOfMemoryError as exc:
                free, total = free_device_memory()
                raise KMeansMemoryError(
                    f"X ({format_bytes(X.nbytes)}) does not fit on the GPU: {format_bytes(free)} "
                    f"free of {format_bytes(total)}. Use float32, a smaller X, the numpy "
                    f"backend, or host streaming.") from exc

    def from_backend(self, arr, like):
        if isinstance(arr, self._cp.ndarray) and not isinstance(like, self._cp.ndarray):
            return arr.get()
        return arr

    def synchronize(self):
        self._cp.cuda.get_current_stream().synchronize()

    def available_memory(self) -> int:
        return free_device_memory()[0]

    def budget(self, xp=None) -> int:
        from kmeans_xp.memory import parse_memory
        value = parse_memory(self.max_memory)
        if value == "auto":
            return max(int(self.available_memory() * DEVICE_AUTO_FRACTION), 1)
        return value

    @contextlib.contextmanager
    def stage(self, name):
        """Record the pool's peak used bytes during this stage into memory_report[name]."""
        cp = self._cp
        self.synchronize()
        peak = _PeakHook().hook
        peak.peak = cp.get_default_memory_pool().used_bytes()
        with peak:
            yield
        self.memory_report[name] = max(self.memory_report.get(name, 0), peak.peak)

    def with_oom_retry(self, fn, rows, *, what):
        """Call fn(rows); on OutOfMemoryError free the pool's cached blocks, halve rows, retry.
        Below MIN_CHUNK_ROWS raise KMeansMemoryError saying what was asked and what to do."""
        cp = self._cp
        while True:
            try:
                return fn(rows)
            except cp.cuda.memory.OutOfMemoryError as exc:
                cp.get_default_memory_pool().free_all_blocks()
                if rows <= MIN_CHUNK_ROWS:
                    free, total = free_device_memory()
                    raise KMeansMemoryError(
                        f"{what}: out of device memory even with a chunk of {rows} rows "
                        f"(asked {format_bytes(getattr(exc, 'size', 0) or 0)}; "
                        f"{format_bytes(free)} free of {format_bytes(total)}). Lower "
                        f"max_memory, use float32, stream X from the host, or use the numpy "
                        f"backend.") from exc
                rows = max(MIN_CHUNK_ROWS, rows // 2)
                self.on_chunk_halved(rows)

    def on_chunk_halved(self, rows):
        """Hook for backends that cache chunk-sized buffers."""
