"""Launchers of the statistics and direct-difference kernels every CuPy backend shares
(cuda/stats.cu, cuda/direct.cu): an assignment's inertia and changed labels written into
float64 slots, the inertia by direct differences, and the points farthest from their centers.
Each reduction is a fixed-order tree (deterministic for a given grid) and launches once.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.backend import Farthest

from . import common
from .common import BLOCK, NULL, cupy

#: at most this many blocks in a reduction (its per-block partials)
MAX_REDUCE_GRID = 1024
#: rows per chunk when `farthest` ranks keys (bounds the sort's memory)
FARTHEST_ROWS = 1 << 22


class Scratch:
    """Per-block partials and the last-block counter of the reduction kernels (used in stream
    order: one at a time)."""

    def __init__(self):
        cp = cupy()
        self.partials = cp.empty(MAX_REDUCE_GRID, dtype=cp.float64)
        self.done = cp.zeros(1, dtype=cp.uint32)


def _reduce_grid(n):
    return min(MAX_REDUCE_GRID, common.grid(n, BLOCK * 8, 8))


def _i64(v):
    return np.int64(v)


def _w(w):
    return NULL if w is None else w


def weighted_total(v, w, out, scratch):
    """out[0] = sum(float64(v) * float64(w)) (w None: unit weights); out a float64 slot."""
    n = v.shape[0]
    fn = common.raw_kernel("stats.cu", f"weighted_total<{common.ctype(v.dtype)}>")
    common.launch(fn, _reduce_grid(n), (v, _w(w), _i64(n), scratch.partials, out,
                                        scratch.done))
    return out


def count_changed(a, b, out, scratch):
    """out[0] = #(a != b) as float64 (b None: all n); a, b int32."""
    n = a.shape[0]
    fn = common.raw_kernel("stats.cu", "count_changed")
    common.launch(fn, _reduce_grid(n), (a, NULL if b is None else b, _i64(n),
                                        scratch.partials, out, scratch.done))
    return out


def label_counts(labels, k):
    """(k,) uint64 points per cluster of int32 labels in [0, k) (one launch: CuPy's bincount
    first checks the labels with a reduction whose first compile took 5 s on the H200 host)."""
    cp = cupy()
    counts = cp.zeros(k, dtype=cp.uint64)
    n = labels.shape[0]
    if n:
        common.launch(common.raw_kernel("stats.cu", "count_labels"), common.grid(n, BLOCK, 8),
                      (labels, _i64(n), counts))
    return counts


#: rows whose mean is the shift a device X's variance is summed about (`column_mean_var`)
SHIFT_ROWS = 1 << 16


def moments_partials(X, shift, problems=1, problem_stride=0):
    """(2, problems, stride) float64 per-thread partials of column_moments over a C-contiguous
    X: [0] column sums, [1] sums of (x - shift)^2 (shift None: of x^2); stride is a multiple
    of d, so a partial's column is its index mod d. A batch: X is the first problem, the
    others problem_stride values apart, shift (problems, d). At most 2 blocks per SM in all:
    1 MiB on an H200, within the budget's fixed slack."""
    cp = cupy()
    m, d = X.shape
    per = max(1, 2 * common.multiprocessors() // problems)
    grid = max(-(-d // BLOCK), min(-(-m * d // BLOCK), per))
    stride = grid * BLOCK // d * d
    part = cp.empty((2, problems, stride), dtype=cp.float64)
    fn = common.raw_kernel("stats.cu", f"column_moments<{common.xtypes(X.dtype)}>")
    common.launch(fn, (grid, problems), (X, _i64(m * d), np.int32(d),
                                         NULL if shift is None else shift, part[0], part[1],
                                         _i64(problem_stride)))
    return part


def _one_launch(Xs) -> int | None:
    """The values between consecutive problems when Xs are equal, C-contiguous views evenly
    spaced in one allocation (a dense batch's problems, or their first rows), else None."""
    first = Xs[0]
    if len(Xs) < 2 or any(x.shape != first.shape or x.dtype != first.dtype
                          or not x.flags.c_contiguous for x in Xs):
        return None
    gap = common.device_ptr(Xs[1]) - common.device_ptr(first)
    if gap <= 0 or gap % first.itemsize:
        return None
    if any(common.device_ptr(x) - common.device_ptr(first) != b * gap for b, x in enumerate(Xs)):
        return None
    return gap // first.itemsize


def _host_moments(Xs, shifts=None):
    """Column sums and squares of `moments_partials` for each X (about its host shift, or
    0 where shifts is None): a dense batch's in one launch, other problems' launched back
    to back; read back in one copy, then added on the host in a fixed order (no CuPy
    reduction: their first compile took 1.2 s of a 3 s first fit)."""
    cp = cupy()
    d = Xs[0].shape[1]
    gap = _one_launch(Xs)
    if gap is not None:
        shift = None if shifts is None else cp.asarray(np.stack(shifts))
        parts = [moments_partials(Xs[0], shift, len(Xs), gap)]
    else:
        parts = [moments_partials(X, None if shifts is None else cp.asarray(s))
                 for X, s in zip(Xs, shifts or [None] * len(Xs))]
    flat = cp.asnumpy(parts[0] if len(parts) == 1 else cp.concatenate(
        [p.ravel() for p in parts])).ravel()
    # (2, problems, stride / d, d) per launch; each column's partials made contiguous before
    # they are summed (along a middle axis of length stride / d NumPy runs an inner loop of
    # d per row: 0.55 ms at d=3 against 0.1)
    out, at = [], 0
    for p in parts:
        mine = np.reshape(flat[at:at + p.size], (2, p.shape[1], -1, d))
        at += p.size
        sums = np.ascontiguousarray(mine.transpose(0, 1, 3, 2)).sum(axis=3)
        out += [sums[:, j, :] for j in range(p.shape[1])]
    return out


def column_mean_var(X, need_var):
    """(float64 per-feature mean, per-feature variance or None) of a C-contiguous device X:
    one pass, and with the variance one more over its first SHIFT_ROWS rows, whose mean is
    the shift the squares are summed about (as host streaming's)."""
    return column_mean_var_many([X], need_var)[0]


def column_mean_var_many(Xs, need_var):
    """`column_mean_var` of each X of a batch, each pass one launch (a dense batch) or its
    kernels launched together, read back in one copy: the means those of one X at a time
    bit for bit (float32 values add exactly in float64, in any order), the variances to
    their rounding."""
    if not need_var:
        return [(m[0] / X.shape[0], None) for X, m in zip(Xs, _host_moments(Xs))]
    heads = [X[:SHIFT_ROWS] for X in Xs]
    shifts = [m[0] / h.shape[0] for h, m in zip(heads, _host_moments(heads))]
    out = []
    moments = _host_moments(Xs, shifts)
    for X, shift, (total, sq) in zip(Xs, shifts, moments):
        mean = total / X.shape[0]
        # sum (x - s)^2 = sum (x - mean)^2 + n (mean - s)^2
        out.append((mean, np.maximum(sq / X.shape[0] - (mean - shift) ** 2, 0.0)))
    return out


def _rows_grid(n, d):
    """Grid of the kernels built on for_each_direct_sq_dist: eight lanes per row from d = 16
    on, one thread per row below; at most 8 blocks per SM."""
    lanes = 8 if d >= 16 else 1
    return common.grid(n * lanes, BLOCK, 8)


def direct_inertia(X, w, labels, C, out, scratch):
    """out[0] = sum of w * ||x - c_label||^2 by direct differences (numpy's rounding)."""
    n, d = X.shape
    fn = common.raw_kernel("direct.cu", f"direct_inertia<{common.xtypes(X.dtype)}>")
    common.launch(fn, min(MAX_REDUCE_GRID, _rows_grid(n, d)),
                  (X, _w(w), labels, C, _i64(n), np.int32(d), scratch.partials, out,
                   scratch.done))
    return out


def labelled_sq_dist(X, labels, C, out):
    """out[i] = ||X[i] - C[labels[i]]||^2 by direct differences."""
    n, d = X.shape
    if n:
        fn = common.raw_kernel("direct.cu", f"labelled_sq_dist<{common.xtypes(X.dtype)}>")
        common.launch(fn, _rows_grid(n, d), (X, labels, C, _i64(n), np.int32(d), out))
    return out


def relocation_keys(X, w, labels, C, keys):
    """keys[i] = ||X[i] - C[labels[i]]||^2, or -1 where the weight is 0."""
    n, d = X.shape
    if n:
        fn = common.raw_kernel("direct.cu", f"relocation_keys<{common.xtypes(X.dtype)}>")
        common.launch(fn, _rows_grid(n, d), (X, _w(w), labels, C, _i64(n), np.int32(d), keys))
    return keys


class TopKeys:
    """The m largest keys seen so far with their row indices, key descending and index
    ascending among equals (the driver's relocation order), merged chunk by chunk (rows come
    in ascending order, and the sorts are stable). weighted: some keys may be -1 (zero
    weight), which `result` drops; without weights every key is a distance (>= 0), and the
    result is read without the boolean mask's device round trip."""

    def __init__(self, m, weighted=True):
        self.m, self.weighted = int(m), weighted
        self.keys = self.index = None

    def add(self, keys, offset):
        cp = cupy()
        order = cp.argsort(-keys)[: self.m]           # stable: lower index first among equals
        k = keys[order].astype(cp.float64)
        # (CuPy's ufuncs called with a Python scalar: its operators would hand one to
        # NumPy's dispatch, which imports cupyx; tests/test_cupy_host_operands.py)
        i = cp.add(order.astype(cp.int64), offset)
        if self.keys is not None:
            k, i = cp.concatenate([self.keys, k]), cp.concatenate([self.index, i])
            top = cp.argsort(-k)[: self.m]            # earlier rows first among equals
            k, i = k[top], i[top]
        self.keys, self.index = k, i

    def result(self):
        """(keys, index) of the points with a positive weight (key >= 0)."""
        if not self.weighted:
            return self.keys, self.index
        cp = cupy()
        keep = cp.greater_equal(self.keys, 0)
        return self.keys[keep], self.index[keep]


def farthest(X, w, labels, C, m, *, rows=FARTHEST_ROWS):
    """The m points of X farthest from their own centers (kmeans_xp.contract.backend.Farthest): keys by
    direct differences chunk by chunk, ranked without an n-sized sort."""
    cp = cupy()
    n = X.shape[0]
    top = TopKeys(m, weighted=w is not None)
    rows = max(int(rows), 1)
    keys = cp.empty(min(rows, n), dtype=common.compute_dtype(X.dtype))
    for s in range(0, n, rows):
        e = min(s + rows, n)
        relocation_keys(X[s:e], None if w is None else w[s:e], labels[s:e], C, keys[: e - s])
        top.add(keys[: e - s], s)
    # (half X: the rows that become centers, in float32, exactly)
    return gather_farthest(top, lambda idx: X[idx].astype(keys.dtype, copy=False),
                           lambda idx: None if w is None else w[idx], labels)


def farthest_many(problems) -> Farthest:
    """`farthest` of several problems of one shape (`KMeansBackend.farthest_many`), each
    (X, weights or None, int32 labels, centers, m), ranked together: each problem's keys a
    row of one (P, n) array (a launch each), one stable sort of the rows (lower index first
    among equals, as `TopKeys`), and each field gathered for every problem; a row's entries
    past its problem's m, and its zero-weight points (key -1), have sq_dist -1."""
    cp = cupy()
    X0, m = problems[0][0], max(int(p[4]) for p in problems)
    keys = cp.empty((len(problems), X0.shape[0]), dtype=common.compute_dtype(X0.dtype))
    for r, (X, w, labels, C, _) in enumerate(problems):
        relocation_keys(X, w, labels, C, keys[r])
    order = cp.argsort(-keys, axis=1)[:, :m]
    dist = cp.take_along_axis(keys, order, axis=1).astype(cp.float64)
    own = cp.asarray([int(p[4]) for p in problems], dtype=cp.int64)
    past = cp.arange(m, dtype=cp.int64)[None, :] >= own[:, None]
    dist = cp.where(past, cp.full((), -1.0, dtype=cp.float64), dist)
    # (half X: the rows that become centers, in float32, exactly)
    x = cp.stack([X[o].astype(keys.dtype, copy=False) for (X, *_), o in zip(problems, order)])
    labels = cp.stack([lab[o] for (_, _, lab, _, _), o in zip(problems, order)])
    weight = (cp.ones(order.shape, dtype=cp.float64) if all(p[1] is None for p in problems)
              else cp.stack([cp.ones(m, dtype=cp.float64) if w is None else
                             w[o].astype(cp.float64) for (_, w, *_), o in zip(problems, order)]))
    return Farthest(order.astype(cp.int64), x, weight, labels, dist)


def gather_farthest(top, rows_of, weights_of, labels) -> Farthest:
    """Farthest from ranked keys: rows_of(index) gives the (centered) rows of X,
    weights_of(index) their weights (None: unit)."""
    cp = cupy()
    dist, idx = top.result()
    w = weights_of(idx)
    weight = cp.ones(idx.shape[0], dtype=cp.float64) if w is None else w.astype(cp.float64)
    return Farthest(idx, rows_of(idx), weight, cp.asarray(labels)[idx], dist)


def kernel_instances():
    """(file, instance) of every kernel of stats.cu and direct.cu the backends launch (the
    compile check), host streaming's included."""
    out = [("stats.cu", "count_changed"), ("stats.cu", "fixed_point_scales"),
           ("stats.cu", "count_labels")]
    out += [("stats.cu", f"store_labels<{t}>") for t in ("unsigned char", "unsigned short", "int")]
    for t in common.CTYPE.values():
        out.append(("stats.cu", f"weighted_total<{t}>"))
    for t in common.X_TYPES.values():
        out += [("stats.cu", f"column_absmax<{t}>"),
                ("stats.cu", f"column_moments<{t}>"), ("direct.cu", f"direct_inertia<{t}>"),
                ("direct.cu", f"labelled_sq_dist<{t}>"), ("direct.cu", f"relocation_keys<{t}>")]
    return out
