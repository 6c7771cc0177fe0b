"""Hierarchical initial centers for large k: ``KMeans(init="hierarchical")``.

A flat fit costs n * k * d per iteration from its first; at k of tens of thousands its
k-means++ alone (k passes over X) and its first iterations dominate the fit. The
hierarchical init (cuVS's balanced hierarchical k-means, FAISS's two-level training):

1. a coarse fit at k1 = round(sqrt(k)) clusters: k-means++ and COARSE_ITER Lloyd
   iterations of the one driver, on all of X (n * sqrt(k) * d each);
2. each coarse cluster j, of n_j rows, split into k_j clusters, k_j proportional to n_j
   (largest remainders; sum k_j = k, 1 <= k_j <= n_j): k-means++ and SPLIT_ITER driver
   iterations on its rows alone (n_j * k_j * d each, about n * sqrt(k) * d in all);
3. the k centers go to the estimator's Lloyd run (`max_iter` flat iterations: a few are
   enough to undo the coarse split's borders; with ``balance=`` they are balanced).

Its quality cost against the flat fit is measured in docs/large_k.md and
benchmarks/large_k.py. Every step goes through the driver on the fit's own backend, so it
runs wherever the fit does; a coarse cluster's rows are gathered (X[idx]) for its split.
"""
from __future__ import annotations

import math

import numpy as np

from kmeans_xp.algorithms.lloyd import kmeans_single_lloyd
from kmeans_xp.contract.capacity import rows_of
from kmeans_xp.contract.namespaces import device, to_numpy

#: Lloyd iterations of the coarse fit and of each split (each split is small and starts
#: from k-means++: a few iterations take it most of the way; the flat iterations after
#: finish it)
COARSE_ITER = 10
SPLIT_ITER = 10
#: below this k the init is k-means++ itself: sqrt(k) coarse clusters of about sqrt(k)
#: centers each would save nothing
MIN_K = 16
#: host bytes per row: the coarse labels, their sort order, and the weights' copy
HOST_ROW_BYTES = 24


def coarse_k(k: int) -> int:
    """Coarse clusters of a hierarchical init of k centers."""
    return max(1, min(k, int(round(math.sqrt(k)))))


def split_counts(sizes, k: int) -> np.ndarray:
    """Clusters per coarse cluster: proportional to `sizes` (rows that can be centers),
    by largest remainders, each at most its size and at least 1 where its size is not 0,
    summing to k (sizes.sum() >= k)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.sum() < k:
        raise ValueError(f"{int(sizes.sum())} rows cannot give {k} centers")
    share = sizes * (k / max(int(sizes.sum()), 1))
    counts = np.minimum(np.maximum(np.floor(share).astype(np.int64), sizes > 0), sizes)
    while counts.sum() != k:
        if counts.sum() < k:   # the largest remainder among clusters with rows to spare
            room = np.where(counts < sizes, share - counts, -np.inf)
            counts[int(np.argmax(room))] += 1
        else:                  # the smallest share among clusters giving more than 1
            over = np.where(counts > 1, share - counts, np.inf)
            counts[int(np.argmin(over))] -= 1
    return counts


def hierarchical_init(X, k, *, sample_weight, random_state, xp, rows, backend=None,
                      persist=None, verbose=0, plusplus):
    """(k, d) initial centers of X (centered, on the backend's device) by the hierarchical
    scheme of the module docstring; `plusplus` is k-means++ as the init table runs it."""
    if backend is None:   # (the benchmark's shared init runs the table on NumPy input)
        from kmeans_xp.contract.registry import get_backend
        backend = get_backend("numpy")()
    seed = dict(sample_weight=sample_weight, random_state=random_state, xp=xp, rows=rows,
                backend=backend, persist=persist)
    k1 = coarse_k(k)
    if k < MIN_K or k1 < 2:
        return plusplus(X, k, **seed, verbose=verbose)
    centers = xp.astype(plusplus(X, k1, **seed), X.dtype)
    coarse = kmeans_single_lloyd(backend, X, sample_weight, centers, xp=xp,
                                 max_iter=COARSE_ITER, tol=0)
    labels = to_numpy(coarse.labels).astype(np.int64)
    w = None if sample_weight is None else to_numpy(sample_weight)
    usable = labels if w is None else labels[w > 0]   # (a center is a row of weight > 0)
    counts = split_counts(np.bincount(usable, minlength=k1), k)
    order = np.argsort(labels, kind="stable")
    ends = np.cumsum(np.bincount(labels, minlength=k1))
    starts = ends - np.bincount(labels, minlength=k1)
    coarse_centers = to_numpy(coarse.centers)
    parts = []
    for j in np.flatnonzero(counts):
        if counts[j] == 1:   # (the coarse center: the mean of those rows)
            parts.append(coarse_centers[j:j + 1])
            continue
        parts.append(_split(backend, X, w, order[starts[j]:ends[j]], int(counts[j]), xp,
                            rows, persist, random_state, plusplus))
    return xp.asarray(np.concatenate(parts), dtype=X.dtype, device=device(X))


def _split(backend, X, w, idx, kj, xp, rows, persist, random_state, plusplus):
    """kj centers (host) of X's rows idx: k-means++ and SPLIT_ITER driver iterations."""
    Xj = rows_of(X, idx, xp)
    wj = None if w is None else xp.asarray(w[idx], dtype=X.dtype, device=device(X))
    cj = xp.astype(plusplus(Xj, kj, sample_weight=wj, random_state=random_state, xp=xp,
                            rows=rows, backend=backend, persist=persist), X.dtype)
    run = kmeans_single_lloyd(backend, Xj, wj, cj, xp=xp, max_iter=SPLIT_ITER, tol=0)
    return to_numpy(run.centers)
