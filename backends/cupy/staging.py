"""The sources of streaming (`streaming`): `HostRows` (`kmeans_xp.contract.rows`, shared with the
numpy backend) and `DeviceRows`, X on the host or on the device seen mean-centered without a
centered copy; which inputs are memmaps and may be page-locked; pinned host buffers and the
asynchronous copies between them and the device.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from kmeans_xp.contract.memory import host_available_memory
from kmeans_xp.contract.rows import HostRows, is_memmap
from kmeans_xp.contract.threads import ThreadPool

from .common import cupy

#: host threads copying X into the pinned buffers (and back out): the copy rate grows up to
#: about this many (figure: benchmarks/profile_fit.py, kept in benchmarks/results/<kind>.md)
STAGING_THREADS = max(1, min(16, os.cpu_count() or 2))
#: a memmap is page-locked in place (read into RAM once, then copied at the full DMA rate)
#: when it takes at most this share of the host's available memory; a larger one is staged
MEMMAP_LOCK_SHARE = 0.5
#: rows per staging thread below which fewer threads are used
STAGING_MIN_ROWS = 1 << 16


class DeviceRows(HostRows):
    """A CuPy X seen mean-centered (X - mean) without a centered copy: the fit of a device X
    whose copy would not fit beside it (or with stream=True). It is streamed like HostRows,
    from device memory: each chunk is copied into a slot's buffer and centered there. Row
    selections give centered CuPy arrays, bit for bit `X[rows] - mean`. X is never written."""

    def __init__(self, data, mean):
        super().__init__(data, mean)
        self.device = data.device

    @staticmethod
    def _asarray(mean, dtype):
        return cupy().asarray(mean, dtype=dtype)

    def _gather(self, indices, mode):
        return self.data.take(indices, axis=0)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("DeviceRows lives on the device: select its rows (X[rows]) instead")


#: the host's available memory (MemAvailable), or None where it cannot be read
available_host_bytes = functools.partial(host_available_memory, default=None)


def lockable(X) -> bool:
    """Whether pin_input="auto" page-locks X: an in-memory array always (its pages are
    resident already; locking only keeps them so), a memmap when it fits comfortably in the
    available memory (locking reads it in and keeps it resident for the fit)."""
    if not is_memmap(X):
        return True
    avail = available_host_bytes()
    return avail is not None and X.nbytes <= MEMMAP_LOCK_SHARE * avail


def copy_to_device(dst, src, stream):
    """Asynchronous copy into device `dst` on `stream`: from the host (src pinned or
    registered) or, for a device X (`DeviceRows`), from device memory (src C-contiguous)."""
    if isinstance(src, np.ndarray):
        dst.set(src, stream=stream)
    else:
        dst.data.copy_from_device_async(src.data, src.nbytes, stream)


def copy_to_host(dst, src, stream):
    """Asynchronous device -> host copy on `stream` into pinned `dst`."""
    src.get(stream=stream, out=dst, blocking=False)


def copy_to_host_blocking(dst, src, stream):
    """Device -> host copy on `stream` into any host `dst`, waiting for it."""
    src.get(stream=stream, out=dst)


class Pinned:
    """A pinned host buffer viewed as a NumPy array (the allocation kept alive with it)."""

    def __init__(self, cp, shape, dtype):
        count = int(np.prod(shape))
        self.mem = cp.cuda.alloc_pinned_memory(max(count * np.dtype(dtype).itemsize, 1))
        self.array = np.frombuffer(self.mem, dtype=dtype, count=count).reshape(shape)
        self.nbytes = count * np.dtype(dtype).itemsize


def all_ones(w, rows=1 << 24):
    """Whether every weight is 1, without an n-sized temporary."""
    for s in range(0, w.shape[0], rows):
        if not np.all(w[s:s + rows] == 1):
            return False
    return True


def parallel_copy(dst, src, pool):
    """dst[...] = src with several threads of `pool` for large chunks (copies release the
    GIL); pool() gives the executor."""
    m = dst.shape[0]
    parts = min(STAGING_THREADS, max(1, m // STAGING_MIN_ROWS))
    if parts == 1:
        np.copyto(dst, src, casting="unsafe")
        return
    bounds = [m * i // parts for i in range(parts + 1)]
    list(pool().map(lambda i: np.copyto(dst[bounds[i]:bounds[i + 1]],
                                        src[bounds[i]:bounds[i + 1]], casting="unsafe"),
                    range(parts)))


#: host X of at least this size goes to the device through pinned buffers (`upload`):
#: W1's 24 MB X took 2.0 ms staged in one piece against 2.8 ms pageable on the H100 host
#: (in two pieces 2.4, four 2.9: below a full chunk, pipelining costs more than it hides)
UPLOAD_STAGED_BYTES = 4 << 20
#: the same for results coming back (`download`): W1's 8 MB of labels took 1.9 ms staged
#: against 0.7 ms in one pageable copy there, so only large ones
DOWNLOAD_STAGED_BYTES = 64 << 20
#: bytes per pinned staging buffer of `upload` and `download`, and how many buffers: the
#: upload rate stops growing at this size, and a third buffer adds nothing (figure:
#: benchmarks/profile_fit.py, kept in benchmarks/results/<kind>.md)
UPLOAD_CHUNK_BYTES = 64 << 20
UPLOAD_BUFFERS = 2


@functools.lru_cache(maxsize=1)
def copy_pool():
    """The host threads that fill and empty pinned buffers (`parallel_copy`): one pool for
    the process, shared by uploads, downloads and host streaming."""
    return ThreadPool(STAGING_THREADS, "kmeans_xp-stage")


def _pinned_buffers(cp, a, staged_from):
    """(rows per chunk, up to UPLOAD_BUFFERS pinned buffers of that many rows: one per
    chunk, no more) to stage `a` through, or None where `a` is small (one pageable copy
    costs less) or no page-locked memory is to be had."""
    if a.nbytes < staged_from:
        return None
    n = a.shape[0]
    rows = max(1, UPLOAD_CHUNK_BYTES // max(1, a.nbytes // n))
    try:
        return rows, [Pinned(cp, (min(rows, n),) + a.shape[1:], a.dtype)
                      for _ in range(min(UPLOAD_BUFFERS, -(-n // rows)))]
    except cp.cuda.runtime.CUDARuntimeError:
        return None


def upload(cp, X):
    """Host X (C-contiguous) as a new device array. A pageable copy runs at a fraction of
    the bus (9 GB/s on the H200 host, 55 GB/s pinned): large X goes through two pinned
    buffers instead, host threads filling one while the copy engine empties the other."""
    staged = _pinned_buffers(cp, X, UPLOAD_STAGED_BYTES)
    if staged is None:
        return cp.asarray(X)
    (rows, bufs), n = staged, X.shape[0]
    out = cp.empty(X.shape, dtype=X.dtype)
    done = [None] * len(bufs)
    stream = cp.cuda.Stream(non_blocking=True)
    for i, start in enumerate(range(0, n, rows)):
        b, m = i % len(bufs), min(rows, n - start)
        if done[b] is not None:
            done[b].synchronize()  # the copy engine has emptied this buffer
        parallel_copy(bufs[b].array[:m], X[start:start + m], copy_pool)
        out[start:start + m].set(bufs[b].array[:m], stream=stream)
        done[b] = stream.record()
    stream.synchronize()
    return out


def download(cp, arr, dtype=None):
    """A device array as a new host array of `dtype` (default: arr's), through two pinned
    buffers as `upload` (a fit's labels from a NumPy X: 80 MB at W3); the copy threads that
    empty the buffers also convert, and touch the new pages in parallel."""
    dtype = arr.dtype if dtype is None else np.dtype(dtype)
    staged = (_pinned_buffers(cp, arr, DOWNLOAD_STAGED_BYTES) if arr.flags.c_contiguous
              else None)
    if staged is None:
        return cp.asnumpy(arr).astype(dtype, copy=False)
    (rows, bufs), n = staged, arr.shape[0]
    nb = len(bufs)
    out = np.empty(arr.shape, dtype=dtype)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(cp.cuda.get_current_stream().record())  # arr's producers first
    chunks = [(s, min(rows, n - s)) for s in range(0, n, rows)]
    ready = []

    def empty(i):  # chunk i's buffer into out, once its copy is done
        ready[i].synchronize()
        s0, m0 = chunks[i]
        parallel_copy(out[s0:s0 + m0], bufs[i % nb].array[:m0], copy_pool)

    for i, (start, m) in enumerate(chunks):
        if i >= nb:  # empty the buffer this chunk reuses
            empty(i - nb)
        arr[start:start + m].get(stream=stream, out=bufs[i % nb].array[:m], blocking=False)
        ready.append(stream.record())
    for i in range(max(0, len(chunks) - nb), len(chunks)):
        empty(i)
    return out
