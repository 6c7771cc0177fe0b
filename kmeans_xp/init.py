"""Initial centers, written once against the array API so they run on every backend's device.

Randomness comes from a host `numpy.random.RandomState` (a few numbers per center); the O(n)
work runs in the backend's namespace, over row chunks so memory stays bounded.
"""
from __future__ import annotations

import math

import numpy as np

from ._xp import to_numpy


def row_chunks(n, rows):
    for start in range(0, n, rows):
        yield slice(start, min(start + rows, n))


def sq_dist_to_points(X, P, xp, rows):
    """Yield (rows slice, (rows, len(P)) squared distances) chunk by chunk; direct differences
    for d <= 4 (exact), the norm expansion otherwise."""
    n, d = X.shape
    p_norm = xp.sum(P * P, axis=1)
    for sl in row_chunks(n, rows):
        Xc = X[sl, ...]
        if d <= 4:
            diff = Xc[:, None, :] - P[None, :, :]
            yield sl, xp.sum(diff * diff, axis=2)
        else:
            dist = xp.sum(Xc * Xc, axis=1)[:, None] - 2 * (Xc @ P.T) + p_norm[None, :]
            yield sl, xp.clip(dist, 0, None) if hasattr(xp, "clip") else xp.where(
                dist < 0, xp.zeros_like(dist), dist)


def _min_update(closest, X, P, xp, rows, sample_weight):
    """(candidate potentials (len(P),), closest distance if P were added) without an (n, len(P))
    array alive at once beyond one chunk."""
    pots = xp.zeros(P.shape[0], dtype=xp.float64)
    for sl, dist in sq_dist_to_points(X, P, xp, rows):
        dist = xp.minimum(dist, closest[sl][:, None])
        pots = pots + xp.sum(xp.astype(dist, xp.float64) * sample_weight[sl][:, None], axis=0)
    return pots


def _closest_with(closest, X, p, xp, rows):
    parts = [xp.minimum(closest[sl], dist[:, 0]) for sl, dist in
             sq_dist_to_points(X, p[None, :], xp, rows)]
    return parts[0] if len(parts) == 1 else xp.concat(parts)


def _draw(weights_cum, total, u, xp, n):
    """Index i with cum[i-1] < u * total <= cum[i]; never a zero-weight point."""
    vals = xp.asarray(np.asarray(u, dtype=np.float64) * total, dtype=xp.float64,
                      device=_device(weights_cum))
    idx = xp.searchsorted(weights_cum, vals, side="right")
    return xp.clip(idx, 0, n - 1) if hasattr(xp, "clip") else xp.minimum(idx, n - 1)


def _device(x):
    from array_api_compat import device
    return device(x)


def kmeans_plusplus(X, n_clusters, *, sample_weight, random_state, xp, rows,
                    n_local_trials=None):
    """Greedy k-means++ (Arthur & Vassilvitskii; scikit-learn's variant): each new center is the
    best of 2 + int(ln k) candidates drawn with probability w * D(x)^2. Returns (centers, indices).
    """
    n = X.shape[0]
    if n_local_trials is None:
        n_local_trials = 2 + int(math.log(n_clusters))
    sw64 = xp.astype(sample_weight, xp.float64)
    cum = xp.cumulative_sum(sw64)
    first = int(_draw(cum, float(cum[-1]), [random_state.uniform()], xp, n)[0])
    indices = [first]
    closest = _closest_with(xp.full(n, math.inf, dtype=X.dtype, device=_device(X)), X,
                            X[first, :], xp, rows)
    for _ in range(1, n_clusters):
        cum = xp.cumulative_sum(xp.astype(closest, xp.float64) * sw64)
        pot = float(cum[-1])
        if pot <= 0:  # every positive-weight point is already a center (duplicates)
            # the total must be cum[-1] itself: xp.sum rounds differently, and a draw past
            # cum[-1] would be clipped onto the last row, which may have zero weight
            cum = xp.cumulative_sum(sw64)
            pot = float(cum[-1])
        cand = _draw(cum, pot, random_state.uniform(size=n_local_trials), xp, n)
        P = xp.take(X, cand, axis=0)
        pots = _min_update(closest, X, P, xp, rows, sw64)
        best = int(xp.argmin(pots))
        indices.append(int(cand[best]))
        closest = _closest_with(closest, X, P[best, :], xp, rows)
    idx = xp.asarray(indices, dtype=xp.int64, device=_device(X))
    return xp.take(X, idx, axis=0), np.asarray(indices)


def random_init(X, n_clusters, *, sample_weight, random_state, xp):
    """k distinct rows drawn with probability proportional to their weight."""
    w = to_numpy(sample_weight).astype(np.float64)
    seeds = random_state.choice(X.shape[0], size=n_clusters, replace=False, p=w / w.sum())
    idx = xp.asarray(seeds, dtype=xp.int64, device=_device(X))
    return xp.take(X, idx, axis=0), seeds
