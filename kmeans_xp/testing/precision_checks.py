"""The contract suite's half-precision checks (`check_backend` runs them): what a backend must
do to take part in half precision (docs/precision.md). It takes float16 X and returns float32
centers; at each precision it declares (`KMeansBackend.precisions`), a fit from the numpy
backend's exact fit's initial centers lands within the documented bound of its inertia; and
each assignment at that precision picks, for every row, a center no farther than the
certified bound from the nearest (`contract.precision.assignment_error`)."""
from __future__ import annotations

import warnings

import numpy as np

from kmeans_xp.contract import registry
from kmeans_xp.contract.namespaces import to_numpy
from kmeans_xp.contract.precision import (LABEL_SHARE, assignment_error, inertia_gap_bound,
                                          storage_dtype)
from kmeans_xp.testing.fits import asymmetric_data


def half_case():
    """(X float32, init): k matches the data's clusters, n no multiple of a chunk."""
    X = asymmetric_data(2003, 8, 6, dtype=np.float32, seed=11)
    X -= X.mean(axis=0)
    init = X[np.random.default_rng(5).choice(len(X), 6, replace=False)]
    return X, init


def _fit(name, X, init, precision):
    from kmeans_xp.estimators.kmeans import KMeans
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return KMeans(len(init), init=init, backend=name, precision=precision, tol=0,
                      max_iter=100).fit(X)


def check_fit_within_bound(got, ref, precision, d, where):
    """The documented whole-fit bound: relative inertia gap and share of labels."""
    gap = abs(got.inertia_ - ref.inertia_) / ref.inertia_
    bound = inertia_gap_bound(precision, d)
    assert gap <= bound, f"{where}: inertia gap {gap:.3g} > the bound {bound:.3g}"
    moved = np.mean(to_numpy(got.labels_) != np.asarray(ref.labels_))
    assert moved <= LABEL_SHARE, f"{where}: {moved:.2%} of labels differ (> {LABEL_SHARE:.0%})"
    centers = to_numpy(got.cluster_centers_)
    assert centers.dtype == np.float32, f"{where}: centers are {centers.dtype}, not float32"


def check_assignment_bound(backend, to_arr, precision, where, case=None):
    """Each row's center at `precision` is within the certified error of the nearest; case:
    (X, centers) float32 NumPy arrays, half_case()'s by default."""
    X, init = half_case() if case is None else case
    backend.use_precision(precision)
    try:
        Xb = backend.placement.to_backend(to_arr(X))
        xp = backend.placement.namespace(Xb)
        C = xp.asarray(init)
        labels = to_numpy(backend.assign(Xb, C, xp=xp).labels).astype(np.int64)
    finally:
        backend.use_precision("exact")
    X64, C64 = X.astype(np.float64), init.astype(np.float64)
    dist = ((X64[:, None, :] - C64[None]) ** 2).sum(-1)
    excess = dist[np.arange(len(X)), labels] - dist.min(1)
    eps = assignment_error(precision, X.shape[1], np.linalg.norm(X64, axis=1),
                           np.linalg.norm(C64, axis=1).max())
    assert np.all(excess <= 2 * eps), f"{where}: a row's center is farther than the bound"


def check_half_precision(backend, to_arr):
    """The half-precision checks on `backend` (registered for the fits); the number passed."""
    name = backend.name
    X, init = half_case()
    X16 = X.astype(np.float16)
    passed = 0
    try:
        X16_in = to_arr(X16)
    except (TypeError, ValueError):   # a namespace without float16 (array-api-strict)
        X16_in = None
    with registry.registered(type(backend)):
        if X16_in is not None:
            ref16 = _fit("numpy", X16, init, "exact")
            got = _fit(name, X16_in, init, "exact")
            check_fit_within_bound(got, ref16, "fp16", X.shape[1], f"{name} float16 X")
            passed += 1
        ref = _fit("numpy", X, init, "exact")
        for precision in backend.precisions:
            if precision == "exact":
                continue
            where = f"{name} precision={precision!r}"
            backend.use_precision(precision)
            try:   # (a precision the backend declares may need a device it is not on: its
                # reject_reason says so, and the fit is refused before any work)
                refused = backend.reject_reason(to_arr(X), n_clusters=len(init))
            finally:
                backend.use_precision("exact")
            if refused is not None:
                continue
            check_fit_within_bound(_fit(name, to_arr(X), init, precision), ref, precision,
                                   X.shape[1], where)
            check_assignment_bound(backend, to_arr, precision, where)
            passed += 2
            half = _half_input(X, precision, to_arr) if precision in backend.half_data else None
            if half is not None:
                check_half_data(name, *half, to_arr, init, precision, where)
                passed += 1
    return passed


def _half_input(X, precision, to_arr):
    """(X in `precision`'s half dtype on the host, the same as the backend takes it), or
    None where NumPy or the backend's namespace has no such dtype (bfloat16 without
    ml_dtypes)."""
    dtype = storage_dtype(precision, np)
    if dtype is None:
        return None
    Xh = X.astype(dtype)
    try:
        return Xh, to_arr(Xh)
    except (TypeError, ValueError):
        return None


def check_half_data(name, Xh, Xh_in, to_arr, init, precision, where):
    """A precision of `half_data`: the fit of X in that format computes on it as it is
    (within the bound of the exact fit of its values), and a float32 X holding the same
    values gives the same fit (its centered data is rounded to the format once, as the half
    X's is)."""
    what = f"{where}, {Xh.dtype} X"
    ref = _fit("numpy", Xh, init, "exact")
    got = _fit(name, Xh_in, init, precision)
    check_fit_within_bound(got, ref, precision, Xh.shape[1], what)
    same = _fit(name, to_arr(Xh.astype(np.float32)), init, precision)
    assert np.array_equal(to_numpy(got.labels_), to_numpy(same.labels_)), \
        f"{what}: it and its float32 values give different labels"
    assert np.array_equal(to_numpy(got.cluster_centers_), to_numpy(same.cluster_centers_)), \
        f"{what}: it and its float32 values give different centers"
    assert got.inertia_ == same.inertia_, f"{what}: different inertia"
