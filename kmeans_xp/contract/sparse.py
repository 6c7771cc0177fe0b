"""Sparse X (scipy.sparse, cupyx.scipy.sparse) seen by the driver and the backends, never
densified whole.

`SparseRows` is to sparse X what `rows.HostRows` is to a memory-mapped X: X seen shifted by
a vector (`mean`) without a shifted copy. Row selections give dense rows of ``X - mean``
(a handful of rows: init's centers, the points relocated to empty clusters); the backends'
sparse kernels read `csr` and `mean` and work on chunks of the CSR's rows: the distances
from the rows' squared norms and a sparse-dense product, the sums per cluster as a sparse
product. scipy and cupyx are never imported here: the array library is read off the input.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.rows import row_key

#: a squared distance by the expansion within this many float64 ulps of the squared norms
#: it came from is rounding as much as distance: transform takes it by differences instead
NEAR_ULPS = 64

#: the namespace names (`namespaces.namespace_name`) of sparse input
SCIPY_SPARSE, CUPYX_SPARSE = "scipy.sparse", "cupyx.scipy.sparse"


def sparse_namespace(X):
    """'scipy.sparse' or 'cupyx.scipy.sparse' for a sparse matrix or array (and a
    `SparseRows` of one), else None."""
    if isinstance(X, SparseRows):
        X = X.csr
    module = type(X).__module__
    if module.startswith("scipy.sparse"):
        return SCIPY_SPARSE
    if module.startswith("cupyx.scipy.sparse"):
        return CUPYX_SPARSE
    return None


def is_sparse(X) -> bool:
    return sparse_namespace(X) is not None


def dense_module(X):
    """The dense array library of a sparse X: numpy, or cupy for cupyx's."""
    if sparse_namespace(X) == CUPYX_SPARSE:
        import cupy
        return cupy
    return np


class SparseRows:
    """X (CSR) seen as X - mean, without a shifted copy.

    `csr` is X, `mean` a dense (d,) vector in X's dtype on X's device (zeros: X as it is),
    `sq_norms` the rows' squared norms of X (float64, computed once). Row selections
    (`X[rows]`, `X[rows, ...]`, `xp.take(X, idx, axis=0)`) give dense rows of X - mean;
    there is no `__array__`: code that would densify the whole X fails instead."""

    ndim = 2

    def __init__(self, csr, mean=None):
        self.csr = csr
        self.xp = dense_module(csr)
        self.shape = tuple(csr.shape)
        self.dtype = csr.dtype
        self.mean = (self.xp.zeros(self.shape[1], dtype=self.dtype) if mean is None
                     else self.xp.asarray(mean, dtype=self.dtype))
        self.shifted = bool(self.xp.any(self.mean != 0))
        self._sq_norms = None

    @property
    def device(self):
        return "cpu" if self.xp is np else self.csr.data.device

    @property
    def sq_norms(self):
        """(n,) float64 squared norms of X's rows (not of X - mean)."""
        if self._sq_norms is None:
            self._sq_norms = row_sq_norms(self.csr)
        return self._sq_norms

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        key = row_key(key, self)
        if not isinstance(key, slice):
            key = self.xp.asarray(key)   # (cupyx indexes with device arrays)
        rows = self.csr[key]
        return self.xp.asarray(rows.toarray()) - self.mean

    def take(self, indices, axis=None, out=None, mode="raise"):
        if axis != 0 or out is not None:
            raise TypeError(f"{type(self).__name__}.take gathers rows: axis=0, no out")
        idx = indices.get() if hasattr(indices, "get") else np.asarray(indices)
        return self[np.asarray(idx, dtype=np.int64).reshape(-1)]

    def chunk(self, sl):
        """Rows `sl` of X as CSR (not shifted: kernels use `centers + mean`)."""
        return self.csr[sl]

    def scaled(self, scale):
        """SparseRows of X * scale (a copy of the CSR's values: exact, a power of two)."""
        csr = self.csr.copy()
        csr.data *= csr.dtype.type(scale)
        return SparseRows(csr, self.mean * scale)

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, nnz=" \
               f"{self.csr.nnz})"


def as_csr(X):
    """X as CSR (CSC and the other formats converted; a CSR as given, its indices sorted
    and duplicates summed on a copy only where needed)."""
    csr = X.tocsr() if X.format != "csr" else X
    if not getattr(csr, "has_canonical_format", True):
        csr = csr.copy()
        csr.sum_duplicates()
    return csr


def row_sq_norms(csr):
    """(n,) float64 squared norms of the rows of a CSR."""
    xp = dense_module(csr)
    data = csr.data.astype(xp.float64)
    return xp.bincount(nnz_rows(csr), weights=data * data, minlength=csr.shape[0])


def nnz_rows(csr):
    """(nnz,) the row of each stored value of a CSR (CuPy's repeat takes no array of
    counts: a search of the row pointers there)."""
    xp = dense_module(csr)
    if xp is np:
        return np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    return xp.searchsorted(csr.indptr[1:], xp.arange(csr.nnz), side="right")


def points(P, mean, dtype):
    """The dense points P (in the frame shifted by `mean`) as the sparse product takes them:
    (p^T in X's dtype, C-contiguous; ||p||^2 in float64) with p = P + mean. Made once per
    pass, for all its chunks."""
    xp = dense_module(P) if is_sparse(P) else _lib_of(P)
    p = P.astype(xp.float64) + mean.astype(xp.float64)
    return xp.ascontiguousarray(p.astype(dtype).T), xp.sum(p * p, axis=1)


def _lib_of(a):
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def sq_dist_to(chunk, sq_norms, pts):
    """(rows, m) squared distances of the CSR rows `chunk` (squared norms `sq_norms`,
    float64) to the `points` pts: the expansion ||x||^2 - 2 x.p + ||p||^2, the product in
    X's dtype as scikit-learn's (cuSPARSE takes one dtype), added in float64, clamped at 0."""
    xp = dense_module(chunk)
    pT, p_sq = pts
    cross = xp.asarray(chunk @ pT).astype(xp.float64)
    d2 = sq_norms[:, None] - 2 * cross + p_sq[None, :]
    return xp.maximum(d2, 0)


def labelled_sq_dist(chunk, sq_norms, centers, labels, mean):
    """(rows,) float64 squared distance of each CSR row (shifted by mean) to its center:
    ||x||^2 + ||c||^2 - 2 x.c_label from the stored values only (scikit-learn's
    `_inertia_sparse`), clamped at 0."""
    xp = dense_module(chunk)
    c = centers.astype(xp.float64) + mean.astype(xp.float64)
    labels = xp.asarray(labels).astype(xp.int64)
    at = nnz_rows(chunk)
    dots = xp.bincount(at, weights=chunk.data.astype(xp.float64) *
                       c[labels[at], chunk.indices], minlength=chunk.shape[0])
    c_sq = xp.sum(c * c, axis=1)
    return xp.maximum(sq_norms + c_sq[labels] - 2 * dots, 0)


def distances(X, centers, rows):
    """transform's (n, k) Euclidean distances of sparse X (as given) to `centers` (dense,
    uncentered), in X's dtype, over chunks of `rows` rows: the expansion in float64, and
    where it is within its own rounding of 0 (NEAR_ULPS), differences with the row made
    dense (a few rows: points on or next to a center), so a point on a center gets 0."""
    csr = as_csr(X)
    xp = dense_module(csr)
    norms = row_sq_norms(csr)
    c64 = xp.asarray(centers).astype(xp.float64)
    cT, c_sq = xp.ascontiguousarray(c64.T), xp.sum(c64 * c64, axis=1)[None, :]
    eps = NEAR_ULPS * float(np.finfo(np.float64).eps)
    parts = []
    for s in range(0, csr.shape[0], rows):
        chunk, x_sq = csr[s:s + rows], norms[s:s + rows, None]
        d2 = x_sq - 2 * xp.asarray(chunk.astype(xp.float64) @ cT) + c_sq
        i, j = xp.nonzero(d2 <= eps * (x_sq + c_sq))
        if i.size:
            diff = xp.asarray(chunk[i].toarray()).astype(xp.float64) - c64[j]
            d2[i, j] = xp.sum(diff * diff, axis=1)
        parts.append(xp.sqrt(xp.maximum(d2, 0)).astype(csr.dtype))
    return parts[0] if len(parts) == 1 else xp.concatenate(parts)


def cosine_distances(X, centers, rows):
    """SphericalKMeans' transform of sparse X: (n, k) 1 - cos(x, c) in [0, 2] for unit
    centers, in X's dtype (rows of norm 0 raise ValueError: they have no direction)."""
    csr = as_csr(X)
    xp = dense_module(csr)
    norms = xp.sqrt(row_sq_norms(csr))
    if bool(xp.any(norms == 0)):
        raise ValueError("X has rows of norm 0, which have no cosine with any center; drop "
                         "them.")
    cT = xp.ascontiguousarray(centers.astype(xp.float64).T)
    parts = []
    for s in range(0, csr.shape[0], rows):
        dots = xp.asarray(csr[s:s + rows].astype(xp.float64) @ cT)
        parts.append(xp.clip(1.0 - dots / norms[s:s + rows, None], 0.0, 2.0).astype(
            csr.dtype))
    return parts[0] if len(parts) == 1 else xp.concatenate(parts)
