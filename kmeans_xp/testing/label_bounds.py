"""How far the labels of two correct implementations may differ, as bounds on exact distances
(NumPy, float64): where two roundings of the expansion ||c||^2 - 2 x.c may order two centers
differently (`near_tie`), and how much farther than the nearest a center that
`precision="tf32"` picks may be (`tf32_error`, the README's bound). The agreement tests and the
device probes assert labels against these."""
from __future__ import annotations

import numpy as np


def near_tie(X, C, a, b, dtype):
    """Rows where two implementations of the expansion ||c||^2 - 2 x.c in `dtype` may order
    centers a and b differently. Whatever the summation order, a computed distance to c is
    within gamma_{d+2} (2 |x| |c| + |c|^2) of the exact one (d products in the dot, the norm's
    d terms, one final addition; Cauchy-Schwarz for sum |x_j c_j|), gamma_m = m u / (1 - m u),
    u = eps / 2. So if one implementation puts a first and the other b, the exact distances
    differ by at most the sum of the two centers' bounds. The exact distances are evaluated
    in float64 (plus that evaluation's own rounding, which matters only for float64 data)."""
    d = X.shape[1]
    u = np.finfo(dtype).eps / 2
    gamma = (d + 2) * u / (1 - (d + 2) * u)
    X64, C64 = np.asarray(X, dtype=np.float64), np.asarray(C, dtype=np.float64)
    da = ((X64 - C64[a]) ** 2).sum(1)
    db = ((X64 - C64[b]) ** 2).sum(1)
    nx2 = (X64 ** 2).sum(1)
    na2, nb2 = (C64[a] ** 2).sum(1), (C64[b] ** 2).sum(1)
    nx, na, nb = np.sqrt(nx2), np.sqrt(na2), np.sqrt(nb2)
    bound = gamma * (2 * nx * (na + nb) + na2 + nb2)
    bound += 4 * (d + 2) * np.finfo(np.float64).eps * (2 * nx2 + na2 + nb2)
    return np.abs(da - db) <= bound


def tf32_error(X, C, c):
    """Per row, e(c): how far a TF32 distance to center c[i] may be from the exact one. Inputs
    cut to TF32's 10-bit fraction (u = 2^-10 also covers truncation, which cuBLAS may use; our
    kernels round to nearest) make each product x_j (-2 c_j) off by at most 2u (1 + u) of
    itself, plus FP32 accumulation of d terms (gamma_d) and ||c||^2 (gamma_d |c|^2). A TF32
    label l is then at most e(l) + e(c*) farther than the nearest center c*."""
    d = X.shape[1]
    u = 2.0 ** -10
    u32 = np.finfo(np.float32).eps / 2
    gamma = d * u32 / (1 - d * u32)
    nx = np.sqrt((np.asarray(X, dtype=np.float64) ** 2).sum(1))
    nc = np.sqrt((np.asarray(C, dtype=np.float64)[c] ** 2).sum(1))
    return (2 * u * (1 + u) + gamma) * 2 * nx * nc + gamma * nc ** 2
