"""`cupy-kernels`: the seed's custom-kernel idea done right.

The seed built an (n, k) distance array from a 2-feature ElementwiseKernel (swapping x and y)
and summed clusters through a (k, n) mask. Here one kernel pass over the points finds each
point's nearest center over all d features (several points per thread against tiles of
centers in shared memory; no n x k array) with the numpy backend's own arithmetic
(||c||^2 - 2 x.c, one fused multiply-add per feature, first index on ties: the same partition,
bit for bit), one pass adds w * x and w into float64 (k, d) / (k,) sums privatised per block
in shared memory (no (k, n) mask), and two reductions give the assignment's inertia and the
labels changed; the driver (kmeans_xp.algorithms.lloyd) updates the centers on the device. Nothing is
chunked: the working memory is the outputs. NumPy X too large for the device is streamed from
the host (see `streaming`).
"""
from __future__ import annotations

from kmeans_xp.contract.memory import MemoryEstimate

from . import nearest
from .base import BASE_OPTIONS, STREAM_OPTIONS, CupyBackendBase


class CupyKernelsBackend(CupyBackendBase):
    name = "cupy-kernels"
    options = {**BASE_OPTIONS, **STREAM_OPTIONS}
    supports_streaming = True

    def stream_work_bytes(self, rows, d, k, itemsize, budget):
        return 0  # the kernels need no working memory beyond their outputs

    def fit_kernels(self, n, d, k, dtype, *, seeding=None):
        return super().fit_kernels(n, d, k, dtype, seeding=seeding) + nearest.assignment_kernels(
            k, d, dtype, ("nearest.cu", nearest.nearest_kernel_name(d, dtype)))

    # -- the per-chunk primitive (also what host streaming runs on each chunk) -----------------
    def chunk_centers(self, centers, dtype):
        """The centers' operands on the device (pack_centers, numpy's rounding)."""
        return nearest.center_operands(centers, dtype), centers.shape[0]

    def assign_chunk(self, X, state, labels, min_sq):
        ops, k = state
        nearest.nearest_center(X, ops, k, labels, min_sq)

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto", stream="auto") -> MemoryEstimate:
        """Device bytes of the backend's own part of a fit (the driver's arrays are counted by
        the core, `kmeans_xp.contract.memory.driver_bytes`): X on the device (`data`), the
        assignment's distances, the centers' operands and statistics (k-means++'s steps:
        `seeding_bytes`). stream=True: the parts of a fit streamed from the host
        (see `CupyBackendBase.stream_estimate`); "auto" estimates X on the device."""
        n, d, k = n_samples, n_features, n_clusters
        inst = cls.planner(max_memory)
        if stream is True:
            return inst.stream_estimate(n, d, k, itemsize)
        parts = {
            "data": n * d * itemsize,
            "per_sample_work": n * itemsize,  # the assignment's distances
            "center_operands": k * nearest.ops_stride(d, itemsize) * itemsize + 2 * 8 * 1024,
        }
        return MemoryEstimate(parts, sum(parts.values()), n)
