"""cupy-chunked's batch of problems in one launch per step (`KMeansBackend.batch_lloyd_iter`):
the distances of every active problem by ONE batched GEMM per chunk of rows (cupy.matmul on
(m, rows, d) x (m, d, k) stacks, -2 folded into the centers: exact), each problem's argmin by
cupy-chunked's row kernel (`nearest.row_argmin_shifted`: ||c||^2 added with one rounding,
the lower index on ties), and the per-problem sums by ONE scatter (`nearest.cluster_sums`)
over the labels offset by j * k, so problem j owns rows j*k .. j*k+k-1 of one (A*k, d)
table. The squared distances of the inertia are direct differences, as cupy-chunked's.

Problems that left the batch (converged) are skipped without a copy: the active problems
are taken as runs of consecutive indices, each run a view of the (B, n, d) array; with all
problems active, one run. The distance block (m, rows, k) is bounded by the fit's budget
and by MAX_BLOCK_BYTES. A ragged batch (a list of arrays) loops over the problems
(`contract.batching.loop_batch_lloyd_iter`).

Numerics: cupy-chunked's (cuBLAS's GEMM, whose batched order may differ from the single
GEMM's in the last bit: a near tie may go the other way; `check_backend`'s batch checks
allow for that).
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.backend import BatchStats

from . import nearest, reductions

#: a distance block larger than this buys no speed, only memory (as cupy-chunked's)
MAX_BLOCK_BYTES = 1 << 30


def runs(active):
    """(first position, last position + 1, first problem) of each run of consecutive
    problem indices in `active`."""
    out, start = [], 0
    for j in range(1, len(active) + 1):
        if j == len(active) or active[j] != active[j - 1] + 1:
            out.append((start, j, active[start]))
            start = j
    return out


def chunk_rows(n, m, d, k, itemsize, budget):
    """Rows per chunk so that the (m, rows, k) distance block (and what cuBLAS may stage of
    a strided (m, rows, d) operand) stay within the budget and MAX_BLOCK_BYTES."""
    per_row = m * (k + d + 2) * itemsize
    return int(max(1, min(n, min(budget, MAX_BLOCK_BYTES) // per_row)))


def batch_lloyd_iter(backend, X, sample_weight, centers, labels_old, active):
    """`BatchStats` of the active problems of a dense batch on the device (X.array is
    the (B, n, d) CuPy array; centers (A, k, d) in X's dtype)."""
    cp = backend._cp
    arr = X.array
    n, d = arr.shape[1], arr.shape[2]
    a, k = centers.shape[0], centers.shape[1]
    C = backend.contiguous(centers, arr.dtype)
    c_norm = [nearest.center_norms(C[j], arr.dtype) for j in range(a)]
    minus2 = C * arr.dtype.type(-2)   # (x . -2c is -2 x.c exactly, cuBLAS's alpha=-2)
    labels = cp.empty((a, n), dtype=cp.int32)
    min_sq = cp.empty((a, n), dtype=arr.dtype)
    with backend.stage("assign"):
        for j0, j1, b0 in runs(active):
            m = j1 - j0
            rows = chunk_rows(n, m, d, k, arr.itemsize, backend.memory.bytes())
            block = cp.empty((m, rows, k), dtype=arr.dtype)
            run_min = cp.empty(rows, dtype=arr.dtype)
            Ct = minus2[j0:j1].transpose(0, 2, 1)
            for s in range(0, n, rows):
                e = min(n, s + rows)
                # (a contiguous (m, e - s, k) block: the last chunk is shorter)
                dist = block.reshape(-1)[:m * (e - s) * k].reshape(m, e - s, k)
                cp.matmul(arr[b0:b0 + m, s:e], Ct, out=dist)
                for j in range(m):
                    nearest.row_argmin_shifted(cp.ascontiguousarray(dist[j]), c_norm[j0 + j],
                                               0, True, run_min[:e - s], labels[j0 + j, s:e])
            del block
            for j in range(m):
                reductions.labelled_sq_dist(arr[b0 + j], labels[j0 + j], C[j0 + j],
                                            min_sq[j0 + j])
    weights_of = _weights(backend, sample_weight, arr.dtype)
    sums = cp.zeros((a * k, d), dtype=cp.float64)
    counts = cp.zeros((a * k,), dtype=cp.float64)
    offset = cp.arange(0, a * k, k, dtype=cp.int32)[:, None]   # (no host operand)
    with backend.stage("update"):
        for j0, j1, b0 in runs(active):
            m = j1 - j0
            shifted = cp.ascontiguousarray(labels[j0:j1] + offset[j0:j1]).reshape(-1)
            nearest.cluster_sums(arr[b0:b0 + m].reshape(m * n, d), shifted,
                                 weights_of(b0, m), sums, counts)
    w = None if sample_weight is None else cp.stack(
        [weights_of(active[j], 1) for j in range(a)]).astype(cp.float64)
    dist = min_sq.astype(cp.float64)
    inertia = cp.sum(dist if w is None else dist * w, axis=1)
    if labels_old is None:
        changed = cp.full((a,), float(n), dtype=cp.float64)
    else:
        old = labels_old if hasattr(labels_old, "ndim") else cp.stack(list(labels_old))
        changed = cp.sum(labels != old, axis=1).astype(cp.float64)
    return BatchStats(labels, sums.reshape(a, k, d), counts.reshape(a, k), inertia, changed)


def _weights(backend, sample_weight, dtype):
    """weights_of(first problem, m): the (m * n,) contiguous weights of m consecutive
    problems in X's dtype, or None (unit weights: the sums kernel takes a null)."""
    if sample_weight is None:
        return lambda b0, m: None
    cp = backend._cp
    whole = getattr(sample_weight, "array", None)
    if whole is not None:
        whole = backend.contiguous(whole, dtype)
        return lambda b0, m: whole[b0:b0 + m].reshape(-1)
    return lambda b0, m: backend.contiguous(
        cp.concatenate([sample_weight[b] for b in range(b0, b0 + m)]), np.dtype(dtype))
