"""What a backend returns, checked against the contract before the driver uses it.

A plugin that returns float labels, too few labels, labels out of [0, k), a list, or NaN
sums would otherwise give NaN or wrong centers, or a NumPy error from deep inside `fit`.
The checks of shape and dtype read no data and run on every return; those that read data
(the labels' range, the finiteness of sums) run once per call site of a fit (the first
iteration, the final assignment, a predict), so a fit pays a few small reductions. The error
names the backend, the member that returned the value, and what the contract asks.
"""
from __future__ import annotations

import math

import numpy as np

from kmeans_xp.contract.namespaces import array_namespace, to_numpy


class BackendContractError(RuntimeError):
    """A backend returned something the contract does not allow (docs/plugins.md): the
    message names the backend, its member and what was wrong."""


def member_of(backend, member, part):
    """The member that produced `part` of a `member` call: the default `lloyd_iter` and
    `labels_inertia` pass on what `assign` and `reduce` returned, so those are named."""
    own = getattr(type(backend), member, None)
    if getattr(own, "__qualname__", "") == f"KMeansBackend.{member}":  # the default
        if member == "lloyd_iter":
            return "reduce" if part in ("weighted_sums", "weight_in_clusters") else "assign"
        if member == "labels_inertia":
            return "assign" if part == "labels" else "inertia"
    return member


def _fail(backend, member, part, what):
    raise BackendContractError(
        f"backend {backend.name!r} ({type(backend).__module__}.{type(backend).__qualname__}): "
        f"{member_of(backend, member, part)} returned {part} {what} (see the contract in "
        f"docs/plugins.md; kmeans_xp.testing.check_backend finds such faults)")


def check_array(backend, member, part, a):
    """`a` itself when it is an array (has a shape and a dtype), else the contract error."""
    if not (hasattr(a, "shape") and hasattr(a, "dtype")):
        _fail(backend, member, part, f"as {type(a).__name__}, not an array")
    return a


def _dtype_kind(a):
    """'i', 'u', 'f', 'b', 'c' or '?' for an array of any namespace."""
    dtype = a.dtype
    if isinstance(dtype, np.dtype):
        return dtype.kind
    try:
        xp = array_namespace(a)
        for kind, name in (("b", "bool"), ("i", "signed integer"), ("u", "unsigned integer"),
                           ("f", "real floating"), ("c", "complex floating")):
            if xp.isdtype(dtype, name):
                return kind
    except (TypeError, ValueError, AttributeError):
        pass
    return "?"


def check_labels(backend, member, labels, n, k, *, values=True):
    """labels: an (n,) integer array; with values, all in [0, k) (read: two reductions)."""
    check_array(backend, member, "labels", labels)
    if tuple(labels.shape) != (n,) and not _lazy_rows(labels, n):
        _fail(backend, member, "labels", f"of shape {tuple(labels.shape)}; expected ({n},): "
                                          f"one label per row of X")
    if _dtype_kind(labels) not in "iu":
        _fail(backend, member, "labels", f"of dtype {labels.dtype}; labels are integers "
                                          f"(int32) in [0, {k})")
    if values and n and not _is_lazy(labels):
        _verify(backend, member, _gather(_summaries(labels, []), False), k)
    return labels


def check_label_values(backend, member, labels, k):
    """All of `labels` (any shape: a batch's (problems, n) array) in [0, k): one read."""
    if math.prod(labels.shape) and not _is_lazy(labels):
        _verify(backend, member, _gather(_summaries(labels, []), False), k)


def check_sums(backend, member, sums, weights, k, d, *, values=True):
    """weighted_sums (k, d) and weight_in_clusters (k,), real floating; with values,
    finite (read: one reduction of k * (d + 1) values)."""
    for part, a, shape in (("weighted_sums", sums, (k, d)),
                           ("weight_in_clusters", weights, (k,))):
        check_array(backend, member, part, a)
        if tuple(a.shape) != shape:
            _fail(backend, member, part, f"of shape {tuple(a.shape)}; expected {shape}")
        if _dtype_kind(a) != "f":
            _fail(backend, member, part, f"of dtype {a.dtype}; expected float64")
    if values:   # (a placement may keep the two apart: one read per device)
        _verify(backend, member, _gather(_summaries(None, [sums, weights]), True), k)


def check_iteration(backend, it, n, k, d, *, values=True):
    """One `lloyd_iter`'s IterStats (the driver's and the mini-batch steps'). With values,
    the labels' range and the sums' finiteness are read in one transfer per device (each
    read waits for the device: three of them were a GPU iteration's worth)."""
    if values:
        iteration_check(backend, it, n, k, d)()
    else:
        _check_shapes(backend, it, n, k, d)
    return it


def iteration_check(backend, it, n, k, d, *, fetch=None):
    """`check_iteration` in two steps, for a driver that reads the device only with its
    statistics: the shapes are checked now and the summaries (labels' range, sums' totals)
    queued on the device and copied by `fetch` (a placement's: a function that waits for
    the copy, `Placement.fetch`; default: read now); the function returned waits for them
    and raises on a fault. A read here would wait for the device at a GPU fit's first
    iteration: the pipeline drained before the second pass was issued."""
    _check_shapes(backend, it, n, k, d)
    labels = it.labels if n and not _is_lazy(it.labels) else None
    reads = _summaries(labels, [it.weighted_sums, it.weight_in_clusters], fetch)
    return lambda: _verify(backend, "lloyd_iter", _gather(reads, labels is None), k)


def _check_shapes(backend, it, n, k, d):
    check_labels(backend, "lloyd_iter", it.labels, n, k, values=False)
    check_sums(backend, "lloyd_iter", it.weighted_sums, it.weight_in_clusters, k, d,
               values=False)


def _summaries(labels, arrays, fetch=None):
    """[(positions, a function giving their float64 values)]: min(labels), max(labels) and
    the sum of each array, reduced where they live, one copy per namespace and device
    (`fetch`, default: now)."""
    from kmeans_xp.contract.namespaces import device
    items = ([] if labels is None else [("min", labels), ("max", labels)]) + [
        ("sum", a) for a in arrays]
    groups = {}
    for i, (how, a) in enumerate(items):
        xp = array_namespace(a)
        groups.setdefault((id(xp), str(device(a))), (xp, []))[1].append((i, how, a))
    out = []
    for xp, members in groups.values():
        # (reduced in their own dtype, the 0-d result made float64: no copy of n labels)
        vals = xp.stack([xp.astype(getattr(xp, how)(xp.astype(a, xp.float64) if how == "sum"
                                                    else a), xp.float64)
                         for _, how, a in members])
        read = fetch(vals) if fetch is not None else (lambda v=to_numpy(vals): v)
        out.append(([i for i, _, _ in members], read))
    return out


def _verify(backend, member, read, k):
    """Raise on a fault in `_gather`'s values: labels outside [0, k) (NaN: none read), a
    sum (weighted_sums, then weight_in_clusters) not finite."""
    lo, hi = read[0], read[1]
    if not math.isnan(lo) and (lo < 0 or hi >= k):
        _fail(backend, member, "labels",
              f"from {int(lo)} to {int(hi)}; labels are in [0, {k})")
    for part, total in zip(("weighted_sums", "weight_in_clusters"), read[2:]):
        if not math.isfinite(total):
            _fail(backend, member, part, "with NaN or infinity")


def _gather(reads, no_labels):
    """The values of `_summaries`, in item order ([NaN, NaN] first without labels)."""
    out = [math.nan] * sum(len(pos) for pos, _ in reads)
    for pos, read in reads:
        for i, v in zip(pos, np.asarray(read()).tolist()):
            out[i] = v
    return ([math.nan, math.nan] if no_labels else []) + out


def check_statistic(backend, member, part, value):
    """A 0-d statistic read on the host (inertia, shift): a finite number."""
    v = float(value)
    if not math.isfinite(v):
        _fail(backend, member, part, f"{v}: not a finite number")
    return v


def check_run(backend, result, n, k, d):
    """A backend's own whole run (`KMeansBackend.lloyd`): its labels, centers, inertia."""
    check_labels(backend, "lloyd", result.labels, n, k)
    c = check_array(backend, "lloyd", "centers", result.centers)
    if tuple(c.shape) != (k, d):
        _fail(backend, "lloyd", "centers", f"of shape {tuple(c.shape)}; expected {(k, d)}")
    if not np.all(np.isfinite(to_numpy(c))):
        _fail(backend, "lloyd", "centers", "with NaN or infinity")
    check_statistic(backend, "lloyd", "inertia", result.inertia)
    return result


def assigned_labels(backend, X, centers, xp):
    """`backend.assign`'s labels of X against centers, checked (predict, partial_fit)."""
    labels = backend.assign(X, centers, xp=xp).labels
    return check_labels(backend, "assign", labels, int(X.shape[0]), int(centers.shape[0]))


def check_read(backend, shift, inertia):
    """The driver's per-iteration read: a NaN or infinite center shift comes from the sums,
    an infinite inertia from the distances (read anyway: no extra cost)."""
    if not math.isfinite(float(shift)):
        _fail(backend, "lloyd_iter", "weighted_sums", "that make NaN or infinite centers")
    if not math.isfinite(float(inertia)):
        _fail(backend, "lloyd_iter", "min_sq_dist", f"summing to {float(inertia)}")


def _is_lazy(a):
    return type(a).__module__.startswith("dask")


def _lazy_rows(a, n):
    """A lazy array (dask) whose row count is not known until computed: not checked."""
    rows = a.shape[0] if len(a.shape) == 1 else None
    return rows is None or rows != rows
