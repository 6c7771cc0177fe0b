"""The numpy backend's tuning constants choose speed, not answers: a fit with any of them moved
(sub-chunk sizes, the worker processes' sub-chunks, label-grouped sums for every d, features
cast a group at a time) is the default's fit up to what rounding allows (the same partition up
to near ties, inertia and centers within rounding: `kmeans_xp.testing.label_bounds
.fit_differences`), on the contract's whole-fit cases (`lloyd_cases`, float32 and float64, on
two threads) and on wider data cut in many blocks over two threads (d = 130, so that the sums
are label-grouped and a feature group is short). A GEMM of other row counts may round
otherwise on some BLAS builds, so bit equality is not what is asserted.

The benchmark that times these variants is benchmarks/test_bench_numpy.py."""
import functools
import warnings

import kmeans_xp_backends.numpy.backend as nb
import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
from kmeans_xp.testing.fits import lloyd_cases
from kmeans_xp.testing.label_bounds import fit_differences

#: label -> constants of kmeans_xp_backends.numpy.backend set for the fit
VARIANTS = {
    "threads only": {"PROCESS_MIN_NS": float("inf")},
    "workers at every d": {"PROCESS_MAX_D": 1 << 30},
    "workers' sub-chunks of 16 threads": {"PROCESS_SUB_THREADS": 16},
    "sums label-grouped at every d": {"SORTED_SUMS_MIN_D": 0},
    "sub-chunks of 8 MiB": {"SUB_NS_PER_THREAD": 10**9},
    "sub-chunks of 16 MiB": {"SUB_NS_PER_THREAD": 10**9, "TARGET_BLOCK_BYTES": 16 << 20},
    "sub-chunks of 120 us": {"SUB_NS_PER_THREAD": 120_000},
    "sub-chunks of 256 rows at least": {"MIN_ROWS": 256},
    "sub-chunks of 1024 rows at least": {"MIN_ROWS": 1024},
    "sums cast 32 features at a time": {"SORTED_SUMS_GROUP": 32},
    "sums cast 8 features at a time": {"SORTED_SUMS_GROUP": 8},
}


def wide_cases(dtype):
    """d = 130 (past SORTED_SUMS_MIN_D; 130 = 8 x 16 + 2), plain, weighted, and with centers
    nobody is near (empty clusters, relocation)."""
    X = asymmetric_data(3001, 130, 9, dtype=dtype, seed=11)
    init = X[np.random.default_rng(5).choice(len(X), 9, replace=False)]
    w = np.random.default_rng(6).uniform(0.5, 2.0, len(X)).astype(dtype)
    far = init.copy()
    far[:2] += 1e3
    return [("wide plain", dict(n_clusters=9, init=init, max_iter=30), X, {}),
            ("wide weights", dict(n_clusters=9, init=init, max_iter=30), X, {"sample_weight": w}),
            ("wide empty clusters", dict(n_clusters=9, init=far, max_iter=30), X, {})]


#: (variant, case, dtype) whose fit may reach another partition: in float64 'duplicates'
#: (every point repeated, ties everywhere) label-grouped sums for d < 16 add a cluster's
#: values pairwise (reduceat), not in row order (bincount), and the last bit of a mean
#: decides a tie between a center on a point and the mean of its copies (5 clusters, inertia
#: ~1e-27, against 4 and 448)
TIES_DECIDE = {("sums label-grouped at every d", "duplicates", "float64")}

#: the wide cases in blocks of this many rows (several per thread: the pool's paths)
WIDE_TASK_ROWS = 500


def _fits(cases, attrs):
    saved = {a: getattr(nb, a) for a in attrs}
    try:
        for a, v in attrs.items():
            setattr(nb, a, v)
        out = []
        for _, kwargs, X, fit_kw in cases:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out.append(KMeans(backend="numpy", backend_options={"n_threads": 2},
                                  **kwargs).fit(X, **fit_kw))
        return out
    finally:
        for a, v in saved.items():
            setattr(nb, a, v)


@functools.lru_cache(maxsize=None)
def _reference(dtype_name, wide):
    dtype = np.dtype(dtype_name).type
    if wide:
        return _fits(wide_cases(dtype), {"TARGET_TASK_ROWS": WIDE_TASK_ROWS})
    return _fits(lloyd_cases(dtype), {})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_fits_as_the_default(variant, dtype):
    attrs = VARIANTS[variant]
    for wide, cases in ((False, lloyd_cases(dtype)), (True, wide_cases(dtype))):
        ref = _reference(np.dtype(dtype).name, wide)
        got = _fits(cases, {**attrs, "TARGET_TASK_ROWS": WIDE_TASK_ROWS} if wide else attrs)
        for (case, _, X, fit_kw), a, b in zip(cases, got, ref):
            if (variant, case, np.dtype(dtype).name) in TIES_DECIDE:
                continue
            problems = fit_differences(X, a, b, sample_weight=fit_kw.get("sample_weight"))
            assert not problems, f"{variant} {np.dtype(dtype)} case {case!r}: {problems}"


def test_every_variant_is_a_constant_of_the_backend():
    for variant, attrs in VARIANTS.items():
        assert attrs and all(hasattr(nb, a) for a in attrs), variant


def test_grouped_sums_cast_a_group_at_a_time(monkeypatch):
    import kmeans_xp_backends.numpy.blocks as blocks
    calls = []
    monkeypatch.setattr(nb, "SORTED_SUMS_GROUP", 16)
    monkeypatch.setattr(nb, "TARGET_TASK_ROWS", 500)
    real_sums = blocks.sorted_sums
    monkeypatch.setattr(blocks, "sorted_sums", lambda *a, **k: (
        calls.append(("group", a[5]["group"])), real_sums(*a, **k)))
    X = asymmetric_data(3001, 130, 9, dtype=np.float32, seed=1)
    nb.NumpyBackend(n_threads=2).lloyd_iter(X, None, X[:9].copy(), None)
    assert ("group", 16) in calls


def test_fit_differences_sees_another_partition():
    X = asymmetric_data(2001, 3, 6, dtype=np.float32, seed=3)
    fit = KMeans(6, init=X[:6], max_iter=20, backend="numpy").fit(X)
    assert fit_differences(X, fit, fit) == []
    other = KMeans(6, init=X[-6:], max_iter=1, backend="numpy").fit(X)
    assert fit_differences(X, other, fit)
