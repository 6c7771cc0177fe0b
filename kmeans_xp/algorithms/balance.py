"""Balanced fits: the driver's iteration with a capacity-aware assignment.

`KMeans(balance=...)` runs the one Lloyd driver (`kmeans_xp.algorithms.lloyd`) with a
`BalancedStep` in place of the backend's `lloyd_iter`, as a fit with bounds runs with a
`BoundedStep`: each iteration asks the backend for every row's m nearest centers
(`KMeansBackend.nearest`), assigns the rows under the cap or the penalty
(`kmeans_xp.contract.capacity`: the algorithm and why), and has the backend reduce X by
those labels (`reduce`). The driver's semantics stay its own: convergence when no label
changes or the centers stop moving, empty clusters relocated, and a final assignment, here
a balanced one, so ``labels_`` holds the cap. ``predict`` stays the nearest center: a new
row is not counted against anyone's capacity (an IVF index assigns its queries so too).

Every backend runs it: the candidates come from its own distances, NumPy and CuPy keep
them where X is, and the others (dask, torch) send (n, m) of them to the host, m small.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract import return_checks as returned
from kmeans_xp.contract.capacity import (
    FALLBACK_CANDIDATES,
    array_module,
    capacity_assign,
    cluster_cap,
    greedy_rounds,
    host_or_module,
    labels_like,
    penalized_choice,
    rows_of,
)
from kmeans_xp.contract.namespaces import array_namespace, device, to_numpy
from kmeans_xp.contract.results import IterStats


#: the soft form's cluster weights are averaged over iterations with this weight on the
#: past: a penalty from the last iteration's weights alone sends rows back and forth
#: between the clusters it empties and fills
SIZE_MEMORY = 0.8


class BalancedStep:
    """The driver's iteration of a balanced fit, called as `KMeansBackend.lloyd_iter` is;
    `final` is the run's last (balanced) assignment and its inertia by differences."""

    def __init__(self, backend, balance, n, k):
        self.backend, self.balance, self.n, self.k = backend, balance, n, k
        self.cap = None if balance.max_size is None else cluster_cap(balance, n, k)
        self.m = min(k, balance.candidates)
        self._w = self._mod = None
        self._prev = None            # the last assignment's labels (NumPy or CuPy)
        self._sizes = None           # soft form: the last iteration's cluster weights
        self._mean_sq = None         # ... and its mean squared distance

    def _weights(self, sample_weight, mod):
        """float64 weights in `mod` (None for unit weights), made once per run."""
        if sample_weight is None:
            return None
        if self._w is None or self._mod is not mod:
            w = host_or_module(sample_weight, mod)
            self._w, self._mod = w.astype(mod.float64), mod
        return self._w

    def assignment(self, X, sample_weight, centers, *, xp):
        """(labels as NumPy or CuPy int64, the weighted sum of their squared distances)."""
        near = self.backend.nearest(X, centers, self.m, xp=xp)
        mod = array_module(near.index) or np
        cand = host_or_module(near.index, mod)
        dist = host_or_module(near.sq_dist, mod).astype(mod.float64)
        if cand.shape != (self.n, self.m):
            raise returned.BackendContractError(
                f"backend {self.backend.name!r}: nearest returned candidates of shape "
                f"{tuple(cand.shape)}, not (n, m) = {(self.n, self.m)}")
        w = self._weights(sample_weight, mod)
        if self.cap is not None:
            labels, chosen, remaining = capacity_assign(cand, dist, w, self.cap, self.k,
                                                        mod)
            self._fallback(X, centers, labels, chosen, w, remaining, mod, xp)
        elif self._sizes is None or self.balance.penalty == 0:
            labels, chosen = cand[:, 0].astype(mod.int64), dist[:, 0]
        else:
            labels, chosen = penalized_choice(cand, dist, self._penalty(mod), mod)
        total = float(mod.sum(chosen) if w is None else mod.sum(chosen * w))
        return labels, total

    def _penalty(self, mod):
        """lam * D * (W_j / (W / k) - 1) per cluster (`kmeans_xp.contract.capacity`)."""
        sizes = self._sizes
        rel = sizes * (self.k / max(float(sizes.sum()), 1e-300)) - 1.0
        return host_or_module(self.balance.penalty * self._mean_sq * rel, mod)

    def _fallback(self, X, centers, labels, chosen, w, remaining, mod, xp):
        """Rows whose m candidates all filled: the nearest centers with room, asked of the
        backend against those centers only. Each pass fills at least one more center (a row
        left over had all its candidates fill), and a pass offered every open center places
        every row (the caps add to at least n)."""
        left = mod.flatnonzero(labels < 0)
        cxp = array_namespace(centers)
        while left.shape[0]:
            open_ = mod.flatnonzero(remaining > 0)
            m = int(min(open_.shape[0], max(FALLBACK_CANDIDATES, self.m)))
            sub = rows_of(centers, open_, cxp)
            near = self.backend.nearest(rows_of(X, left, xp), sub, m, xp=xp)
            cand = open_[host_or_module(near.index, mod).astype(mod.int64)]
            dist = host_or_module(near.sq_dist, mod).astype(mod.float64)
            greedy_rounds(cand, dist, w, remaining, mod, labels=labels, chosen=chosen,
                          rows=left)
            left = left[labels[left] < 0]

    def _small(self, value, centers):
        cxp = array_namespace(centers)
        return cxp.asarray(value, dtype=cxp.float64, device=device(centers))

    def __call__(self, X, sample_weight, centers, labels_old, *, xp):
        labels, inertia = self.assignment(X, sample_weight, centers, xp=xp)
        changed = (self.n if labels_old is None or self._prev is None
                   else int(array_module(labels).count_nonzero(labels != self._prev)))
        self._prev = labels
        out = labels_like(labels, X, xp)
        sums, weights = self.backend.reduce(X, out, sample_weight, self.k, xp=xp)
        # (reduce may hand its statistics back on the host, cupy-fused does: the driver's
        # update computes where the centers are)
        sums, weights = _at_centers(sums, centers), _at_centers(weights, centers)
        if self.balance.penalty is not None:
            sizes = to_numpy(weights).astype(np.float64)
            self._mean_sq = inertia / max(float(sizes.sum()), 1e-300)
            self._sizes = sizes if self._sizes is None else (
                SIZE_MEMORY * self._sizes + (1 - SIZE_MEMORY) * sizes)
        return IterStats(out, sums, weights, self._small(inertia, centers),
                         self._small(float(changed), centers))

    def final(self, X, sample_weight, centers, *, xp):
        labels = labels_like(self.assignment(X, sample_weight, centers, xp=xp)[0], X, xp)
        return labels, self.backend.inertia(X, sample_weight, centers, labels, xp=xp)


def _at_centers(stat, centers):
    """A statistic in float64 where the centers are: reduce may hand it back on the host
    while the centers are on the device (cupy-fused) or on the device while they are on the
    host (cupy-fused keeps host centers too); a device array never converts implicitly."""
    if isinstance(centers, np.ndarray):
        return to_numpy(stat).astype(np.float64, copy=False)
    cxp = array_namespace(centers)
    return cxp.asarray(stat, dtype=cxp.float64, device=device(centers))


def balanced_step(backend, X, n_clusters, balance):
    """The driver's `BalancedStep` for a fit of X under `balance` (a parsed
    `contract.capacity.Balance`)."""
    return BalancedStep(backend, balance, int(X.shape[0]), int(n_clusters))
