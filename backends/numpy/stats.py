"""The numpy backend's O(n d) passes outside the Lloyd iteration, on its threads and bit for
bit the driver's single-threaded NumPy: X's per-feature sums (the mean), the tolerance's
variance, the centered copy, and the farthest points of an empty-cluster relocation.

Each keeps the reference's order of additions, so that every CPU backend centers X and
relocates the same way whatever its thread count:

- NumPy sums a C-ordered (n, d >= 2) X over axis 0 row after row (each column in order);
  here each thread takes a column or a group of columns and carries its running sums from
  one block of rows to the next (the block's first row is the carry: the same additions);
- the tolerance's chunks are the driver's (`chunks.tolerance`), each split by columns;
- X - mean and ||x - c_label||^2 are per element and per row: any split gives the same bits.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.backend import Farthest, farthest_order
from kmeans_xp.contract.chunks import deviation_sums, sq_dist_to_labels
from kmeans_xp.contract.rows import is_memmap

#: rows per block of a pass (a block's float64 buffers stay in a core's cache)
BLOCK_ROWS = 1 << 14
#: fewer rows than this: one thread (starting threads costs more than the pass)
MIN_PARALLEL_ROWS = 1 << 16


def parallel_columns(X) -> bool:
    """Whether X's sums run here: `column_sums` gives np.sum(X, axis=0, dtype=float64)'s
    bits where NumPy adds a C-ordered X's rows in order, with two columns or more (one column
    is a contiguous reduction, summed pairwise). Not a memory-mapped X: one pass over the
    file, not one per thread, keeps a file larger than memory streaming once."""
    return (isinstance(X, np.ndarray) and X.ndim == 2 and X.shape[1] >= 2
            and X.shape[0] >= MIN_PARALLEL_ROWS and X.flags.c_contiguous
            and not is_memmap(X))


def column_groups(d, threads):
    """[(j0, j1)]: d columns in at most `threads` groups of near-equal size."""
    t = max(1, min(threads, d))
    return [(g * d // t, (g + 1) * d // t) for g in range(t)]


#: columns summed together by one thread (fewer: each row is a short loop of its own)
MIN_GROUP_COLUMNS = 32


def column_sums(X, spawn, threads):
    """(d,) float64 column sums of X, np.sum(X, axis=0, dtype=np.float64)'s bits
    (`parallel_columns`): few features one column per task, many a group of at least
    MIN_GROUP_COLUMNS per thread."""
    n, d = X.shape
    if d <= 2 * threads:
        tasks = [(j, j + 1) for j in range(d)]
    else:
        tasks = column_groups(d, max(1, min(threads, d // MIN_GROUP_COLUMNS)))
    sums = np.empty(d, dtype=np.float64)
    buf_rows = min(n, BLOCK_ROWS) + 1

    def job(t):
        for j0, j1 in tasks[t::threads]:
            buf = np.empty((buf_rows, j1 - j0), dtype=np.float64)
            carry = X[0, j0:j1].astype(np.float64)   # NumPy's reduction starts from row 0
            for s in range(1, n, BLOCK_ROWS):
                e = min(s + BLOCK_ROWS, n)
                b = buf[:e - s + 1]
                b[0] = carry
                np.copyto(b[1:], X[s:e, j0:j1], casting="unsafe")
                # two columns or more: NumPy's reduction over axis 0 adds row after row;
                # one column would be a contiguous reduction (pairwise): a cumulative sum
                carry = (np.add.reduce(b, axis=0) if j1 - j0 > 1
                         else np.cumsum(b[:, 0])[-1:])
            sums[j0:j1] = carry

    spawn(job, min(threads, len(tasks)))
    return sums


def deviation_sums_by_columns(X, sl, mean64, spawn, threads):
    """`chunks.deviation_sums` of X's rows `sl`, its columns split over the threads in
    groups of two or more (NumPy sums one column pairwise, as a contiguous reduction; two or
    more row after row, as the whole chunk's): `chunks.tolerance`'s chunk_sums."""
    d = X.shape[1]
    groups = column_groups(d, max(1, min(threads, d // 2)))

    def job(t):
        j0, j1 = groups[t]
        return _deviation_sums_blocked(X[sl, j0:j1], mean64[j0:j1])

    parts = spawn(job, len(groups))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _deviation_sums_blocked(rows, mean64):
    """`chunks.deviation_sums(rows, mean64)`'s bits (two columns or more: NumPy adds the
    rows in order from row 0) through one float64 buffer of BLOCK_ROWS rows, the running
    sums carried in its first row as `column_sums` does, instead of three float64
    temporaries of the whole chunk (a 100k x 128 chunk: 0.2 s of page faults)."""
    n, w = rows.shape
    if n == 0 or w < 2:
        return deviation_sums(rows, mean64, np)
    c0 = rows[0].astype(np.float64) - mean64
    sq, shift = c0 * c0, c0
    buf = np.empty((min(n, BLOCK_ROWS) + 1, w), dtype=np.float64)
    for s in range(1, n, BLOCK_ROWS):
        e = min(s + BLOCK_ROWS, n)
        b = buf[:e - s + 1]
        np.copyto(b[1:], rows[s:e], casting="unsafe")
        b[1:] -= mean64
        b[0] = shift
        shift = np.add.reduce(b, axis=0)
        b[1:] *= b[1:]
        b[0] = sq
        sq = np.add.reduce(b, axis=0)
    return sq, shift


def centered(X, mean, spawn, threads, out=None):
    """X - mean (into `out`: X itself to center in place), a block of rows per task."""
    n = X.shape[0]
    if out is None:
        out = np.empty(X.shape, dtype=np.result_type(X, mean))
    bounds = _row_splits(n, threads)

    def job(t):
        s, e = bounds[t], bounds[t + 1]
        np.subtract(X[s:e], mean, out=out[s:e])

    spawn(job, len(bounds) - 1)
    return out


def _row_splits(n, threads):
    t = max(1, min(threads, -(-n // BLOCK_ROWS)))
    return [i * n // t for i in range(t + 1)]


def _at_least_mth(values, m):
    """Indices of the values at least as large as the m-th largest (all on ties: the lower
    index among equals is chosen after the merge)."""
    r = values.shape[0]
    if m >= r:
        return np.arange(r)
    if m == 0:
        return np.arange(0)
    return np.flatnonzero(values >= np.partition(values, r - m)[r - m])


def farthest(X, sample_weight, centers, labels, m, spawn, threads):
    """The m points farthest from their own centers (`Farthest`), as the backend default
    finds them (||x - c_label||^2 summed in X's dtype, as `chunks.labelled_sq_dist`, then
    float64; distance descending, lower index first; zero weights never): each thread keeps
    its rows' candidates (every row at least as far as its m-th farthest), and the
    candidates are ranked once."""
    n = X.shape[0]
    m = max(0, min(int(m), n))
    bounds = _row_splits(n, threads)
    w = None if sample_weight is None else np.asarray(sample_weight)

    def job(t):
        idx, dist = [], []
        for s in range(bounds[t], bounds[t + 1], BLOCK_ROWS):
            e = min(s + BLOCK_ROWS, bounds[t + 1])
            dd = sq_dist_to_labels(X[s:e], centers, labels[s:e], np).astype(np.float64)
            if w is not None:
                dd = np.where(w[s:e] > 0, dd, -1.0)
            keep = _at_least_mth(dd, m)
            idx.append(keep + s)
            dist.append(dd[keep])
        return np.concatenate(idx), np.concatenate(dist)

    parts = spawn(job, len(bounds) - 1)
    idx = np.concatenate([p[0] for p in parts]).astype(np.int64)
    dist = np.concatenate([p[1] for p in parts])
    order = farthest_order(idx, dist, m)
    idx, dist = idx[order], dist[order]
    weight = (np.ones(len(idx), dtype=np.float64) if w is None
              else w[idx].astype(np.float64))
    return Farthest(idx, np.take(X, idx, axis=0), weight, np.take(labels, idx), dist)
