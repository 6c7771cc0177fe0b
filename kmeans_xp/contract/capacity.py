"""Capacity-aware assignment: the assignment step of a balanced fit (`KMeans(balance=...)`).

A balanced fit is the same Lloyd run (`kmeans_xp.algorithms.balance`), whose assignment
gives each row one of its m nearest centers (`KMeansBackend.nearest`, the backend's
distances) under a bound on cluster sizes:

hard cap (``balance={"max_size": f}``)
    at most ``cap = ceil(f * n / k)`` rows a cluster (an int ``max_size``: that many rows).
    The cap counts rows, whatever their sample weights: an inverted list holds rows. The
    weights weigh the cost, sum of w * ||x - c||^2, that the assignment keeps low.
soft penalty (``balance={"penalty": lam}``)
    each row takes the candidate minimising ||x - c_j||^2 + lam * D * W_j / (W / k): W_j
    is cluster j's weight after the previous iteration, W the total weight and D the mean
    squared distance of the previous assignment (so lam has no units). Iterated, the
    penalty pushes rows out of heavy clusters; it bounds nothing.

The hard cap is a transportation problem: rows to clusters of `cap` slots each, at cost
w * ||x - c||^2. It is solved by Bertsekas's auction (the forward auction for the
assignment problem with similar objects, Jacobi form: every unplaced row bids at once),
over each row's m nearest centers:

- a row bids for the candidate of least cost + price, raising its price by the gap to its
  second-best candidate plus EPS; a cluster keeps its `cap` highest bids (earlier ones
  included) and sends the others back; a full cluster's price is its lowest kept bid, a
  cluster with room has price 0.
- at the end every row pays within EPS of its best alternative, so the assignment is
  within n * EPS of the optimum over those candidates (EPS = AUCTION_EPS times the mean
  cost of the rows' nearest centers: within 1% of the unconstrained cost).
- each assignment starts from prices 0 (the last iteration's prices as a warm start took
  fewer rounds but cost 1-6% more: a cluster that no longer fills keeps a price it should
  not have); with m < k, rounds stop at AUCTION_ROUNDS or a stall (the increment doubles
  while no row is placed: a price war), and rows still unplaced take the free slots
  of their candidates in regret order (`greedy_rounds`), then the nearest centers with
  room (`BalancedStep`'s fallback, the backend's distances).

Why an auction: it is the exact method whose every step is a vectorised sort of the rows
still moving (NumPy, or CuPy on the GPU), and the caps are never exceeded at any step;
greedy assignment alone (no prices) was up to 2x the optimum on small adversarial problems,
and the auction matches `scipy.optimize.linear_sum_assignment` on each center replicated
`cap` times (tests/test_balance.py).

Rows and candidates stay where the backend put them when that is NumPy or CuPy (the rounds
run there); other namespaces (dask, torch) bring the (n, m) candidates to the host, and the
labels go back in X's namespace (`labels_like`).
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from kmeans_xp.contract.namespaces import device, namespace_name, to_numpy

#: candidates per row by default: the rounds rarely reach the 8th nearest center at a cap
#: of 1.1 n / k, and (n, 8) indices and distances are 96 bytes a row
DEFAULT_CANDIDATES = 8
#: candidates per row of the fallback, where rows look past their m nearest centers
FALLBACK_CANDIDATES = 64
#: bytes of one chunk's (rows, k) distances in the default `nearest` (`nearest_xp`) on the
#: host: a chunk stays in cache while it is selected
NEAREST_CHUNK_BYTES = 32 << 20
#: the auction's bid increment, as a fraction of the mean cost of the rows' nearest centers:
#: the assignment is within n times the increment of the optimum (1% of that cost)
AUCTION_EPS = 0.01
#: bidding rounds of one assignment at most with m < k candidates (each round sorts the
#: rows still moving; a Lloyd iteration on uneven data can take hundreds to place the last
#: few rows): rows still unplaced then go to `greedy_rounds` and the fallback
AUCTION_ROUNDS = 100
#: ... where every center is a candidate (m = k: the auction's bound holds when it ends)
AUCTION_EXACT_ROUNDS = 5000
#: rounds without fewer rows unplaced after which the auction stops where rows have fewer
#: candidates than k: those left may have candidates that cannot hold them all (the cap
#: pushes them past their m nearest centers), and bidding only moves them around; they go
#: to the free slots (`greedy_rounds`, fallback). With every center a candidate the auction
#: always ends, and runs to AUCTION_EXACT_ROUNDS (adversarial small problems, random
#: centers and a cap of n / k, took up to 1800)
AUCTION_STALL = 20
#: rounds without fewer rows unplaced after which the increment doubles: prices that must
#: climb far (a dense region's rows pushed out past several clusters) climb in fewer
#: rounds, at the cost of the bound (n times the last increment)
AUCTION_SLOW = 4
#: the regret of a row at its last candidate: far beyond any squared distance, finite so
#: that a zero weight times it is 0, not NaN
LAST_REGRET = 1e300

BALANCE_KEYS = ("max_size", "penalty", "candidates")


class Balance(NamedTuple):
    """A parsed `balance` option: one of max_size (float factor of n / k, or int rows) and
    penalty (float), and the candidates per row."""
    max_size: float | int | None
    penalty: float | None
    candidates: int


class NearestResult(NamedTuple):
    index: Any     # (n, m) integer: each row's m nearest centers, nearest first
    sq_dist: Any   # (n, m) float64: their squared distances (clamped at 0)


def _is_real(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def parse_balance(spec) -> Balance | None:
    """The `balance` option as a `Balance` (None: no balance), or a ValueError saying what
    was given and what is taken. A bare float f is ``{"max_size": f}``."""
    if spec is None:
        return None
    if _is_real(spec) and not isinstance(spec, numbers.Integral):
        spec = {"max_size": float(spec)}
    if not isinstance(spec, dict):
        raise ValueError(f"balance must be None, a float >= 1 (the hard cap as a factor of "
                         f"n_samples / n_clusters) or a dict such as {{'max_size': 1.1}} or "
                         f"{{'penalty': 1.0}}; got {spec!r}.")
    unknown = sorted(set(spec) - set(BALANCE_KEYS))
    if unknown:
        raise ValueError(f"balance takes the keys {list(BALANCE_KEYS)}, not {unknown}.")
    size, penalty = spec.get("max_size"), spec.get("penalty")
    if (size is None) == (penalty is None):
        raise ValueError(f"balance needs exactly one of 'max_size' (a hard cap) and "
                         f"'penalty' (a soft one); got {spec!r}.")
    if size is not None:
        if isinstance(size, numbers.Integral) and not isinstance(size, bool):
            if size < 1:
                raise ValueError(f"balance['max_size'] as an int is rows per cluster, at "
                                 f"least 1; got {size}.")
            size = int(size)
        elif not _is_real(size) or not size >= 1.0 or math.isinf(size):
            raise ValueError(f"balance['max_size'] must be a float >= 1 (a factor of "
                             f"n_samples / n_clusters, e.g. 1.1) or an int (rows); got "
                             f"{size!r}.")
        else:
            size = float(size)
    if penalty is not None and (not _is_real(penalty) or not 0 <= penalty < math.inf):
        raise ValueError(f"balance['penalty'] must be a finite float >= 0; got {penalty!r}.")
    m = spec.get("candidates", DEFAULT_CANDIDATES)
    if not isinstance(m, numbers.Integral) or isinstance(m, bool) or m < 1:
        raise ValueError(f"balance['candidates'] must be an int >= 1 (nearest centers each "
                         f"row may take); got {m!r}.")
    return Balance(size, None if penalty is None else float(penalty), int(m))


def cluster_cap(balance: Balance, n: int, k: int) -> int:
    """Rows a cluster may hold: ceil(f * n / k) for a factor f, the int itself otherwise;
    a ValueError where k clusters of that size cannot hold the n rows."""
    size = balance.max_size
    if isinstance(size, int):
        cap = size
    else:  # (the product rounded down first: 1.1 * 1000 / 100 is 11.000000000000002)
        cap = math.ceil(round(size * n / k, 9))
    if cap * k < n:
        raise ValueError(f"balance['max_size']={size} allows {cap} rows per cluster, and "
                         f"{k} clusters of {cap} rows cannot hold n_samples={n}: give at "
                         f"least {math.ceil(n / k)} rows, or a factor >= 1.")
    return cap


# -- the m nearest centers --------------------------------------------------------------------
def array_module(a):
    """numpy or cupy for an array of theirs (the rounds run there), else None."""
    name = namespace_name(a)
    if name == "numpy":
        return np
    if name == "cupy":
        import cupy
        return cupy
    return None


def _stable_argsort(a, mod):
    """A stable argsort of a 1-d array (CuPy's sorts are stable radix sorts)."""
    return mod.argsort(a, kind="stable") if mod is np else mod.argsort(a)


def top_m(dist, m, mod):
    """(indices, distances) of each row's m smallest entries of `dist`, smallest first
    (a NumPy or CuPy module `mod`)."""
    k = dist.shape[1]
    if m < k:
        part = mod.argpartition(dist, m - 1, axis=1)[:, :m]
        pd = mod.take_along_axis(dist, part, axis=1)
    else:
        part, pd = mod.broadcast_to(mod.arange(k), dist.shape), dist
    order = mod.argsort(pd, axis=1, kind="stable") if mod is np else mod.argsort(pd, axis=1)
    return mod.take_along_axis(part, order, axis=1), mod.take_along_axis(pd, order, axis=1)


def nearest_xp(X, centers, m, xp, budget_bytes):
    """The default `KMeansBackend.nearest`: squared distances by the norm expansion, chunk by
    chunk of rows whose (rows, k) distances and their selection fit a quarter of the budget
    (on the host also NEAREST_CHUNK_BYTES), in X's dtype, the top m of each chunk kept (float64). NumPy and CuPy keep them where X is;
    other namespaces bring each chunk's distances to the host."""
    n, k = X.shape[0], centers.shape[0]
    m = min(int(m), k)
    mod = array_module(X)
    room = max(budget_bytes, 1) // 4
    if mod is np or mod is None:   # (on a GPU, a chunk this small would be launch-bound)
        room = min(NEAREST_CHUNK_BYTES, room)
    rows = max(1, room // (16 * k))
    if mod is not None and array_module(centers) is not mod:   # (centers kept on the host)
        centers = mod.asarray(to_numpy(centers))
    c = xp.astype(centers, X.dtype)   # (X's dtype: the GEMM at its speed, as assign's)
    c2 = xp.sum(c * c, axis=1)
    idx, dist = [], []
    for s in range(0, n, rows):
        x = X[s:min(s + rows, n), ...]
        D = xp.sum(x * x, axis=1)[:, None] - 2 * (x @ c.T) + c2[None, :]
        D = xp.where(D < 0, xp.zeros_like(D), D)
        if mod is None:
            i, d = top_m(to_numpy(D), m, np)
        else:
            i, d = top_m(D, m, mod)
        idx.append(i)
        dist.append(d.astype((mod or np).float64))
    cat = (mod or np).concatenate
    return NearestResult(cat(idx) if len(idx) > 1 else idx[0],
                         cat(dist) if len(dist) > 1 else dist[0])


# -- the auction ------------------------------------------------------------------------------
def _two_best(cost, mod):
    """(column of each row's least cost, that cost, its second least: +inf for one column)."""
    if cost.shape[1] == 1:
        zero = mod.zeros(cost.shape[0], dtype=mod.int64)
        return zero, cost[:, 0], mod.full(cost.shape[0], mod.inf)
    two = mod.argpartition(cost, 1, axis=1)[:, :2]
    c = mod.take_along_axis(cost, two, axis=1)
    first = (c[:, 1] < c[:, 0]).astype(mod.int64)
    best = mod.take_along_axis(two, first[:, None], axis=1)[:, 0]
    return best, mod.minimum(c[:, 0], c[:, 1]), mod.maximum(c[:, 0], c[:, 1])


def auction(cand, dist, w, cap, k, mod, rounds=None):
    """(labels, -1 where unplaced after AUCTION_ROUNDS) of Bertsekas's auction over the
    candidates (module docstring), from all prices 0. A cluster with room keeps price 0,
    so a bid for it is the row's regret plus eps, and a full one's price is its lowest
    kept bid: at the end each row pays within eps of its best alternative, and the
    assignment is within n * eps of the optimum."""
    n, m = cand.shape
    if rounds is None:
        rounds = AUCTION_EXACT_ROUNDS if m >= k else AUCTION_ROUNDS
    cost_all = dist if w is None else dist * w[:, None]
    eps = AUCTION_EPS * float(mod.mean(cost_all[:, 0])) + 1e-300
    labels = mod.full(n, -1, dtype=mod.int64)
    _bidding(cost_all, cand, cap, k, mod, mod.zeros(k), eps, labels, mod.zeros(n), rounds)
    return labels


def _bidding(cost_all, cand, cap, k, mod, price, eps, labels, bid, rounds):
    """Rounds of bids by the unplaced rows until none is left, AUCTION_ROUNDS, or
    (with fewer candidates than centers) AUCTION_STALL rounds without fewer left; labels
    and bid are updated in place, the prices returned."""
    m = cand.shape[1]
    fewest, since = labels.shape[0] + 1, 0
    U = mod.flatnonzero(labels < 0)
    for _ in range(rounds):
        if U.shape[0] == 0:
            break
        fewest, since = (U.shape[0], 0) if U.shape[0] < fewest else (fewest, since + 1)
        if m < k:   # (the heuristics of a partial candidate list: module docstring)
            if since > AUCTION_STALL:
                break
            if since and since % AUCTION_SLOW == 0:
                eps *= 2.0
        cu = cand[U].astype(mod.int64)
        best, c1, c2 = _two_best(cost_all[U] + price[cu], mod)
        j = cu[mod.arange(U.shape[0]), best]
        gap = mod.where(mod.isfinite(c2), c2 - c1, LAST_REGRET)
        b = price[j] + gap + eps
        hit = mod.zeros(k, dtype=bool)
        hit[j] = True
        held = mod.flatnonzero((labels >= 0) & hit[mod.maximum(labels, 0)])
        rows = mod.concatenate([held, U])
        cl = mod.concatenate([labels[held], j])
        bids = mod.concatenate([bid[held], b])
        # by cluster, then bid descending (then held before new, a fixed order): each
        # cluster keeps its cap best
        order = _stable_argsort(-bids, mod)
        order = order[_stable_argsort(cl[order], mod)]
        cs, rs, bs = cl[order], rows[order], bids[order]
        ok = mod.arange(cs.shape[0]) - mod.searchsorted(cs, cs, side="left") < cap
        U = rs[~ok]   # (the rows left: bidders turned down and holders outbid)
        labels[U] = -1
        labels[rs[ok]], bid[rs[ok]] = cs[ok], bs[ok]
        count = mod.bincount(cs[ok], minlength=k)
        lowest = mod.full(k, mod.inf)
        kc, kb = cs[ok], bs[ok]   # (grouped by cluster, bids descending: a group's last)
        last = mod.flatnonzero(mod.concatenate([kc[1:] != kc[:-1], mod.ones(1, dtype=bool)]))
        lowest[kc[last]] = kb[last]
        price = mod.where(hit, mod.where(count >= cap, lowest, 0.0), price)
    return price


def capacity_assign(cand, dist, w, cap, k, mod, rounds=None):
    """(labels, -1 where the candidates had no room; their distances; the rows each
    cluster may still take): the auction, then `greedy_rounds` for the rows it left
    unplaced."""
    labels = auction(cand, dist, w, cap, k, mod, rounds)
    placed = labels >= 0
    remaining = cap - mod.bincount(labels[placed], minlength=k).astype(mod.int64)
    chosen = mod.where(cand == labels[:, None], dist, mod.inf).min(axis=1)
    left = mod.flatnonzero(~placed)
    if left.shape[0]:
        chosen[left] = mod.nan
        greedy_rounds(cand[left], dist[left], w, remaining, mod, labels=labels,
                      chosen=chosen, rows=left)
    return labels, chosen, remaining


# -- the rounds -------------------------------------------------------------------------------
def greedy_rounds(cand, dist, w, remaining, mod, labels=None, chosen=None, rows=None):
    """One pass of the regret-ordered rounds (module docstring) over the rows `rows` (all
    when None) with candidates `cand` (their (len(rows), m) centers, nearest first) and
    distances `dist`. Writes each placed row's center into `labels` and its distance into
    `chosen` (made when None; -1 and NaN where not placed), lowers `remaining` (rows each
    cluster may still take) in place. Returns (labels, chosen)."""
    n, m = cand.shape
    if rows is None:
        rows = mod.arange(n)
    if labels is None:
        labels = mod.full(int(rows.shape[0]), -1, dtype=mod.int64)
        chosen = mod.full(int(rows.shape[0]), mod.nan, dtype=mod.float64)
        rows_out = mod.arange(n)
    else:
        rows_out = rows
    k = remaining.shape[0]
    active = mod.arange(n)   # positions in cand
    for r in range(m):
        if active.shape[0] == 0:
            break
        c = cand[active, r].astype(mod.int64)
        here = dist[active, r]
        nxt = dist[active, r + 1] if r + 1 < m else here + LAST_REGRET
        regret = nxt - here
        if w is not None:
            regret = regret * w[rows[active]]
        # by cluster, then regret descending, then row (`active` is sorted)
        order = _stable_argsort(-regret, mod)
        order = order[_stable_argsort(c[order], mod)]
        cs, pos = c[order], active[order]
        rank = mod.arange(cs.shape[0]) - mod.searchsorted(cs, cs, side="left")
        ok = rank < remaining[cs]
        took = cs[ok]
        labels[rows_out[pos[ok]]] = took
        chosen[rows_out[pos[ok]]] = dist[pos[ok], r]
        remaining -= mod.bincount(took, minlength=k).astype(remaining.dtype)
        active = mod.sort(pos[~ok])
    return labels, chosen


def penalized_choice(cand, dist, penalty, mod):
    """(labels, distances) of the candidate minimising distance + penalty[center]."""
    cost = dist + penalty[cand.astype(mod.int64)]
    best = mod.argmin(cost, axis=1)[:, None]
    return (mod.take_along_axis(cand, best, axis=1)[:, 0].astype(mod.int64),
            mod.take_along_axis(dist, best, axis=1)[:, 0])


def labels_like(labels, X, xp):
    """Labels (NumPy or CuPy int64) as the backend takes them with X: int32 in X's namespace
    and on its device (a dask X: blocks laid out like X's rows)."""
    if namespace_name(X) == "dask":
        import dask.array as da
        return da.from_array(to_numpy(labels).astype(np.int32), chunks=(X.chunks[0],))
    if array_module(X) is not None and array_module(X) is array_module(labels):
        return labels.astype(array_module(X).int32)
    return xp.asarray(to_numpy(labels).astype(np.int32), device=device(X))


def rows_of(X, idx, xp):
    """X's rows at the (NumPy or CuPy) positions idx, in X's namespace."""
    if namespace_name(X) == "dask":
        return X[to_numpy(idx)]
    if array_module(X) is not None and array_module(X) is array_module(idx):
        return X[idx]
    return xp.take(X, xp.asarray(to_numpy(idx), device=device(X)), axis=0)


def host_or_module(a, mod):
    """a in `mod` (NumPy or CuPy): moved there when it is elsewhere."""
    if array_module(a) is mod:
        return a
    host = to_numpy(a)
    return host if mod is np else mod.asarray(host)
