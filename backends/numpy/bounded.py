"""The numpy backend's bounded assignment (`KMeansBackend.assign_bounded`: the driver's
triangle-inequality bounds, `kmeans_xp.contract.bounds`): the contract's vectorised steps,
the recomputed rows' distances by the backend's augmented GEMM (`blocks.Operands`), and the
recomputed rows at a near tie labelled by that GEMM on their own sub-chunk of the pass
(`sub_chunk_labels`)."""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.bounds import assign_bounded_numpy, labels_by_block

from kmeans_xp_backends.numpy import blocks


def assign_bounded(backend, X, centers, bounds):
    """Labels (int32) of X against `centers`, `bounds` moved to them."""
    ops = blocks.Operands(centers, np.asarray(X).dtype)
    return assign_bounded_numpy(X, centers, bounds,
                                distances=lambda rows, _centers: augmented(rows, ops),
                                ties=lambda idx: sub_chunk_labels(backend, X, ops, idx))


def augmented(rows, ops):
    """(rows, k) ||c||^2 - 2 x.c as the pass computes them: [x, 1] @ `ops.gemm`."""
    A = np.empty((rows.shape[0], rows.shape[1] + 1), dtype=rows.dtype)
    A[:, :-1] = rows
    A[:, -1] = 1
    return A @ ops.gemm


def sub_chunk_labels(backend, X, ops, idx):
    """The labels the backend's `assign` gives rows `idx` of X: each row's own sub-chunk of
    the pass (the plan's blocks and sub-chunks, `blocks.assign_block`) through the same GEMM
    again, so that BLAS takes the same shapes."""
    X = np.asarray(X)
    n, d = X.shape
    plan = backend._plan(n, d, ops.gemm.shape[1], X.dtype.itemsize, backend.max_memory,
                         backend.threads)
    idx = np.asarray(idx, dtype=np.intp)
    block = idx // plan.block * plan.block
    starts = block + (idx - block) // plan.sub * plan.sub
    stops = np.minimum(np.minimum(starts + plan.sub, block + plan.block), n)

    return labels_by_block(idx, starts, stops,
                           lambda s0, e0: np.argmin(augmented(X[s0:e0], ops), axis=1),
                           lambda: backend.assign(X, ops.c).labels, n)
