"""Every variant of the numpy backend that benchmarks/cpu_probe.py measures (module constants:
sums grouped by label for every d, GEMM chunks on BLAS's own threads, features cast a group at
a time, the K = d GEMM, sub-chunk sizes) gives the default's fits: the same labels, iteration
count and centers on the contract's whole-fit cases (`lloyd_cases`, float32 and float64, on two
threads), and on wider data cut in many blocks over two threads (d = 130, so that the sums are
label-grouped and a feature group is short). So a variant the measurements choose as the
default is already proven, or its differences are listed here (`KNOWN_DIFFERENCES`)."""
import functools
import warnings

import kmeans_xp_backends.numpy.backend as nb
import numpy as np
import pytest

from benchmarks.cpu_probe import VARIANTS
from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
from kmeans_xp.testing.fits import lloyd_cases

#: the distinct variants (constants -> the probe's labels)
_BY_ATTRS = {}
for _workload, _rows in VARIANTS.items():
    for _label, _attrs in _rows.items():
        _BY_ATTRS.setdefault(tuple(sorted(_attrs.items())), []).append(f"{_workload}: {_label}")
VARIANT_ATTRS = {" | ".join(labels): dict(key) for key, labels in _BY_ATTRS.items()}


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


#: cases where a variant's partition is not the default's, by the constants it sets: label-
#: grouped sums for d < 16 add a cluster's values pairwise (reduceat), not in row order
#: (bincount), and in float64 'duplicates' (every point repeated, ties everywhere) the last
#: bit of a mean decides a tie between a center on a point and the mean of its copies: the
#: fit reaches another partition (5 clusters, inertia ~1e-27, against 4 and 448)
KNOWN_DIFFERENCES = {("SORTED_SUMS_MIN_D", 0): {("duplicates", "float64")}}

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
@pytest.mark.parametrize("variant", sorted(VARIANT_ATTRS))
def test_variant_fits_as_the_default(variant, dtype):
    attrs = VARIANT_ATTRS[variant]
    known = set().union(*(v for (a, x), v in KNOWN_DIFFERENCES.items() if attrs.get(a) == x))
    differ = set()
    for wide, cases in ((False, lloyd_cases(dtype)), (True, wide_cases(dtype))):
        ref = _reference(np.dtype(dtype).name, wide)
        got = _fits(cases, {**attrs, "TARGET_TASK_ROWS": WIDE_TASK_ROWS} if wide else attrs)
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        for (case, *_), a, b in zip(cases, got, ref):
            where = f"{variant} {np.dtype(dtype)} case {case!r}"
            if (case, np.dtype(dtype).name) in known:
                differ.add((case, np.dtype(dtype).name)) if not np.array_equal(
                    a.labels_, b.labels_) else None
                continue
            assert np.array_equal(a.labels_, b.labels_), \
                f"{where}: {np.mean(a.labels_ != b.labels_):.4%} of labels differ"
            assert a.n_iter_ == b.n_iter_, where
            np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=rtol,
                                       atol=rtol, err_msg=where)
            assert a.inertia_ == pytest.approx(b.inertia_, rel=rtol), where
    # a known difference that went away is news: KNOWN_DIFFERENCES is to be updated
    assert differ == {c for c in known if c[1] == np.dtype(dtype).name}, (variant, differ)


def test_every_variant_is_a_constant_of_the_backend():
    for variant, attrs in VARIANT_ATTRS.items():
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
