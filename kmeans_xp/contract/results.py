"""What backends return: the primitives' results (`AssignResult`, `ReduceResult`), one
iteration's (`IterStats`), a whole run's (`LloydResult`), the farthest points that empty
clusters take (`Farthest`), and the labels' dtypes. `kmeans_xp.contract.backend` re-exports
them with the contract that returns them.

Labels: an integer array of values in [0, k), in any integer dtype that holds k. Between
its own passes a backend may keep them compact (`compact_labels_dtype`: uint8 up to 256
clusters, uint16 up to 65536, else int32: the numpy backend's `lloyd_iter` labels, a CuPy
backend's streamed label store), the driver only compares and keeps them. What the user gets
(labels_, predict, in every namespace) is int32, scikit-learn's dtype: the first-party
backends' signed labels are int32 (numpy's `assign` and `labels_inertia`, array-api's
`assign`, CuPy's, dask's label blocks), and `placement.from_backend` widens unsigned ones to
int32 (`user_labels`: e.g. the last iteration's when a run converges strictly). A
third-party backend should do the same; the estimators pass every label they give the user
through `user_labels`, so a plugin's int64 labels reach the user as int32 too.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kmeans_xp.contract.namespaces import device

#: the labels a user gets from a backend that chooses their type (`user_labels`)
LABELS_DTYPE = np.dtype(np.int32)


def compact_labels_dtype(k):
    """The smallest dtype that holds labels 0..k-1: uint8, uint16, else int32."""
    if k <= 1 << 8:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16) if k <= 1 << 16 else LABELS_DTYPE


def user_labels_dtype(dtype):
    """The dtype labels of `dtype` reach the user in: int32 for every integer dtype
    (unsigned compact ones, a plugin's int64)."""
    if isinstance(dtype, np.dtype) and dtype.kind in "iu" and dtype != LABELS_DTYPE:
        return LABELS_DTYPE
    return dtype


def user_labels(arr):
    """Labels as the user gets them, int32 whatever the backend gave: a NumPy, CuPy or dask
    array of another integer dtype is converted (a torch or JAX array through its
    namespace); int32 labels as they are."""
    dtype = getattr(arr, "dtype", None)
    if isinstance(dtype, np.dtype):
        return arr if user_labels_dtype(dtype) is dtype else arr.astype(LABELS_DTYPE)
    if dtype is None:
        return arr
    from array_api_compat import array_namespace
    try:
        xp = array_namespace(arr)
    except TypeError:
        return arr
    if dtype == xp.int32 or not xp.isdtype(dtype, "integral"):
        return arr
    return xp.astype(arr, xp.int32)


class AssignResult(NamedTuple):
    labels: Any          # (n,) integer index of the nearest center (see "Labels" above)
    min_sq_dist: Any     # (n,) squared distance to it, clamped at 0


class ReduceResult(NamedTuple):
    weighted_sums: Any        # (k, d) float64 sum of w * x per cluster
    weight_in_clusters: Any   # (k,) float64 sum of w per cluster


class IterStats(NamedTuple):
    """One Lloyd iteration's results, computed where the data lives."""
    labels: Any               # (n,) a new array each call (the driver keeps the last one);
                              # may be compact (`compact_labels_dtype`)
    weighted_sums: Any        # (k, d) float64
    weight_in_clusters: Any   # (k,) float64
    inertia: Any              # 0-d float64: sum of w * ||x - c_label||^2 of this
                              # assignment (its min_sq_dist, or the same from the sums)
    n_changed: Any            # 0-d float64: labels != labels_old (n when labels_old is None)


class LloydResult(NamedTuple):
    """One Lloyd run's outcome: the driver's (`kmeans_xp.algorithms.lloyd`), or a backend's
    own loop's (`KMeansBackend.lloyd`), which must be the same."""
    labels: Any
    inertia: float
    centers: Any
    n_iter: int
    history: dict     # {"inertia": [...], "center_shift": [...]} per iteration


class Farthest(NamedTuple):
    """The m points farthest from their own centers: distance descending, lower index first
    among equals, zero-weight points never (sklearn's relocation candidates)."""
    index: Any     # (m,) int64
    x: Any         # (m, d) their rows of the centered X
    weight: Any    # (m,) float64
    label: Any     # (m,) their labels
    sq_dist: Any   # (m,) float64 their squared distances


def stacked_farthest(found, xp) -> Farthest:
    """Several problems' `Farthest` as one: each field (P, m_max, ...), problem p's row its
    own points first, then padding (index 0, zero rows and weights, label 0, sq_dist -1:
    below every distance, as a zero-weight point's key)."""
    m = max([int(f.index.shape[0]) for f in found] + [0])

    def padded(a, fill):
        extra = m - int(a.shape[0])
        if extra:
            a = xp.concat([a, xp.full((extra, *a.shape[1:]), fill, dtype=a.dtype,
                                      device=device(a))], axis=0)
        return a

    return Farthest(*(xp.stack([padded(getattr(f, name), fill) for f in found])
                      for name, fill in (("index", 0), ("x", 0), ("weight", 0), ("label", 0),
                                         ("sq_dist", -1))))


def farthest_order(index, sq_dist, m):
    """Positions of the m first candidates (NumPy arrays of their indices in X and
    distances) in `Farthest`'s order: distance descending, lower index first among equals.
    Where each part of X gave every point at least as far as its m-th, these are X's m
    farthest."""
    return np.lexsort((index, -sq_dist))[:m]
