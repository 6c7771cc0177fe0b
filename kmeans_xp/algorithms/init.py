"""Initial centers, written once against the array API so they run on every backend's device.

Randomness comes from a host `numpy.random.RandomState` (a few numbers per center); the O(n)
work runs in the backend's namespace, over row chunks so memory stays bounded.

`INIT_METHODS` is the table of the init methods an estimator accepts by name: how each runs
and what it needs. Validation, the estimators' fits and the backends' head start read it; a
new method is its function and a row there (and a test).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from kmeans_xp.algorithms.progress import bar
from kmeans_xp.contract.chunks import column_sums, map_rows, row_chunks
from kmeans_xp.contract.memory import xp_seeding_bytes
from kmeans_xp.contract.namespaces import dtype_name, to_numpy
from kmeans_xp.contract.precision import compute_dtype
from kmeans_xp.contract.seeding import local_trials


def sq_dist(Xc, P, xp):
    """(rows, len(P)) squared distances: direct differences for d <= 4 (exact), the norm
    expansion otherwise."""
    d = Xc.shape[1]
    if d <= 4:
        # feature by feature: a reduction over a length-d last axis is slow in NumPy
        acc = None
        for j in range(d):
            diff = Xc[:, j][:, None] - P[:, j][None, :]
            acc = diff * diff if acc is None else acc + diff * diff
        return acc
    dist = xp.sum(Xc * Xc, axis=1)[:, None] - 2 * (Xc @ P.T) + xp.sum(P * P, axis=1)[None, :]
    return xp.where(dist < 0, xp.zeros_like(dist), dist)


def sq_dist_to_points(X, P, xp, rows):
    """Yield (rows slice, (rows, len(P)) squared distances) chunk by chunk."""
    for sl in row_chunks(X.shape[0], rows):
        yield sl, sq_dist(X[sl, ...], P, xp)


def _min_update(closest, X, P, xp, rows, sample_weight, keep):
    """(candidate potentials (len(P),): sum of w * min(closest, d(x, p)) for each candidate,
    the (rows, len(P)) minima of each chunk when `keep`, else None), without an (n, len(P))
    array alive beyond one chunk per thread unless kept."""
    def part(sl):
        dist = xp.minimum(sq_dist(X[sl, ...], P, xp), closest[sl][:, None])
        if sample_weight is None:  # blocked: a GPU sum over n with len(P) outputs is slow
            pot = column_sums(dist, xp)
        else:
            pot = sample_weight[sl] @ xp.astype(dist, xp.float64)
        return pot, (dist if keep else None)
    parts = map_rows(part, X.shape[0], rows, xp)
    pots = parts[0][0]
    for p, _ in parts[1:]:  # in row order: the same sum however the chunks ran
        pots = pots + p
    return pots, ([m for _, m in parts] if keep else None)


def _column(parts, best, xp):
    """The (n,) column `best` of the kept chunk minima: the new running distances."""
    cols = [xp.take(m, best, axis=1)[:, 0] for m in parts]
    return cols[0] if len(cols) == 1 else xp.concat(cols)


def _closest_with(closest, X, p, xp, rows):
    parts = map_rows(lambda sl: xp.minimum(closest[sl], sq_dist(X[sl, ...], p[None, :], xp)[:, 0]),
                     X.shape[0], rows, xp)
    return parts[0] if len(parts) == 1 else xp.concat(parts)


def _draw(cum, u, xp, n):
    """Indices i with cum[i-1] < u * cum[-1] <= cum[i], on the device (no host round trip);
    never a zero-weight point. The total must be cum[-1] itself: a sum rounds differently,
    and a draw past cum[-1] would be clipped onto the last row, which may have zero weight."""
    idx = xp.searchsorted(cum, u * cum[-1], side="right")
    # (an index is >= 0; xp.minimum, not array-api-compat's clip, which costs 2 ms a call on
    # CuPy: it was 60% of k-means++ on the H200)
    return xp.minimum(idx, n - 1)


def _draw_by_weight(cum_w, u, u_host, xp, n):
    """_draw on the weights alone; unit weights (cum_w None): floor(u * n), the same index,
    from the host copy of the uniforms (no device kernels: their first compile took 1.07 s of
    a GPU's cold first fit) moved to u's device."""
    if cum_w is not None:
        return _draw(cum_w, u, xp, n)
    idx = np.minimum(np.floor(u_host * n).astype(np.int64), n - 1)
    return xp.asarray(idx, device=_device(u))


def _weights64(sample_weight, X, xp):
    """float64 weights on X's device (ones for None: only the O(n) passes of init need them)."""
    if sample_weight is None:
        return xp.ones(X.shape[0], dtype=xp.float64, device=_device(X))
    return xp.astype(sample_weight, xp.float64)


def _device(x):
    from array_api_compat import device
    return device(x)


class Seeding:
    """k-means++'s O(n) steps, in xp over row chunks of `rows` (every namespace). A backend
    may give its own (`KMeansBackend.seeding`): the same three steps on its device, with the
    same draws (its sums may add in another order).

    `persist` (a backend's `persist`) makes the running distances concrete at each step, so
    a lazy namespace (dask) does not recompute their whole history."""

    def __init__(self, X, sample_weight, xp, rows, persist=None):
        self.X, self.xp, self.rows = X, xp, rows
        self.persist = persist or (lambda a: a)
        self.sw64 = (None if sample_weight is None
                     else self.persist(xp.astype(sample_weight, xp.float64)))
        # the chosen candidate's distances are kept from its trial when all n fit one budget
        self.keep = rows >= X.shape[0]

    def first(self, index):
        """The running squared distances D(x)^2 to the row `index` ((1,) ints on X's device)."""
        X, xp = self.X, self.xp
        # (float16 data: its distances in float32)
        inf = xp.full(X.shape[0], math.inf, dtype=compute_dtype(X.dtype, xp), device=_device(X))
        return self.persist(_closest_with(inf, X, xp.take(X, index, axis=0)[0, :], xp,
                                          self.rows))

    def candidates(self, closest, u, by_weight):
        """(L,) rows drawn with probability w * D(x)^2, one per uniform number of u (L,);
        by_weight's where no potential is left (every positive-weight point is a center)."""
        xp = self.xp
        cum = self.persist(
            xp.cumulative_sum(closest, dtype=xp.float64) if self.sw64 is None else
            xp.cumulative_sum(xp.astype(closest, xp.float64) * self.sw64))
        return xp.where(cum[-1] > 0, _draw(cum, u, xp, self.X.shape[0]), by_weight)

    def trial(self, closest, cand):
        """(the candidate leaving the least potential sum w * min(D(x)^2, ||x - p||^2), the
        first among equals, as a (1,) index; D(x)^2 with it)."""
        X, xp = self.X, self.xp
        P = xp.take(X, cand, axis=0)
        pots, minima = _min_update(closest, X, P, xp, self.rows, self.sw64, self.keep)
        best = xp.reshape(xp.argmin(pots), (1,))
        closest = (_column(minima, best, xp) if self.keep else
                   _closest_with(closest, X, xp.take(P, best, axis=0)[0, :], xp, self.rows))
        return xp.take(cand, best), self.persist(closest)


def kmeans_plusplus(X, n_clusters, *, sample_weight, random_state, xp, rows,
                    n_local_trials=None, persist=None, progress=None, seeding=None):
    """Greedy k-means++ (Arthur & Vassilvitskii; scikit-learn's variant): each new center is the
    best of 2 + int(ln k) candidates drawn with probability w * D(x)^2. Returns (centers, indices).
    `seeding` runs the O(n) steps (a backend's `seeding(X, sample_weight, n_local_trials)`;
    default `Seeding(X, sample_weight, xp, rows, persist)`); `progress` (a bar) is advanced
    once per center.
    """
    persist = persist or (lambda a: a)
    n = X.shape[0]
    dev = _device(X)
    L = local_trials(n_clusters) if n_local_trials is None else n_local_trials
    steps = seeding or Seeding(X, sample_weight, xp, rows, persist)
    cum_w = (None if sample_weight is None else
             persist(xp.cumulative_sum(xp.astype(sample_weight, xp.float64))))

    # every random number of the run at once, in the order the greedy steps use them (the
    # same stream as drawing them step by step): a host-to-device copy per center would wait
    # for the device each time. The draws by weight alone (used where no potential is left)
    # are made for all of them at once too.
    u_host = np.reshape(random_state.uniform(size=1 + (n_clusters - 1) * L), (-1,))
    u_all = xp.asarray(u_host, dtype=xp.float64, device=dev)
    by_weight = _draw_by_weight(cum_w, u_all, u_host, xp, n)
    chosen = [by_weight[:1]]
    closest = steps.first(chosen[0])
    for c in range(1, n_clusters):
        draws = slice(1 + (c - 1) * L, 1 + c * L)
        cand = steps.candidates(closest, u_all[draws], by_weight[draws])
        best, closest = steps.trial(closest, cand)
        chosen.append(best)
        if progress is not None:
            progress.update(1)
    idx = xp.concat(chosen)  # on the device until here: one transfer for all k
    return xp.take(X, idx, axis=0), to_numpy(idx).astype(np.int64)


def random_init(X, n_clusters, *, sample_weight, random_state, xp):
    """k distinct rows drawn with probability proportional to their weight."""
    # sklearn always passes p (uniform for unit weights): the same draws as sklearn's
    w = (np.ones(X.shape[0]) if sample_weight is None
         else to_numpy(sample_weight).astype(np.float64))
    seeds = random_state.choice(X.shape[0], size=n_clusters, replace=False, p=w / w.sum())
    idx = xp.asarray(seeds, dtype=xp.int64, device=_device(X))
    return xp.take(X, idx, axis=0), seeds


#: k-means|| defaults: candidates drawn per round = OVERSAMPLING * k, over ROUNDS rounds
KMEANS_PARALLEL_OVERSAMPLING = 2.0
KMEANS_PARALLEL_ROUNDS = 5
#: extra rounds allowed when the candidates hold fewer than k distinct points
_MAX_EXTRA_ROUNDS = 20


def _min_sq_dist_to(X, P, xp, rows, backend):
    """(n,) squared distance of each row of X to its nearest row of P: the backend's `assign`
    when there is one (its device, its memory budget), else row chunks in xp."""
    if backend is not None:
        return backend.assign(X, P, xp=xp).min_sq_dist
    parts = [xp.min(dist, axis=1) for _, dist in sq_dist_to_points(X, P, xp, rows)]
    return parts[0] if len(parts) == 1 else xp.concat(parts)


def _candidate_weights(X, sample_weight, C, xp, rows, backend):
    """(m,) float64: the sample_weight of the points of X closest to each candidate."""
    m = C.shape[0]
    if backend is not None:
        labels = backend.assign(X, C, xp=xp).labels
        weights = backend.reduce(X, labels, sample_weight, m, xp=xp).weight_in_clusters
        return to_numpy(weights).astype(np.float64)
    # the standard has no scatter-add: a one-hot product per chunk, (m, rows) at most
    ids = xp.arange(m, dtype=xp.int64, device=_device(X))
    total = np.zeros(m, dtype=np.float64)
    for sl, dist in sq_dist_to_points(X, C, xp, rows):
        lab = xp.argmin(dist, axis=1)
        onehot = xp.astype(lab[None, :] == ids[:, None], xp.float64)
        w = (xp.ones(lab.shape[0], dtype=xp.float64, device=_device(X)) if sample_weight is None
             else xp.astype(sample_weight[sl], xp.float64))
        total += to_numpy(onehot @ w)
    return total


def _plusplus_on_candidates(C, weights, k, random_state, xp, backend):
    """Indices into C of greedy weighted k-means++ on the (m, d) candidates C (float64): on
    the backend's device when it has a `seeding` (k host steps of a few small NumPy calls
    each cost more than the rounds), else on the host."""
    m = C.shape[0]
    if backend is not None:
        C64 = xp.astype(C, xp.float64)
        w64 = xp.asarray(weights, dtype=xp.float64, device=_device(C))
        seeding = backend.seeding(C64, w64, local_trials(k), xp=xp)
        if seeding is not None:
            return kmeans_plusplus(C64, k, sample_weight=w64, random_state=random_state,
                                   xp=xp, rows=m, seeding=seeding)[1]
    from array_api_compat import numpy as np_xp
    return kmeans_plusplus(to_numpy(C).astype(np.float64), k, sample_weight=weights,
                           random_state=random_state, xp=np_xp, rows=min(m, 1 << 16))[1]


def kmeans_parallel(X, n_clusters, *, sample_weight, random_state, xp, rows,
                    oversampling_factor=KMEANS_PARALLEL_OVERSAMPLING,
                    n_rounds=KMEANS_PARALLEL_ROUNDS, backend=None, persist=None):
    """k-means|| (scalable k-means++, Bahmani et al., VLDB 2012). Returns (centers, indices):
    k distinct rows of X (as long as X has k distinct positive-weight rows) and their indices.

    1. One center drawn with probability proportional to the sample weight.
    2. `n_rounds` rounds; each draws l = ceil(oversampling_factor * k) candidates with
       probability proportional to w * D(x)^2 (D: distance to the nearest candidate so far),
       i.i.d. with replacement, which gives each point the expected count l * w D^2 / phi of
       the paper's independent Bernoulli draws while needing only l random numbers per round
       (drawn on the host, so the result is the same on every backend); repeats are merged.
       Extra rounds run while fewer than k distinct positions have been drawn.
    3. Each candidate is weighted by the sample_weight of the points nearest to it.
    4. Greedy weighted k-means++ on the candidates (small: about l * n_rounds rows, in
       float64) picks the k centers: on the backend's device where it has a `seeding`,
       else on the host.

    The O(n) work is a few passes per round instead of a few per center as in k-means++: the
    distances go to `backend.assign` / `backend.lloyd_iter` when a backend is given (its
    device, its memory budget), else to row chunks of `rows` in xp. `persist` (a backend's
    `persist`) keeps lazy namespaces (dask) from recomputing history.
    """
    persist = persist or (lambda a: a)
    n = X.shape[0]
    k = int(n_clusters)
    if not oversampling_factor > 0:
        raise ValueError(f"oversampling_factor must be > 0, got {oversampling_factor!r}")
    if isinstance(n_rounds, bool) or not isinstance(n_rounds, (int, np.integer)) or n_rounds < 0:
        raise ValueError(f"n_rounds must be an integer >= 0, got {n_rounds!r}")
    n_draws = max(1, math.ceil(oversampling_factor * k))
    sw64 = persist(_weights64(sample_weight, X, xp))
    cum = xp.cumulative_sum(sw64)
    dev = _device(X)
    first = int(_draw(cum, xp.asarray([random_state.uniform()], dtype=xp.float64, device=dev),
                      xp, n)[0])
    chosen = [first]
    seen = {first}
    closest = persist(_min_sq_dist_to(X, X[first:first + 1, :], xp, rows, backend))

    def one_round():
        cum = persist(xp.cumulative_sum(xp.astype(closest, xp.float64) * sw64))
        phi = float(cum[-1])
        if not phi > 0:  # every positive-weight point sits on a candidate
            return None
        u = xp.asarray(random_state.uniform(size=n_draws), dtype=xp.float64, device=dev)
        drawn = to_numpy(_draw(cum, u, xp, n))
        new = [int(i) for i in dict.fromkeys(drawn.tolist()) if int(i) not in seen]
        seen.update(new)
        chosen.extend(new)
        return new

    max_rounds = n_rounds + _MAX_EXTRA_ROUNDS
    target, done, exhausted = n_rounds, 0, False
    while True:
        while done < target and not exhausted:
            done += 1
            new = one_round()
            if new is None:
                exhausted = True
            elif new:
                P = xp.take(X, xp.asarray(np.asarray(new, dtype=np.int64), dtype=xp.int64,
                                          device=_device(X)), axis=0)
                closest = persist(xp.minimum(closest, _min_sq_dist_to(X, P, xp, rows, backend)))
        if len(chosen) < k and not exhausted and done < max_rounds:
            target += 1  # fewer than k candidates so far: another round
            continue
        idx = np.asarray(chosen, dtype=np.int64)
        C = xp.take(X, xp.asarray(idx, dtype=xp.int64, device=_device(X)), axis=0)
        weights = _candidate_weights(X, sample_weight, C, xp, rows, backend)
        # candidates at one position split nothing: one takes all their points' weight, so
        # fewer than k positive weights means fewer than k distinct positions; draw more.
        # When X has fewer than k distinct positive-weight rows, k-means++ below repeats
        # centers, as sequential k-means++ does (the estimator warns).
        if np.count_nonzero(weights) >= k or exhausted or done >= max_rounds:
            break
        target += 1
    picked = _plusplus_on_candidates(C, weights, k, random_state, xp, backend)
    indices = idx[np.asarray(picked, dtype=np.int64)]
    centers = xp.take(X, xp.asarray(indices, dtype=xp.int64, device=_device(X)), axis=0)
    return centers, indices


# -- the table of init methods ----------------------------------------------------------------
def _plusplus(X, k, *, sample_weight, random_state, xp, rows, backend=None, persist=None,
              verbose=0):
    """k-means++ with the backend's own O(n) steps where it has them (`seeding`)."""
    progress = bar(k, "k-means++", verbose)
    try:
        seeding = (None if backend is None else
                   backend.seeding(X, sample_weight, local_trials(k), xp=xp))
        return kmeans_plusplus(X, k, sample_weight=sample_weight, random_state=random_state,
                               xp=xp, rows=rows, persist=persist, progress=progress,
                               seeding=seeding)[0]
    finally:
        progress.close()


def _parallel(X, k, *, sample_weight, random_state, xp, rows, backend=None, persist=None,
              verbose=0):
    return kmeans_parallel(X, k, sample_weight=sample_weight, random_state=random_state, xp=xp,
                           rows=rows, backend=backend, persist=persist)[0]


def _random(X, k, *, sample_weight, random_state, xp, rows=None, backend=None, persist=None,
            verbose=0):
    return random_init(X, k, sample_weight=sample_weight, random_state=random_state, xp=xp)[0]


def _hierarchical(X, k, *, sample_weight, random_state, xp, rows, backend=None, persist=None,
                  verbose=0):
    """A coarse fit at sqrt(k), each coarse cluster split (`algorithms.hierarchical`)."""
    from kmeans_xp.algorithms.hierarchical import hierarchical_init  # (it runs the driver)
    return hierarchical_init(X, k, sample_weight=sample_weight, random_state=random_state,
                             xp=xp, rows=rows, backend=backend, persist=persist,
                             verbose=verbose, plusplus=_plusplus)


def _hierarchical_bytes(n, k, itemsize):
    """k-means++ of sqrt(k) centers, and the coarse labels on the host (no more than
    k-means++ of k: its candidates' chunks are larger)."""
    from kmeans_xp.algorithms.hierarchical import HOST_ROW_BYTES, MIN_K, coarse_k
    if k < MIN_K:
        return xp_seeding_bytes(n, k, itemsize)
    return xp_seeding_bytes(n, coarse_k(k), itemsize) + HOST_ROW_BYTES * n


class InitMethod(NamedTuple):
    """An init method by name: how it runs and what it needs."""
    #: (X, k, *, sample_weight, random_state, xp, rows, backend, persist, verbose) -> the
    #: (k, d) initial centers on X's device (X centered; backend None: xp code alone)
    run: Callable
    #: n_init="auto" runs it once (a careful init), else the estimator's default number of
    #: times (a cheap one, as scikit-learn does)
    runs_once: bool
    #: the dtype the backend's k-means++ steps (`KMeansBackend.seeding`) run in during this
    #: init: "X" (X's own), "float64" (k-means||'s candidates), or None (it does not use them)
    seeding: str | None
    #: (n, k, itemsize) -> bytes of its O(n) arrays in xp code; the memory estimate counts
    #: k-means++'s (`memory.xp_seeding_bytes`), which no method may exceed
    xp_bytes: Callable


INIT_METHODS = {
    "k-means++": InitMethod(_plusplus, True, "X", xp_seeding_bytes),
    # weights, their and the distances' cumulative sums (float64); running distances, labels
    "k-means||": InitMethod(_parallel, True, "float64",
                            lambda n, k, itemsize: 6 * 8 * n + 3 * itemsize * n),
    # the drawing probabilities on the host (float64, two copies)
    "random": InitMethod(_random, False, None, lambda n, k, itemsize: 2 * 8 * n),
    # for large k: a coarse fit at sqrt(k) clusters, each split (runs the Lloyd driver)
    "hierarchical": InitMethod(_hierarchical, True, "X", _hierarchical_bytes),
}


def seeding_dtype(init, dtype) -> str | None:
    """The dtype name the backend's k-means++ steps run in during `init` (a method name, an
    array or a callable) of X of this dtype, or None where it does not use them."""
    method = INIT_METHODS.get(init) if isinstance(init, str) else None
    if method is None or method.seeding is None:
        return None
    return dtype_name(dtype) if method.seeding == "X" else method.seeding
