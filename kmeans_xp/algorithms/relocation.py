"""Empty clusters: scikit-learn's relocation, for one fit or for several problems of a batch
at once (`lloyd._update`, `batches.BatchRun`).

Each empty cluster, in index order, takes the next point farthest from its center, moving
that point's weight and weighted coordinates out of its old cluster; nothing moves when all
those points sit on their centers (distance 0). An empty cluster never gives a point, and a
cluster that gives several has them subtracted in the candidates' order, as sklearn's loop
does.

The work is done on the host on the weights and the rows of sums it changes, in three steps
whatever the number of problems: every problem's farthest points are asked for at once
(`farthest_many`: a device backend ranks them together); their rows and their clusters' rows
of sums come down in one transfer; the moves of all problems are computed together, and the
changed rows and weights go back in one transfer, put in place by one `take`. (k x d float64
both ways was a millisecond at W5, and each further read is a device round trip: a batch
relocating problem by problem made three round trips a problem.)
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kmeans_xp.contract.namespaces import array_namespace, device, to_numpy


class Problem(NamedTuple):
    """A problem whose clusters are relocated: its position in the stack of sums, its
    centered X, weights (None: unit), the centers of the iteration and its labels."""
    at: int
    X: Any
    sample_weight: Any
    centers: Any
    labels: Any


def relocate_empty(backend, X, sample_weight, centers_old, labels, sums, weights, xp):
    """One fit's relocation: (sums (k, d), weights (k,)) with its empty clusters filled."""
    cxp = backend.placement.namespace(sums)
    s, w = relocate_empty_many(backend, [Problem(0, X, sample_weight, centers_old, labels)],
                               cxp.reshape(sums, (1, *sums.shape)),
                               cxp.reshape(weights, (1, -1)), xp)
    return s[0, ...], w[0, ...]


def relocate_empty_many(backend, problems, sums, weights, xp):
    """(sums (P, k, d), weights (P, k)) with the empty clusters of `problems` (`Problem`s,
    each at its row of the stack) filled; the other rows as they were."""
    cxp, dev = backend.placement.namespace(sums), device(sums)
    P, k, d = sums.shape
    ats = [p.at for p in problems]
    w = to_numpy(cxp.take(weights, cxp.asarray(ats, device=dev), axis=0)).astype(np.float64)
    empties = [np.flatnonzero(row == 0) for row in w]
    far = backend.farthest_many([(p.X, p.sample_weight, p.centers, p.labels, int(e.size))
                                 for p, e in zip(problems, empties)], xp=xp)
    changed = _moves(k, w, empties, _far_rows(far, [e.size for e in empties], sums, ats, cxp))
    if changed is None:
        return sums, weights
    rows_q, packed = changed
    index = np.asarray(ats, dtype=np.int64)[rows_q // k] * k + rows_q % k   # rows of the stack
    at = np.arange(P * k)   # flat row i of the result: row i, or row j of the changes at P k + j
    at[index] = P * k + np.arange(index.size)
    at_dev = cxp.asarray(at, device=dev)
    new_rows = cxp.asarray(packed, dtype=cxp.float64, device=dev)
    s_all = cxp.concat([cxp.reshape(sums, (P * k, d)), new_rows[:, :d]], axis=0)
    w_all = cxp.concat([cxp.reshape(weights, (P * k,)), new_rows[:, d]], axis=0)
    return (cxp.reshape(cxp.take(s_all, at_dev, axis=0), (P, k, d)),
            cxp.reshape(cxp.take(w_all, at_dev, axis=0), (P, k)))


def _moves(k, w, empties, far):
    """The changed rows of all problems together: (their flat rows q * k + cluster, sorted,
    with q the problem's position in the list; their [sums | weight] rows, float64), or None
    where nothing moves. `w` (Q, k) host weights, changed in place; `far` `_far_rows`'s.

    A problem whose farthest points all sit on their centers moves nothing. Its j-th farthest
    point moves to its j-th empty cluster, out of its old cluster; a cluster giving several
    points has them subtracted in the candidates' order (`np.subtract.at`'s, sklearn's), one
    pass per rank among its points, each pass over every problem at once."""
    keep = [q for q, (dist, _, _, x, _, dtype) in enumerate(far)
            if dist.size and dist.max() > _rounding(x, dtype)]
    if not keep:
        return None
    fw, x, s_old = (np.concatenate([far[q][i] for q in keep]) for i in (1, 3, 4))
    old = np.concatenate([q * k + far[q][2] for q in keep])
    new = np.concatenate([q * k + empties[q][:far[q][1].size] for q in keep])
    rows = np.unique(np.concatenate([old, new]))
    at_old = np.searchsorted(rows, old)
    moved = x * fw[:, None]
    s = np.zeros((rows.size, x.shape[1]), dtype=np.float64)
    s[at_old] = s_old       # (a cluster giving several points: one row)
    flat_w = w.reshape(-1)  # (a view: w is C-contiguous)
    order = np.argsort(at_old, kind="stable")          # each cluster's points in order
    first = np.searchsorted(at_old[order], at_old[order])
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size) - first
    for r in range(int(rank.max()) + 1):
        now = rank == r        # (no cluster twice in a pass)
        s[at_old[now]] -= moved[now]
        flat_w[old[now]] -= fw[now]
    s[np.searchsorted(rows, new)], flat_w[new] = moved, fw
    return rows, np.concatenate([s, flat_w[rows, None]], axis=1)


def _rounding(x, dtype):
    """A squared distance that is rounding, not distance: a point on its center can sit a
    few ulps away when the center is a mean the backend rounded (float64 sums in order) or
    not (exact sums), and the guard must not depend on which."""
    eps = float(np.finfo(np.float32 if "32" in str(dtype) else np.float64).eps)
    return (8 * eps) ** 2 * float(np.max(np.sum(x * x, axis=1), initial=0.0))


def _far_rows(far, counts, sums, ats, cxp):
    """Per problem (distances, weights, labels, rows of X, their clusters' rows of sums, X's
    dtype) of its farthest points (`farthest_many`'s stacked `far`, each problem's first
    `counts[p]` less those of sq_dist < 0) on the host, float64 (labels int64): one transfer
    for all where the points and the sums share a namespace and device (else two). The
    empty clusters' rows of sums are not read: the relocated points replace them."""
    (R, m), (P, k, d) = far.index.shape[:2], sums.shape
    fxp, flat = array_namespace(far.x), cxp.reshape(sums, (P * k, d))
    cols = [fxp.reshape(fxp.astype(a, fxp.float64), (R, m, 1))
            for a in (far.sq_dist, far.weight, far.label)] + [fxp.astype(far.x, fxp.float64)]
    base = np.asarray(ats, dtype=np.int64)[:, None] * k   # (problem p's rows of the stack)
    if fxp is cxp and device(far.x) == device(sums):
        lab = cxp.astype(far.label, cxp.int64) + cxp.asarray(base, device=device(sums))
        rows = cxp.take(flat, cxp.reshape(lab, (-1,)), axis=0)
        host = to_numpy(cxp.concat(cols + [cxp.reshape(rows, (R, m, d))], axis=2))
    else:
        part = to_numpy(fxp.concat(cols, axis=2))
        lab = (part[..., 2].astype(np.int64) + base).reshape(-1)
        rows = to_numpy(cxp.take(flat, cxp.asarray(lab, device=device(sums)), axis=0))
        host = np.concatenate([part, rows.reshape(R, m, d)], axis=2)
    out = []
    for p, c in enumerate(counts):
        # (a problem's own points come first, and those of sq_dist < 0 last among them)
        h = host[p, :int(np.count_nonzero(host[p, :c, 0] >= 0))]
        out.append((h[:, 0], h[:, 1], h[:, 2].astype(np.int64), h[:, 3:3 + d], h[:, 3 + d:],
                    far.x.dtype))
    return out
