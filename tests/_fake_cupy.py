"""A NumPy stand-in for the parts of CuPy the CuPy backends touch, with their kernels emulated,
so the backends' Python paths (planning, chunk and tile loops, OOM halving, stages, the
device-resident loop, finish) run in CPU tests. "Device" arrays are NumPy arrays here.

Only orchestration is tested this way: the kernels themselves are checked by compiling them
(test_cupy_kernel_sources.py) and against NumPy on a GPU (test_cupy_backends.py).
"""
import importlib.machinery
import sys
import types

import numpy as np
from kmeans_xp_backends import _cupy_common
from kmeans_xp_backends import _cupy_kmeans_kernels as kernels
from kmeans_xp_backends import _cupy_streaming as streaming

from kmeans_xp import registry

_REAL_CLUSTER_SUMS = kernels.cluster_sums


class FakeOOM(MemoryError):
    pass


class FakeHook:
    """cupy.cuda.memory_hook.MemoryHook's protocol: the pool calls the active hooks."""

    def __enter__(self):
        ACTIVE_HOOKS.append(self)
        return self

    def __exit__(self, *exc):
        ACTIVE_HOOKS.remove(self)


ACTIVE_HOOKS = []


class FakePool:
    def __init__(self):
        self.used = 0
        self.frees = 0

    def used_bytes(self):
        return self.used

    def free_bytes(self):
        return 0

    def get_limit(self):
        return 0

    def free_all_blocks(self):
        self.frees += 1


class FakeStream:
    """A CUDA stream: a context that makes it current; work runs at once here."""

    def __init__(self, non_blocking=False):
        self.events = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass

    def wait_event(self, event):
        assert event.recorded, "waiting on an event that was never recorded"


class FakeEvent:
    def __init__(self, disable_timing=False):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def synchronize(self):
        assert self.recorded, "synchronizing an event that was never recorded"


class FakeRuntime(types.SimpleNamespace):
    """memGetInfo reports `free` bytes; hostRegister/hostUnregister are recorded (and refused
    for memory already registered, as CUDA does)."""

    def __init__(self, free=1 << 34, total=1 << 35):
        super().__init__(free=free, total=total, registered=set(), register_calls=0,
                         register_flags=[])

    def memGetInfo(self):
        return self.free, self.total

    def getDeviceCount(self):
        return 1

    def hostRegister(self, ptr, size, flags):
        self.register_calls += 1
        self.register_flags.append(flags)
        if ptr in self.registered:
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
        self.registered.add(ptr)

    def hostUnregister(self, ptr):
        self.registered.remove(ptr)


class FakeCupy(types.ModuleType):
    """`empty` fails above `max_alloc` bytes, like a pool at its limit; allocations are
    booked in the pool (never released: the peak is what the tests read)."""

    def __init__(self, max_alloc=1 << 40):
        super().__init__("cupy")
        self.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
        self.max_alloc = max_alloc
        self.allocations = []
        self.pinned = []
        self.pool = FakePool()
        self.pinned_pool = FakePool()
        self.ndarray, self.int64, self.float64 = np.ndarray, np.int64, np.float64
        self.float32, self.uint64 = np.float32, np.uint64
        self.ascontiguousarray, self.stack = np.ascontiguousarray, np.stack
        self.asarray, self.asnumpy = np.asarray, np.asarray
        self.get_default_memory_pool = lambda: self.pool
        self.get_default_pinned_memory_pool = lambda: self.pinned_pool
        stream = types.SimpleNamespace(synchronize=lambda: None)
        self.runtime = FakeRuntime()
        self.cuda = types.SimpleNamespace(
            memory=types.SimpleNamespace(OutOfMemoryError=FakeOOM),
            memory_hook=types.SimpleNamespace(MemoryHook=FakeHook),
            runtime=self.runtime,
            get_current_stream=lambda: stream,
            Stream=FakeStream, Event=FakeEvent,
            alloc_pinned_memory=self._alloc_pinned)
        self.cublas = types.SimpleNamespace(gemm=_gemm)

    def _alloc_pinned(self, nbytes):
        self.pinned.append(nbytes)
        return bytearray(nbytes)

    def _book(self, shape, dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if nbytes > self.max_alloc:
            raise FakeOOM(f"{nbytes} bytes")
        self.allocations.append(nbytes)
        self.pool.used += nbytes
        for hook in ACTIVE_HOOKS:
            hook.malloc_postprocess(device_id=0, size=nbytes, mem_size=nbytes, mem_ptr=1,
                                    pmem_id=1)

    def empty(self, shape, dtype):
        self._book(shape, dtype)
        return np.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype):
        self._book(shape, dtype)
        return np.zeros(shape, dtype=dtype)

    def ones(self, shape, dtype):
        self._book(shape, dtype)
        return np.ones(shape, dtype=dtype)


def _gemm(transa, transb, a, b, out, alpha):
    assert (transa, transb) == ("N", "T") and out.flags.c_contiguous
    out[...] = alpha * (a @ b.T)


# -- the kernels, in NumPy --------------------------------------------------------------------
def nearest_center(X, ops, k, labels, min_sq):
    """The kernels' arithmetic is numpy's GEMM expansion: here it is numpy's own."""
    d = X.shape[1]
    neg2_ct, c_norm = np.ascontiguousarray(ops[:k, :d].T), ops[:k, d]
    for s in range(0, len(X), 4096):
        dist = X[s:s + 4096] @ neg2_ct
        dist += c_norm
        lab = dist.argmin(1)
        best = dist[np.arange(len(dist)), lab]
        best += np.einsum("ij,ij->i", X[s:s + 4096], X[s:s + 4096])
        labels[s:s + 4096] = lab
        min_sq[s:s + 4096] = np.maximum(best, 0)


def cluster_sums(X, labels, w, sums, weights):
    np.add.at(sums, labels, X.astype(np.float64) * w.astype(np.float64)[:, None])
    weights += np.bincount(labels, weights=w.astype(np.float64), minlength=len(weights))


def labelled_sq_dist(X, C, labels, out):
    diff = X - C[labels]
    out[...] = np.einsum("ij,ij->i", diff, diff)
    return out


def row_argmin_shifted(dist, c_norm, col0, first, run_min, labels):
    v = dist + c_norm
    j = v.argmin(axis=1)
    best = v[np.arange(len(v)), j]
    take = np.ones(len(v), bool) if first else best < run_min
    run_min[take] = best[take]
    labels[take] = col0 + j[take]


def update_label_store(labels, store, changed):
    changed += np.uint64(np.count_nonzero(store != labels.astype(store.dtype)))
    store[...] = labels


def copy_to_device(dst, src, stream):
    dst[...] = src


def copy_to_host(dst, src, stream):
    dst[...] = src


REDUCTIONS = {
    "weighted_sum": lambda v, w, axis=None: np.sum(v.astype(np.float64) * w, axis=axis),
    "center_shift": lambda a, b, axis=None: np.sum(
        (a.astype(np.float64) - b.astype(np.float64)) ** 2, axis=axis),
    "count_changed": lambda a, b, axis=None: np.sum(a != b, axis=axis, dtype=np.int64),
    "shifted_sq": lambda x, s, axis=None: np.sum((x.astype(np.float64) - s) ** 2, axis=axis),
}


class _EmulatedRawKernel:
    """A RawModule function whose launches run the real CUDA source on the CPU."""

    def __init__(self, emu, name):
        self.emu, self.name = emu, name

    def __call__(self, grid, block, args, shared_mem=0):
        self.emu.launch(self.name, int(grid[0]), args, smem=int(shared_mem),
                        block=int(block[0]))


def install(monkeypatch, max_alloc=1 << 40, emulated=False):
    """Put a FakeCupy in sys.modules and the NumPy kernels in place; returns the fake.
    emulated=True: the raw kernels are the real CUDA source run on the CPU
    (tests/_cuda_emulator.py) behind the backends' own launch code; the elementwise and
    reduction kernels stay NumPy."""
    fake = FakeCupy(max_alloc)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    raw = ("nearest_center", "row_argmin_shifted", "update_label_store")
    for name in ("cluster_sums", "labelled_sq_dist") + (() if emulated else raw):
        monkeypatch.setattr(kernels, name, globals()[name])
    if emulated:
        from tests._cuda_emulator import EmulatedKernels
        emu = EmulatedKernels(kernels.all_raw_kernel_names())
        monkeypatch.setattr(kernels, "raw_kernel", lambda name: _EmulatedRawKernel(emu, name))
        monkeypatch.setattr(kernels, "_multiprocessors", lambda: 2)
        # cluster_sums' shared-memory path needs its launcher: keep the real one
        monkeypatch.setattr(kernels, "cluster_sums", _REAL_CLUSTER_SUMS)
    for name in ("copy_to_device", "copy_to_host"):
        monkeypatch.setattr(streaming, name, globals()[name])
    monkeypatch.setattr(kernels, "reduction", REDUCTIONS.__getitem__)
    _cupy_common._peak_hook_class.cache_clear()
    registry.list_backends.cache_clear()
    monkeypatch.setattr(registry, "_gpu_present", lambda: (True, ""))
    return fake


def uninstall():
    _cupy_common._peak_hook_class.cache_clear()
    registry.list_backends.cache_clear()
