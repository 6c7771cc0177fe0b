"""CupyBudget: a CuPy fit's memory. max_memory="auto" is a share of what the device has free
(plus the pool's cached blocks, under its limit); stages record the pool's peak used bytes
(`memory_report_`). The errors a backend's memory check raises (`CupyBackendBase.check_memory`,
before any work, for a fit whose X or chunks cannot fit) are made here.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from kmeans_xp.contract.memory import (
    Budget,
    KMeansMemoryError,
    compute_itemsize,
    format_bytes,
    parse_memory,
)

from .common import (
    DEVICE_AUTO_FRACTION,
    DEVICE_HINT,
    NOMINAL_DEVICE_BYTES,
    cupy,
    device_memory_state,
    free_device_memory,
)


def device_free_bytes() -> int:
    """Bytes usable on the current device now (free, plus the pool's cached blocks, under its
    limit): `common.free_device_memory`'s first value."""
    return free_device_memory()[0]


@functools.lru_cache(maxsize=1)
def peak_hook_class():
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


def host_x_error(X, streams_possible):
    """X (NumPy) does not fit on the device: what to use instead."""
    hints = (["float32 (half the bytes)"] if X.dtype != np.float32 else []) + [
        "a smaller X", "the numpy backend"]
    if streams_possible:
        hints.append("host streaming (backend_options={'stream': True})")
    return KMeansMemoryError(
        f"X ({format_bytes(X.nbytes)}, {X.dtype}) does not fit on the GPU: "
        f"{device_memory_state()}. Use {', '.join(hints[:-1])} or {hints[-1]}.")


def centered_copy_error(name, X, itemsize=None):
    """A device X whose centered copy (`itemsize` bytes a value: a half-data fit's format,
    else X's compute dtype) does not fit, where the backend does not center chunk by
    chunk."""
    nbytes = int(np.prod(X.shape)) * (itemsize or compute_itemsize(X.dtype))
    return KMeansMemoryError(
        f"{name} computes on a centered copy of X ({format_bytes(nbytes)}), and the device "
        f"cannot hold it and the fit's labels beside X: {device_memory_state()}. Use "
        f"backend='cupy-kernels' or 'cupy-chunked' (they center X chunk by chunk as it "
        f"streams through, holding it once), copy_x=False (the fit computes on X as given, "
        f"uncentered), or free device memory.")


def unit_copy_error(name, X):
    """A device X whose unit-row copy (a spherical fit) does not fit beside it."""
    nbytes = int(np.prod(X.shape)) * compute_itemsize(X.dtype)
    return KMeansMemoryError(
        f"{name}: a spherical fit computes on a unit-row copy of X ({format_bytes(nbytes)}), "
        f"and the device cannot hold it and the fit's labels beside X: "
        f"{device_memory_state()}. Scale X's rows to unit norm yourself and fit with "
        f"copy_x=False (X is then used as given), give X as a NumPy array (its device copy "
        f"is normalised in place, or it streams), or free device memory.")


class CupyBudget(Budget):
    """Device memory of one backend's fits: what is free comes from the placement
    (`CupyPlacement.free_memory`); the backend checks a fit against it
    (`CupyBackendBase.check_memory`)."""

    def __init__(self, max_memory="auto", free_memory=None):
        super().__init__(max_memory, free_memory or device_free_bytes)
        self._peak_stack = []

    def bytes(self, reserve=0) -> int:
        """max_memory in bytes; "auto" is DEVICE_AUTO_FRACTION of what is usable now, less
        `reserve` bytes the fit will still allocate outside the backend's buffers."""
        value = parse_memory(self.max_memory)
        if value == "auto":
            return max(int((self.available() - reserve) * DEVICE_AUTO_FRACTION), 1)
        return value

    @contextlib.contextmanager
    def explain(self, what, reserve, reserve_what, hint=DEVICE_HINT):
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

    @contextlib.contextmanager
    def stage(self, name):
        """Record the pool's peak used bytes during this stage into report[name]. Stages
        nest: an inner stage reports its own peak and the outer one still sees it."""
        # the pool books allocations on the host when they are made: no sync needed
        used = cupy().get_default_memory_pool().used_bytes()
        if self._peak_stack:
            hook = self._peak_stack[-1]
            outer_peak, hook.peak = hook.peak, used
            try:
                yield
            finally:
                self.record(name, hook.peak)
                hook.peak = max(outer_peak, hook.peak)
            return
        hook = peak_hook_class()()
        hook.peak = used
        self._peak_stack.append(hook)
        try:
            with hook:
                yield
        finally:
            self._peak_stack.pop()
            self.record(name, hook.peak)


class NominalBudget(CupyBudget):
    """The budget of a backend that only plans (`CupyBackendBase.planner` without CuPy):
    "auto" is a share of an empty device of NOMINAL_DEVICE_BYTES; nothing is measured."""

    def available(self) -> int:
        return NOMINAL_DEVICE_BYTES

    @contextlib.contextmanager
    def explain(self, what, reserve, reserve_what, hint=DEVICE_HINT):
        # there is no device whose state an error could quote: it stays as raised
        yield
