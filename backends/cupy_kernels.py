"""`cupy-kernels`: the seed's custom-kernel idea done right.

The seed built an (n, k) distance array from a 2-feature ElementwiseKernel (swapping x and y)
and summed clusters through a (k, n) mask. Here one ElementwiseKernel pass over the points
finds each point's nearest center over all d features (a loop over the centers, no n x k
array), one pass adds w * x and w into float64 (k, d) / (k,) outputs with atomicAdd (no
(k, n) mask), and reduction kernels give inertia, center shift and changed labels, so the
whole Lloyd loop stays on the device. Nothing is chunked: the working memory is the outputs.
"""
from __future__ import annotations

from kmeans_xp.backend import AssignResult, ReduceResult
from kmeans_xp.memory import MemoryEstimate

from . import _cupy_kmeans_kernels as kernels
from ._cupy_common import CupyBackendBase, fit_state_bytes, kmeanspp_bytes


class CupyKernelsBackend(CupyBackendBase):
    name = "cupy-kernels"

    def assign(self, X, centers, *, xp=None) -> AssignResult:
        X = self.contiguous(X)
        C = self.contiguous(centers, X.dtype)
        n = X.shape[0]
        with self.stage("assign"):
            labels = self.device_empty((n,), self._cp.int64, "labels")
            min_sq = self.device_empty((n,), X.dtype, "squared distances")
            kernels.nearest_center(X, C, labels, min_sq)
        return AssignResult(labels, min_sq)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None) -> ReduceResult:
        cp = self._cp
        X = self.contiguous(X)
        with self.stage("update"):
            sums = cp.zeros((n_clusters, X.shape[1]), dtype=cp.float64)
            weights = cp.zeros((n_clusters,), dtype=cp.float64)
            kernels.cluster_sums(X, self.contiguous(labels, cp.int64),
                                 self.contiguous(sample_weight, X.dtype), sums, weights)
        return ReduceResult(sums, weights)

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto") -> MemoryEstimate:
        """Device bytes of a fit, part by part (see `fit_state_bytes`): the kernels need no
        working memory beyond their outputs; k-means++ init works in chunks of driver rows."""
        n, d, k = n_samples, n_features, n_clusters
        rows = cls(max_memory=max_memory).driver_rows(
            n, d, "float32" if itemsize == 4 else "float64")
        parts = fit_state_bytes(n, d, k, itemsize)
        init_per_sample, init_chunk = kmeanspp_bytes(n, d, k, itemsize, rows)
        lloyd_per_sample = parts.pop("labels_and_distances")
        parts["per_sample_work"] = max(lloyd_per_sample, init_per_sample)
        parts["chunk_buffers"] = init_chunk
        return MemoryEstimate(parts, sum(parts.values()), n)
