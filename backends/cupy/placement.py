"""CupyPlacement: where a CuPy fit's data lives and how it moves.

CuPy input stays on its device (made C-contiguous once), as does a CUDA torch tensor, shared
through DLPack (results go back as tensors on its device); NumPy input is copied to the device
once, or, when its fit would not fit in the device memory usable now (stream="auto") or when
asked (stream=True), stays on the host and is streamed through the GPU on every pass
(`streaming.HostRows`). A device X is centered on a copy, or, when that copy and the labels
would not fit beside it (or with stream=True), chunk by chunk as it streams through the same
pipeline from device memory (`streaming.DeviceRows`): the device holds X once. Centers and
the driver's small arrays always live on the device.
Work is queued on the device (`asynchronous`): `fetch` copies the driver's per-iteration
statistics into pinned host memory behind a CUDA event, so the next iteration is queued
before they are read.
"""
from __future__ import annotations

import math
import weakref
from typing import Callable, NamedTuple

import numpy as np

from kmeans_xp.contract.backend import Placement, user_labels, user_labels_dtype
from kmeans_xp.contract.chunks import tol_from_variances
from kmeans_xp.contract.memory import compute_itemsize, driver_bytes
from kmeans_xp.contract.namespaces import (
    DLPACK_FOREIGN,
    array_namespace,
    as_like,
    dlpack_source,
    dtype_name,
    foreign_device_type,
)
from kmeans_xp.contract.precision import half_kind, half_storage
from kmeans_xp.contract.scaling import rescaled
from kmeans_xp.contract.sphere import unit_rows

from . import common, reductions
from .budget import device_free_bytes, host_x_error, unit_copy_error
from .common import cupy, out_of_memory_error
from .staging import download, upload

#: stream="auto" streams host X when X, the driver's arrays and this much working memory
#: would not fit in the device memory usable now
STREAM_AUTO_SLACK = 64 << 20
#: float32 bytes of X a step of `_centered_as` holds (its only temporary)
HALF_CHUNK_BYTES = 64 << 20


class CupySettings(NamedTuple):
    """What a CupyPlacement knows of its backend's configuration, read once when the backend
    is made (its options do not change after): the placement asks the backend nothing for
    its decisions."""
    name: str
    streaming: bool        # the backend can stream X (`CupyBackendBase.supports_streaming`)
    stream: object         # its stream option: "auto", True or False
    free_pool: bool        # its free_memory option: hand the pool's blocks back at finish
    seeding_bytes: Callable  # its class's `seeding_bytes` (k-means++'s device steps' bytes)

    @classmethod
    def of(cls, backend):
        return cls(backend.name, bool(backend.supports_streaming), backend.stream,
                   bool(getattr(backend, "free_memory", False)), type(backend).seeding_bytes)


class CupyPlacement(Placement):
    asynchronous = True
    #: centers of at most this many values live on the host, where the driver's center math
    #: costs microseconds in NumPy instead of a dozen kernel launches (0: always the device)
    small_on_host = 0

    def __init__(self, backend):
        super().__init__(backend)
        self.settings = CupySettings.of(backend)
        # the backend's own work it starts (compiling its kernels, its streaming engine, its
        # buffers, its budget's stages), through a weak reference: no reference cycle, so a
        # backend nobody holds (predict's) is freed at once, and with it the streaming
        # engine and X's page lock
        self.backend = weakref.proxy(backend)
        self._cp = cupy()
        self._stream_choice = None  # (id of the host X, stream it?) decided once per X
        self._uploaded = None  # the device copy of a host X made by to_backend: the fit's own

    def converts_from(self, namespace, X=None):
        return namespace in ("numpy", "list") or (
            namespace in DLPACK_FOREIGN and foreign_device_type(X) == "cuda")

    # -- data movement ----------------------------------------------------------------------
    def warm_up(self, X, n_clusters, seeding):
        """The fit's kernels compiled on other threads while X moves and its mean is taken: a
        cold fit's first launches each waited for an NVRTC run of 0.1-0.3 s. The seeding
        kernels in `seeding`'s dtype too, unless X is streamed from the host (its k-means++
        then runs in xp code)."""
        (n, d), dtype = X.shape, dtype_name(X.dtype)
        if seeding is not None and self.streams(X, n_clusters):
            seeding = None
        try:
            kernels = self.backend.fit_kernels(n, d, n_clusters, dtype, seeding=seeding)
        except Exception:  # noqa: BLE001 - only a head start: each kernel compiles when used
            return
        common.prefetch(kernels)

    def to_backend(self, X):
        cp = self._cp
        if foreign_device_type(X) == "cuda":
            # its device memory, shared through DLPack (never written: not _uploaded)
            X = cp.from_dlpack(dlpack_source(X))
        if isinstance(X, cp.ndarray) and not isinstance(X, np.ndarray):
            # kernels index rows directly: a strided view is made C-contiguous once, here
            return X if X.flags.c_contiguous else self._device_copy(X)
        streamed = self.streams(X)
        X = np.ascontiguousarray(X)  # kernels index rows directly (a memmap stays one)
        if streamed:
            self._stream_choice = (id(X), True)
            return X  # stays on the host: every pass streams it through the GPU
        with self.backend.memory.stage("transfer"):
            try:
                Xd = upload(cp, X)
                # (a namespace that only wraps host memory gives X itself back: not ours)
                self._uploaded = Xd if Xd is not X else None
                return Xd
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise host_x_error(X, self.settings.streaming) from exc

    def _device_copy(self, X):
        cp = self._cp
        try:
            return cp.ascontiguousarray(X)
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise out_of_memory_error("X as C-contiguous", exc) from exc

    def from_backend(self, arr, like):
        cp = self._cp
        if arr is None:
            return arr
        if foreign_device_type(like) is not None:
            # a CUDA result through DLPack, a host one copied
            return as_like(user_labels(arr), like)
        if isinstance(arr, cp.ndarray) and not isinstance(like, cp.ndarray) \
                and hasattr(arr, "get"):
            # compact labels cross the bus before they widen, widened by the copy threads
            # (a widening pass of its own took 1 s of a 1e9-row fit's 1.4 s copy back)
            return download(cp, arr, dtype=user_labels_dtype(arr.dtype))
        if isinstance(like, cp.ndarray) and isinstance(arr, np.ndarray):
            arr = cp.asarray(arr)  # centers kept on the host go back as the caller's type
        return user_labels(arr)  # streamed labels live in compact unsigned types

    def namespace(self, X):
        from .streaming import DeviceRows, HostRows
        if isinstance(X, DeviceRows):
            return array_namespace(X.data)
        if isinstance(X, HostRows):
            return array_namespace(np.empty(0))
        return array_namespace(X)

    def small(self, x, plan=None):
        """Centers on the device, whatever X's placement (the driver's center math runs
        there); on the host when they are no larger than `small_on_host` values."""
        cp = self._cp
        if x.size <= self.small_on_host:
            return cp.asnumpy(x)
        return x if isinstance(x, cp.ndarray) else cp.asarray(x)

    def synchronize(self):
        self._cp.cuda.get_current_stream().synchronize()

    def free_memory(self) -> int:
        """Bytes usable on the device now: free, plus the pool's cached blocks under its
        limit (`budget.device_free_bytes`)."""
        return device_free_bytes()

    def fetch(self, values):
        """An asynchronous copy of `values` (small, 1-d) into pinned host memory behind a
        CUDA event; the function returned waits for the event and gives the NumPy array."""
        cp = self._cp
        if not hasattr(values, "get"):  # already on the host
            host = np.array(values)
            return lambda: host
        values = cp.ascontiguousarray(values)
        mem = cp.cuda.alloc_pinned_memory(max(values.nbytes, 1))
        host = np.frombuffer(mem, dtype=values.dtype, count=values.size).reshape(values.shape)
        values.get(out=host, blocking=False)
        event = cp.cuda.Event(disable_timing=True)
        event.record()

        def wait():
            event.synchronize()
            return host.copy()  # the pinned block goes back to CuPy's pinned pool

        return wait

    def label_counts(self, labels, n_clusters):
        cp = self._cp
        if isinstance(labels, cp.ndarray) and labels.dtype == cp.int32 and labels.ndim == 1:
            return cp.asnumpy(reductions.label_counts(cp.ascontiguousarray(labels), n_clusters))
        return super().label_counts(labels, n_clusters)

    # -- centering --------------------------------------------------------------------------
    def feature_stats(self, X, tol, *, xp):
        if isinstance(X, np.ndarray) and self.streams(X):
            from .streaming import mean_and_tol
            b = self.backend
            engine = b.stream_engine(X, 1)
            return b.stream_pass(engine, run=lambda: mean_and_tol(engine, tol))
        if self._kernel_stats(X):
            return self.batch_feature_stats([X], tol, xp=xp)[0]
        return super().feature_stats(X, tol, xp=xp)

    def batch_feature_stats(self, problems, tol, *, xp):
        if not all(self._kernel_stats(X) for X in problems):
            return super().batch_feature_stats(problems, tol, xp=xp)
        cp = self._cp
        return [(cp.asarray(mean64.astype(common.compute_dtype(X.dtype))),
                 tol_from_variances(var, tol))
                for X, (mean64, var) in zip(problems, reductions.column_mean_var_many(
                    problems, need_var=tol != 0))]

    def _kernel_stats(self, X) -> bool:
        """Whether X's mean and variance come from the column_moments kernel: one kernel,
        compiled ahead with the fit's own (`warm_up`): CuPy's reductions and its first
        scalar arithmetic (which imports cupyx) took 2.4 s of a cold 3 s first fit. float32
        only: float32 values added in float64 are exact in any order while 24 bits +
        log2(n) + their exponent range fit in 53, so the mean is the numpy backend's bit
        for bit; float64 X's sums round, differently in another order, and a mean's last
        bit decides exact ties. Half X likewise (read in its format, summed in float64)."""
        cp = self._cp
        return (isinstance(X, cp.ndarray) and X.ndim == 2 and X.shape[0] > 0
                and X.flags.c_contiguous
                and (X.dtype == cp.float32 or half_kind(X.dtype) is not None))

    def center(self, X, mean, *, xp, in_place=False, dtype=None):
        if isinstance(X, np.ndarray) and self.streams(X):
            from .streaming import HostRows
            # centered chunk by chunk on the device (mean None, copy_x=False: by 0)
            return HostRows(X, np.zeros(X.shape[1]) if mean is None else np.asarray(mean))
        if mean is None:
            return X  # copy_x=False: the fit computes on X as given (never written)
        if dtype is not None:
            return self._centered_as(X, mean, 1.0, dtype)
        # the device copy of a host X is the fit's own: centered where it is, so the device
        # holds X once
        in_place = in_place or (self._uploaded is not None and X is self._uploaded)
        if not in_place and self.centers_chunkwise(X):
            from .streaming import DeviceRows
            return DeviceRows(X, mean)
        return super().center(X, mean, xp=xp, in_place=in_place)

    def center_scaled(self, X, mean, scale, *, xp, dtype=None):
        """(X - mean) * scale: always on an array the fit owns (rescaled in place), never X
        itself nor a chunkwise view, whatever `center` would choose."""
        if isinstance(X, np.ndarray) and self.streams(X):
            return super().center_scaled(X, mean, scale, xp=xp)
        if dtype is not None:
            return self._centered_as(X, mean, scale, dtype)
        own = self._uploaded is not None and X is self._uploaded
        return rescaled(Placement.center(self, X, mean, xp=xp, in_place=own), scale, xp)

    def _centered_as(self, X, mean, scale, dtype):
        """(X - mean) * scale in float32, rounded once to `dtype` (float16, bfloat16: the data
        of a backend's `half_data` fit), row chunk by row chunk into the fit's own array: X's
        device copy of a host X when it already has that dtype, else a new one (half the
        bytes of a float32 copy). X as the user gave it is never written. A batch's (B, n, d)
        X with (B, 1, d) means goes the same way, its rows chunked across all problems."""
        cp = self._cp
        dtype = np.dtype(dtype)
        own = self._uploaded is not None and X is self._uploaded and X.dtype == dtype
        out = X if own else cp.empty(X.shape, dtype=dtype)
        m = cp.asarray(mean if mean is not None else 0, dtype=cp.float32)
        n, row_values = X.shape[-2], math.prod(X.shape[:-2]) * X.shape[-1]
        rows = max(1, min(n, HALF_CHUNK_BYTES // max(1, row_values * 4)))   # (n = 0: no step)
        # one float32 buffer for every chunk: a chunk made per step would be allocated
        # before the last one is let go, two of them held at the peak
        buf = cp.empty(X.shape[:-2] + (rows, X.shape[-1]), dtype=cp.float32)
        for r0 in range(0, n, rows):
            part = buf[..., :min(rows, n - r0), :]
            cp.subtract(X[..., r0:r0 + rows, :], m, out=part, dtype=cp.float32)
            if scale != 1:
                cp.multiply(part, np.float32(scale), out=part)
            out[..., r0:r0 + rows, :] = part   # (rounded to nearest even)
        return out

    def unit_rows(self, X, *, xp):
        """Unit rows (a spherical fit): in place on the fit's own device copy of a host X, so
        the device holds X once; a streamed host X on a host copy, streamed as X would be."""
        rows = self.backend.driver_rows(X)
        if isinstance(X, np.ndarray) and self.streams(X):
            Xu = unit_rows(X, xp, rows)
            self._stream_choice = (id(Xu), True)
            return Xu
        own = self._uploaded is not None and X is self._uploaded
        if not own and not self.copy_fits(X):
            raise unit_copy_error(self.settings.name, X)
        return unit_rows(X, xp, rows, in_place=own)

    def half_dtype(self):
        """The dtype the fit's centered data is stored in on the device
        (`precision.half_storage`), else None."""
        return half_storage(self.backend, self._cp)

    def copy_bytes(self, X) -> int:
        """Bytes per value of a centered copy of X: its half format's for a half-data fit,
        else its compute dtype's."""
        half = self.half_dtype()
        return np.dtype(half).itemsize if half is not None else compute_itemsize(X.dtype)

    def host_x_bytes(self, X) -> int:
        """Bytes per value a fit of host X holds on the device for its data: X's copy in its
        compute dtype, centered in place (a half-data fit's X in its format: that format's),
        plus a half-data fit's centered copy where X is in another dtype (float32 X at
        fp16: 4 + 2)."""
        half = self.half_dtype()
        if half is not None and X.dtype == half:
            return np.dtype(half).itemsize
        return compute_itemsize(X.dtype) + (0 if half is None else np.dtype(half).itemsize)

    def copy_fits(self, X) -> bool:
        """Whether a centered copy of device X fits in the device memory usable now, with
        the labels of three iterations (int32) and an assignment's distances beside it."""
        n, d = X.shape
        itemsize = compute_itemsize(X.dtype)
        need = (n * d * self.copy_bytes(X) + n * (3 * 4 + 2 * itemsize)
                + STREAM_AUTO_SLACK)
        return need <= self.free_memory()

    def centers_chunkwise(self, X) -> bool:
        """Whether device X is centered chunk by chunk as it streams (`DeviceRows`) instead
        of on a copy: with stream=True, or with "auto" when the copy does not fit."""
        s = self.settings
        if not s.streaming or s.stream is False:
            return False
        return s.stream is True or not self.copy_fits(X)

    def fit_state_bytes(self, n, d, n_clusters, itemsize, x_bytes=None):
        """Device bytes a fit of host X needs beside the backend's buffers: X once (centered
        in place; `x_bytes` per value where that is not `itemsize`: `host_x_bytes`) and the
        driver's arrays."""
        seeding = self.settings.seeding_bytes(n, d, n_clusters, itemsize)
        parts = driver_bytes(n, d, n_clusters, itemsize, seeding=seeding)
        held = itemsize if x_bytes is None else x_bytes
        return n * d * held + sum(parts.values()) - parts["centered_copy"]

    # -- host streaming ---------------------------------------------------------------------
    def streams(self, X, n_clusters=1) -> bool:
        """Whether this host X is streamed rather than copied to the device (decided once per
        X: the budget's check decides with the fit's k, to_backend reuses it)."""
        s = self.settings
        if not s.streaming or not isinstance(X, np.ndarray) or X.ndim != 2:
            return False   # (a batch's (B, n, d) array is not streamed: to_backend moved it)
        if self._stream_choice is not None and self._stream_choice[0] == id(X):
            return self._stream_choice[1]
        if s.stream != "auto":
            choice = bool(s.stream)
        else:
            n, d = X.shape
            state = self.fit_state_bytes(n, d, n_clusters, compute_itemsize(X.dtype),
                                         self.host_x_bytes(X))
            choice = state + STREAM_AUTO_SLACK > self.free_memory()
        self._stream_choice = (id(X), choice)
        return choice

    def finish(self, kept=None):
        """The fit is over: drop per-fit buffers and, with free_memory=True, hand the pool's
        cached blocks back to the device (and CuPy's cached pinned host blocks). The kept
        arrays then go to the host and back: one left where it was would hold the rest of a
        pool block it was cut from, which the pool cannot hand back."""
        self.backend.release_buffers()
        self._stream_choice = None
        self._uploaded = None
        if not self.settings.free_pool:
            return kept
        cp = self._cp
        kept = {} if kept is None else kept
        on_device = [k for k, v in kept.items() if isinstance(v, cp.ndarray)]
        for k in on_device:
            # in the caller's own dict: a new dict would leave the caller holding the device
            # arrays while the pool is emptied, and their blocks cached once it lets go
            kept[k] = cp.asnumpy(kept[k])
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
        for k in on_device:
            kept[k] = cp.asarray(kept[k])
        return kept

