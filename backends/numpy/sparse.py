"""The CPU backends' sparse path: scipy.sparse X (CSR; CSC converted once) without densifying.

Chosen by "auto" for scipy.sparse input, and taken by a fit that names the numpy or numba
backend with sparse X (`selection.SPARSE_PATH`). X reaches the primitives as a
`contract.sparse.SparseRows` (the CSR, and the vector it is seen shifted by: zeros in a
fit, as scikit-learn computes on sparse X as given). Chunks of CSR rows, sized so that
their (rows, k) distances stay within `max_memory`, on all cores on the host
(`sparse_threads.steps`):

- labels: the argmin of ||c||^2 - 2 x.c (a sparse-dense product in X's dtype, the rest in
  float64), and the distance to the label's center with ||x||^2 (once per fit) added;
- sums per cluster, float64: on the host a sparse product of a one-hot matrix with the rows,
  added into the (k, d) sums by each chunk's thread in row order
  (`sparse_threads.OrderedSums`); on a GPU one bincount over the stored values
  (cluster * d + column);
- inertia and the farthest points: from the stored values (scikit-learn's `_inertia_sparse`);
- k-means++: the same draws as the xp steps (`algorithms.init.Seeding`), on sparse rows.

The code reads its dense library off X (`sparse.dense_module`), so the CuPy backend's sparse
path (`kmeans_xp_backends.cupy.sparse`) is this class on cupyx.scipy.sparse.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.backend import (
    AssignResult,
    Farthest,
    IterStats,
    KMeansBackend,
    Placement,
    ReduceResult,
)
from kmeans_xp.contract.chunks import (
    row_chunks,
    spawn,
    tol_from_variances,
    usable_cores,
)
from kmeans_xp.contract.memory import MemoryEstimate, chunk_rows
from kmeans_xp_backends.numpy.sparse_threads import OrderedSums, in_order, steps
from kmeans_xp.contract.sparse import (
    SCIPY_SPARSE,
    SparseRows,
    as_csr,
    dense_module,
    is_sparse,
    labelled_sq_dist,
    nnz_rows,
    points,
    sq_dist_to,
)
from kmeans_xp.contract.sphere import ZeroNormError

#: bytes per row of a chunk, per cluster: the cross products, the distances and a temporary
#: (float64 each)
ROW_BYTES_PER_CLUSTER = 3 * 8
#: bytes per row beyond them: labels, squared norms, minima, the chunk's CSR row pointer
ROW_BYTES = 64


def _rows(budget, n, k):
    return chunk_rows(budget, ROW_BYTES_PER_CLUSTER * k + ROW_BYTES, 0, n_samples=n, floor=1,
                      what=f"the sparse path (k={k})")


def column_variances(csr):
    """(d,) float64 variances of the columns of a CSR, from its stored values."""
    xp = dense_module(csr)
    n, d = csr.shape
    data = csr.data.astype(xp.float64)
    s = xp.bincount(csr.indices, weights=data, minlength=d)
    sq = xp.bincount(csr.indices, weights=data * data, minlength=d)
    mean = s / n
    return xp.maximum(sq / n - mean * mean, 0)


def _nearest(chunk, norms, pts, lib):
    """(labels, float64 squared distances to them) of the CSR rows `chunk` (squared norms
    `norms`) among the `points` pts: the argmin over p of ||p||^2 - 2 x.p, the product in X's
    dtype, the rest in float64 (||x||^2 is the same for every p: left out of the (rows, k)
    block, as scikit-learn's `_update_chunk_sparse` does); the distance, ||x||^2 added and
    clamped at 0, for the label's point only."""
    pT, p_sq = pts
    e = lib.asarray(chunk @ pT).astype(lib.float64, copy=False)
    e *= -2.0   # (exact; in place: the product's own array, or its float64 copy)
    e += p_sq
    labels = lib.argmin(e, axis=1)
    mins = lib.maximum(norms + e[lib.arange(e.shape[0]), labels], 0)
    return labels, mins


def _host_points(P, mean, dtype, shifted):
    """`sparse.points` on the host, for X as given (mean 0, the fit's case): p = P, so the
    (k, d) centers are not copied to float64 and back, and the transposed copy and the
    squared norms (the same bits) are made on the cores (k x d work each iteration, as long
    as a pass when d is large)."""
    if shifted:
        return points(P, mean, dtype)
    P = np.asarray(P)
    k, d = P.shape
    pT = np.empty((d, k), dtype=dtype)
    p_sq = np.empty(k, dtype=np.float64)
    jobs = max(1, min(usable_cores(), k, (k * d) >> 20))   # (a million values a job or more)
    cols = np.linspace(0, d, jobs + 1).astype(np.int64)
    rows = np.linspace(0, k, jobs + 1).astype(np.int64)

    def job(t):
        for j in range(cols[t], cols[t + 1], 4096):   # (blocks that stay in cache)
            j1 = min(j + 4096, cols[t + 1])
            pT[j:j1] = P[:, j:j1].T
        g = P[rows[t]:rows[t + 1]].astype(np.float64)
        p_sq[rows[t]:rows[t + 1]] = np.sum(g * g, axis=1)   # (row by row, as np.sum of P)

    spawn(job, jobs)
    return pT, p_sq


class SparsePlacement(Placement):
    """Sparse X as CSR, never densified; the driver's xp is the dense library's."""

    def to_backend(self, X):
        """Sparse X as CSR; a dense array (a kept k-sized one) as it is."""
        return as_csr(X) if is_sparse(X) and not isinstance(X, SparseRows) else X

    def namespace(self, X):
        from array_api_compat import array_namespace
        if not is_sparse(X):
            return array_namespace(X)   # (the driver's small arrays)
        return array_namespace(dense_module(X).empty(0))

    def feature_stats(self, X, tol, *, xp):
        """(zeros: sparse X is not centered, as in scikit-learn; its tol from the columns'
        variances)."""
        csr = X.csr if isinstance(X, SparseRows) else X
        lib = dense_module(csr)
        mean = lib.zeros(csr.shape[1], dtype=csr.dtype)
        return mean, (0.0 if tol == 0 else tol_from_variances(column_variances(csr), tol))

    def center(self, X, mean, *, xp, in_place=False):
        """X seen as X - mean (`SparseRows`), without a shifted copy."""
        if isinstance(X, SparseRows):
            return X if mean is None else SparseRows(X.csr, X.mean + mean)
        return SparseRows(as_csr(X), mean)

    def center_scaled(self, X, mean, scale, *, xp):
        return self.center(X, mean, xp=xp).scaled(scale)

    def unit_rows(self, X, *, xp):
        """The rows scaled to unit norm on a copy of the CSR's values (SphericalKMeans)."""
        csr = (X.csr if isinstance(X, SparseRows) else as_csr(X)).copy()
        lib = dense_module(csr)
        norms = lib.sqrt(SparseRows(csr).sq_norms)
        if bool(lib.any(norms == 0)):
            first = int(lib.flatnonzero(norms == 0)[0])
            raise ZeroNormError(f"X has rows of norm 0 (row {first} the first); a spherical "
                                f"fit needs a direction for every row: drop them.")
        csr.data = (csr.data / norms[nnz_rows(csr)]).astype(csr.dtype)
        return SparseRows(csr)


class ScipySparseBackend(KMeansBackend):
    name = "scipy-sparse"
    namespaces = frozenset({SCIPY_SPARSE})
    device = "cpu"
    placement_class = SparsePlacement
    #: the fit computes on X as given: no centered copy (`planning.estimate_memory`)
    centered_copy = False

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto"):
        from kmeans_xp.contract.memory import host_available_memory, resolve_budget
        budget = resolve_budget(max_memory, host_available_memory(), cap=1 << 30)
        rows = min(n_samples, _rows(budget, n_samples, n_clusters))
        parts = {"chunk": rows * (ROW_BYTES_PER_CLUSTER * n_clusters + ROW_BYTES),
                 # the rows' squared norms, the minima and labels of assign
                 "per_row": n_samples * (8 + itemsize + 4),
                 # the float64 sums per cluster and their flat bincount
                 "sums": 2 * n_clusters * n_features * 8}
        return MemoryEstimate(parts, sum(parts.values()), rows)

    # -- helpers ----------------------------------------------------------------------------
    def _map(self, X, k, fn):
        """[fn(slice, CSR rows, their squared norms) for each chunk of X's rows], in row
        order, the chunks within the budget (`sparse_threads.steps`): on the host on all cores (scipy's
        sparse products, NumPy's large ufuncs, take and fancy assignment release the GIL),
        on a GPU in turn."""
        n = X.shape[0]
        rows = min(n, _rows(self.memory.bytes(), n, max(k, 1)))
        step, threads = steps(n, rows, X.csr.nnz * max(k, 1), X.xp)
        norms = X.sq_norms
        slices = list(row_chunks(n, step))

        def job(i):
            return fn(slices[i], X.chunk(slices[i]), norms[slices[i]])

        if threads == 1:
            return [job(i) for i in range(len(slices))]
        return spawn(job, len(slices))

    @staticmethod
    def _sums(chunk, labels, w, k, lib):
        """(sums of w * x per cluster of the chunk's rows, (k,) float64 sums of w): on the
        host a sparse (k, d) CSR, the product of a one-hot matrix with the rows (scipy's
        product merges a cluster's columns and releases the GIL; `OrderedSums` adds it in), on a
        GPU a dense (k, d) bincount over the stored values (atomics); float64 either way."""
        lab = labels.astype(lib.int64)
        w64 = None if w is None else w.astype(lib.float64)
        weights = (lib.bincount(lab, minlength=k).astype(lib.float64) if w is None
                   else lib.bincount(lab, weights=w64, minlength=k))
        if lib is np:
            import scipy.sparse as sp
            order = np.argsort(lab, kind="stable")   # the rows, cluster by cluster
            indptr = np.concatenate([[0], np.cumsum(np.bincount(lab, minlength=k))])
            data = np.ones(order.size) if w64 is None else w64[order]
            onehot = sp.csr_matrix((data, order, indptr), shape=(k, chunk.shape[0]))
            return sp.csr_matrix(onehot @ chunk.astype(np.float64)), weights
        d = chunk.shape[1]
        at = nnz_rows(chunk)
        values = chunk.data.astype(lib.float64)
        if w64 is not None:
            values = values * w64[at]
        sums = lib.bincount(lab[at] * d + chunk.indices, weights=values, minlength=k * d)
        return sums.reshape(k, d), weights

    def _points(self, centers, X):
        """The centers as the sparse product takes them (`sparse.points`), once per pass."""
        if X.xp is np:
            return _host_points(centers, X.mean, X.dtype, X.shifted)
        return points(centers, X.mean, X.dtype)

    def driver_rows(self, X):
        return max(1, min(X.shape[0], _rows(self.memory.bytes(), X.shape[0], 64)))

    # -- the contract -----------------------------------------------------------------------
    def assign(self, X, centers, *, xp=None):
        X = self.placement.center(X, None, xp=xp)
        lib = X.xp
        labels = lib.empty(X.shape[0], dtype=lib.int32)
        mins = lib.empty(X.shape[0], dtype=X.dtype)
        pts = self._points(centers, X)

        def chunk_assign(sl, chunk, norms):
            labels[sl], mins[sl] = _nearest(chunk, norms, pts, lib)

        self._map(X, centers.shape[0], chunk_assign)
        return AssignResult(labels, mins)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        X = self.placement.center(X, None, xp=xp)
        lib = X.xp
        acc = OrderedSums(lib, n_clusters, X.shape[1])

        def chunk_sums(sl, chunk, _):
            w = None if sample_weight is None else sample_weight[sl]
            return acc.fold(sl, lambda: self._sums(chunk, labels[sl], w, n_clusters, lib))

        parts = self._map(X, n_clusters, chunk_sums)
        sums, weights = acc.sums, in_order(parts, lib.zeros(n_clusters, dtype=lib.float64))
        if X.shifted:   # sums of w * (x - mean)
            sums -= weights[:, None] * X.mean.astype(lib.float64)[None, :]
        return ReduceResult(sums, weights)

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        X = self.placement.center(X, None, xp=xp)
        lib = X.xp
        k = centers.shape[0]
        labels = lib.empty(X.shape[0], dtype=lib.int32)
        pts = self._points(centers, X)
        acc = OrderedSums(lib, k, X.shape[1])

        def chunk_iter(sl, chunk, norms):
            lab, mins = _nearest(chunk, norms, pts, lib)
            labels[sl] = lab
            w = None if sample_weight is None else sample_weight[sl]
            inertia = lib.sum(mins) if w is None else lib.sum(mins * w)
            part, weights = self._sums(chunk, lab, w, k, lib)
            return part, (weights, inertia)

        parts = self._map(X, k, lambda sl, chunk, norms: acc.fold(
            sl, lambda: chunk_iter(sl, chunk, norms)))
        sums = acc.sums
        weights = in_order([p[0] for p in parts], lib.zeros(k, dtype=lib.float64))
        # (0-d, on the device: the driver reads it)
        inertia = in_order([p[1] for p in parts], lib.zeros((), dtype=lib.float64))
        if X.shifted:
            sums -= weights[:, None] * X.mean.astype(lib.float64)[None, :]
        changed = (lib.asarray(float(X.shape[0])) if labels_old is None else
                   lib.count_nonzero(labels != lib.asarray(labels_old)).astype(lib.float64))
        return IterStats(labels, sums, weights, inertia, changed)

    def _labelled(self, X, centers, labels):
        lib = X.xp
        out = lib.empty(X.shape[0], dtype=lib.float64)

        def chunk_dist(sl, chunk, norms):
            out[sl] = labelled_sq_dist(chunk, norms, centers, labels[sl], X.mean)

        self._map(X, 1, chunk_dist)
        return out

    def inertia(self, X, sample_weight, centers, labels, *, xp=None):
        X = self.placement.center(X, None, xp=xp)
        dist = self._labelled(X, centers, labels)
        lib = X.xp
        return lib.sum(dist) if sample_weight is None else lib.sum(
            dist * sample_weight.astype(lib.float64))

    def farthest(self, X, sample_weight, centers, labels, m, *, xp=None):
        X = self.placement.center(X, None, xp=xp)
        lib = X.xp
        dist = self._labelled(X, centers, labels)
        if sample_weight is not None:
            dist = lib.where(sample_weight > 0, dist, -1.0)
        idx = lib.argsort(-dist, kind="stable")[:m]
        w = (lib.ones(idx.shape[0], dtype=lib.float64) if sample_weight is None
             else sample_weight[idx].astype(lib.float64))
        return Farthest(idx.astype(lib.int64), X.take(idx, axis=0), w,
                        lib.asarray(labels)[idx], dist[idx])

    def seeding(self, X, sample_weight, n_local_trials, *, xp):
        X = self.placement.center(X, None, xp=xp)
        return SparseSeeding(X, sample_weight, self)


class SparseSeeding:
    """k-means++'s steps (`algorithms.init.Seeding`'s first, candidates, trial) on sparse
    rows: the same draws, distances by the expansion (scikit-learn's on sparse X)."""

    def __init__(self, X, sample_weight, backend):
        self.X, self.backend, self.lib = X, backend, X.xp
        self.sw64 = None if sample_weight is None else sample_weight.astype(self.lib.float64)

    def _to(self, P):
        return self.lib.min(self._dist(P), axis=1)

    def _dist(self, P):
        pts = self.backend._points(P, self.X)
        parts = self.backend._map(self.X, P.shape[0],
                                  lambda sl, chunk, norms: sq_dist_to(chunk, norms, pts))
        return parts[0] if len(parts) == 1 else self.lib.concatenate(parts)

    def first(self, index):
        return self._to(self.X.take(index, axis=0))

    def candidates(self, closest, u, by_weight):
        lib = self.lib
        cum = lib.cumsum(closest if self.sw64 is None else closest * self.sw64)
        idx = lib.minimum(lib.searchsorted(cum, u * cum[-1], side="right"),
                          self.X.shape[0] - 1)
        return lib.where(cum[-1] > 0, idx, by_weight)

    def trial(self, closest, cand):
        lib = self.lib
        dist = lib.minimum(self._dist(self.X.take(cand, axis=0)), closest[:, None])
        pots = dist.sum(axis=0) if self.sw64 is None else self.sw64 @ dist
        best = int(lib.argmin(pots))
        return lib.reshape(cand[best:best + 1], (1,)), lib.ascontiguousarray(dist[:, best])
