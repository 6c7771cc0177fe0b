"""The driver: one Lloyd run, with the same semantics whatever backend does the heavy work.

Mirrors scikit-learn's `_kmeans_single_lloyd`: stop on strict convergence (labels unchanged)
or when the squared center shift is <= tol; relocate empty clusters to the farthest points;
finish with an assignment against the final centers so `labels_ == predict(X)`; inertia from
direct squared distances. X arrives mean-centered (see `KMeans.fit`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .namespaces import to_numpy
from .init import row_chunks


class LloydResult(NamedTuple):
    labels: Any
    inertia: float
    centers: Any
    n_iter: int
    history: dict     # {"inertia": [...], "center_shift": [...]} per iteration


def tolerance(X, tol, xp) -> float:
    """scikit-learn's tol: absolute, scaled by the mean per-feature variance of X."""
    if tol == 0:
        return 0.0
    return float(xp.mean(xp.var(X, axis=0))) * tol


def feature_mean(X, xp):
    """Per-feature mean accumulated in float64, then cast: every library rounds it the same
    way, so every backend centers X identically (a float32 pairwise mean differs in the last
    bit between NumPy and CuPy, and near-tie labels would follow)."""
    total = xp.sum(X, axis=0, dtype=xp.float64)
    return xp.astype(total / X.shape[0], X.dtype)


def direct_sq_dist(X, centers, labels, xp, rows):
    """||x - c_label||^2 by differences (not the GEMM expansion), chunk by chunk."""
    parts = []
    for sl in row_chunks(X.shape[0], rows):
        diff = X[sl, ...] - xp.take(centers, labels[sl], axis=0)
        parts.append(xp.sum(diff * diff, axis=1))
    return parts[0] if len(parts) == 1 else xp.concat(parts)


def inertia(X, sample_weight, centers, labels, xp, rows) -> float:
    d = direct_sq_dist(X, centers, labels, xp, rows)
    return max(float(xp.sum(xp.astype(d, xp.float64) * xp.astype(sample_weight, xp.float64))),
               0.0)


def relocate_empty(X, sample_weight, centers_old, labels, sums, weights, xp, rows):
    """scikit-learn's relocation: each empty cluster takes the point farthest from its center
    (ties to the lower index; zero-weight points are never taken), moving that point's weight
    and weighted coordinates out of its old cluster. Done on the host: k x d is small."""
    w_host = to_numpy(weights).astype(np.float64)
    empty = np.flatnonzero(w_host == 0)
    if empty.size == 0:
        return sums, weights
    dist = to_numpy(direct_sq_dist(X, centers_old, labels, xp, rows)).astype(np.float64)
    sw = to_numpy(sample_weight).astype(np.float64)
    dist[sw <= 0] = -1.0
    far = np.argsort(-dist, kind="stable")[: empty.size]
    s_host = to_numpy(sums).astype(np.float64)
    lab = to_numpy(labels)
    far_dev = xp.asarray(far, dtype=xp.int64, device=_dev(X))
    Xf = to_numpy(xp.take(X, far_dev, axis=0)).astype(np.float64)
    for j, (new_id, idx) in enumerate(zip(empty, far)):
        old_id, wt = lab[idx], sw[idx]
        s_host[old_id] -= Xf[j] * wt
        s_host[new_id] = Xf[j] * wt
        w_host[old_id] -= wt
        w_host[new_id] = wt
    dev = _dev(sums)
    return (xp.asarray(s_host, dtype=sums.dtype, device=dev),
            xp.asarray(w_host, dtype=weights.dtype, device=dev))


def _dev(x):
    from array_api_compat import device
    return device(x)


def new_centers(sums, weights, centers_old, xp):
    """Weighted means; a cluster with no weight keeps its old center."""
    w = weights[:, None]
    safe = xp.where(w > 0, w, xp.ones_like(w))
    out = xp.where(w > 0, sums / safe, xp.astype(centers_old, sums.dtype))
    return xp.astype(out, centers_old.dtype)


def stop_reason(i, labels_unchanged, shift, tol, verbose=0):
    """The driver's stopping rule, shared by every loop that reproduces it on a device:
    "strict" when no label changed, "tol" when the squared center shift is <= tol, else None."""
    if labels_unchanged:
        if verbose:
            print(f"Converged at iteration {i}: strict convergence.")
        return "strict"
    if shift <= tol:
        if verbose:
            print(f"Converged at iteration {i}: center shift {shift:.3g} within tolerance "
                  f"{tol:.3g}.")
        return "tol"
    return None


def kmeans_single_lloyd(backend, X, sample_weight, centers, *, xp, max_iter, tol, rows,
                        verbose=0) -> LloydResult:
    """One Lloyd run from `centers` (already in X's namespace and dtype)."""
    history = {"inertia": [], "center_shift": []}
    labels_old = None
    strict = False
    sw64 = xp.astype(sample_weight, xp.float64)
    for i in range(max_iter):
        it = backend.lloyd_iter(X, sample_weight, centers, xp=xp)
        sums, weights = relocate_empty(X, sample_weight, centers, it.labels,
                                       it.weighted_sums, it.weight_in_clusters, xp, rows)
        centers_new = new_centers(sums, weights, centers, xp)
        shift = float(xp.sum((centers_new - centers) ** 2))
        history["inertia"].append(float(xp.sum(xp.astype(it.min_sq_dist, xp.float64) * sw64)))
        history["center_shift"].append(shift)
        if verbose:
            print(f"Iteration {i}, inertia {history['inertia'][-1]:.6g}, "
                  f"center shift {shift:.3g}")
        centers = backend.persist(centers_new)  # lazy namespaces: no growing history
        unchanged = labels_old is not None and bool(xp.all(it.labels == labels_old))
        stop = stop_reason(i, unchanged, shift, tol, verbose)
        if stop:
            strict = stop == "strict"
            break
        # a copy: a backend that reuses its output buffer would otherwise make the next
        # iteration's labels equal these by aliasing, and stop the run as converged
        labels_old = xp.asarray(it.labels, copy=True)
    labels = it.labels
    if not strict:
        labels = backend.lloyd_iter(X, sample_weight, centers, xp=xp,
                                    update_centers=False).labels
    return LloydResult(labels, inertia(X, sample_weight, centers, labels, xp, rows), centers,
                       i + 1, history)
