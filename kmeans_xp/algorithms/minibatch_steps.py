"""The mini-batch driver: scikit-learn's MiniBatchKMeans steps, written once, for every backend.

A step assigns one batch of rows to the centers and moves each center towards the mean of its
rows with a per-center learning rate (1 / the weight it has seen: `counts`); every 10 * k
rows seen, or while a center has seen nothing, centers whose count is below
`reassignment_ratio` times the largest move to random rows of the batch; `MiniBatchKMeans.fit`
stops on the center shift (tol) or when the exponentially weighted average (EWA) of the batch
inertia has not improved for `max_no_improvement` steps. The random numbers are drawn from
the same `RandomState` in scikit-learn's order, so the same seed and the same initial centers
give scikit-learn's steps.

The heavy work of a step is the backend's `lloyd_iter` on the batch (labels, per-cluster
sums and weights, inertia: one pass); the k-sized update runs in xp where the centers live.
Rows are gathered where X is (its device, the host for NumPy and memmap X, the client for
dask X) and only the batch moves to the backend: X is never copied or centered whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kmeans_xp.contract import return_checks as returned
from kmeans_xp.contract.chunks import column_sums, map_rows, tolerance
from kmeans_xp.contract.namespaces import DLPACK_FOREIGN, array_namespace, device, namespace_name, to_numpy
from kmeans_xp.algorithms.progress import logger
from kmeans_xp.contract.scaling import host_dtype_of, rescaled
from kmeans_xp.contract.sparse import dense_module, is_sparse

#: rows of the weights turned into float64 probabilities at a time (bounded host memory)
CDF_CHUNK = 1 << 22


def _is_dask(X) -> bool:
    return namespace_name(X) == "dask.array"


class BatchRows:
    """The rows of X (as the user gave it, validated) at drawn indices, centered by `shift`
    and scaled by `scale` (the fit's `NumericGuard` power of two), on the backend's device. X already in the backend's namespace is gathered there (a CuPy X
    on its GPU); other X (NumPy, memmap, dask) is gathered where it is and only the batch is
    moved (`placement.to_backend`)."""

    def __init__(self, X, backend, shift=None, scale=1.0):
        self.place = place = backend.placement
        ns = namespace_name(X)
        if ns in DLPACK_FOREIGN and place.converts_from(ns, X):
            X = place.to_backend(X)  # a torch or JAX array shared through DLPack, no copy
        self.X, self.backend = X, backend
        self.local = namespace_name(X) in backend.namespaces
        self.sparse = is_sparse(X)   # batches are CSR rows, seen shifted (`SparseRows`)
        # indices are made where the rows are gathered: on X's device for a device X
        on_device = (self.local and not isinstance(X, np.ndarray) and not _is_dask(X)
                     and not self.sparse)
        self.index_xp = array_namespace(X if on_device else np.empty(0))
        self.index_device = device(X) if on_device else None
        self.shift = shift          # (d,) in X's dtype, host (NumPy)
        self._shift_b = None        # the same on the backend's device
        self.scale = scale          # the guard's power of two (exact)

    @property
    def n(self):
        return int(self.X.shape[0])

    def raw(self, idx):
        """X's rows at idx, uncentered: in X's namespace when it is the backend's, else NumPy
        (a dask X's rows computed on the client)."""
        X = self.X
        if self.sparse:
            return X[dense_module(X).asarray(to_numpy(idx))]
        if _is_dask(X):
            return np.asarray(to_numpy(X[to_numpy(idx)]))
        if isinstance(X, np.ndarray):
            # a memmap reads only these rows (and gives a plain array, not a memmap)
            return np.take(np.asarray(X), to_numpy(idx), axis=0)
        idx = self.index_xp.asarray(idx, device=self.index_device)
        return self.index_xp.take(X, idx, axis=0)

    def batch(self, idx):
        """(X[idx] - shift on the backend's device, its namespace)."""
        rows = self.raw(idx)
        if not self.local:
            rows = self.place.to_backend(rows)
        xp = self.place.namespace(rows)
        if self.sparse:
            return self.place.center(rows, self.shift, xp=xp), xp
        if self._shift_b is None:
            self._shift_b = xp.asarray(self.shift, dtype=rows.dtype, device=device(rows))
        if rows is not self.X and namespace_name(rows) in ("numpy", "cupy"):
            rows -= self._shift_b   # a gathered copy of our own
        else:
            rows = rows - self._shift_b
        return (rows if self.scale == 1 else rescaled(rows, self.scale, xp)), xp

    def slices(self, rows):
        """Yield (slice, centered rows on the backend's device, namespace) over all of X."""
        for start in range(0, self.n, rows):
            sl = slice(start, min(start + rows, self.n))
            part = self.X[sl, ...]
            if self.sparse:
                part = self.place.to_backend(part)
                xp = self.place.namespace(part)
                yield sl, self.place.center(part, self.shift, xp=xp), xp
                continue
            if _is_dask(part):
                part = np.asarray(to_numpy(part))
            if not self.local or _is_dask(self.X):
                part = self.place.to_backend(np.ascontiguousarray(part))
            xp = self.place.namespace(part)
            shift = xp.asarray(self.shift, dtype=part.dtype, device=device(part))
            part = part - shift
            yield sl, (part if self.scale == 1 else rescaled(part, self.scale, xp)), xp


class BatchDraws:
    """scikit-learn's draw of a batch: ``RandomState.choice(n, b, p=w / w.sum())``, which is
    ``random_sample(b)`` searched in the cumulative of p. sklearn rebuilds that cumulative
    (O(n)) every step; here it is built once, the same bits (a sequential float64 cumulative
    of p in X's dtype, divided by its last value), and searched where the rows are gathered."""

    def __init__(self, sample_weight, n, dtype, xp, dev):
        dtype = np.dtype(host_dtype_of(dtype))
        cdf = np.empty(n, dtype=np.float64)
        if sample_weight is None:
            # np.sum of n ones: exact but for float32 past 2**24 (then summed as NumPy does)
            total = (np.float64(n) if dtype == np.float64 or n <= 1 << 24
                     else np.sum(np.ones(n, dtype=dtype)))
            q = np.float64(dtype.type(1) / dtype.type(total))
        else:
            total = np.sum(sample_weight)
        carry = 0.0
        for start in range(0, n, CDF_CHUNK):
            stop = min(start + CDF_CHUNK, n)
            part = cdf[start:stop]
            if sample_weight is None:
                part.fill(q)
            else:
                np.copyto(part, sample_weight[start:stop] / total, casting="unsafe")
            part[0] += carry    # the next addition of one running sum
            np.cumsum(part, out=part)
            carry = part[-1]
        cdf /= cdf[-1]
        self.xp, self.dev = xp, dev
        self.cdf = cdf if dev is None else xp.asarray(cdf, device=dev)

    def indices(self, random_state, size):
        u = random_state.random_sample(size)
        if self.dev is None:
            # on all cores: each search is a chain of cache misses in an n-long array
            parts = map_rows(lambda sl: np.searchsorted(self.cdf, u[sl], side="right"), size,
                             size, self.xp)
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        return self.xp.searchsorted(self.cdf, self.xp.asarray(u, device=self.dev), side="right")


@dataclass
class StepState:
    """What the steps carry from one to the next (an estimator keeps it between partial_fit
    calls): the centers (centered, X's dtype) and counts (X's dtype) where the driver's center
    math runs, and sklearn's reassignment and early-stopping counters."""
    centers: Any
    counts: Any
    n_since_last_reassign: int = 0
    #: the host knows every count is > 0 (counts never decrease, so it stays known)
    counts_positive: bool = False
    ewa_inertia: float | None = None
    ewa_inertia_min: float | None = None
    no_improvement: int = 0
    history: dict = field(default_factory=lambda: {"batch_inertia": [], "ewa_inertia": []})

    def random_reassign(self, batch_size, n_clusters):
        """sklearn's `_random_reassign`: every 10 * k rows seen, and at every step while some
        center has seen nothing."""
        self.n_since_last_reassign += batch_size
        if not self.counts_positive:
            self.counts_positive = bool(np.all(to_numpy(self.counts) > 0))
        if not self.counts_positive or self.n_since_last_reassign >= 10 * n_clusters:
            self.n_since_last_reassign = 0
            return True
        return False


def _f64(a, xp):
    return a if a.dtype == xp.float64 else xp.astype(a, xp.float64)


def step(backend, Xb, xp, sample_weight, state, random_state, *, reassign, reassignment_ratio,
         verbose=0, check=True):
    """One mini-batch step on Xb (centered, on the backend's device): the centers and counts
    of `state` are replaced. Returns the batch's inertia (0-d float64, before the update).
    `check`: the backend's statistics are checked against the contract (`return_checks`)
    in full; else their shapes only."""
    place = backend.placement
    centers, counts = state.centers, state.counts
    cxp = place.namespace(centers)
    it = returned.check_iteration(backend, backend.lloyd_iter(Xb, sample_weight, centers, None,
                                                              xp=xp),
                                  Xb.shape[0], centers.shape[0], Xb.shape[1], values=check)
    sums, weights, inertia = it.weighted_sums, it.weight_in_clusters, it.inertia
    if array_namespace(sums) is not cxp:
        sums, weights, inertia = _statistics_to(centers, place, sums, weights, inertia)
    dtype = centers.dtype
    counts64 = _f64(counts, cxp)
    seen = counts64 + weights
    filled = weights > 0
    # sklearn's update, c * count + sum(w x) over the new count, in float64 then X's dtype
    moved = (_f64(centers, cxp) * counts64[:, None] + sums) / cxp.where(
        filled, seen, cxp.ones_like(seen))[:, None]
    centers = cxp.where(filled[:, None], cxp.astype(moved, dtype), centers)
    counts = cxp.where(filled, cxp.astype(seen, dtype), counts)
    if reassign and reassignment_ratio > 0:
        centers, counts, state.counts_positive = _reassign(
            Xb, xp, centers, counts, random_state, reassignment_ratio, cxp, place, verbose)
    state.centers, state.counts = place.persist(centers), place.persist(counts)
    return inertia


def _statistics_to(centers, place, sums, weights, inertia):
    """(sums, weights, inertia) where the centers are: to host centers in ONE transfer (each
    read of a device array waits for the device: three of them per step were a tenth of a
    GPU step), else through the placement."""
    if not isinstance(centers, np.ndarray):
        return place.small(sums), place.small(weights), inertia
    sxp = array_namespace(sums)
    k, d = sums.shape
    flat = to_numpy(sxp.concat([sxp.reshape(sums, (k * d,)), _f64(weights, sxp),
                                sxp.reshape(_f64(sxp.asarray(inertia), sxp), (1,))]))
    return flat[:k * d].reshape(k, d), flat[k * d:k * d + k], flat[k * d + k]


def _reassign(Xb, xp, centers, counts, random_state, ratio, cxp, place, verbose):
    """sklearn's random reassignment, decided on the host (k counts) with NumPy's own
    comparisons and argsort, so the same centers move and the same random numbers are
    drawn: the permutation is drawn only when some center moves."""
    host = np.array(to_numpy(counts))
    b = Xb.shape[0]
    to_reassign = host < ratio * host.max()
    if to_reassign.sum() > 0.5 * b:
        to_reassign[np.argsort(host)[int(0.5 * b):]] = False
    n_reassigns = int(to_reassign.sum())
    if n_reassigns:
        picked = random_state.choice(b, replace=False, size=n_reassigns)
        if verbose:
            logger.info(f"[MiniBatchKMeans] Reassigning {n_reassigns} cluster centers.")
        source = np.zeros(host.shape[0], dtype=np.int64)
        source[to_reassign] = picked
        rows = xp.take(Xb, xp.asarray(source, device=device(Xb)), axis=0)
        rows = place.small(xp.astype(rows, centers.dtype))
        mask = cxp.asarray(to_reassign, device=device(centers))
        centers = cxp.where(mask[:, None], rows, centers)
    # the reassigned centers keep a count, so they are not reassigned again at once
    host[to_reassign] = np.min(host[~to_reassign])
    return centers, cxp.asarray(host, device=device(counts)), bool(np.all(host > 0))


class EwaConvergence:
    """sklearn's `_mini_batch_convergence`: the batch inertia per row, smoothed by an
    exponentially weighted average; stop when the center shift is <= tol (tol > 0), or when
    the average has not improved for max_no_improvement steps. The first step is skipped:
    its inertia is the initialisation's."""

    def __init__(self, state, batch_size, n_samples, tol, max_no_improvement, verbose=0):
        self.state, self.batch_size, self.n_samples = state, batch_size, n_samples
        self.tol, self.max_no_improvement, self.verbose = tol, max_no_improvement, verbose

    def converged(self, i, n_steps, shift, batch_inertia):
        s = self.state
        batch_inertia /= self.batch_size
        i += 1
        s.history["batch_inertia"].append(batch_inertia)
        if i == 1:
            if self.verbose:
                logger.info(f"Minibatch step {i}/{n_steps}: mean batch inertia: {batch_inertia}")
            s.history["ewa_inertia"].append(None)
            return False
        if s.ewa_inertia is None:
            s.ewa_inertia = batch_inertia
        else:
            alpha = min(self.batch_size * 2.0 / (self.n_samples + 1), 1)
            s.ewa_inertia = s.ewa_inertia * (1 - alpha) + batch_inertia * alpha
        s.history["ewa_inertia"].append(s.ewa_inertia)
        if self.verbose:
            logger.info(f"Minibatch step {i}/{n_steps}: mean batch inertia: {batch_inertia}, "
                        f"ewa inertia: {s.ewa_inertia}")
        if self.tol > 0.0 and shift <= self.tol:
            if self.verbose:
                logger.info(f"Converged (small centers change) at step {i}/{n_steps}")
            return True
        if s.ewa_inertia_min is None or s.ewa_inertia < s.ewa_inertia_min:
            s.no_improvement = 0
            s.ewa_inertia_min = s.ewa_inertia
        else:
            s.no_improvement += 1
        if self.max_no_improvement is not None and s.no_improvement >= self.max_no_improvement:
            if self.verbose:
                logger.info(f"Converged (lack of improvement in inertia) at step {i}/{n_steps}")
            return True
        return False


def run_steps(backend, rows, draws, state, random_state, *, n_steps, batch_size, tol,
              max_no_improvement, reassignment_ratio, verbose=0) -> int:
    """MiniBatchKMeans.fit's steps: a batch of `batch_size` rows drawn with probability
    proportional to the weights (so each step uses unit weights) from `random_state`, at most
    n_steps of them. Returns the number of steps run. Each step reads one small array (the
    batch inertia and shift that sklearn's stopping rule needs), and the k counts when it
    may reassign."""
    place = backend.placement
    k = int(state.centers.shape[0])
    conv = EwaConvergence(state, batch_size, rows.n, tol, max_no_improvement, verbose)
    i = -1
    for i in range(n_steps):
        Xb, xp = rows.batch(draws.indices(random_state, batch_size))
        old = state.centers
        cxp = place.namespace(old)
        reassign = state.random_reassign(batch_size, k)
        inertia = step(backend, Xb, xp, None, state, random_state, reassign=reassign,
                       reassignment_ratio=reassignment_ratio, verbose=verbose, check=i == 0)
        small = [_f64(cxp.asarray(inertia, device=device(old)), cxp)]
        if tol > 0:
            diff = _f64(state.centers, cxp) - _f64(old, cxp)
            small.append(cxp.sum(diff * diff))
        values = place.fetch(cxp.stack(small))()
        del Xb
        if conv.converged(i, n_steps, float(values[1]) if tol > 0 else 0.0,
                          float(values[0])):
            break
    return i + 1


def labels_and_inertia(rows, backend, centers, sample_weight, chunk_rows):
    """(labels of all of X against `centers`, in the backend's namespace; their weighted
    inertia), one pass over X in chunks of `chunk_rows` rows, each the backend's
    `labels_inertia`: X is never centered whole, and the total is read once."""
    labels, total = [], None
    for sl, part, xp in rows.slices(chunk_rows):
        w = None
        if sample_weight is not None:
            w = xp.asarray(sample_weight[sl], device=device(part))
        lab, inertia = backend.labels_inertia(part, w, centers, xp=xp)
        returned.check_labels(backend, "labels_inertia", lab, part.shape[0], centers.shape[0],
                              values=not labels)
        total = inertia if total is None else total + inertia
        labels.append(lab)
    lxp = array_namespace(labels[0])
    return ((labels[0] if len(labels) == 1 else lxp.concat(labels)),
            max(float(to_numpy(total)), 0.0))


def on_backend(a, X, backend):
    """A kept k-sized array (maybe NumPy after a pickle) in the namespace of the backend's
    batches."""
    if namespace_name(a) in backend.namespaces:
        return a
    probe = backend.placement.to_backend(np.zeros((1, 1), dtype=np.asarray(to_numpy(a)).dtype))
    xp = backend.placement.namespace(probe)
    return xp.asarray(to_numpy(a), device=device(probe))


#: X is computed on about its mean only when its offset is this many times its spread
#: (squared): below, scikit-learn's own arithmetic on X as given is as accurate
OFFSET_SPREAD_RATIO = 256.0


def shift_point(A, dtype, scale=1.0):
    """The point the fit computes about (centers and batches minus it), from the rows A:
    their mean where X's offset dwarfs its spread (float32 distances ||c||^2 - 2 x.c there
    lose the differences between centers), else 0, so that the distances are sklearn's
    own, bit for bit, and its ties break the same way. Offset and spread are compared in
    the fit's units (X times `scale`), where their squares are numbers."""
    dtype = host_dtype_of(dtype)
    if is_sparse(A):   # computed on as given, as scikit-learn does
        return np.zeros(A.shape[1], dtype=dtype)
    xp = array_namespace(A)
    m = A.shape[0]
    mean = np.asarray(to_numpy(column_sums(A, xp))) / m
    offset = float(np.sum((mean * scale) ** 2))
    if offset == 0:
        return np.zeros(A.shape[1], dtype=dtype)
    # the total variance, in float64 chunks about the mean (`chunks.tolerance` with tol 1)
    spread = A.shape[1] * _scaled_tolerance(A, mean.astype(dtype), 1.0, xp, 1 << 16, scale)
    if offset > OFFSET_SPREAD_RATIO * spread:
        return mean.astype(dtype)
    return np.zeros(A.shape[1], dtype=dtype)


def tolerance_of(X, shift, tol, backend, scale=1.0):
    """sklearn's tol (tol times the mean feature variance of X), one pass over X in chunks,
    the variance taken about `shift` and corrected by the mean (`chunks.tolerance`), in the
    fit's units (X times `scale`)."""
    if tol == 0:
        return 0.0
    if is_sparse(X):
        return backend.placement.feature_stats(X, tol, xp=None)[1]
    xp = array_namespace(X)
    rows = X.shape[0] if namespace_name(X) == "dask.array" else backend.driver_rows(X)
    return _scaled_tolerance(X, shift, tol, xp, rows, scale)


def _scaled_tolerance(X, shift, tol, xp, rows, scale):
    """`chunks.tolerance` of X * scale about shift * scale (scaled after the difference, in
    float64: X's own squares could overflow or underflow)."""
    dev = None if namespace_name(X) == "dask.array" else device(X)
    shift = xp.asarray(shift, device=dev) if dev is not None else xp.asarray(shift)
    if scale == 1:
        return tolerance(X, shift, tol, xp, rows)

    def sums(sl, mean64):
        c = (xp.astype(X[sl, ...], xp.float64) - mean64) * scale
        return column_sums(c * c, xp), column_sums(c, xp)
    return tolerance(X, shift, tol, xp, rows, chunk_sums=sums)
