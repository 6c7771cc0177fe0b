"""What every CuPy backend shares: lazy import, host<->device movement, the memory budget from
free device memory, per-stage peak memory measured on the CuPy pool, OOM recovery by chunk
halving, the device-resident Lloyd loop, and the memory every fit keeps on the device.
CuPy is imported only when a CuPy backend is instantiated.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math

import numpy as np

from kmeans_xp.backend import KMeansBackend
from kmeans_xp.memory import KMeansMemoryError, format_bytes, parse_memory

#: fraction of (free device memory + pool free blocks) that max_memory="auto" uses
DEVICE_AUTO_FRACTION = 0.8
#: below this many rows a chunked stage gives up halving and raises KMeansMemoryError
MIN_CHUNK_ROWS = 1024


def cupy():
    return importlib.import_module("cupy")


def free_device_memory() -> tuple[int, int]:
    """(free bytes usable now, total bytes): the driver's free memory plus the blocks the CuPy
    pool caches but does not use (CuPy counts those as taken), capped by the pool's limit
    (`set_limit`, CUPY_GPU_MEMORY_LIMIT) when one is set: that is what this process may take."""
    cp = cupy()
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    usable = free + pool.free_bytes()
    limit = pool.get_limit()
    if limit:
        usable = min(usable, max(limit - pool.used_bytes(), 0))
    return int(usable), int(total)


@functools.lru_cache(maxsize=1)
def _peak_hook_class():
    """A CuPy MemoryHook that records the pool's peak used bytes (built once, lazily)."""
    cp = cupy()

    class PeakHook(cp.cuda.memory_hook.MemoryHook):
        name = "kmeans_xp_peak"

        def __init__(self):
            self.peak = 0

        def malloc_postprocess(self, **kwargs):
            used = cp.get_default_memory_pool().used_bytes()
            if used > self.peak:
                self.peak = used

    return PeakHook


def device_memory_state() -> str:
    """'X free of Y' (and the pool limit when one is set), for error messages."""
    free, total = free_device_memory()
    limit = cupy().get_default_memory_pool().get_limit()
    text = f"{format_bytes(free)} free of {format_bytes(total)}"
    return text + (f" under a pool limit of {format_bytes(limit)}" if limit else "")


def out_of_memory_error(what, exc, hint=""):
    """KMeansMemoryError saying what was asked, what is free, and what to change."""
    # CuPy's OutOfMemoryError keeps the request in `_size` (its message says it too)
    asked = getattr(exc, "_size", None) or getattr(exc, "size", None) or 0
    return KMeansMemoryError(
        f"{what}: out of device memory (asked {format_bytes(asked)}; "
        f"{device_memory_state()}).{hint} Lower max_memory, use float32, stream X from the "
        f"host, or use the numpy backend.")


def fit_state_bytes(n, d, k, itemsize) -> dict:
    """Device bytes a fit keeps besides a backend's working buffers, part by part.

    data: X on the device (the user's CuPy array, or the copy of host X); centered_copy: the
    estimator's mean-centered X; sample_weight: the weights (X's dtype); labels_and_distances:
    labels (int64) and squared distances of this and the previous Lloyd iteration;
    centers_and_sums: centers, new centers, float64 sums and weights, and their host round
    trips' device copies."""
    return {
        "data": n * d * itemsize,
        "centered_copy": n * d * itemsize,
        "sample_weight": n * itemsize,
        "labels_and_distances": 2 * n * (8 + itemsize),
        "centers_and_sums": 8 * k * (d + 1) * 8,
    }


def kmeanspp_bytes(n, d, k, itemsize, driver_rows) -> tuple[int, int]:
    """(per-sample bytes, chunk bytes) that k-means++ (kmeans_xp.init) allocates on the device:
    per sample its float64 weights, the running closest distances and their concatenated
    chunks, and the float64 cumulative potential; per chunk row the candidates' distances."""
    trials = 2 + int(math.log(k)) if k > 1 else 2
    per_sample = 8 + 3 * itemsize + 3 * 8
    if d <= 4:   # direct differences: (rows, trials, d) twice, then (rows, trials) distances
        per_row = 2 * trials * d * itemsize + 2 * trials * itemsize + 2 * trials * 8
    else:        # norm expansion: x*x, the GEMM block and its clipped/min copies
        per_row = d * itemsize + 5 * trials * itemsize + 2 * trials * 8
    return n * per_sample, driver_rows * per_row


class CupyBackendBase(KMeansBackend):
    """Base of the CuPy backends: NumPy input is copied to the device once, results go back
    to NumPy; CuPy input stays where it is.

    free_memory: when True, hand the pool's cached blocks back to the device when a fit ends
    (CuPy keeps freed blocks cached for reuse, so other processes would not see them free).
    """

    namespaces = frozenset({"cupy"})
    device = "gpu"

    def __init__(self, max_memory="auto", free_memory=False, **options):
        if options:
            raise TypeError(f"backend {self.name!r} takes no options {sorted(options)}; "
                            f"backend_options it knows: ['free_memory']")
        super().__init__(max_memory)
        if not isinstance(free_memory, bool):
            raise TypeError(f"free_memory must be True or False, got {free_memory!r}")
        self.free_memory = free_memory
        self._cp = cupy()
        self._input_on_host = False
        self._peak_stack = []

    def converts_from(self, namespace):
        return namespace in ("numpy", "list")

    # -- data movement ----------------------------------------------------------------------
    def to_backend(self, X):
        cp = self._cp
        if isinstance(X, cp.ndarray):
            # kernels index rows directly: a strided view is made C-contiguous once, here
            return X if X.flags.c_contiguous else self.device_copy(X, "X as C-contiguous")
        self._input_on_host = True
        X = np.ascontiguousarray(X)  # kernels index rows directly
        with self.stage("transfer"):
            try:
                return cp.asarray(X)
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise KMeansMemoryError(
                    f"X ({format_bytes(X.nbytes)}) does not fit on the GPU: "
                    f"{device_memory_state()}. Use float32, a smaller X, the numpy "
                    f"backend, or host streaming.") from exc

    def from_backend(self, arr, like):
        if isinstance(arr, self._cp.ndarray) and not isinstance(like, self._cp.ndarray):
            return arr.get()
        return arr

    def device_copy(self, X, what):
        try:
            return self._cp.ascontiguousarray(X)
        except self._cp.cuda.memory.OutOfMemoryError as exc:
            raise out_of_memory_error(what, exc) from exc

    def device_empty(self, shape, dtype, what):
        """An output array that cannot be chunked; OOM becomes a KMeansMemoryError."""
        try:
            return self._cp.empty(shape, dtype=dtype)
        except self._cp.cuda.memory.OutOfMemoryError as exc:
            raise out_of_memory_error(f"allocating {what} {tuple(shape)}", exc) from exc

    def contiguous(self, a, dtype=None):
        """a as a C-contiguous CuPy array of dtype (a no-op when it already is one)."""
        cp = self._cp
        if dtype is not None and a.dtype != dtype:
            a = a.astype(dtype)
        return a if a.flags.c_contiguous else cp.ascontiguousarray(a)

    def synchronize(self):
        self._cp.cuda.get_current_stream().synchronize()

    # -- memory -----------------------------------------------------------------------------
    def available_memory(self) -> int:
        return free_device_memory()[0]

    def budget(self, xp=None, *, reserve=0) -> int:
        """max_memory in bytes; "auto" is DEVICE_AUTO_FRACTION of what is usable now, less
        `reserve` bytes the fit will still allocate outside the backend's buffers."""
        value = parse_memory(self.max_memory)
        if value == "auto":
            return max(int((self.available_memory() - reserve) * DEVICE_AUTO_FRACTION), 1)
        return value

    @contextlib.contextmanager
    def stage(self, name):
        """Record the pool's peak used bytes during this stage into memory_report[name].
        Stages nest: an inner stage reports its own peak and the outer one still sees it."""
        # the pool books allocations on the host when they are made: no sync needed
        used = self._cp.get_default_memory_pool().used_bytes()
        if self._peak_stack:
            hook = self._peak_stack[-1]
            outer_peak, hook.peak = hook.peak, used
            try:
                yield
            finally:
                self._record_peak(name, hook.peak)
                hook.peak = max(outer_peak, hook.peak)
            return
        hook = _peak_hook_class()()
        hook.peak = used
        self._peak_stack.append(hook)
        try:
            with hook:
                yield
        finally:
            self._peak_stack.pop()
            self._record_peak(name, hook.peak)

    def _record_peak(self, name, peak):
        self.memory_report[name] = max(self.memory_report.get(name, 0), int(peak))

    def with_oom_retry(self, fn, rows, *, what):
        """Call fn(rows); on OutOfMemoryError free the pool's cached blocks, halve rows, retry.
        Below MIN_CHUNK_ROWS raise KMeansMemoryError saying what was asked and what to do."""
        cp = self._cp
        while True:
            try:
                return fn(rows)
            except cp.cuda.memory.OutOfMemoryError as exc:
                self.on_chunk_halved(rows)  # drop chunk buffers before freeing the pool
                cp.get_default_memory_pool().free_all_blocks()
                if rows <= MIN_CHUNK_ROWS:
                    raise out_of_memory_error(
                        f"{what}", exc, f" A chunk of {rows} rows was tried, the smallest "
                        f"allowed.") from exc
                rows = max(MIN_CHUNK_ROWS, rows // 2)

    def on_chunk_halved(self, rows):
        """Hook for backends that cache chunk-sized buffers: forget them."""

    def finish(self):
        """The fit is over: drop per-fit buffers and, with free_memory=True, hand the pool's
        cached blocks back to the device."""
        self.release_buffers()
        if self.free_memory:
            self._cp.get_default_memory_pool().free_all_blocks()

    def release_buffers(self):
        """Hook for backends that keep per-fit buffers."""

    # -- the Lloyd loop on the device -------------------------------------------------------
    def kmeans_single(self, X, sample_weight, centers, *, xp, max_iter, tol, verbose=0):
        """The driver's Lloyd run with its O(n) bookkeeping (inertia, center shift, changed
        labels) done by reduction kernels: no n-sized temporaries, one sync per iteration."""
        from ._cupy_kmeans_kernels import DeviceReductions
        from ._device_loop import lloyd_with_reductions

        rows = self.driver_rows(X.shape[0], X.shape[1], X.dtype)
        sw = sample_weight if sample_weight.dtype == X.dtype else sample_weight.astype(X.dtype)
        return lloyd_with_reductions(self, X, sw, centers, xp=xp, max_iter=max_iter, tol=tol,
                                     rows=rows, reductions=DeviceReductions(), verbose=verbose)
