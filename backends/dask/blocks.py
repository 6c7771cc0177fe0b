"""What runs on the workers: one row block of X on its local backend.

Each function here takes NumPy or CuPy blocks and returns small NumPy results (or per-sample
blocks that stay where they were made). They are module level so they pickle by reference,
and they import nothing from the client side of the package. The local backend of a block is
the numpy backend on NumPy blocks and the first of `CUPY_BLOCK_BACKENDS` installed on CuPy
blocks (or the `block_backend` option), one per worker thread, kept between calls.

An iteration's statistics of a block travel as one float64 vector, `stats`:
``[weighted sums (k*d), weights (k), inertia, changed labels]``. Every entry adds up across
blocks, so the fit's statistics are the element-wise sum of the blocks' vectors, in block
order, whoever adds them (the client, a tree of tasks, or the actors' caller).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from kmeans_xp.contract.backend import LABELS_DTYPE, farthest_order
from kmeans_xp.contract.namespaces import to_numpy

#: local backends tried, in order, on CuPy blocks
CUPY_BLOCK_BACKENDS = ("cupy-fused", "cupy-chunked", "cupy-kernels")


# -- what a block is ---------------------------------------------------------------------------
def block_kind(X) -> str:
    """'numpy', 'cupy' or the module of a dask array's blocks, read from its meta (no
    compute)."""
    meta = getattr(X, "_meta", None)
    if isinstance(meta, np.ndarray):
        return "numpy"
    return type(meta).__module__.split(".")[0]


def cupy():
    import cupy as cp
    return cp


def like_block(a, kind):
    """A small host (or device) array as the block library's array."""
    if a is None:
        return None
    return cupy().asarray(a) if kind == "cupy" else to_numpy(a)


def block_meta(kind, dtype, ndim=1):
    """An empty array of the blocks' library (a dask array's meta)."""
    shape = (0,) * ndim
    return cupy().empty(shape, dtype=dtype) if kind == "cupy" else np.empty(shape, dtype=dtype)


def block_xp(xb):
    from array_api_compat import array_namespace
    return array_namespace(xb)


def sync_device(kind):
    if kind == "cupy":
        cupy().cuda.Device().synchronize()


def worker_name():
    try:
        from distributed import get_worker
        return get_worker().address
    except Exception:  # not on a distributed worker (local scheduler)
        return threading.current_thread().name


# -- the local backend -------------------------------------------------------------------------
_local = threading.local()


def local_backend(spec):
    """The backend computing blocks on this worker thread for `spec` = (kind, backend name
    or None, max_memory), cached per thread (CuPy backends keep chunk buffers and compiled
    kernels between iterations)."""
    cache = getattr(_local, "cache", None)
    if cache is None:
        cache = _local.cache = {}
    backend = cache.get(spec)
    if backend is None:
        from kmeans_xp.contract.registry import get_backend
        kind, name, max_memory = spec
        name = name or ("numpy" if kind == "numpy" else first_cupy_backend())
        options = {"n_threads": 1} if name == "numpy" else {}
        backend = cache[spec] = get_backend(name)(max_memory=max_memory, **options)
    return backend


def first_cupy_backend():
    from kmeans_xp.contract.registry import available_backends
    have = available_backends()
    for name in CUPY_BLOCK_BACKENDS:
        if name in have:
            return name
    raise RuntimeError(f"X has CuPy blocks but no CuPy backend is available on this worker "
                       f"(tried {list(CUPY_BLOCK_BACKENDS)}; installed: {have}). Install "
                       f"kmeans_xp[cuda12] (or [cuda13]) on the workers.")


def _operands(xb, wb, centers, labels, kind):
    """The block's weights, centers (X's dtype) and labels in the block's library."""
    c = like_block(centers, kind)
    if c.dtype != xb.dtype:
        c = c.astype(xb.dtype)
    if isinstance(labels, tuple):   # a block result of the last iteration: its labels
        labels = labels[0]
    if kind == "cupy":              # no copy for CuPy blocks (persisted as CuPy already)
        wb, labels = like_block(wb, kind), like_block(labels, kind)
    return wb, c, labels


def as_user_labels(labels):
    """A block's labels as the user gets them: int32 (`kmeans_xp.contract.backend`'s "Labels")."""
    return labels if labels.dtype == LABELS_DTYPE else labels.astype(LABELS_DTYPE)


def _timed(spec, timed, fn):
    """fn() and, with `timed`, the block's own wall time with the device synchronised before
    and after (start/stop on this host's clock, seconds inside)."""
    if not timed:
        return fn(), None
    sync_device(spec[0])
    start, t0 = time.time(), time.perf_counter()
    out = fn()
    sync_device(spec[0])
    return out, {"worker": worker_name(), "start": start, "stop": time.time(),
                 "seconds": time.perf_counter() - t0}


# -- the tasks ---------------------------------------------------------------------------------
def stats_vector(it, kind):
    """An IterStats' numbers as one float64 vector in the block's library (`stats` above)."""
    if kind == "cupy":
        cp = cupy()
        return cp.concatenate([cp.asarray(a, dtype=cp.float64).reshape(-1) for a in (
            it.weighted_sums, it.weight_in_clusters, it.inertia, it.n_changed)])
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in (
        it.weighted_sums, it.weight_in_clusters, it.inertia, it.n_changed)])


def iterate_step(xb, wb, centers, labels_old, spec, timed=False):
    """(labels, stats on the block's device, timing or None) of one Lloyd iteration
    on one block: the local backend's `lloyd_iter`, the changed labels counted against the
    block's last labels (all of them without)."""
    kind = spec[0]

    def run():
        w, c, old = _operands(xb, wb, centers, labels_old, kind)
        it = local_backend(spec).lloyd_iter(xb, w, c, old, xp=block_xp(xb))
        return it.labels, stats_vector(it, kind)

    (labels, stats), info = _timed(spec, timed, run)
    if info is not None:
        info["rows"] = int(xb.shape[0])
    return labels, stats, info


def iterate_block(xb, wb, labels_old, centers, spec, timed=False):
    """A graph task: (labels, stats as float64 NumPy, timing or None); the labels stay where
    the block is (in the local backend's integer type, as the next iteration takes them;
    `labels_out` hands them out as int32), the k x d stats travel."""
    labels, stats, info = iterate_step(xb, wb, centers, labels_old, spec, timed)
    return labels, to_numpy(stats), info


def assign_block(xb, centers, spec, timed=False):
    """A graph task: (labels, min_sq_dist in X's dtype, timing or None)."""
    def run():
        _, c, _ = _operands(xb, None, centers, None, spec[0])
        labels, min_sq = local_backend(spec).assign(xb, c, xp=block_xp(xb))
        return labels, (min_sq if min_sq.dtype == xb.dtype else
                                  min_sq.astype(xb.dtype))

    (labels, min_sq), info = _timed(spec, timed, run)
    return labels, min_sq, info


def reduce_block(xb, wb, lb, n_clusters, spec):
    """A graph task: the block's [sums (k*d), weights (k)] as one float64 vector."""
    w, _, lab = _operands(xb, wb, np.empty((0, xb.shape[1]), dtype=xb.dtype), lb, spec[0])
    sums, weights = local_backend(spec).reduce(xb, lab, w, n_clusters, xp=block_xp(xb))
    return np.concatenate([np.asarray(to_numpy(sums), dtype=np.float64).reshape(-1),
                           np.asarray(to_numpy(weights), dtype=np.float64)])


def inertia_step(xb, wb, centers, labels, spec):
    """0-d float64 (on the block's device) sum of w * ||x - c_label||^2 by differences."""
    w, c, lab = _operands(xb, wb, centers, labels, spec[0])
    return local_backend(spec).inertia(xb, w, c, lab, xp=block_xp(xb))


def inertia_block(xb, wb, labels, centers, spec):
    """A graph task: the block's inertia as a float64 NumPy vector of one."""
    return np.asarray(to_numpy(inertia_step(xb, wb, centers, labels, spec)),
                      dtype=np.float64).reshape(1)


def farthest_block(xb, wb, labels, centers, m, offset, spec):
    """A graph task: the block's own m farthest points (the local backend's `farthest`), as
    NumPy (index in X, x, weight, label, sq_dist); the m farthest of X are among the
    blocks' m farthest (see `merge_farthest`)."""
    w, c, lab = _operands(xb, wb, centers, labels, spec[0])
    far = local_backend(spec).farthest(xb, w, c, lab, min(int(m), xb.shape[0]),
                                       xp=block_xp(xb))
    idx, x, weight, label, dist = (to_numpy(a) for a in far)
    return (idx.astype(np.int64) + int(offset), np.asarray(x), weight.astype(np.float64),
            label.astype(np.int64), dist.astype(np.float64))


def merge_farthest(parts, m):
    """The m farthest of the blocks' candidates: distance descending, lower index first
    among equals (the order `Farthest` defines)."""
    idx, x, weight, label, dist = (np.concatenate([p[j] for p in parts]) for j in range(5))
    order = farthest_order(idx, dist, m)
    return idx[order], x[order], weight[order], label[order], dist[order]


def add_vectors(parts):
    """The element-wise sum of float64 vectors, in list order."""
    total = np.array(parts[0], dtype=np.float64, copy=True)
    for p in parts[1:]:
        total += p
    return total


def running_sum_block(xb, running):
    """`running` plus the block's rows in float64, added one after the other in row order
    (NumPy reduces a C-ordered axis 0 row by row): chained block after block, the sum of X
    in row order whatever its chunks, as NumPy sums X in one piece."""
    xp = block_xp(xb)
    kind = "cupy" if type(xb).__module__.startswith("cupy") else "numpy"
    first = xp.reshape(like_block(np.asarray(running, dtype=np.float64), kind), (1, -1))
    return np.asarray(to_numpy(xp.sum(xp.concat([first, xp.astype(xb, xp.float64)]), axis=0)))


def moments_block(xb, mean):
    """[sum (x - mean)^2, sum (x - mean)] per feature, float64 (the tolerance's variance)."""
    xp = block_xp(xb)
    kind = "cupy" if type(xb).__module__.startswith("cupy") else "numpy"
    c = xp.astype(xb, xp.float64) - like_block(np.asarray(mean, dtype=np.float64), kind)
    return np.concatenate([np.asarray(to_numpy(xp.sum(c * c, axis=0))),
                           np.asarray(to_numpy(xp.sum(c, axis=0)))])


def labels_out(result):
    """The labels of a block task's result as int32 (the labels arrays' blocks)."""
    return as_user_labels(result[0])


def take(result, index):
    """One item of a block task's result (a task of its own, on the block's worker)."""
    return result[index]


def same(block):
    """The block itself (an alias task: X's blocks under another array's keys)."""
    return block


def empty_rows(kind, dtype, rest):
    """A 0-row block of the library `kind` (restores X's empty blocks in per-sample results)."""
    return cupy().empty((0, *rest), dtype=dtype) if kind == "cupy" else np.empty(
        (0, *rest), dtype=dtype)


def second(xb, ab):
    """`ab`, computed where X's block `xb` lives (places a per-sample block next to X's)."""
    return ab


def center_block(xb, mean):
    """The block minus the feature mean (in X's dtype, in the block's library)."""
    m = like_block(mean, "cupy" if type(xb).__module__.startswith("cupy") else "numpy")
    return xb - (m if m.dtype == xb.dtype else m.astype(xb.dtype))


def checked_block(xb):
    """(the block, its max |x| as a (1, 1) float64 NumPy array), after the core's NaN/inf
    check (its error message, raised on the worker and re-raised on the client): one read
    of the block gives both."""
    from kmeans_xp.contract.finite import check_finite
    return xb, np.full((1, 1), check_finite(xb, block_xp(xb), "X"))


def block_absmax(xb):
    """The block's max |x| as a (1, 1) array, after the NaN/inf check."""
    return checked_block(xb)[1]


def center_scale_block(xb, mean, scale):
    """(block - mean) * scale in X's dtype: centered as `center_block`, then multiplied by a
    power of two (exact), in one task."""
    c = center_block(xb, mean)
    c *= c.dtype.type(scale)
    return c


def unit_rows_block(xb, block_info=None):
    """The block's rows at unit L2 norm (`kmeans_xp.contract.sphere.unit_rows`): a row of norm 0
    raises ZeroNormError on the worker, numbered as a row of X."""
    from kmeans_xp.contract.sphere import unit_rows
    first = block_info[0]["array-location"][0][0] if block_info else 0
    return unit_rows(xb, block_xp(xb), xb.shape[0], first_row=first)
