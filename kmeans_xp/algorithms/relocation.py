"""Empty clusters: scikit-learn's relocation, for one fit or for several problems of a batch
at once (`lloyd._update`, `batches.BatchRun`).

Each empty cluster, in index order, takes the next point farthest from its center, moving
that point's weight and weighted coordinates out of its old cluster; nothing moves when all
those points sit on their centers (distance 0). An empty cluster never gives a point, and
`np.subtract.at` subtracts in index order, as sklearn's loop does where a cluster gives
several points.

The work is done on the host on the weights and the rows of sums it changes, in three steps
whatever the number of problems: every problem's farthest points are asked for before any is
read; their rows and their clusters' rows of sums come down in one transfer; the changed rows
and weights go back in one, and one `take` puts them in place. (k x d float64 both ways was a
millisecond at W5, and each further read is a device round trip: a batch relocating problem
by problem made three round trips a problem.)
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
    fars = [backend.farthest(p.X, p.sample_weight, p.centers, p.labels, int(e.size), xp=xp)
            for p, e in zip(problems, empties)]
    index, packed = [], []   # flat rows (problem * k + cluster) changed, their [sums | weight]
    for p, row_w, empty, (dist, fw, old, x, s_old, dtype) in zip(
            problems, w, empties, _far_rows(fars, sums, ats, cxp)):
        if dist.size == 0 or not dist.max() > _rounding(x, dtype):
            continue
        new = empty[:len(fw)]
        moved = x * fw[:, None]
        rows = np.unique(np.concatenate([old, new]))
        at_old = np.searchsorted(rows, old)
        s = np.zeros((rows.size, d), dtype=np.float64)
        s[at_old] = s_old       # (a cluster giving several points: one row)
        np.subtract.at(s, at_old, moved)
        np.subtract.at(row_w, old, fw)
        s[np.searchsorted(rows, new)], row_w[new] = moved, fw
        index.append(p.at * k + rows)
        packed.append(np.concatenate([s, row_w[rows, None]], axis=1))
    if not index:
        return sums, weights
    at = np.arange(P * k)   # flat row i of the result: row i, or row j of the changes at P k + j
    changed = np.concatenate(index)
    at[changed] = P * k + np.arange(changed.size)
    at_dev = cxp.asarray(at, device=dev)
    new_rows = cxp.asarray(np.concatenate(packed), dtype=cxp.float64, device=dev)
    s_all = cxp.concat([cxp.reshape(sums, (P * k, d)), new_rows[:, :d]], axis=0)
    w_all = cxp.concat([cxp.reshape(weights, (P * k,)), new_rows[:, d]], axis=0)
    return (cxp.reshape(cxp.take(s_all, at_dev, axis=0), (P, k, d)),
            cxp.reshape(cxp.take(w_all, at_dev, axis=0), (P, k)))


def _rounding(x, dtype):
    """A squared distance that is rounding, not distance: a point on its center can sit a
    few ulps away when the center is a mean the backend rounded (float64 sums in order) or
    not (exact sums), and the guard must not depend on which."""
    eps = float(np.finfo(np.float32 if "32" in str(dtype) else np.float64).eps)
    return (8 * eps) ** 2 * float(np.max(np.sum(x * x, axis=1), initial=0.0))


def _far_rows(fars, sums, ats, cxp):
    """Per problem (distances, weights, labels, rows of X, their clusters' rows of sums, X's
    dtype) of its farthest points on the host, float64 (labels int64): one transfer for all
    where the points and the sums share a namespace and device (else two a problem). The
    empty clusters' rows of sums are not read: the relocated points replace them."""
    d = sums.shape[2]
    parts = []
    for far, at in zip(fars, ats):
        m = far.x.shape[0]
        fxp = array_namespace(far.x)
        cols = [fxp.reshape(fxp.astype(a, fxp.float64), (m, 1))
                for a in (far.sq_dist, far.weight, far.label)] + [fxp.astype(far.x, fxp.float64)]
        if fxp is cxp and device(far.x) == device(sums):
            rows = cxp.take(sums[at, ...], cxp.astype(far.label, cxp.int64), axis=0)
            parts.append(cxp.concat(cols + [rows], axis=1))
        else:
            part = to_numpy(fxp.concat(cols, axis=1))
            lab = cxp.asarray(part[:, 2].astype(np.int64), device=device(sums))
            parts.append(np.concatenate([part, to_numpy(cxp.take(sums[at, ...], lab, axis=0))],
                                        axis=1))
    sizes = [int(p.shape[0]) for p in parts]
    on_device = [p for p in parts if not isinstance(p, np.ndarray)]
    read = iter(np.split(to_numpy(cxp.concat(on_device, axis=0)),
                         np.cumsum([int(p.shape[0]) for p in on_device])[:-1])
                if on_device else ())
    out = []
    for far, part, m in zip(fars, parts, sizes):
        host = part if isinstance(part, np.ndarray) else next(read)
        out.append((host[:, 0], host[:, 1], host[:, 2].astype(np.int64), host[:, 3:3 + d],
                    host[:, 3 + d:], far.x.dtype))
    return out
