"""Shared memory of the numpy backend's worker processes (`numpy_pool`): memfd segments (no
/dev/shm size limit applies to them), mapped here and, through their descriptors, in each
worker. X lies in one (the fit's centered copy, made there by `shared_empty`); a run's
labels, accumulator slots, centers and weights in another (`RunBuffers`)."""
from __future__ import annotations

import mmap
import os
import weakref

import numpy as np

_SEGMENTS = {}   # id(mmap) -> (weakref to the mmap, fd, address)


def segment(nbytes, name):
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        mm = mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        os.close(fd)
        raise
    return fd, mm


def shared_empty(shape, dtype):
    """np.empty(shape, dtype) in shared memory the workers can map (`segment_of`); the memory
    and its descriptor go with the last array on it."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    fd, mm = segment(count * dtype.itemsize, "kmeans_xp-X")
    out = np.frombuffer(mm, dtype=dtype, count=count).reshape(shape)
    key = id(mm)
    _SEGMENTS[key] = (weakref.ref(mm), fd, out.ctypes.data)
    weakref.finalize(mm, _forget, key, fd)
    return out


def _forget(key, fd):
    _SEGMENTS.pop(key, None)
    os.close(fd)


def segment_of(X):
    """(fd, byte offset) of a C-contiguous X in memory from `shared_empty`, else None."""
    base = X
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    entry = _SEGMENTS.get(id(base))
    if entry is None or entry[0]() is not base or not X.flags.c_contiguous:
        return None
    return entry[1], X.ctypes.data - entry[2]


def view(buffer, spec):
    """The array that spec = (byte offset, dtype, shape) describes in `buffer` (a run's
    segment or X's, mapped here or in a worker)."""
    offset, dtype, shape = spec
    return np.frombuffer(buffer, dtype=dtype, count=int(np.prod(shape)),
                         offset=offset).reshape(shape)


class RunBuffers:
    """A run's segment: labels (compact), one accumulator slot per worker, the centers and
    the weights (copied in once). `meta`: each array's spec (`view`), for the workers."""

    def __init__(self, n, labels_dtype, count, slot_len, centers_shape, dtype, w):
        parts = [("labels", labels_dtype, (n,)), ("slots", np.float64, (count, slot_len)),
                 ("centers", dtype, tuple(centers_shape))]
        parts += [] if w is None else [("w", w.dtype, (n,))]
        self.meta, at = {"w": None}, 0
        for name, dt, shape in parts:
            dt = np.dtype(dt)
            self.meta[name] = (at, dt.str, shape)
            at += -(-int(np.prod(shape)) * dt.itemsize // 64) * 64
        self.fd, self._map = segment(at, "kmeans_xp-run")
        self.labels, self.slots, self.centers, self.w = (
            None if self.meta[name] is None else view(self._map, self.meta[name])
            for name in ("labels", "slots", "centers", "w"))
        if w is not None:
            self.w[:] = w

    def close(self):
        self.labels = self.slots = self.centers = self.w = None
        os.close(self.fd)   # (the map goes with its last view)
