"""The driver's Lloyd run (`kmeans_xp.lloyd.kmeans_single_lloyd`) with its O(n) bookkeeping
handed to a backend's reductions, for backends that keep the whole loop on their device.

The semantics are the driver's, line for line: same stopping rules (labels unchanged, or
center shift <= tol), the driver's own empty-cluster relocation and center update, a final
assignment when the run did not converge strictly, inertia from direct squared distances.
Only three per-iteration numbers (center shift, inertia, changed labels) are computed by
`reductions` and fetched together, so an iteration makes no n-sized temporaries and
synchronises once. tests/test_device_loop.py checks it against the driver on the CPU.

`reductions` provides:
    weighted_sum(v, w)               -> scalar sum(float64(v) * float64(w))
    center_shift(a, b)               -> scalar sum((float64(a) - float64(b)) ** 2)
    count_changed(a, b)              -> scalar number of positions where a != b
    labelled_sq_dist(X, C, labels, out) -> ||X[i] - C[labels[i]]||^2 by differences, into out
    fetch(scalars)                   -> list of Python floats (one device->host transfer)
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.lloyd import LloydResult, new_centers, relocate_empty, stop_reason


class HostReductions:
    """The reductions in NumPy (the CuPy backends have them as kernels,
    `_cupy_kmeans_kernels.DeviceReductions`): for NumPy blocks of the dask backend, and the
    reference the device loop is tested against on the CPU."""

    @staticmethod
    def weighted_sum(v, w):
        return np.sum(v.astype(np.float64) * w.astype(np.float64))

    @staticmethod
    def center_shift(a, b):
        return np.sum((a.astype(np.float64) - b.astype(np.float64)) ** 2)

    @staticmethod
    def count_changed(a, b):
        return np.count_nonzero(a != b)

    @staticmethod
    def labelled_sq_dist(X, C, labels, out):
        diff = X - C[labels]
        out[...] = np.einsum("ij,ij->i", diff, diff)
        return out

    @staticmethod
    def fetch(scalars):
        return [float(s) for s in scalars]


def lloyd_with_reductions(backend, X, sample_weight, centers, *, xp, max_iter, tol, rows,
                          reductions, verbose=0) -> LloydResult:
    red = reductions
    history = {"inertia": [], "center_shift": []}
    labels_old = None
    strict = False
    for i in range(max_iter):
        it = backend.lloyd_iter(X, sample_weight, centers, xp=xp)
        sums, weights = relocate_empty(X, sample_weight, centers, it.labels,
                                       it.weighted_sums, it.weight_in_clusters, xp, rows)
        centers_new = new_centers(sums, weights, centers, xp)
        scalars = [red.center_shift(centers_new, centers),
                   red.weighted_sum(it.min_sq_dist, sample_weight)]
        if labels_old is not None:
            scalars.append(red.count_changed(it.labels, labels_old))
        values = red.fetch(scalars)
        shift = values[0]
        history["inertia"].append(values[1])
        history["center_shift"].append(shift)
        if verbose:
            print(f"Iteration {i}, inertia {values[1]:.6g}, center shift {shift:.3g}")
        centers = centers_new
        stop = stop_reason(i, labels_old is not None and values[2] == 0, shift, tol, verbose)
        if stop:
            strict = stop == "strict"
            break
        labels_old = it.labels
    # keep one labels/distances pair alive at a time from here on
    labels, scratch = it.labels, it.min_sq_dist
    del it
    labels_old = None
    if not strict:
        final = backend.lloyd_iter(X, sample_weight, centers, xp=xp, update_centers=False)
        labels, scratch = final.labels, final.min_sq_dist
        del final
    with backend.stage("assign"):
        dist = red.labelled_sq_dist(X, centers, labels, scratch)
        inertia = max(red.fetch([red.weighted_sum(dist, sample_weight)])[0], 0.0)
    return LloydResult(labels, inertia, centers, i + 1, history)
