"""`HostCenters`: cupy-fused's centers kept on the host when its passes are short, and the
pinned buffers they and the iteration's statistics cross the bus through."""
from __future__ import annotations

import numpy as np

from .staging import Pinned


class HostCenters:
    """Pinned buffers for centers kept on the host: the centers in, the statistics out. A
    pageable copy either way costs more than the short pass it serves (W1: 0.2 ms). For the
    small-d layout the operands themselves are packed here, as pack_centers would (-2c, then
    ||c||^2 by np.einsum, whose order that kernel reproduces): one launch less per pass.

    The device idles while the host turns one pass's statistics into the next centers (W1,
    H200: CuPy's set/get and an event per copy cost 30 us a 0.2 ms pass): so raw cudaMemcpyAsync
    on buffers made once, the statistics through one reused device buffer (`read` copies)."""

    def __init__(self, cp, k, d, dtype, S=None):
        self._rt = cp.cuda.runtime
        self.stats_out = Pinned(cp, (k * (d + 1) + 2,), np.float64)
        self.stats_dev = cp.empty(k * (d + 1) + 2, dtype=np.float64)
        # the centers themselves go up only where the operands are not packed here
        self.centers_in = Pinned(cp, (k, d), dtype) if S is None else None
        self.centers_dev = cp.empty((k, d), dtype=dtype) if S is None else None
        self.ops_in = None if S is None else Pinned(cp, (k, S), dtype)
        if self.ops_in is not None:
            self.ops_in.array[...] = 0  # the padding past ||c||^2 stays zero
            self._neg2c, self._norms = self.ops_in.array[:, :d], self.ops_in.array[:, d]
        # recorded after each copy out of a pinned buffer (an unrecorded event is complete)
        self.copied = cp.cuda.Event(disable_timing=True)

    def _send(self, cp, dst, src):
        stream = cp.cuda.get_current_stream()
        self._rt.memcpyAsync(dst.data.ptr, src.mem.ptr, src.nbytes,
                             self._rt.memcpyHostToDevice, stream.ptr)
        self.copied.record(stream)

    def upload(self, cp, centers):
        self.copied.synchronize()  # the last copy has left the buffer
        np.copyto(self.centers_in.array, centers, casting="same_kind")
        self._send(cp, self.centers_dev, self.centers_in)
        return self.centers_dev

    def upload_operands(self, cp, centers, ops_dev):
        """The small-d operands of `centers` into ops_dev (k * S values)."""
        self.copied.synchronize()
        c = np.asarray(centers, dtype=self.ops_in.array.dtype)
        np.multiply(c, -2, out=self._neg2c)
        np.einsum("ij,ij->i", c, c, out=self._norms)
        self._send(cp, ops_dev, self.ops_in)

    def read(self, cp, out):
        """out (the statistics, `stats_dev`) on the host; waits for the device."""
        stream = cp.cuda.get_current_stream()
        self._rt.memcpyAsync(self.stats_out.mem.ptr, out.data.ptr, out.nbytes,
                             self._rt.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        return self.stats_out.array.copy()  # the caller keeps it past the next pass
