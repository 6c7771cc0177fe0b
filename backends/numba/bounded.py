"""The numba backend's bounded assignment (`KMeansBackend.assign_bounded`: the driver's
triangle-inequality bounds, `kmeans_xp.contract.bounds`): the contract's steps, with the row
test and the recomputed rows' bounds compiled (`bounds_kernels.filter_rows`,
`bounds_kernels.set_rows`: one pass each on numba's threads), the recomputed rows' distances
by the expansion in one GEMM a chunk, and the recomputed rows at a near tie labelled by the
backend's own pass on their own tile (`tile_labels`)."""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.bounds import PRUNE_SLACK, assign_bounded_numpy, labels_by_block

from kmeans_xp_backends.numba import bounds_kernels as numba_bounds
from kmeans_xp_backends.numba.kernels import ASSIGN


def assign_bounded(backend, X, centers, bounds, *, launch):
    """Labels (int32) of X against `centers`, `bounds` moved to them; `launch(threads,
    blas)`: the backend's context that sets numba's threads for a kernel."""

    def filter_rows(b, X, centers, sh):
        group = sh.group if sh.group is not None else np.zeros(1)
        fail = np.empty(b.n, dtype=np.uint8)
        with launch(backend.threads, False):
            numba_bounds.filter_rows(X, b.centers, b.labels, b.upper, b.lower,
                                     numba_bounds.METHOD[b.method], sh.s, sh.s1, sh.j1,
                                     sh.s2, group, sh.half, b.x2, b.gamma, sh.c2max,
                                     PRUNE_SLACK, fail)
        return np.flatnonzero(fail)

    def set_rows(b, idx, D, x2, delta):
        groups = b.groups if b.groups is not None else np.zeros(1, np.intp)
        with launch(backend.threads, False):
            numba_bounds.set_rows(D, np.asarray(idx, dtype=np.intp), x2, delta,
                                  numba_bounds.METHOD[b.method], groups, b.labels, b.upper,
                                  b.lower)

    return assign_bounded_numpy(X, centers, bounds, row_filter=filter_rows,
                                row_setter=set_rows,
                                ties=lambda idx: tile_labels(backend, X, centers, idx))


def tile_labels(backend, X, centers, idx):
    """The labels the backend's `assign` gives rows `idx` of X: each row's own tile of the
    pass (the plan's tasks and tiles) assigned again alone, so that BLAS takes the same
    shapes (a tile of one task, of the same rows: the plan for it keeps them in one tile)."""
    X = np.asarray(X)
    n, d = X.shape
    plan = backend._plan(n, d, centers.shape[0], X.dtype.itemsize)

    idx = np.asarray(idx, dtype=np.intp)
    task = idx // plan.task_rows * plan.task_rows
    starts = task + (idx - task) // plan.tile * plan.tile
    stops = np.minimum(np.minimum(starts + plan.tile, task + plan.task_rows), n)
    return labels_by_block(
        idx, starts, stops, lambda s0, e0: backend._pass(X[s0:e0], None, centers, ASSIGN)[0],
        lambda: backend._pass(X, None, centers, ASSIGN)[0], n)
