"""The numba backend's kernels for the driver's bounds (`kmeans_xp.contract.bounds`), each
the NumPy code's arithmetic in one parallel pass instead of several NumPy passes:

- `filter_rows`: moves each row's bounds by the centers' shift, keeps the rows whose lower
  bounds clear their upper bound, tightens the others' upper bound to their exact distance,
  and marks the rows that still fail (`bounds.filter_rows_numpy`);
- `set_rows`: the failing rows' labels and bounds from their recomputed distances
  (`bounds.Bounds.set_rows`)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

#: method codes
HAMERLY, ELKAN, YINYANG = 0, 1, 2
METHOD = {"hamerly": HAMERLY, "elkan": ELKAN, "yinyang": YINYANG}


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def filter_rows(X, c64, labels, upper, lower, method, s, s1, j1, s2, group_shift, half, x2,
                gamma, c2max, slack, fail):
    """fail[i] = 1 where row i must be recomputed, else 0; upper and lower updated in
    place (see `bounds.filter_rows_numpy`)."""
    n, d = X.shape
    m = lower.shape[1]
    for i in prange(n):
        a = labels[i]
        u = upper[i] + s[a]
        if method == HAMERLY:
            z = lower[i, 0] - (s2 if a == j1 else s1)
            lower[i, 0] = z
        elif method == ELKAN:
            z = np.inf
            for c in range(m):
                v = lower[i, c] - s[c]
                lower[i, c] = v
                if v < z:
                    z = v
        else:
            z = np.inf
            for g in range(m):
                v = lower[i, g] - group_shift[g]
                lower[i, g] = v
                if v < z:
                    z = v
        h = 2.0 * half[a] - u
        if h > z:
            z = h
        delta2 = 2.0 * gamma * (x2[i] + 2.0 * c2max)
        if z > np.sqrt(u * u + delta2) * slack:
            upper[i] = u
            fail[i] = 0
            continue
        acc = 0.0
        for f in range(d):
            t = np.float64(X[i, f]) - c64[a, f]
            acc += t * t
        u = np.sqrt(acc) * slack
        upper[i] = u
        fail[i] = 0 if z > np.sqrt(u * u + delta2) * slack else 1


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def set_rows(D, idx, x2, delta, method, groups, labels, upper, lower):
    """`Bounds.set_rows` in one pass over each recomputed row's distances D[j] (its
    ||c||^2 - 2 x.c, row idx[j] of X): the argmin (the lowest index on a tie, as
    np.argmin), the upper bound, and the method's lower bounds, widened by delta[j]."""
    r, k = D.shape
    for j in prange(r):
        i = idx[j]
        best = D[j, 0]
        a = 0
        for c in range(1, k):
            if D[j, c] < best:
                best = D[j, c]
                a = c
        labels[i] = a
        shift = x2[j] - delta[j]
        upper[i] = np.sqrt(max(np.float64(best) + x2[j] + delta[j], 0.0))
        if method == ELKAN:
            for c in range(k):
                lower[i, c] = np.inf if c == a else np.sqrt(
                    max(np.float64(D[j, c]) + shift, 0.0))
        elif method == HAMERLY:
            m = np.inf
            for c in range(k):
                if c != a and D[j, c] < m:
                    m = np.float64(D[j, c])
            lower[i, 0] = np.sqrt(max(m + shift, 0.0))
        else:
            t = lower.shape[1]
            for g in range(t):
                lower[i, g] = np.inf
            for c in range(k):
                if c != a:
                    g = groups[c]
                    v = np.float64(D[j, c])
                    if v < lower[i, g]:
                        lower[i, g] = v
            for g in range(t):
                lower[i, g] = np.sqrt(max(lower[i, g] + shift, 0.0))
