"""The CPU reference backend: BLAS GEMM per row chunk, argmin, bincount sums.

Rows are processed in chunks sized from `max_memory` (and kept cache-sized), on a thread pool:
NumPy releases the GIL in matmul and argmin, so chunks run on all cores while the BLAS call in
each chunk runs single-threaded within it.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kmeans_xp.backend import AssignResult, IterResult, KMeansBackend, ReduceResult
from kmeans_xp.memory import MemoryEstimate, chunk_rows, resolve_budget, host_available_memory

#: distance block per chunk kept near L2 size: bigger blocks stop paying and cost memory
TARGET_BLOCK_BYTES = 1 << 20
MIN_ROWS = 64


def _n_threads(requested):
    if requested is not None:
        return max(1, int(requested))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


class NumpyBackend(KMeansBackend):
    name = "numpy"
    namespaces = frozenset({"numpy"})
    device = "cpu"

    def __init__(self, max_memory="auto", n_threads=None):
        super().__init__(max_memory)
        self.n_threads = _n_threads(n_threads)
        self._pool = None

    def converts_from(self, namespace):
        return namespace == "list"

    # -- memory -----------------------------------------------------------------------------
    @staticmethod
    def _row_bytes(k, d, itemsize):
        # distance block row, its argmin/min row, labels, weights*x for the sums
        return k * itemsize + 3 * 8 + d * 8

    @classmethod
    def _fixed_bytes(cls, k, d, threads):
        # per-thread partial sums (float64) and the -2 C^T / ||c||^2 operands
        return threads * (k * d * 8 + k * 8) + 2 * k * (d + 1) * 8

    @classmethod
    def _plan(cls, n, d, k, itemsize, max_memory, threads):
        budget = resolve_budget(max_memory, host_available_memory(), cap=1 << 30)
        fixed = cls._fixed_bytes(k, d, threads)
        per_thread_budget = (budget - fixed) // threads
        rows = chunk_rows(per_thread_budget, cls._row_bytes(k, d, itemsize), 0, n_samples=n,
                          floor=1, what=f"the numpy backend (k={k}, d={d})")
        cache_rows = max(MIN_ROWS, TARGET_BLOCK_BYTES // max(k * itemsize, 1))
        # at least one chunk per thread so all cores work
        rows = min(rows, cache_rows, max(MIN_ROWS, -(-n // threads)))
        return rows, budget, fixed

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize, max_memory="auto",
                        n_threads=None):
        threads = _n_threads(n_threads)
        rows, _, fixed = cls._plan(n_samples, n_features, n_clusters, itemsize, max_memory,
                                   threads)
        per_chunk = rows * cls._row_bytes(n_clusters, n_features, itemsize)
        parts = {"chunk_buffers": threads * per_chunk, "partial_sums": fixed,
                 "outputs": n_samples * (8 + itemsize)}
        return MemoryEstimate(parts, sum(parts.values()), rows)

    # -- work -------------------------------------------------------------------------------
    def _chunks(self, X, k):
        n, d = X.shape
        rows, _, _ = self._plan(n, d, k, X.dtype.itemsize, self.max_memory, self.n_threads)
        return [slice(s, min(s + rows, n)) for s in range(0, n, rows)]

    def _map(self, fn, items):
        if self.n_threads == 1 or len(items) == 1:
            return [fn(it) for it in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.n_threads)
        return list(self._pool.map(fn, items))

    @staticmethod
    def _assign_chunk(Xc, neg2_ct, c_norm):
        dist = Xc @ neg2_ct
        dist += c_norm
        labels = np.argmin(dist, axis=1)
        best = np.take_along_axis(dist, labels[:, None], axis=1)[:, 0]
        best += np.einsum("ij,ij->i", Xc, Xc)
        np.maximum(best, 0, out=best)
        return labels, best

    def _operands(self, centers, dtype):
        c = np.asarray(centers, dtype=dtype)
        return np.ascontiguousarray((-2 * c).T), np.einsum("ij,ij->i", c, c)

    def assign(self, X, centers, *, xp=None):
        neg2_ct, c_norm = self._operands(centers, X.dtype)
        labels = np.empty(X.shape[0], dtype=np.int64)
        min_sq = np.empty(X.shape[0], dtype=X.dtype)

        def work(sl):
            labels[sl], min_sq[sl] = self._assign_chunk(X[sl], neg2_ct, c_norm)

        self._map(work, self._chunks(X, centers.shape[0]))
        return AssignResult(labels, min_sq)

    @staticmethod
    def _reduce_chunk(Xc, lab, w, k):
        weights = np.bincount(lab, weights=w, minlength=k)
        sums = np.empty((k, Xc.shape[1]), dtype=np.float64)
        for j in range(Xc.shape[1]):
            sums[:, j] = np.bincount(lab, weights=Xc[:, j] * w, minlength=k)
        return sums, weights

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        parts = self._map(
            lambda sl: self._reduce_chunk(X[sl], labels[sl], sample_weight[sl], n_clusters),
            self._chunks(X, n_clusters))
        return ReduceResult(sum(p[0] for p in parts), sum(p[1] for p in parts))

    def lloyd_iter(self, X, sample_weight, centers, *, xp=None, update_centers=True):
        if not update_centers:
            return IterResult(*self.assign(X, centers), None, None)
        k = centers.shape[0]
        neg2_ct, c_norm = self._operands(centers, X.dtype)
        labels = np.empty(X.shape[0], dtype=np.int64)
        min_sq = np.empty(X.shape[0], dtype=X.dtype)

        def work(sl):
            labels[sl], min_sq[sl] = self._assign_chunk(X[sl], neg2_ct, c_norm)
            return self._reduce_chunk(X[sl], labels[sl], sample_weight[sl], k)

        parts = self._map(work, self._chunks(X, k))
        sums = np.add.reduce([p[0] for p in parts])
        weights = np.add.reduce([p[1] for p in parts])
        return IterResult(labels, min_sq, sums, weights)

    def __del__(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False)
