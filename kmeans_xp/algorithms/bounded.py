"""Fits with bounds: the driver's iteration with triangle-inequality bounds.

`kmeans_single_lloyd(..., bounds=method)` runs the one Lloyd driver
(`kmeans_xp.algorithms.lloyd`) with a `BoundedStep` in place of the backend's `lloyd_iter`,
as a balanced fit runs with a `BalancedStep` (`algorithms.balance`): each iteration asks the
backend for the bounded assignment (`KMeansBackend.assign_bounded`, on the bound state of
`kmeans_xp.contract.bounds`: the methods, their exactness and the row tests), then reduces X
by those labels. The same labels as Lloyd's kernels, so the same run (docs/bounds.md).
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract import bounds as B
from kmeans_xp.contract.chunks import inertia_of_sums
from kmeans_xp.contract.results import IterStats
from kmeans_xp.contract.rows import is_memmap


def inertia_from_sums(bounds, centers, sums, weights, sample_weight):
    """`chunks.inertia_of_sums`, sum w ||x||^2 from the bounds' row norms (kept for the
    fit): the bounds leave most rows' distances uncomputed."""
    if bounds.sq_norm_total is None:
        w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        bounds.sq_norm_total = float(bounds.x2.sum() if w is None else bounds.x2 @ w)
    return inertia_of_sums(bounds.sq_norm_total, centers, sums, weights)


class BoundedStep:
    """The driver's iteration with bounds, called as `KMeansBackend.lloyd_iter` is:
    `backend.assign_bounded`, then `backend.reduce`, the inertia from the sums and the
    changed labels. `final` is the run's last assignment (labels and their inertia by
    differences, as `labels_inertia`).

    Where the bounds keep too few rows (more than PAUSE_SHARE recomputed: the centers still
    move a lot), the next iterations are the backend's plain `lloyd_iter` (the same labels),
    PAUSE_ITERATIONS of them, doubling at each such pause up to MAX_PAUSE; then the bounds
    start again from a full assignment. Decided by counts, never by the clock, so a fit
    takes the same path on every run."""

    def __init__(self, backend, bounds):
        self.backend, self.bounds = backend, bounds
        self.pause = 0        # the length of the last pause
        self.plain_left = 0   # plain iterations left in this one

    def __call__(self, X, sample_weight, centers, labels_old, *, xp):
        b = self.bounds
        if self.plain_left:
            self.plain_left -= 1
            if not self.plain_left:
                b.restart()
            return self.backend.lloyd_iter(X, sample_weight, centers, labels_old, xp=xp)
        labels = self.backend.assign_bounded(X, centers, b, xp=xp)
        if not b.full and b.recomputed > B.PAUSE_SHARE * b.n:
            self.pause = min(B.MAX_PAUSE, 2 * self.pause or B.PAUSE_ITERATIONS)
            self.plain_left = self.pause
        sums, weights = self.backend.reduce(X, labels, sample_weight, b.k, xp=xp)
        inertia = inertia_from_sums(b, centers, sums, weights, sample_weight)
        changed = (labels.shape[0] if labels_old is None
                   else int(np.count_nonzero(labels != np.asarray(labels_old))))
        return IterStats(labels, sums, weights, np.float64(inertia), np.float64(changed))

    def final(self, X, sample_weight, centers, *, xp):
        if self.plain_left or not self.bounds.started:  # (bounds paused: a plain pass)
            return self.backend.labels_inertia(X, sample_weight, centers, xp=xp)
        labels = self.backend.assign_bounded(X, centers, self.bounds, xp=xp)
        return labels, self.backend.inertia(X, sample_weight, centers, labels, xp=xp)


def bounded_step(backend, X, n_clusters, method):
    """The driver's `BoundedStep` for a fit of X with bounds `method`, or None where the
    run keeps Lloyd's kernels: no method, X not a NumPy array in memory (a memmap, whose
    recomputed rows would be read from the file at random; a device array), or a placement
    that queues iterations ahead."""
    if method is None or not isinstance(X, np.ndarray) or X.ndim != 2 or is_memmap(X):
        return None
    if backend.placement.asynchronous or n_clusters < 2:
        return None
    n, d = X.shape
    space = B.room(backend, n, d, n_clusters, X.dtype.itemsize)
    return BoundedStep(backend, B.Bounds(method, n, d, n_clusters, X.dtype, room=space))
