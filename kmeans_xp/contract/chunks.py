"""Row chunks, and the small xp reductions over them that the driver, init and the backends'
defaults share (so O(n) work never builds more than one chunk's temporaries): the column
statistics the fit centers X with and stops on (scikit-learn's tol), the labelled distances
of inertia and relocation, weighted totals and changed-label counts."""
from __future__ import annotations

import os
import threading

import numpy as np
from array_api_compat import is_numpy_namespace

from kmeans_xp.contract.namespaces import device, operand, to_numpy
from kmeans_xp.contract.threads import ThreadPool

#: fewest rows a thread of `map_rows` gets (below that, threads cost more than they give)
MIN_THREAD_ROWS = 8192
_pool = None
_pool_lock = threading.Lock()


def row_chunks(n, rows):
    for start in range(0, n, rows):
        yield slice(start, min(start + rows, n))


def usable_cores() -> int:
    """The cores this process may run on (its affinity; all of them where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def _shared_pool():
    """The process's pool of one thread per core (made at first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPool(usable_cores(), "kmeans_xp-rows")
        return _pool


def _after_fork():
    """In a forked child the pool's threads are gone: the next use makes a new pool."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def map_rows(fn, n, rows, xp, min_rows=MIN_THREAD_ROWS):
    """[fn(slice) for each chunk of rows], in row order. On NumPy the chunks run on all cores
    (its ufuncs release the GIL on large arrays), each thread holding at most rows / threads
    rows (and at least min_rows), so the memory bound of `rows` still holds; other namespaces
    run them in turn (a GPU queues them; dask builds one graph)."""
    threads = usable_cores() if is_numpy_namespace(xp) else 1
    if threads == 1 or n < 2 * min_rows:
        return [fn(sl) for sl in row_chunks(n, rows)]
    step = max(min_rows, min(rows // threads, -(-n // (4 * threads))))
    return list(_shared_pool().map(fn, row_chunks(n, step)))


def imap_rows(fn, n, rows, xp):
    """`map_rows`'s results one at a time, in row order, so that the caller folds each as
    it comes (a chunk's result is held only until the caller takes it)."""
    threads = usable_cores() if is_numpy_namespace(xp) else 1
    if threads == 1 or n < 2 * MIN_THREAD_ROWS:
        yield from (fn(sl) for sl in row_chunks(n, rows))
        return
    step = max(MIN_THREAD_ROWS, min(rows // threads, -(-n // (4 * threads))))
    yield from _shared_pool().map(fn, row_chunks(n, step))


def spawn(job, count):
    """[job(0), ..., job(count - 1)] on `map_rows`'s pool (NumPy work of the CPU backends
    outside their own passes); jobs beyond its threads wait for one. The pool starts them
    first in, first out, so a job may wait on jobs of a lower index (started before it:
    running or done), never on a later one."""
    if count <= 1:
        return [job(0)]
    return list(_shared_pool().map(job, range(count)))


def labelled_sq_dist(X, centers, labels, xp, rows):
    """Yield (rows slice, ||x - c_label||^2) chunk by chunk, by differences."""
    for sl in row_chunks(X.shape[0], rows):
        yield sl, sq_dist_to_labels(X[sl, ...], centers, labels[sl], xp)


def sq_dist_to_labels(rows, centers, labels, xp):
    """||x - c_label||^2 of `rows` in their dtype, by differences (a row's value does not
    depend on which rows come with it)."""
    diff = rows - xp.take(centers, labels, axis=0)
    return xp.sum(diff * diff, axis=1)


def weighted_total(values, weights, xp):
    """0-d float64 sum of values * weights (weights None: unit)."""
    v = xp.astype(values, xp.float64)
    if weights is None:
        return xp.sum(v)
    return xp.sum(v * xp.astype(weights, xp.float64))


def count_changed(labels, labels_old, xp):
    """0-d float64 number of positions where labels differ (all n when there is no old)."""
    if labels_old is None:
        return xp.asarray(float(labels.shape[0]), dtype=xp.float64, device=device(labels))
    return xp.astype(xp.sum(xp.astype(labels != labels_old, xp.int64)), xp.float64)


#: row blocks of `column_sums`: a GPU reduction over one long axis with d outputs runs on d
#: thread blocks (30 ms for 20M x 3 on an H200, where reading X takes 0.1 ms)
COLUMN_BLOCKS = 1024


def column_sums(A, xp):
    """(d,) float64 sums over the rows of A, cast inside the reduction (no float64 copy of
    A). NumPy adds the rows in order in one pass; elsewhere (a GPU) per block of rows, then
    over the blocks, each a reduction with many outputs. (NumPy's reduction over the middle
    axis of the blocks is the slow one: k-means++'s potentials took 24 s instead of 14.)"""
    n, d = A.shape
    r = n // COLUMN_BLOCKS
    if r < 2 or is_numpy_namespace(xp) or not c_contiguous(A):
        # (the blocks of a strided A would be a copy of it)
        return xp.sum(A, axis=0, dtype=xp.float64)
    m = COLUMN_BLOCKS * r
    blocks = xp.sum(xp.reshape(A[:m, ...], (COLUMN_BLOCKS, r, d)), axis=1, dtype=xp.float64)
    total = xp.sum(blocks, axis=0)
    return total if m == n else total + xp.sum(A[m:, ...], axis=0, dtype=xp.float64)


def c_contiguous(A, unknown=True) -> bool:
    """Whether A says it is C-contiguous (NumPy/CuPy flags, torch's is_contiguous);
    `unknown` where it does not say."""
    flags = getattr(A, "flags", None)
    if flags is not None and hasattr(flags, "c_contiguous"):
        return bool(flags.c_contiguous)
    is_contiguous = getattr(A, "is_contiguous", None)  # torch
    return bool(is_contiguous()) if callable(is_contiguous) else unknown


def deviation_sums(rows, mean64, xp):
    """(sum of (x - mean)^2, sum of x - mean) per feature of `rows`, in float64: `tolerance`'s
    sums of one chunk."""
    c = xp.astype(rows, xp.float64) - mean64
    return column_sums(c * c, xp), column_sums(c, xp)


def feature_mean(X, xp):
    """Per-feature mean: X's float64 `column_sums` divided by n, then cast to X's dtype, so
    every backend centers X the same way."""
    return mean_of_sums(column_sums(X, xp), X.shape[0], X.dtype, xp)


def inertia_of_sums(sq_norm_total, centers, sums, weights) -> float:
    """sum_i w_i ||x_i - c_label(i)||^2 = sum w ||x||^2 - 2 sum_j c_j.S_j + sum_j W_j ||c_j||^2
    in float64, from the per-cluster sums S and weights W (NumPy arrays) and the rows'
    sum w ||x||^2: an iteration's inertia without a second loop over X. At least 0 (a sum
    of squares, whatever the rounding)."""
    c = np.asarray(centers, dtype=np.float64)
    S, W = np.asarray(sums, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    total = sq_norm_total - 2.0 * float(np.einsum("ij,ij->", c, S)) + float(
        W @ np.einsum("ij,ij->i", c, c))
    return max(total, 0.0)


def mean_of_sums(sums, n, dtype, xp):
    """The mean of `feature_mean` from X's float64 column sums."""
    return xp.astype(sums / operand(n, sums, xp), dtype)


def tolerance(X, mean, tol, xp, rows, chunk_sums=None) -> float:
    """scikit-learn's tol: absolute, tol times the mean per-feature variance of X. The
    variance is of X - mean in float64 (two-pass), so an offset in float32 X cannot inflate
    it (np.var of float32 X at a 1e6 offset is 68x too large). chunk_sums(slice, mean64):
    a chunk's `deviation_sums`, computed elsewhere (the numpy backend's threads)."""
    if tol == 0:
        return 0.0
    mean64 = xp.astype(mean, xp.float64)
    sq = shift = None
    for sl in row_chunks(X.shape[0], rows):
        a, b = (deviation_sums(X[sl, ...], mean64, xp) if chunk_sums is None
                else chunk_sums(sl, mean64))
        sq, shift = (a, b) if sq is None else (sq + a, shift + b)
    n = operand(X.shape[0], sq, xp)
    rounding = shift / n
    var = sq / n - rounding * rounding   # the mean's rounding, removed
    return tol_from_variances(var, tol)


def tol_from_variances(variances, tol) -> float:
    """scikit-learn's absolute tol from X's per-feature variances (any namespace): their mean
    times `tol`. The one place the formula lives: every backend that computes the variances
    its own way (a streamed pass, dask's blocks, a kernel) hands them here. The d values are
    averaged on the host: a GPU library's first full reduction compiles for seconds."""
    if tol == 0:
        return 0.0
    return float(np.mean(to_numpy(variances))) * tol
