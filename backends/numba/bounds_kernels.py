"""The numba backend's row test for the driver's bounds (`kmeans_xp.contract.bounds`): one
parallel pass over the rows that moves each row's bounds by the centers' shift, keeps the
rows whose lower bounds clear their upper bound, tightens the others' upper bound to their
exact distance, and marks the rows that still fail (recomputed by the caller against all
centers). The same arithmetic as `bounds.filter_rows_numpy`, in one pass instead of a few
NumPy passes over the (n, k) Elkan bounds."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

#: method codes
HAMERLY, ELKAN, YINYANG = 0, 1, 2


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
