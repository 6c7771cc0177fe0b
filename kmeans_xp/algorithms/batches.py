"""Batches of problems: the batched mode of the Lloyd driver (`lloyd.drive`); their initial
centers are `batch_init`'s.

B independent problems (same d and k) run through the one loop together: each iteration
calls the backend's `batch_lloyd_iter` once for the problems still running (a GPU backend
computes them in one launch per step), updates their (A, k, d) centers in one set of xp
operations, and reads one (4, A) array. Each problem keeps the single fit's semantics:
its own tol, strict convergence, empty clusters relocated by its own farthest points
(`lloyd.relocate_empty`, sklearn's rules), a final assignment so that its labels equal
predict's. A problem that converged leaves the active set and costs no more work.

Unlike `lloyd.SingleRun`, a batch reads each iteration's statistics before it issues the
next: one iteration of a batch is a whole batch's GEMMs, long beside the host's turn-around.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kmeans_xp.algorithms.lloyd import FILLED, drive, new_centers
from kmeans_xp.algorithms.relocation import Problem, relocate_empty_many
from kmeans_xp.contract import return_checks as returned
from kmeans_xp.contract.batching import batch_size, check_batch_stats, problem, row
from kmeans_xp.contract.namespaces import device, to_numpy


class BatchResult(NamedTuple):
    """A batched run's outcome, one entry per problem."""
    labels: list        # B label arrays
    inertia: np.ndarray  # (B,) float64
    centers: Any         # (B, k, d)
    n_iter: np.ndarray   # (B,) int
    history: list        # B dicts {"inertia": [...], "center_shift": [...]}


def kmeans_batch_lloyd(backend, X, sample_weight, centers, *, xp, max_iter, tol,
                       verbose=0) -> BatchResult:
    """One Lloyd run of each problem of a batch from its `centers` ((B, k, d), X's dtype):
    X and sample_weight as `contract.batching` describes them (centered problems), tol one
    absolute tolerance per problem ((B,) or a float for all)."""
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), (batch_size(X),))
    return drive(BatchRun(backend, X, sample_weight, centers, xp=xp), max_iter=max_iter,
                 tol=tol, verbose=verbose)


class BatchRun:
    """A batch's run for `lloyd.drive` (the same protocol as `lloyd.SingleRun`)."""

    batched = True

    def __init__(self, backend, X, sample_weight, centers, *, xp):
        self.backend, self.X, self.sw, self.xp = backend, X, sample_weight, xp
        self.place = backend.placement
        B, self.k = batch_size(X), centers.shape[1]
        self.active = tuple(range(B))
        self.centers = centers
        self.centers64 = xp.astype(centers, xp.float64)
        self.zero = xp.zeros((), dtype=xp.float64, device=device(centers))
        self._histories = [{"inertia": [], "center_shift": []} for _ in range(B)]
        self.final = [None] * B      # each problem's centers once it stopped
        self.labels = [None] * B     # its labels when it converged strictly
        self.n_iter = np.zeros(B, dtype=np.int64)
        self.it = self._iterate(None, values=True)

    def _iterate(self, labels_old, values=False):
        stats = self.backend.batch_lloyd_iter(self.X, self.sw, self.centers, labels_old,
                                              self.active, xp=self.xp)
        return check_batch_stats(self.backend, stats, self.X, self.active, self.k,
                                 values=values)

    def histories(self):
        return [self._histories[b] for b in self.active]

    def advance(self):
        c_new, c64, small = self._update(())
        values = self._read(small)
        empty = np.flatnonzero(values[FILLED] < self.k)
        if empty.size:
            c_new, c64, small = self._update(empty)
            values = self._read(small)
        self.centers, self.centers64 = c_new, c64
        return values

    def _read(self, small):
        xp = self.xp
        return np.reshape(self.place.fetch(xp.reshape(small, (-1,)))(), (4, -1))

    def _update(self, relocate):
        """(new centers, the same in float64, the (4, A) array to read): the single fit's
        update (`lloyd._update`) for every active problem at once; the problems in
        `relocate` (positions in the active set) first relocate their empty clusters."""
        xp, it = self.xp, self.it
        sums, weights = it.weighted_sums, it.weight_in_clusters
        a = len(self.active)
        if len(relocate):   # (all the relocating problems' in one round trip)
            which = [(j, self.active[j]) for j in relocate]
            sums, weights = relocate_empty_many(
                self.backend, [Problem(j, self.X[b], problem(self.sw, b), self.centers[j, ...],
                                       row(it.labels, j)) for j, b in which], sums, weights, xp)
        filled = weights > self.zero
        # (the heaviest-cluster fill after a relocation: each problem's, in one take)
        c_new = new_centers(sums, weights, self.centers, xp, fill_empty=bool(len(relocate)),
                            filled=filled)
        c64 = xp.astype(c_new, xp.float64, copy=False)
        diff = c64 - self.centers64
        shift = xp.sum(xp.reshape(diff * diff, (a, -1)), axis=1)
        n_filled = xp.sum(xp.astype(filled, xp.float64), axis=1)
        return c_new, c64, xp.stack([shift, it.inertia, it.n_changed, n_filled])

    def retire(self, stop, strict, n_iter):
        it = self.it
        for j in np.flatnonzero(stop):
            b = self.active[j]
            self.final[b] = self.centers[j, ...]
            self.labels[b] = row(it.labels, j) if strict[j] else None
            self.n_iter[b] = n_iter
        keep = np.flatnonzero(~np.asarray(stop))
        self.labels_old = it.labels
        if keep.size < len(self.active):
            self.labels_old = self._rows(it.labels, keep)
            self.active = tuple(self.active[j] for j in keep)
            if keep.size:
                at = self.xp.asarray(keep, device=device(self.centers))
                self.centers = self.xp.take(self.centers, at, axis=0)
                self.centers64 = self.xp.take(self.centers64, at, axis=0)

    def _rows(self, labels, keep):
        """The kept problems' labels: rows of a 2-D array (a backend's batched labels)
        stay one array, for its next launch."""
        if getattr(labels, "ndim", 1) == 2:
            return self.xp.take(labels, self.xp.asarray(keep, device=device(labels)), axis=0)
        return [row(labels, j) for j in keep]

    def next(self):
        self.it = self._iterate(self.labels_old)
        self.labels_old = None

    def finish(self) -> BatchResult:
        """Each problem's labels and inertia at its final centers: the problems that did
        not converge strictly get their final assignment in one batched iteration (its
        labels: a backend's lloyd_iter labels equal its assign's), so that labels_ ==
        predict(X); the inertia by direct differences, each problem's launched before any
        is read."""
        backend, xp = self.backend, self.xp
        self.it = self.labels_old = None
        again = tuple(b for b, lab in enumerate(self.labels) if lab is None)
        if again:
            self.active = again
            self.centers = xp.stack([self.final[b] for b in again])
            final = self._iterate(None)
            for j, b in enumerate(again):
                self.labels[b] = row(final.labels, j)
        totals = [backend.inertia(self.X[b], problem(self.sw, b), centers, self.labels[b],
                                  xp=xp) for b, centers in enumerate(self.final)]
        inertia = np.array([max(returned.check_statistic(backend, "inertia", "inertia",
                                                         to_numpy(t)), 0.0) for t in totals])
        return BatchResult(list(self.labels), inertia, xp.stack(self.final),
                           self.n_iter.copy(), self._histories)
