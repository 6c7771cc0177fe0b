"""Initial centers of a batch of problems: each problem draws from its own seed
(`batch_seeds`, from the fit's RandomState), so the same random_state gives the same batch.

A dense batch ((B, n, d) in one array) runs k-means++ and random for all problems at once:
one set of xp operations per center for the whole batch (`batch_plusplus`), with each
problem's random numbers drawn as a single fit with its seed draws them, so that problem b
gets the centers k-means++ gives it alone (up to the order its sums add in). A ragged batch,
k-means||, and a dense batch whose (B, n, trials) arrays would not fit the budget run the
init method of each problem in turn.
"""
from __future__ import annotations


import numpy as np

from kmeans_xp.algorithms import init as _init
from kmeans_xp.contract.batching import batch_size, dense_array, problem
from kmeans_xp.contract.namespaces import device, operand
from kmeans_xp.contract.precision import compute_dtype
from kmeans_xp.contract.seeding import local_trials

#: arrays of (B, n, trials) values alive at once in a k-means++ step (distances, minima,
#: comparisons, float64): the step's memory is this many times B * n * trials * 8 bytes
PLUSPLUS_ARRAYS = 4


def batch_seeds(random_state, B):
    """One seed per problem, drawn from the fit's RandomState."""
    return random_state.randint(np.iinfo(np.int32).max, size=B)


def batch_initial_centers(method, X, k, sample_weight, random_state, *, xp, backend,
                          verbose=0):
    """(B, k, d) initial centers of the batch X by the init method named `method`."""
    seeds = batch_seeds(random_state, batch_size(X))
    arr = dense_array(X)
    if arr is not None and method == "random":
        return batch_random(arr, k, sample_weight, seeds, xp=xp)
    if arr is not None and method == "k-means++":
        B, n, d = arr.shape
        # (data in a half format is seeded on a float32 copy: its distances leave the
        # format's range and precision)
        wide = compute_dtype(arr.dtype, xp)
        copy = 0 if wide == arr.dtype else B * n * d * 4   # (float32)
        if PLUSPLUS_ARRAYS * B * n * local_trials(k) * 8 + copy <= backend.memory.bytes():
            return batch_plusplus(arr if not copy else xp.astype(arr, wide), k,
                                  None if sample_weight is None else
                                  dense_array(sample_weight), seeds, xp=xp)
    centers = []
    for b, seed in enumerate(seeds):
        Xb = X[b]
        centers.append(_init.INIT_METHODS[method].run(
            Xb, k, sample_weight=problem(sample_weight, b),
            random_state=np.random.RandomState(seed), xp=xp, rows=backend.driver_rows(Xb),
            backend=backend, persist=backend.placement.persist, verbose=verbose))
    return xp.stack([xp.astype(c, compute_dtype(X[0].dtype, xp)) for c in centers])


def batch_random(arr, k, sample_weight, seeds, *, xp):
    """k distinct rows of each problem, drawn as `init.random_init` draws them with the
    problem's seed, gathered in one take."""
    B, n, d = arr.shape
    idx = np.stack([_init.random_init(
        np.empty((n, 0)), k, sample_weight=problem(sample_weight, b), xp=np,
        random_state=np.random.RandomState(seed))[1] for b, seed in enumerate(seeds)])
    return _gather(arr, idx + np.arange(B)[:, None] * n, xp)


def _gather(arr, rows, xp):
    """arr's rows at global row indices `rows` (B, m) of its (B * n, d) view: (B, m, d)."""
    B, n, d = arr.shape
    flat = xp.reshape(arr, (B * n, d))
    at = xp.reshape(xp.asarray(rows, dtype=xp.int64, device=device(arr)), (-1,))
    return xp.reshape(xp.take(flat, at, axis=0), (B, -1, d))


def batch_plusplus(arr, k, sample_weight, seeds, *, xp):
    """Greedy k-means++ (`init.kmeans_plusplus`) of every problem of arr (B, n, d) at once:
    per center, one draw of 2 + int(ln k) candidates per problem with probability
    w * D(x)^2, their (B, n, trials) distances, and the best candidate per problem."""
    B, n, d = arr.shape
    L = local_trials(k)
    dev = device(arr)
    u_host = np.stack([np.random.RandomState(s).uniform(size=1 + (k - 1) * L) for s in seeds])
    u_all = xp.asarray(u_host, dtype=xp.float64, device=dev)
    w64 = None if sample_weight is None else xp.astype(sample_weight, xp.float64)
    base = xp.asarray(np.arange(B, dtype=np.int64)[:, None] * n, device=dev)
    by_weight = _by_weight(w64, u_all, u_host, n, xp)             # (B, 1 + (k-1) L)
    chosen = [by_weight[:, :1]]
    x_sq = None if d <= 4 else xp.sum(arr * arr, axis=2)[:, :, None]   # (once: B n d reads)
    closest = _sq_dist(arr, _gather(arr, chosen[0] + base, xp), x_sq, xp)[..., 0]
    trials = xp.arange(L, device=dev)
    for c in range(1, k):
        draws = slice(1 + (c - 1) * L, 1 + c * L)
        mass = xp.astype(closest, xp.float64) if w64 is None else xp.astype(
            closest, xp.float64) * w64
        drawn = _draw_rows(mass, u_all[:, draws], n, xp)
        cand = xp.where(xp.sum(mass, axis=1)[:, None] > operand(0, mass, xp), drawn,
                        by_weight[:, draws])
        minima = xp.minimum(_sq_dist(arr, _gather(arr, cand + base, xp), x_sq, xp),
                            closest[..., None])                   # (B, n, L)
        m64 = xp.astype(minima, xp.float64)
        pots = xp.sum(m64 if w64 is None else m64 * w64[..., None], axis=1)   # (B, L)
        best = (trials[None, :] == xp.argmin(pots, axis=1)[:, None])          # (B, L)
        closest = xp.sum(xp.where(best[:, None, :], minima, xp.zeros_like(minima)), axis=2)
        chosen.append(xp.sum(xp.where(best, cand, xp.zeros_like(cand)), axis=1)[:, None])
    return _gather(arr, xp.concat(chosen, axis=1) + base, xp)


def _draw_rows(mass, u, n, xp):
    """(B, L) row indices drawn per problem with probability `mass` (B, n): the rows i
    with cum[i-1] < u * total <= cum[i] (`init._draw`'s rule, row by row)."""
    cum = xp.cumulative_sum(mass, axis=1)
    target = u * cum[:, -1:]                                      # (B, L)
    below = xp.sum(xp.astype(cum[:, :, None] <= target[:, None, :], xp.int64), axis=1)
    return xp.minimum(below, xp.asarray(n - 1, dtype=xp.int64))


def _by_weight(w64, u_all, u_host, n, xp):
    """The draws by weight alone (`init._draw_by_weight`): floor(u * n) for unit weights."""
    if w64 is None:
        idx = np.minimum(np.floor(u_host * n).astype(np.int64), n - 1)
        return xp.asarray(idx, device=device(u_all))
    return _draw_rows(w64, u_all, n, xp)


def _sq_dist(arr, P, x_sq, xp):
    """(B, n, m) squared distances of each problem's rows to its m points P (B, m, d), as
    `init.sq_dist` computes them: direct differences for d <= 4, else the expansion with the
    rows' squared norms `x_sq` (B, n, 1)."""
    d = arr.shape[2]
    if d <= 4:
        acc = None
        for j in range(d):
            diff = arr[:, :, j][:, :, None] - P[:, :, j][:, None, :]
            acc = diff * diff if acc is None else acc + diff * diff
        return acc
    p_sq = xp.sum(P * P, axis=2)[:, None, :]
    dots = xp.matmul(arr, xp.permute_dims(P, (0, 2, 1)))
    # (scalars as device operands: `operand`)
    dist = x_sq - dots * operand(2, dots, xp) + p_sq
    return xp.maximum(dist, operand(0, dist, xp))


