"""What every CuPy backend shares: lazy import, host<->device movement, the memory budget from
free device memory, per-stage peak memory measured on the CuPy pool, OOM recovery by chunk
halving, the device-resident Lloyd loop, the memory every fit keeps on the device, and host
streaming (`_cupy_streaming`) for backends that provide a per-chunk primitive.
CuPy is imported only when a CuPy backend is instantiated.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math
from typing import ClassVar

import numpy as np

from kmeans_xp.backend import KMeansBackend, ReduceResult
from kmeans_xp.memory import KMeansMemoryError, MemoryEstimate, format_bytes, parse_memory

#: fraction of (free device memory + pool free blocks) that max_memory="auto" uses
DEVICE_AUTO_FRACTION = 0.8
#: below this many rows a chunked stage gives up halving and raises KMeansMemoryError
MIN_CHUNK_ROWS = 1024
#: stream="auto" streams host X when the in-memory fit's state plus this much working memory
#: would not fit in the device memory usable now
STREAM_AUTO_SLACK = 64 << 20
#: what to change when the device is what is short
DEVICE_HINT = (
    "Raise or remove the pool limit (cupy.get_default_memory_pool().set_limit(size=0)), "
    "free device memory held by other arrays or processes, give an explicit max_memory, use "
    "float32, stream X from the host (NumPy input; backend_options={'stream': True}), or "
    "use the numpy backend.")


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
    to NumPy; CuPy input stays where it is. Backends with a per-chunk primitive
    (`supports_streaming`) stream NumPy input from the host instead when it does not fit.

    Options (backend_options):
      free_memory: when True, hand the pool's cached blocks (and CuPy's cached pinned host
        blocks) back when a fit ends (CuPy keeps freed blocks cached for reuse, so other
        processes would not see them free).
      stream: "auto" (default): a NumPy X (array or memmap) whose fit would not fit in the
        device memory usable now is streamed through the GPU every iteration instead of
        copied; True: always stream NumPy X; False: never (a KMeansMemoryError says so).
      stream_rows: rows per streamed chunk (default: ~256 MiB of X, within the budget).
      pin_input: "auto" (default): page-lock X (cudaHostRegister) for the fit so chunks are
        copied from it directly: an in-memory X always, a memmap when it takes at most half
        the host's available memory (locking reads it in); staging through pinned buffers
        otherwise and where CUDA refuses. True: try for any memmap; False: always stage.
    """

    namespaces = frozenset({"cupy"})
    device = "gpu"
    #: True for backends that define `chunk_centers`, `assign_chunk` and `stream_work_bytes`
    supports_streaming: ClassVar[bool] = False

    def __init__(self, max_memory="auto", free_memory=False, stream="auto", stream_rows=None,
                 pin_input="auto", **options):
        known = (["free_memory", "stream", "stream_rows", "pin_input"]
                 if self.supports_streaming else ["free_memory"])
        given = {"stream": stream != "auto", "stream_rows": stream_rows is not None,
                 "pin_input": pin_input != "auto"}
        options.update({k: v for k, v in (("stream", stream), ("stream_rows", stream_rows),
                                          ("pin_input", pin_input))
                        if given[k] and k not in known})
        if options:
            raise TypeError(f"backend {self.name!r} takes no options {sorted(options)}; "
                            f"backend_options it knows: {known}")
        super().__init__(max_memory)
        if not isinstance(free_memory, bool):
            raise TypeError(f"free_memory must be True or False, got {free_memory!r}")
        for option, value in (("stream", stream), ("pin_input", pin_input)):
            if not (isinstance(value, bool) or value == "auto"):
                raise TypeError(f"{option} must be 'auto', True or False, got {value!r}")
        if stream_rows is not None and (isinstance(stream_rows, bool) or not isinstance(
                stream_rows, (int, np.integer)) or stream_rows < 1):
            raise TypeError(f"stream_rows must be a positive int or None, got {stream_rows!r}")
        self.free_memory = free_memory
        self.stream, self.stream_rows, self.pin_input = stream, stream_rows, pin_input
        self._cp = cupy()
        self._input_on_host = False
        self._peak_stack = []
        self._stream_choice = None  # (id of the host X, stream it?) decided once per X
        self._engine = None         # StreamEngine of the fit, when X is streamed

    def converts_from(self, namespace):
        return namespace in ("numpy", "list")

    # -- data movement ----------------------------------------------------------------------
    def to_backend(self, X):
        cp = self._cp
        if isinstance(X, cp.ndarray):
            # kernels index rows directly: a strided view is made C-contiguous once, here
            return X if X.flags.c_contiguous else self.device_copy(X, "X as C-contiguous")
        self._input_on_host = True
        streamed = self.streams(X)
        X = np.ascontiguousarray(X)  # kernels index rows directly (a memmap stays one)
        if streamed:
            self._stream_choice = (id(X), True)
            return X  # stays on the host: every pass streams it through the GPU
        with self.stage("transfer"):
            try:
                return cp.asarray(X)
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise self._host_x_error(X) from exc

    def _host_x_error(self, X):
        hints = (["float32 (half the bytes)"] if X.dtype != np.float32 else []) + [
            "a smaller X", "the numpy backend"]
        if self.supports_streaming:
            hints.append("host streaming (backend_options={'stream': True})")
        return KMeansMemoryError(
            f"X ({format_bytes(X.nbytes)}, {X.dtype}) does not fit on the GPU: "
            f"{device_memory_state()}. Use {', '.join(hints[:-1])} or {hints[-1]}.")

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

    # -- host streaming ---------------------------------------------------------------------
    def streams(self, X, n_clusters=1) -> bool:
        """Whether this host X is streamed rather than copied to the device (decided once per
        X: check_memory decides with the fit's k, to_backend reuses it)."""
        if not self.supports_streaming or not isinstance(X, np.ndarray):
            return False
        if self._stream_choice is not None and self._stream_choice[0] == id(X):
            return self._stream_choice[1]
        if self.stream != "auto":
            choice = bool(self.stream)
        else:
            n, d = X.shape
            itemsize = 4 if X.dtype == np.float32 else 8
            state = sum(fit_state_bytes(n, d, n_clusters, itemsize).values())
            choice = state + STREAM_AUTO_SLACK > self.available_memory()
        self._stream_choice = (id(X), choice)
        return choice

    def is_streamed(self, X) -> bool:
        from ._cupy_streaming import HostRows
        return isinstance(X, HostRows)

    def _stream_engine(self, X, n_clusters, sample_weight=None):
        """The fit's StreamEngine for host X (built on first use, kept until finish: X's
        page lock and the pinned buffers outlive a pass), planned for n_clusters."""
        from ._cupy_streaming import StreamEngine
        cp = self._cp
        with self.stage("stream"):
            try:
                if self._engine is None or self._engine.X is not X:
                    self.release_buffers()
                    self._engine = StreamEngine(self, X, pin_input=self.pin_input)
                return self._engine.configure(n_clusters, sample_weight, self.stream_rows)
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise out_of_memory_error(f"{self.name} setting up host streaming", exc) from exc

    def _stream_pass(self, engine, *args, run=None, **kwargs):
        """engine.run(*args, **kwargs) (or run()), its device peak recorded as the "stream"
        stage and its pinned host bytes as "pinned_host"; OOM becomes KMeansMemoryError."""
        cp = self._cp
        with self.stage("stream"):
            try:
                return run() if run is not None else engine.run(*args, **kwargs)
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise out_of_memory_error(
                    f"{self.name} streaming X (n={engine.n}, d={engine.d}) in chunks of "
                    f"{engine.plan.rows} rows", exc,
                    " Give a smaller backend_options['stream_rows'].") from exc
            finally:
                self.memory_report["pinned_host"] = max(
                    self.memory_report.get("pinned_host", 0), engine.pinned_bytes)

    def feature_stats(self, X, tol, *, xp):
        if isinstance(X, np.ndarray) and self.streams(X):
            from ._cupy_streaming import mean_and_tol
            engine = self._stream_engine(X, 1)
            return self._stream_pass(engine, run=lambda: mean_and_tol(engine, tol))
        return super().feature_stats(X, tol, xp=xp)

    def center(self, X, mean, *, xp, in_place=False):
        if isinstance(X, np.ndarray) and self.streams(X):
            from ._cupy_streaming import HostRows
            return HostRows(X, mean)  # centered chunk by chunk on the device
        return super().center(X, mean, xp=xp, in_place=in_place)

    def stream_assign(self, X, centers):
        from kmeans_xp.backend import AssignResult
        r = self._stream_pass(self._stream_engine(X.data, centers.shape[0]), centers,
                              mean=X.mean, labels_out=True, min_out=True)
        return AssignResult(r.labels, r.min_sq)

    def stream_reduce(self, X, labels, sample_weight, n_clusters):
        engine = self._stream_engine(X.data, n_clusters, np.asarray(sample_weight))
        r = self._stream_pass(engine, mean=X.mean, accumulate=True,
                              labels_in=np.ascontiguousarray(labels, dtype=np.int64))
        return ReduceResult(r.sums, r.weights)

    def stream_lloyd_iter(self, X, sample_weight, centers, update_centers):
        from kmeans_xp.backend import IterResult
        engine = self._stream_engine(X.data, centers.shape[0], np.asarray(sample_weight))
        r = self._stream_pass(engine, centers, mean=X.mean, accumulate=update_centers,
                              labels_out=True, min_out=True)
        return IterResult(r.labels, r.min_sq, r.sums, r.weights)

    def stream_estimate(self, n, d, k, itemsize, *, weighted=False) -> MemoryEstimate:
        """Bytes of a fit streamed from the host, part by part: on the device the label
        store, the chunk buffers of every slot, the backend's working memory, centers and
        sums (their sum is `total`); on the host (parts ending in _host, not in total) the
        pinned buffers and, when it does not fit on the device, the label store."""
        from ._cupy_streaming import plan_stream
        what = f"{self.name} streaming X (n={n}, d={d}) from the host"
        with self.explain_device_budget(what, 0, "nothing else: X stays on the host",
                                        hint=self.STREAM_HINT):
            plan = plan_stream(
                n, d, k, itemsize, self.budget(), weighted=weighted, rows=self.stream_rows,
                what=what, work_bytes=lambda r, share: self.stream_work_bytes(
                    r, d, k, itemsize, share))
        self.release_buffers()
        return MemoryEstimate(dict(plan.parts), plan.device_bytes, plan.rows)

    def stream_work_bytes(self, rows, d, k, itemsize, budget):
        raise NotImplementedError(f"{self.name} does not stream")

    def drop_work_buffers(self):
        """Hook: free the per-chunk working buffers of the streamed primitive (re-planning)."""

    # -- memory -----------------------------------------------------------------------------
    def available_memory(self) -> int:
        return free_device_memory()[0]

    def check_memory(self, X, n_clusters, options=None):
        """Before any work: a NumPy X that is streamed must fit its chunks in the budget; one
        that is copied must fit on the device; then the backend's estimate (its chunk plan)
        must fit. When max_memory is "auto" the error states the device's side (asked,
        free and total memory, the pool limit, what to change)."""
        if isinstance(X, np.ndarray):
            n, d = X.shape
            itemsize = 4 if X.dtype == np.float32 else 8
            if self.streams(X, n_clusters):
                self.stream_estimate(n, d, n_clusters, itemsize, weighted=True)
                return
            if X.nbytes > self.available_memory():
                raise self._host_x_error(X)
        super().check_memory(X, n_clusters, options)

    #: what to change when streaming itself does not fit
    STREAM_HINT = (
        "Raise or remove the pool limit (cupy.get_default_memory_pool().set_limit(size=0)), "
        "free device memory held by other arrays or processes, give an explicit max_memory, "
        "or use the numpy backend.")

    @contextlib.contextmanager
    def explain_device_budget(self, what, reserve, reserve_what, hint=DEVICE_HINT):
        """A KMeansMemoryError raised inside, when max_memory is "auto" (so the budget is what
        the device has free), is restated with the device's numbers and what to change."""
        try:
            yield
        except KMeansMemoryError as exc:
            if parse_memory(self.max_memory) != "auto" or exc.needed is None:
                raise
            beside = (f" beside {format_bytes(reserve)} for {reserve_what}" if reserve
                      else f" ({reserve_what})")
            raise KMeansMemoryError(
                f"{what} needs at least {format_bytes(exc.needed)} of device memory{beside}, "
                f"but max_memory='auto' leaves {format_bytes(exc.allowed)} "
                f"({DEVICE_AUTO_FRACTION:.0%} of what is usable): {device_memory_state()}. "
                f"{hint}", needed=exc.needed, allowed=exc.allowed) from exc

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
        cached blocks back to the device (and CuPy's cached pinned host blocks)."""
        self.release_buffers()
        self._stream_choice = None
        if self.free_memory:
            self._cp.get_default_memory_pool().free_all_blocks()
            self._cp.get_default_pinned_memory_pool().free_all_blocks()

    def release_buffers(self):
        """Drop per-fit buffers (backends that keep more extend this): the streaming engine
        and its pinned and device buffers, X's page lock."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # -- the heavy primitives shared by cupy-kernels and cupy-chunked ----------------------------
    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None) -> ReduceResult:
        """Per-cluster float64 sums of w * x and w (shared-memory privatised atomics)."""
        if self.is_streamed(X):
            return self.stream_reduce(X, labels, sample_weight, n_clusters)
        from . import _cupy_kmeans_kernels as kernels
        cp = self._cp
        X = self.contiguous(X)
        with self.stage("update"):
            sums = cp.zeros((n_clusters, X.shape[1]), dtype=cp.float64)
            weights = cp.zeros((n_clusters,), dtype=cp.float64)
            kernels.cluster_sums(X, self.contiguous(labels, cp.int64),
                                 self.contiguous(sample_weight, X.dtype), sums, weights)
        return ReduceResult(sums, weights)

    def lloyd_iter(self, X, sample_weight, centers, *, xp=None, update_centers=True):
        if self.is_streamed(X):
            return self.stream_lloyd_iter(X, sample_weight, centers, update_centers)
        return super().lloyd_iter(X, sample_weight, centers, xp=xp,
                                  update_centers=update_centers)

    # -- the Lloyd loop on the device -------------------------------------------------------
    def kmeans_single(self, X, sample_weight, centers, *, xp, max_iter, tol, verbose=0):
        """The driver's Lloyd run with its O(n) bookkeeping (inertia, center shift, changed
        labels) done by reduction kernels: no n-sized temporaries, one sync per iteration.
        Host-streamed X: the same loop with that bookkeeping done during each streamed pass
        (`_cupy_streaming.stream_lloyd`)."""
        from ._cupy_kmeans_kernels import DeviceReductions
        from ._device_loop import lloyd_with_reductions

        if self.is_streamed(X):
            from ._cupy_streaming import stream_lloyd
            sw = np.asarray(sample_weight)
            engine = self._stream_engine(X.data, centers.shape[0], sw)
            rows = self.driver_rows(X.shape[0], X.shape[1], X.dtype)
            return self._stream_pass(
                engine, run=lambda: stream_lloyd(engine, X.mean, sw, np.asarray(centers),
                                                 max_iter=max_iter, tol=tol, rows=rows,
                                                 verbose=verbose))

        rows = self.driver_rows(X.shape[0], X.shape[1], X.dtype)
        sw = sample_weight if sample_weight.dtype == X.dtype else sample_weight.astype(X.dtype)
        return lloyd_with_reductions(self, X, sw, centers, xp=xp, max_iter=max_iter, tol=tol,
                                     rows=rows, reductions=DeviceReductions(), verbose=verbose)
