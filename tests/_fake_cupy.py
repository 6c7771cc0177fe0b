"""A NumPy stand-in for the parts of CuPy the CuPy backends touch, so that their Python paths
(placement, budgets and stages, planning, chunk and tile loops, OOM halving, streaming,
finish) and their real CUDA kernels, run on the CPU by tests/_cuda_emulator.py, are tested
where no GPU is. "Device" arrays are NumPy arrays here; cuBLAS's GEMM is NumPy's.

What this cannot show: speed, occupancy, real streams (work runs at once) and CuPy's own
argument packing (the emulator checks every launch's argument types instead).
"""
import importlib.machinery
import sys
import types

import numpy as np
from kmeans_xp_backends.cupy import budget, common, fused_plan, staging

from kmeans_xp.contract import registry


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
        pass

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
    """`empty` & co. fail above `max_alloc` bytes, like a pool at its limit; allocations are
    booked in the pool (never released: the peak is what the tests read)."""

    def __init__(self, max_alloc=1 << 40):
        super().__init__("cupy")
        self.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
        self.max_alloc = max_alloc
        self.allocations = []
        self.pinned = []
        self.pool = FakePool()
        self.pinned_pool = FakePool()
        for name in ("int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                     "float32", "float64", "ndarray", "ascontiguousarray", "stack", "asarray",
                     "concatenate", "where", "inf", "cumsum", "add", "greater_equal",
                     # (the batched iteration's, backends/cupy/batched.py)
                     "sum", "matmul", "argmin", "take_along_axis", "maximum", "arange",
                     # (half data, placement._centered_as; precision.storage_dtype's probe)
                     "subtract", "multiply", "isnan", "any"):
            setattr(self, name, getattr(np, name))
        self.asnumpy = np.asarray
        self.get_default_memory_pool = lambda: self.pool
        self.get_default_pinned_memory_pool = lambda: self.pinned_pool
        stream = FakeStream()
        self.runtime = FakeRuntime()
        self.cuda = types.SimpleNamespace(
            memory=types.SimpleNamespace(OutOfMemoryError=FakeOOM),
            memory_hook=types.SimpleNamespace(MemoryHook=FakeHook),
            runtime=self.runtime,
            get_current_stream=lambda: stream,
            Stream=FakeStream, Event=FakeEvent,
            # (compute capability 8.0: the emulator has mma.sync and cp.async, not the
            # sm_90a wgmma, so the fused backend takes its mma.sync kernels here)
            Device=lambda *a: types.SimpleNamespace(id=0, compute_capability="80"),
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

    def empty(self, shape, dtype=np.float64):
        self._book(shape, dtype)
        return np.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype=np.float64):
        self._book(shape, dtype)
        return np.zeros(shape, dtype=dtype)

    def ones(self, shape, dtype=np.float64):
        self._book(shape, dtype)
        return np.ones(shape, dtype=dtype)

    def full(self, shape, value, dtype=np.float64):
        self._book(shape, dtype)
        return np.full(shape, value, dtype=dtype)

    @staticmethod
    def argsort(a, axis=-1):
        return np.argsort(a, axis=axis, kind="stable")  # CuPy's sort is stable


def _gemm(transa, transb, a, b, out, alpha):
    assert (transa, transb) == ("N", "T") and out.flags.c_contiguous
    np.matmul(a, b.T, out=out)  # into the block, as cuBLAS writes (no temporaries)
    out *= alpha


def copy_to_device(dst, src, stream):
    dst[...] = src


def copy_to_host(dst, src, stream):
    dst[...] = src


copy_to_host_blocking = copy_to_host


class _EmulatedRawKernel:
    """A RawModule function whose launches run the real CUDA source on the CPU."""

    num_regs = 64

    def __init__(self, emu, file, name):
        self.emu, self.file, self.name = emu, file, name
        LOOKED_UP.append((file, name))

    def __call__(self, grid, block, args, shared_mem=0):
        self.emu.launch(self.file, self.name, tuple(int(g) for g in grid), args,
                        smem=int(shared_mem), block=int(block[0]))


_EMULATOR = None
#: (file, instance) of every kernel looked up (`common.raw_kernel`: compiled on a GPU), in order
LOOKED_UP = []


def emulator():
    global _EMULATOR
    if _EMULATOR is None:
        from tests._cuda_emulator import EmulatedKernels
        _EMULATOR = EmulatedKernels()
    return _EMULATOR


def install(monkeypatch, max_alloc=1 << 40):
    """Put a FakeCupy in sys.modules with the real kernels emulated on the CPU behind the
    backends' own launch code; returns the fake."""
    fake = FakeCupy(max_alloc)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    emu = emulator()
    monkeypatch.setattr(common, "raw_kernel",
                        lambda file, name: _EmulatedRawKernel(emu, file, name))
    monkeypatch.setattr(common, "multiprocessors", lambda: 2)
    fake.prefetched = []  # what warm_up asked to compile ahead (nothing compiles here)
    monkeypatch.setattr(common, "prefetch", fake.prefetched.extend)
    monkeypatch.setattr(fused_plan, "device_facts",
                        lambda device_id: fused_plan.DeviceFacts(2, 227 * 1024, 228 * 1024, 80))
    for name in ("copy_to_device", "copy_to_host", "copy_to_host_blocking"):
        monkeypatch.setattr(staging, name, globals()[name])
    budget.peak_hook_class.cache_clear()
    registry.list_backends.cache_clear()
    monkeypatch.setattr(registry, "_gpu_present", lambda: (True, ""))
    return fake


def uninstall():
    budget.peak_hook_class.cache_clear()
    registry.list_backends.cache_clear()
