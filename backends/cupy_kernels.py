"""`cupy-kernels`: the seed's custom-kernel idea done right.

The seed built an (n, k) distance array from a 2-feature ElementwiseKernel (swapping x and y)
and summed clusters through a (k, n) mask. Here one kernel pass over the points finds each
point's nearest center over all d features (several points per thread against tiles of
centers in shared memory; no n x k array) with the numpy backend's own arithmetic
(||c||^2 - 2 x.c, one fused multiply-add per feature, first index on ties: the same partition,
bit for bit for d <= 3), one pass adds w * x and w into float64 (k, d) / (k,) sums privatised
per block in shared memory (no (k, n) mask), and reduction kernels give inertia, center shift
and changed labels, so the whole Lloyd loop stays on the device. Nothing is chunked: the
working memory is the outputs. NumPy X too large for the device is streamed from the host
(see `_cupy_streaming`).
"""
from __future__ import annotations

from kmeans_xp.backend import AssignResult
from kmeans_xp.memory import MemoryEstimate

from . import _cupy_kmeans_kernels as kernels
from ._cupy_common import CupyBackendBase, fit_state_bytes, kmeanspp_bytes


class CupyKernelsBackend(CupyBackendBase):
    name = "cupy-kernels"
    supports_streaming = True

    def stream_work_bytes(self, rows, d, k, itemsize, budget):
        return 0  # the kernels need no working memory beyond their outputs

    def assign(self, X, centers, *, xp=None) -> AssignResult:
        if self.is_streamed(X):
            return self.stream_assign(X, centers)
        X = self.contiguous(X)
        n = X.shape[0]
        with self.stage("assign"):
            labels = self.device_empty((n,), self._cp.int64, "labels")
            min_sq = self.device_empty((n,), X.dtype, "squared distances")
            self.assign_chunk(X, self.chunk_centers(centers, X.dtype), labels, min_sq)
        return AssignResult(labels, min_sq)

    # -- the per-chunk primitive (also what host streaming runs on each chunk) -----------------
    def chunk_centers(self, centers, dtype):
        """The centers' operands on the device, built by numpy on the host (see kernels)."""
        return self._cp.asarray(kernels.center_operands(centers, dtype)), centers.shape[0]

    def assign_chunk(self, X, state, labels, min_sq):
        ops, k = state
        kernels.nearest_center(X, ops, k, labels, min_sq)

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto", stream="auto") -> MemoryEstimate:
        """Device bytes of a fit, part by part (see `fit_state_bytes`): the kernels need no
        working memory beyond their outputs; k-means++ init works in chunks of driver rows.
        stream=True: the parts of a fit streamed from the host (see
        `CupyBackendBase.stream_estimate`); "auto" estimates X on the device."""
        n, d, k = n_samples, n_features, n_clusters
        inst = cls(max_memory=max_memory)
        if stream is True:
            return inst.stream_estimate(n, d, k, itemsize)
        rows = inst.driver_rows(n, d, "float32" if itemsize == 4 else "float64")
        parts = fit_state_bytes(n, d, k, itemsize)
        init_per_sample, init_chunk = kmeanspp_bytes(n, d, k, itemsize, rows)
        lloyd_per_sample = parts.pop("labels_and_distances")
        parts["per_sample_work"] = max(lloyd_per_sample, init_per_sample)
        parts["chunk_buffers"] = init_chunk
        return MemoryEstimate(parts, sum(parts.values()), n)
