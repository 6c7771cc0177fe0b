"""k-means++ on the device: `kmeans_xp.algorithms.init.Seeding`'s three steps as the kernels of
cuda/seeding.cu. Per center three launches, and nothing is read back until all k centers are
chosen: the xp steps cost about 20 CuPy calls per center (0.6 s for k=500 at n=500k on the
H200, most of it host time per call); with a CuPy cumsum per center for the draws in place
of the segments' totals, 0.06 s.
"""
from __future__ import annotations

import math

import numpy as np

from . import common
from .common import BLOCK, NULL, cupy, dtype_name

#: candidates per center the kernels take at most (SEED_MAX_TRIALS in cuda/seeding.cu)
MAX_TRIALS = 16
#: the candidates' rows live in a block's shared memory: at most this many bytes of them
MAX_CANDIDATE_BYTES = 48 * 1024
#: the potentials' partials and the segments' totals, at most
SCRATCH_BYTES = 4 << 20
#: rows per segment of the draws' two-level search: about sqrt(n), so that the search over the
#: segments' totals and the one inside a segment read about as many values, in whole tiles
SEGMENT_QUANTUM = 2048
#: chosen indices are written into blocks of this many slots
_SLOTS = 256


def _fits(n_local_trials, d, itemsize) -> bool:
    return (1 <= n_local_trials <= MAX_TRIALS
            and n_local_trials * d * itemsize <= MAX_CANDIDATE_BYTES)


def device_seeding_bytes(n, d, k, itemsize):
    """Device bytes of k-means++ by `DeviceSeeding` (None where it leaves it to the xp
    steps): per sample the running distances and their float64 weighted values, and with
    weights their float64 copy, its scan and a temporary; every random number and draw by
    weight (16 bytes each); the reduction's partials and the scan's scratch."""
    from kmeans_xp.contract.seeding import local_trials
    trials = local_trials(k)
    if not _fits(trials, d, itemsize):
        return None
    draws = 1 + (k - 1) * trials
    return n * (itemsize + 4 * 8) + 16 * draws + SCRATCH_BYTES


def device_seeding(X, sample_weight, n_local_trials):
    """A `DeviceSeeding` for a C-contiguous CuPy X or a `staging.DeviceRows` (centered on the
    fly), else None (the xp steps): host-streamed X, or candidates too many or too wide for
    the kernels."""
    from .staging import DeviceRows, HostRows
    cp = cupy()
    if isinstance(X, DeviceRows):
        data, mean = X.data, X.mean
    elif isinstance(X, HostRows) or not isinstance(X, cp.ndarray):
        return None
    else:
        data, mean = X, None
    n, d = data.shape
    if (n == 0 or not _fits(n_local_trials, d, common.compute_dtype(data.dtype).itemsize)
            or dtype_name(data.dtype) not in common.X_TYPES or not data.flags.c_contiguous):
        return None
    return DeviceSeeding(data, mean, sample_weight)


class DeviceSeeding:
    """The running distances D(x)^2, their weighted values for the scan, and the scratch of
    the potentials' reduction, allocated once per k-means++ run."""

    def __init__(self, data, mean, sample_weight):
        cp = cupy()
        n, d = data.shape
        self.data, self.n, self.d = data, n, d
        # what the kernels compute in (half data: float32; they read it in its format)
        self.T = common.compute_dtype(data.dtype)
        self.mean = NULL if mean is None else cp.ascontiguousarray(mean, dtype=self.T)
        self.w = (NULL if sample_weight is None else
                  cp.ascontiguousarray(sample_weight, dtype=cp.float64))
        self.closest = cp.empty(n, dtype=self.T)
        self.values = cp.empty(n, dtype=cp.float64)
        self.cand = cp.empty(MAX_TRIALS, dtype=cp.int64)
        self.best = cp.empty(1, dtype=cp.int32)
        self.grid = common.grid(n, BLOCK, 4)
        self.partials = cp.empty(self.grid * MAX_TRIALS, dtype=cp.float64)
        self.seg = segment_rows(n)
        self.segments = -(-n // self.seg)
        self.seg_total = cp.empty(self.segments, dtype=cp.float64)
        self.done = cp.zeros(1, dtype=cp.uint32)
        self._slots, self._used = None, _SLOTS
        t = common.xtypes(data.dtype)
        self._potentials = common.raw_kernel("seeding.cu", f"seeding_potentials<{t}>")
        self._update = common.raw_kernel("seeding.cu", f"seeding_update<{t}>")
        self._draw = common.raw_kernel("seeding.cu", "seeding_draw")

    def _run_update(self, chosen, first):
        common.launch(self._update, self.segments,
                      (self.data, self.mean, self.w, np.int64(self.n), np.int32(self.d),
                       np.int64(self.seg), chosen, np.int32(first), self.closest, self.values,
                       self.seg_total),
                      shared_mem=self.d * self.T.itemsize)
        return self.closest

    def first(self, index):
        return self._run_update(index, 1)

    def candidates(self, closest, u, by_weight):
        trials = int(u.shape[0])
        common.launch(self._draw, trials,
                      (self.values, np.int64(self.n), np.int64(self.seg), self.seg_total,
                       np.int64(self.segments), u, by_weight, self.cand))
        return self.cand[:trials]

    def trial(self, closest, cand):
        trials = int(cand.shape[0])
        chosen = self._slot()
        common.launch(self._potentials, self.grid,
                      (self.data, self.mean, self.closest, self.w, np.int64(self.n),
                       np.int32(self.d), cand, np.int32(trials), self.partials, self.done,
                       chosen, self.best),
                      shared_mem=trials * self.d * self.T.itemsize)
        return chosen, self._run_update(chosen, 0)

    def _slot(self):
        """A fresh (1,) int64 device array for the next chosen index (taken from blocks)."""
        if self._used == _SLOTS:
            self._slots, self._used = cupy().empty(_SLOTS, dtype=cupy().int64), 0
        self._used += 1
        return self._slots[self._used - 1:self._used]


def segment_rows(n) -> int:
    """Rows per segment: sqrt(n) rounded up to whole tiles."""
    q = SEGMENT_QUANTUM
    return max(q, -(-math.isqrt(max(n, 1)) // q) * q)


def kernel_instances():
    """(file, instance) of every kernel of seeding.cu (the compile check)."""
    out = [("seeding.cu", "seeding_draw")]
    for t in common.X_TYPES.values():
        out += [("seeding.cu", f"seeding_potentials<{t}>"), ("seeding.cu", f"seeding_update<{t}>")]
    return out
