"""The unit sphere: rows scaled to unit L2 norm, centers projected back onto it, cosine
distances. Spherical k-means (`SphericalKMeans`) needs nothing more from the backends.

For unit x and c, ||x - c||^2 = 2 - 2 cos(x, c): on unit rows the backends' squared-Euclidean
argmin *is* the cosine assignment (the largest cosine), and their float64 per-cluster sums
give each new center's direction. So a spherical fit is THE Lloyd loop on a unit-row copy of
X, with the driver (`kmeans_xp.algorithms.lloyd`) projecting each new center onto the sphere: no kernel
of its own on any backend.

Below the driver and the Placement: imports only `chunks` and `namespaces`.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.chunks import row_chunks
from kmeans_xp.contract.namespaces import device, to_numpy


class ZeroNormError(ValueError):
    """Rows of norm 0: their cosine with any center is undefined."""


def _unit_chunk(x, xp):
    """(x's rows scaled to unit norm in float64, a 0-d count of its zero rows). Each row is
    divided by its largest |value| first, so no square overflows or underflows (float64 X
    at 1e200 or 1e-200 included); zero rows stay zero, and are counted."""
    x = xp.astype(x, xp.float64, copy=False)  # (never written)
    top = xp.max(xp.abs(x), axis=1)
    zero = top == 0
    y = x / xp.where(zero, xp.ones_like(top), top)[:, None]
    norm = xp.sqrt(xp.sum(y * y, axis=1))
    y = y / xp.where(zero, xp.ones_like(norm), norm)[:, None]
    return y, xp.sum(xp.astype(zero, xp.int64))


def zero_norm_error(X, xp, first_row=0):
    """The error for X's rows of norm 0, naming the first few (found again: only on error)."""
    rows = []
    for sl in row_chunks(X.shape[0], 1 << 16):
        top = to_numpy(xp.max(xp.abs(X[sl, ...]), axis=1))
        rows.extend((np.flatnonzero(top == 0) + sl.start + first_row)[:5].tolist())
        if len(rows) >= 5:
            break
    return ZeroNormError(
        f"X has rows of norm 0 (rows {rows[:5]}{', ...' if len(rows) > 5 else ''}): "
        f"their cosine with any center is undefined. Drop them (e.g. "
        f"X[np.linalg.norm(X, axis=1) > 0]) before a spherical fit.")


def unit_rows(X, xp, rows, *, in_place=False, first_row=0):
    """X's rows scaled to unit L2 norm, in X's dtype (normalised in float64, then rounded
    once), chunk by chunk so that no float64 copy of X exists. A new array, or X itself
    rewritten with `in_place` (only for an X the fit owns). Rows of norm 0 raise
    `ZeroNormError` (`first_row`: the row number of X's first row, for the message)."""
    n = X.shape[0]
    if n <= rows and not in_place:
        u, zeros = _unit_chunk(X, xp)
        if int(zeros):
            raise zero_norm_error(X, xp, first_row)
        return xp.astype(u, X.dtype, copy=False)
    out = X if in_place else xp.empty(X.shape, dtype=X.dtype, device=device(X))
    zeros = 0
    for sl in row_chunks(n, rows):
        u, z = _unit_chunk(X[sl, ...], xp)
        zeros = zeros + z  # read once, after the loop: one device sync
        out[sl, ...] = xp.astype(u, X.dtype)
    if int(zeros):
        raise zero_norm_error(X, xp, first_row)
    return out


#: how far from 1 the norm of a row may be where X is used as given (copy_x=False): the
#: point then pulls its center's direction with weight |x| instead of 1, i.e. within 1e-4
UNIT_NORM_TOL = 1e-4


def check_unit_rows(X, xp, rows):
    """Raise ValueError unless every row of X has L2 norm within UNIT_NORM_TOL of 1."""
    worst = []
    for sl in row_chunks(X.shape[0], rows):
        x = xp.astype(X[sl, ...], xp.float64)
        worst.append(xp.max(xp.abs(xp.sqrt(xp.sum(x * x, axis=1)) - 1.0)))
    err = float(to_numpy(xp.max(xp.stack(worst))))
    if not err <= UNIT_NORM_TOL:  # (NaN fails too)
        raise ValueError(
            f"copy_x=False: a spherical fit then computes on X as given, whose rows must have "
            f"unit L2 norm, but a row's norm is {err:.3g} away from 1 (at most "
            f"{UNIT_NORM_TOL:g}). Normalise X's rows first (e.g. "
            f"sklearn.preprocessing.normalize), or use copy_x=True: the fit then normalises "
            f"a copy.")


def unit_centers(C, fallback, xp):
    """C's rows (means of unit rows) projected onto the unit sphere, in float64. A row of
    norm 0 (its cluster's points cancel out exactly: no direction) keeps `fallback`'s row,
    its previous center."""
    # (once per iteration in the driver, a device launch per call on a GPU: no copies)
    c = xp.astype(C, xp.float64, copy=False)
    norm = xp.sqrt(xp.sum(c * c, axis=1))[:, None]
    nonzero = norm > 0
    return xp.where(nonzero, c / xp.where(nonzero, norm, xp.ones_like(norm)),
                    xp.astype(fallback, xp.float64, copy=False))


def cosine_distances(X, centers, xp, rows):
    """(n, k) cosine distances 1 - cos(x, c) in [0, 2], in X's dtype, for unit centers:
    each chunk of X normalised in float64 (rows of norm 0 raise `ZeroNormError`)."""
    c64 = xp.astype(centers, xp.float64)
    parts = []
    for sl in row_chunks(X.shape[0], max(1, rows // max(1, centers.shape[0] // 64))):
        u, zeros = _unit_chunk(X[sl, ...], xp)
        if int(zeros):
            raise zero_norm_error(X, xp)
        dist = 1.0 - u @ c64.T
        dist = xp.clip(dist, 0.0, 2.0) if hasattr(xp, "clip") else xp.where(
            dist < 0, xp.zeros_like(dist), xp.where(dist > 2, xp.full_like(dist, 2.0), dist))
        parts.append(xp.astype(dist, X.dtype))
    return parts[0] if len(parts) == 1 else xp.concat(parts)
