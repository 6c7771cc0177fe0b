"""The numba backend's compiled pass over X's rows: nearest center, float64 per-cluster sums,
inertia and changed labels, fused, parallel over fixed row tasks (`pass_narrow` for d <= 8,
`pass_wide` for any d).

Work split: X is cut into `n_tasks` contiguous tasks of `task_rows` rows (chosen from n, k, d
and the budget, never from the thread count); `prange` runs the tasks on numba's threads, and
each task writes its own float64 partial sums into row t of the partial arrays, which
`merge_partials` adds in task order. So the sums are the same bit for bit whichever thread
ran which task, and however many threads there are.

Within a task, tiles of `tile` rows, each centered as it is read (`mean`: a memory-mapped X
seen centered, bit for bit `X - mean`):

- narrow (d <= 8): the tile is transposed into a zero-padded (width, tile) buffer, width 4
  or 8 (`_make_nearest_register`); for each group of four centers every row's four
  distances are computed in registers and compared in center order; the loop over the
  tile's rows vectorizes (SIMD over rows);
- wide: one BLAS GEMM per tile, ``(-2 C) @ tile^T`` -> (k, rows), then the running minimum
  over centers, again vectorized over rows (numba's np.dot calls SciPy's BLAS; the caller
  holds BLAS to one thread while the threads run).

Distances are ``||c||^2 - 2 x.c`` as the numpy backend's augmented GEMM gives them: the
products summed in feature order with fused multiply-adds (fastmath's "contract" only, no
reassociation: what BLAS kernels do), ``||c||^2`` added last, in X's dtype. The lowest index
wins a tie (strict <), as argmin. The inertia is sum w ||x - c_label||^2 by differences in
float64 (``c64``), not from the expansion.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

#: what a pass does (bit flags)
ASSIGN, MIN_SQ, SUMS, INERTIA, CHANGED = 1, 2, 4, 8, 16

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
#: the distance kernels' products are fused into the running sums (FMA), as BLAS does
_FMA = dict(_OPTS, fastmath={"contract"})


@njit(**_OPTS)
def _load_narrow(X, mean, s0, r, xt):
    """Rows [s0, s0 + r) of X (minus mean when given) into xt's first d rows, transposed."""
    d = X.shape[1]
    centered = mean.shape[0] > 0
    for i in range(r):
        for f in range(d):
            v = X[s0 + i, f]
            xt[f, i] = v - mean[f] if centered else v


@njit(**_OPTS)
def _load_wide(X, mean, s0, r, A):
    """Rows [s0, s0 + r) of X (minus mean when given) into A's first r rows."""
    d = X.shape[1]
    centered = mean.shape[0] > 0
    for i in range(r):
        for f in range(d):
            v = X[s0 + i, f]
            A[i, f] = v - mean[f] if centered else v


def _make_nearest_register(width):
    """The register kernel for `width` features (a constant of the compiled function: LLVM
    unrolls the loop over features): best/idx of the tile's r rows (xt: (width, tile), zero
    rows past d) against the centers (g: (width, k) = -2 C^T zero-padded, cn: ||c||^2), four
    centers at a time, each row's four running sums in registers (one load of a feature
    feeds four FMAs), the loop over the tile's rows vectorized (SIMD over rows). Each sum
    starts at +0 and adds one product per feature by an FMA, ``||c||^2`` last, as BLAS does;
    ties keep the lower index, as argmin."""
    @njit(**_FMA)
    def nearest(xt, r, g, cn, best, idx):
        k = cn.shape[0]
        zero = cn[0] - cn[0]   # +0 in X's dtype (a float literal would make the sums float64)
        for i in range(r):
            best[i] = np.inf
            idx[i] = 0
        j = 0
        while j + 4 <= k:
            c0, c1, c2, c3 = cn[j], cn[j + 1], cn[j + 2], cn[j + 3]
            j0, j1, j2, j3 = np.int32(j), np.int32(j + 1), np.int32(j + 2), np.int32(j + 3)
            for i in range(r):
                x = xt[0, i]
                v0 = x * g[0, j] + zero
                v1 = x * g[0, j + 1] + zero
                v2 = x * g[0, j + 2] + zero
                v3 = x * g[0, j + 3] + zero
                for f in range(1, width):
                    x = xt[f, i]
                    v0 = x * g[f, j] + v0
                    v1 = x * g[f, j + 1] + v1
                    v2 = x * g[f, j + 2] + v2
                    v3 = x * g[f, j + 3] + v3
                b, bi = best[i], idx[i]
                b, bi = _keep_lower(v0 + c0, j0, b, bi)
                b, bi = _keep_lower(v1 + c1, j1, b, bi)
                b, bi = _keep_lower(v2 + c2, j2, b, bi)
                b, bi = _keep_lower(v3 + c3, j3, b, bi)
                best[i] = b
                idx[i] = bi
            j += 4
        while j < k:
            c, jj = cn[j], np.int32(j)
            for i in range(r):
                v = xt[0, i] * g[0, j] + zero
                for f in range(1, width):
                    v = xt[f, i] * g[f, j] + v
                best[i], idx[i] = _keep_lower(v + c, jj, best[i], idx[i])
            j += 1
    return nearest


@njit(inline="always", **_OPTS)
def _keep_lower(v, j, b, bi):
    """(v, j) where v is below the best so far (b, bi), else (b, bi): strict, so a tie keeps
    the lower index, as argmin."""
    return (v, j) if v < b else (b, bi)


#: the register kernels, d up to 4 and up to 8 (REGISTER_WIDTHS in numba_backend)
_nearest_4 = _make_nearest_register(4)
_nearest_8 = _make_nearest_register(8)


@njit(**_FMA)
def _nearest_wide(A, r, g, cn, dbuf, best, idx):
    """best/idx of A's first r rows against the centers (g: (k, d) = -2 C, cn: ||c||^2):
    one GEMM into dbuf as (k, r), then the running minimum over centers."""
    k = cn.shape[0]
    D = dbuf[:k * r].reshape((k, r))
    np.dot(g, A[:r].T, D)
    for i in range(r):
        best[i] = np.inf
        idx[i] = 0
    for j in range(k):
        c = cn[j]
        jj = np.int32(j)
        Dj = D[j]
        for i in range(r):
            v = Dj[i] + c
            b = best[i]
            lt = v < b
            best[i] = v if lt else b
            idx[i] = jj if lt else idx[i]


@njit(**_OPTS)
def _min_sq(rows, r, b0, best, min_sq):
    """min_sq[b0 + i] = best[i] + ||x_i||^2, clamped at 0, in X's dtype: products and sums
    in order, without FMA (the numpy backend's values: np.einsum's ||x||^2 for up to 3
    features, added to the GEMM's minimum)."""
    d = rows.shape[1]
    for i in range(r):
        v = rows[i, 0]
        s = v * v
        for f in range(1, d):
            v = rows[i, f]
            s = s + v * v
        m = best[i] + s
        min_sq[b0 + i] = max(m, 0)


@njit(**_OPTS)
def _tile_results(rows, r, b0, best, idx, flags, w, labels, labels_old, min_sq, sums,
                  weights, c64, stats):
    """What a pass asks of the tile's r rows from b0 (rows[i, f]: the tile as the kernel read
    it, centered), their nearest centers in best/idx when the pass assigns (see
    `pass_narrow`); stats[0] += inertia, stats[1] += changed labels."""
    d = rows.shape[1]
    if flags & ASSIGN:
        for i in range(r):
            labels[b0 + i] = idx[i]
    if flags & MIN_SQ:
        _min_sq(rows, r, b0, best, min_sq)
    has_w = w.shape[0] > 0
    want_sums = (flags & SUMS) != 0
    want_inertia = (flags & INERTIA) != 0
    if want_sums or want_inertia:
        # the inertia per feature (lanes independent: the loop over features vectorizes,
        # where one running sum per row would wait on each add), summed over features last
        acc = np.zeros(d if want_inertia else 1)
        for i in range(r):
            lab = labels[b0 + i]
            wi = np.float64(w[b0 + i]) if has_w else 1.0
            if want_sums:
                weights[lab] += wi
                for f in range(d):
                    sums[lab, f] += wi * np.float64(rows[i, f])
            if want_inertia:
                for f in range(d):
                    diff = np.float64(rows[i, f]) - c64[lab, f]
                    acc[f] += wi * (diff * diff)
        if want_inertia:
            inertia = 0.0
            for f in range(d):
                inertia += acc[f]
            stats[0] += inertia
    if flags & CHANGED:
        changed = 0
        for i in range(r):
            changed += labels_old[b0 + i] != labels[b0 + i]
        stats[1] += changed


@njit(**_OPTS)
def _start(sums, weights, stats, flags):
    if flags & SUMS:
        sums[:] = 0.0
        weights[:] = 0.0
    stats[:] = 0.0


@njit(**_OPTS)
def _task_narrow(X, Xc, mean, w, g, cn, c64, labels, labels_old, min_sq, sums, weights,
                 stats, flags, s0, e0, tile, xt, A, best, idx):
    """Rows [s0, e0) of one task into its own accumulators, d <= 8; xt (zero rows past d),
    A, best, idx: the worker's scratch. The tile's rows are read in place from Xc where X
    is C-contiguous and not centered on the fly, else copied (and centered) into A, once;
    the register kernel reads them transposed into xt (SIMD over rows), the sums, inertia
    and minima row by row (a row's features contiguous: those loops vectorize)."""
    direct = Xc.shape[0] > 0
    no_mean = mean[:0]
    _start(sums, weights, stats, flags)
    for b0 in range(s0, e0, tile):
        r = min(tile, e0 - b0)
        if direct:
            rows = Xc[b0:b0 + r]
        else:
            _load_wide(X, mean, b0, r, A)
            rows = A[:r]
        if flags & ASSIGN:   # (transposed from the tile's rows: X is read and centered once)
            _load_narrow(rows, no_mean, 0, r, xt)
            if xt.shape[0] == 4:
                _nearest_4(xt, r, g, cn, best, idx)
            else:
                _nearest_8(xt, r, g, cn, best, idx)
        _tile_results(rows, r, b0, best, idx, flags, w, labels, labels_old, min_sq, sums,
                      weights, c64, stats)


@njit(**_OPTS)
def _task_wide(X, Xc, mean, w, g, cn, c64, labels, labels_old, min_sq, sums, weights, stats,
               flags, s0, e0, tile, A, dbuf, best, idx):
    """Rows [s0, e0) of one task into its own accumulators, any d (one GEMM per tile); A,
    dbuf, best, idx: the worker's scratch. Xc: X itself when it is C-contiguous and not
    centered on the fly (a tile is then a view of it: no copy), else empty."""
    direct = Xc.shape[0] > 0
    _start(sums, weights, stats, flags)
    for b0 in range(s0, e0, tile):
        r = min(tile, e0 - b0)
        if direct:
            rows = Xc[b0:b0 + r]
        else:
            _load_wide(X, mean, b0, r, A)
            rows = A[:r]
        if flags & ASSIGN:
            _nearest_wide(rows, r, g, cn, dbuf, best, idx)
        _tile_results(rows, r, b0, best, idx, flags, w, labels, labels_old, min_sq, sums,
                      weights, c64, stats)


@njit(parallel=True, **_OPTS)
def pass_narrow(X, Xc, mean, w, g, cn, c64, labels, labels_old, min_sq, part_sums, part_w,
                part_stats, flags, task_rows, tile, workers):
    """One pass over X of at most 8 features (see the module's note); g: (width, k) =
    -2 C^T, zero rows past d, width 4 or 8. flags: ASSIGN (labels from the centers, else
    `labels` is read), MIN_SQ (min_sq = ||x - c||^2 by the expansion, clamped at 0), SUMS
    (part_sums[t], part_w[t]: float64 sums of w x and w per cluster), INERTIA (part_stats[t, 0]:
    sum of w ||x - c64_label||^2), CHANGED (part_stats[t, 1]: labels != labels_old). mean, w,
    labels_old, min_sq: empty when not used (w empty: unit weights); Xc: X C-contiguous and not
    centered on the fly, or empty (the tasks read their tiles' rows in place for what follows
    the nearest centers, and `_task_wide` for its GEMM). workers: the threads (numba's count,
    passed in: a cached function cannot read it)."""
    n, n_tasks = X.shape[0], part_stats.shape[0]
    workers = max(1, min(workers, n_tasks))
    for p in prange(workers):   # (a worker's scratch once, not a task's: see pass_wide)
        xt = np.zeros((g.shape[0], tile), X.dtype)
        A = np.empty((tile if Xc.shape[0] == 0 else 0, X.shape[1]), X.dtype)
        best = np.empty(tile, X.dtype)
        idx = np.empty(tile, np.int32)
        for t in range(p, n_tasks, workers):
            _task_narrow(X, Xc, mean, w, g, cn, c64, labels, labels_old, min_sq, part_sums[t],
                         part_w[t], part_stats[t], flags, t * task_rows,
                         min(n, (t + 1) * task_rows), tile, xt, A, best, idx)


@njit(parallel=True, **_OPTS)
def pass_wide(X, Xc, mean, w, g, cn, c64, labels, labels_old, min_sq, part_sums, part_w,
              part_stats, flags, task_rows, tile, workers):
    """`pass_narrow` for any number of features, g: (k, d) = -2 C. Each worker allocates its
    scratch once and runs tasks p, p + workers, ...: a tile's buffers of hundreds of KB
    allocated per task were fresh pages every time (at n=100k, d=128, k=8 two thirds of the
    pass). Which worker runs a task changes no bit: each task has its own partials."""
    n, n_tasks = X.shape[0], part_stats.shape[0]
    k = cn.shape[0]
    workers = max(1, min(workers, n_tasks))
    for p in prange(workers):
        A = np.empty((tile, X.shape[1]), X.dtype)
        dbuf = np.empty(k * tile if flags & ASSIGN else 1, X.dtype)
        best = np.empty(tile, X.dtype)
        idx = np.empty(tile, np.int32)
        for t in range(p, n_tasks, workers):
            _task_wide(X, Xc, mean, w, g, cn, c64, labels, labels_old, min_sq, part_sums[t],
                       part_w[t], part_stats[t], flags, t * task_rows,
                       min(n, (t + 1) * task_rows), tile, A, dbuf, best, idx)


@njit(parallel=True, **_OPTS)
def merge_partials(part_sums, part_w, sums, weights):
    """sums, weights = the tasks' partial sums added in task order (parallel over clusters)."""
    n_tasks, k, d = part_sums.shape
    for j in prange(k):
        sums[j] = 0.0
        weights[j] = 0.0
        for t in range(n_tasks):
            for f in range(d):
                sums[j, f] += part_sums[t, j, f]
            weights[j] += part_w[t, j]


@njit(parallel=True, **_OPTS)
def deviation_sums(X, s0, e0, mean64, groups, sq, shift):
    """sq[j], shift[j] = sums over rows [s0, e0) of (x_j - mean_j)^2 and x_j - mean_j in
    float64, each column added row after row from 0: `chunks.deviation_sums`' bits (NumPy's
    reduction over the rows of two columns or more) in one pass, no float64 copy of the
    chunk. groups: (g, 2) column ranges, one per parallel task (a column's sum never splits)."""
    for t in prange(groups.shape[0]):
        j0, j1 = groups[t, 0], groups[t, 1]
        m = j1 - j0
        # the group's sums in arrays of its own, the mean copied: LLVM then sees no store
        # that could change X or the mean and vectorizes over the columns (same adds, same
        # order: 8.5x faster at d=128, 14x at d=8)
        lsq, lshift, mu = np.zeros(m), np.zeros(m), mean64[j0:j1].copy()
        for i in range(s0, e0):
            xr = X[i, j0:j1]
            for j in range(m):
                c = np.float64(xr[j]) - mu[j]
                lsq[j] += c * c
                lshift[j] += c
        sq[j0:j1] = lsq
        shift[j0:j1] = lshift
