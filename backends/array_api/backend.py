"""A backend using only the array API standard, so it runs on any compliant namespace
(array-api-strict, torch on CPU or CUDA, CuPy, NumPy). Results stay in the caller's namespace
and on its device.

The standard has no scatter-add, so per-cluster sums are a one-hot product per row chunk:
(k, rows) @ (rows, d), which costs the same order as the distance GEMM.
"""
from __future__ import annotations

from kmeans_xp.contract.backend import AssignResult, KMeansBackend, ReduceResult
from kmeans_xp.contract.memory import MemoryEstimate, chunk_rows, host_available_memory, resolve_budget
from kmeans_xp.contract.namespaces import array_namespace, device, namespace_name

_CAP = 1 << 28  # chunks past a few hundred MB buy nothing on any device


class ArrayAPIBackend(KMeansBackend):
    name = "array-api"
    namespaces = frozenset({"numpy", "cupy", "torch", "array_api_strict", "jax", "ndonnx"})
    device = "any"

    def reject_reason(self, X, *, n_clusters, sample_weight=None):
        ns = namespace_name(X)
        if ns in ("list", "dask.array"):
            return (f"it computes on array API namespaces (numpy, torch, cupy, "
                    f"array-api-strict), not {ns}")
        try:
            array_namespace(X)
        except TypeError as exc:
            return f"{ns} arrays have no array API namespace ({exc})"
        if ns == "jax" and not _jax_x64():
            # the driver's statistics are float64; JAX would make them float32 without a word
            return ("JAX without x64 would compute the driver's float64 statistics in float32; "
                    "enable it (jax.config.update('jax_enable_x64', True)) or give the array "
                    "to backend='auto' or 'numpy' (float64 sums, results as JAX arrays)")
        return None

    @staticmethod
    def _row_bytes(k, d, itemsize):
        # assign: the GEMM, its scaled copy and the distances (3 k values); reduce: the
        # boolean and float64 one-hot rows (9 k bytes) and x * w in float64
        return 3 * k * itemsize + 9 * k + (2 * d + 3) * 8 + 16

    @classmethod
    def _rows(cls, n, d, k, itemsize, max_memory):
        budget = resolve_budget(max_memory, host_available_memory(), cap=_CAP)
        return chunk_rows(budget, cls._row_bytes(k, d, itemsize), 2 * k * (d + 1) * 8,
                          n_samples=n, what=f"the array-api backend (k={k})")

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto"):
        rows = cls._rows(n_samples, n_features, n_clusters, itemsize, max_memory)
        parts = {"chunk_buffers": rows * cls._row_bytes(n_clusters, n_features, itemsize),
                 "sums": 2 * n_clusters * (n_features + 1) * 8,
                 # labels (int32) and distances per chunk, then concatenated
                 "assign_outputs": 2 * n_samples * (4 + itemsize)}
        return MemoryEstimate(parts, sum(parts.values()), rows)

    def _chunks(self, X, k):
        n, d = X.shape
        itemsize = 8 if "64" in str(X.dtype) else 4
        rows = self._rows(n, d, k, itemsize, self.max_memory)
        return [slice(s, min(s + rows, n)) for s in range(0, n, rows)]

    def assign(self, X, centers, *, xp=None):
        xp = xp or array_namespace(X)
        c_norm = xp.sum(centers * centers, axis=1)
        labels, mins = [], []
        for sl in self._chunks(X, centers.shape[0]):
            Xc = X[sl, ...]
            dist = c_norm[None, :] - 2 * (Xc @ centers.T)
            # int32, the user's labels (`kmeans_xp.contract.backend`'s "Labels"), chunk by chunk
            labels.append(xp.astype(xp.argmin(dist, axis=1), xp.int32))
            best = xp.min(dist, axis=1) + xp.sum(Xc * Xc, axis=1)
            mins.append(xp.where(best < 0, xp.zeros_like(best), best))
        labels = xp.concat(labels) if len(labels) > 1 else labels[0]
        mins = xp.concat(mins) if len(mins) > 1 else mins[0]
        return AssignResult(labels, mins)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        xp = xp or array_namespace(X)
        dev = device(X)
        ids = xp.arange(n_clusters, dtype=xp.int64, device=dev)
        sums = xp.zeros((n_clusters, X.shape[1]), dtype=xp.float64, device=dev)
        weights = xp.zeros(n_clusters, dtype=xp.float64, device=dev)
        for sl in self._chunks(X, n_clusters):
            onehot = xp.astype(labels[sl][None, :] == ids[:, None], xp.float64)
            w = (xp.ones(onehot.shape[1], dtype=xp.float64, device=dev)
                 if sample_weight is None else xp.astype(sample_weight[sl], xp.float64))
            sums = sums + onehot @ (xp.astype(X[sl, ...], xp.float64) * w[:, None])
            weights = weights + onehot @ w
        return ReduceResult(sums, weights)


def _jax_x64() -> bool:
    import sys
    return bool(sys.modules["jax"].config.jax_enable_x64)
