"""How far the labels of two correct implementations may differ, as bounds on exact distances
(NumPy, float64): where two roundings of the expansion ||c||^2 - 2 x.c may order two centers
differently (`near_tie`), and how much farther than the nearest a center that
`precision="tf32"` picks may be (`tf32_error`, the README's bound); and whether two whole fits
are the same up to such ties (`fit_differences`). The agreement tests and the GPU tests
assert labels against these."""
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
    gap, bound = _gap_and_bound(X, C, a, b, dtype)
    return gap <= bound


def _gap_and_bound(X, C, a, b, dtype):
    """|d(x, c_a) - d(x, c_b)| exactly (float64), and `near_tie`'s bound on it."""
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
    return np.abs(da - db), bound


def fit_differences(X, got, ref, *, sample_weight=None, rtol=None, max_moved=0.01):
    """What users rely on when two correct implementations fit the same X from the same
    initial centers (different GEMM shapes, BLAS builds, sum orders): the same partition up
    to near ties, and the same inertia and centers up to rounding. Returns the problems
    found, as sentences (empty: the fits agree). `got` and `ref` are fitted estimators
    (labels_, cluster_centers_, inertia_, n_iter_ on the host).

    A row may carry another label only where the two labels' exact distances differ by no
    more than both fits' rounding (`near_tie` at each fit's centers) plus what the other fit's
    centers moved: a center moved by delta changes d(x, c) by at most 2 |x - c| delta +
    delta^2. Where labels differ, a cluster's center may move by the weight of the rows that
    came or left times their distance to it, over the cluster's weight; the inertia by the
    moved rows' distances; and the iteration count may differ. At most `max_moved` of the
    rows may move (more is another partition, however the centers moved). rtol (default by
    X's dtype: 1e-4 float32, 1e-9 float64) bounds the rest."""
    X = np.asarray(X)
    dtype = X.dtype if X.dtype in (np.float32, np.float64) else np.float64
    rtol = (1e-4 if dtype == np.float32 else 1e-9) if rtol is None else rtol
    la, lb = np.asarray(ref.labels_), np.asarray(got.labels_)
    A = np.asarray(ref.cluster_centers_, dtype=np.float64)
    B = np.asarray(got.cluster_centers_, dtype=np.float64)
    w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, np.float64)
    problems = []
    if A.shape != B.shape or la.shape != lb.shape:
        return [f"shapes differ: centers {A.shape} against {B.shape}, labels {la.shape} "
                f"against {lb.shape}"]
    moved = np.flatnonzero(la != lb)
    X64 = X.astype(np.float64)
    if moved.size > max_moved * len(X):
        problems.append(f"{moved.size} of {len(X)} rows carry another label: another "
                        f"partition")
    if moved.size:
        Xm, a, b = X64[moved], la[moved], lb[moved]
        gap, bound_a = _gap_and_bound(Xm, A, a, b, dtype)
        bound_b = _gap_and_bound(Xm, B, a, b, dtype)[1]
        delta = np.linalg.norm(B - A, axis=1)
        ra, rb = (np.linalg.norm(Xm - A[j], axis=1) for j in (a, b))
        slack = 2 * (ra * delta[a] + rb * delta[b]) + delta[a] ** 2 + delta[b] ** 2
        unexplained = gap > (bound_a + bound_b + slack) * (1 + 1e-6)
        if unexplained.any():
            i = moved[unexplained][:5]
            problems.append(f"{np.count_nonzero(unexplained)} of {len(X)} rows carry another "
                            f"label though they are no near tie (rows {i.tolist()})")
    elif got.n_iter_ != ref.n_iter_:
        problems.append(f"same partition, but n_iter {got.n_iter_} against {ref.n_iter_}")
    # centers: a cluster's mean moves by what the moved rows bring or take, over its weight
    k = A.shape[0]
    weight = np.bincount(la, weights=w, minlength=k)
    shift = np.zeros(k)
    if moved.size:
        for lab, C in ((la, A), (lb, A)):
            j = lab[moved]
            np.add.at(shift, j, w[moved] * np.linalg.norm(X64[moved] - C[j], axis=1))
        left = weight - np.bincount(la[moved], weights=w[moved], minlength=k)
        with np.errstate(divide="ignore", invalid="ignore"):   # a cluster all moved: any
            shift = np.where(shift > 0, shift / np.maximum(left, 0), 0.0)
    scale = float(np.abs(A).max()) if A.size else 0.0
    off = np.linalg.norm(B - A, axis=1) - shift - rtol * 10 * (scale + 1)
    if (off > 0).any():
        problems.append(f"centers {np.flatnonzero(off > 0)[:5].tolist()} moved past what the "
                        f"moved rows and rounding allow (by {off.max():.3g})")
    # inertia: the moved rows' distances, plus rounding
    room = rtol * abs(ref.inertia_) + 1e-12
    if moved.size:
        room += float(np.sum(w[moved] * (np.linalg.norm(X64[moved] - A[la[moved]], axis=1)
                                          + np.linalg.norm(X64[moved] - B[lb[moved]], axis=1))
                             ** 2))
    if not abs(got.inertia_ - ref.inertia_) <= room:
        problems.append(f"inertia {got.inertia_!r} against {ref.inertia_!r} (room {room:.3g})")
    return problems


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
