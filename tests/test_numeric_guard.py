"""The numeric guard (`kmeans_xp.contract.scaling.NumericGuard`): every estimator, on every
backend, gives at any magnitude of X the partition it gives at magnitude 1, and the weights
too are brought inside the numbers of X's dtype. R1 (MiniBatchKMeans skipped the
rescaling), R9 (float64 subnormal X raised OverflowError) and weights of any size."""
import math
import pickle

import numpy as np
import pytest

from kmeans_xp import KMeans, MiniBatchKMeans, SphericalKMeans, list_backends
from kmeans_xp.contract.scaling import NumericGuard, pow2_scale

MAGNITUDES = {np.float64: (1e-310, 1e-300, 1e-200, 1e-100, 1e100, 1e200, 1e300),
              np.float32: (1e-30, 1e-25, 1e-20, 1e19, 1e25, 1e30)}
CPU_BACKENDS = [b for b in ("numpy", "numba", "array-api", "dask")
                if list_backends()[b].available]
GPU_BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")
ESTIMATORS = (KMeans, MiniBatchKMeans, SphericalKMeans)


def _data(dtype, n=241):
    """Three clusters in 3-D, features on different scales and offsets (asymmetric), none
    through the origin (a spherical fit sees them as directions), n odd."""
    rng = np.random.default_rng(7)
    centers = np.array([[4.0, 0.5, 0.2], [0.5, 5.0, -1.0], [-1.0, 0.3, 6.0]]) * [1, 2, 3]
    X = centers[rng.integers(0, 3, n)] + rng.normal(size=(n, 3)) * [0.3, 0.5, 0.6]
    return X.astype(dtype), centers.astype(dtype)


def _same_partition(a, b):
    """Labels equal up to renaming the clusters."""
    a, b = np.asarray(a), np.asarray(b)
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def _fit(cls, backend, X, init, **kw):
    if cls is MiniBatchKMeans:
        kw.setdefault("batch_size", 64)
        kw.setdefault("max_iter", 20)
    return cls(3, init=init, n_init=1, backend=backend, random_state=0, **kw).fit(X)


def _sweep(cls, backend, dtype):
    X, C = _data(dtype)
    ref = _fit(cls, backend, X, C)
    for m in MAGNITUDES[dtype]:
        Xm, Cm = X * dtype(m), C * dtype(m)
        assert np.all(np.isfinite(Xm)) and np.all(Xm != 0), "the data must stay numbers"
        fit = _fit(cls, backend, Xm, Cm)
        where = f"{cls.__name__} {backend} {np.dtype(dtype)} at {m:g}"
        assert _same_partition(ref.labels_, fit.labels_), where
        assert np.all(np.isfinite(np.asarray(fit.cluster_centers_))), where
        assert _same_partition(fit.labels_, fit.predict(Xm)), f"{where}: predict"
        if cls is not SphericalKMeans:
            # centers and inertia in X's units (where X's squared units hold them)
            np.testing.assert_allclose(np.asarray(fit.cluster_centers_, dtype=np.float64) / m,
                                       np.asarray(ref.cluster_centers_, dtype=np.float64),
                                       rtol=1e-3, atol=1e-3, err_msg=where)
            log_expected = math.log10(ref.inertia_) + 2 * math.log10(m)
            if -300 < log_expected < 300:
                assert math.log10(fit.inertia_) == pytest.approx(log_expected, abs=1e-3), where


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_estimator_and_backend_at_every_magnitude(cls, backend, dtype):
    _sweep(cls, backend, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_estimator_on_gpu_at_every_magnitude(cls, backend, dtype):
    _sweep(cls, backend, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_partial_fit_at_every_magnitude(dtype):
    """partial_fit batch by batch gives the same steps at any magnitude, and a later batch
    at another magnitude than the first is fitted inside the numbers too."""
    X, C = _data(dtype, n=400)
    ref = MiniBatchKMeans(3, init=C, n_init=1, random_state=0, backend="numpy")
    for part in np.array_split(X, 4):
        ref.partial_fit(part)
    for m in MAGNITUDES[dtype]:
        km = MiniBatchKMeans(3, init=C * dtype(m), n_init=1, random_state=0, backend="numpy")
        for part in np.array_split(X * dtype(m), 4):
            km.partial_fit(part)
        assert _same_partition(ref.predict(X), km.predict(X * dtype(m))), m
        np.testing.assert_allclose(np.asarray(km.cluster_centers_, np.float64) / m,
                                   ref.cluster_centers_, rtol=1e-3, atol=1e-3)
    km = MiniBatchKMeans(3, init=C, n_init=1, random_state=0, backend="numpy")
    km.partial_fit(X[:200])
    big = dtype(MAGNITUDES[dtype][-1])
    km.partial_fit(X[200:] * big)   # squared distances past the dtype's largest number
    assert np.all(np.isfinite(np.asarray(km.cluster_centers_)))
    assert not np.isnan(km.inertia_)   # (inf where X's squared units cannot hold it)
    assert set(np.unique(km.predict(X * big)).tolist()) <= {0, 1, 2}


def test_subnormal_float64_does_not_overflow():
    """R9: float64 X near 1e-310 (subnormal) fits; its power of two is capped at 2**1023,
    which still brings it far from underflow."""
    X, C = _data(np.float64)
    Xs = X * 1e-310
    assert np.abs(Xs).max() < np.finfo(np.float64).tiny
    scale = pow2_scale(float(np.abs(Xs).max()), np.float64, 3)
    assert scale == 2.0 ** 1023
    for cls in ESTIMATORS:
        km = cls(3, random_state=0, backend="numpy").fit(Xs)
        assert np.all(np.isfinite(np.asarray(km.cluster_centers_)))
        assert km.inertia_ >= 0 and np.isfinite(km.score(Xs))
        assert _same_partition(km.labels_, km.predict(Xs))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("w", [1e-320, 1e-200, 1e-40, 1e39, 1e300])
def test_weights_of_any_size(dtype, w):
    """Weights at the edges of float64 (and past float32's range, for float32 X) give the
    partition of unit weights: they are brought inside X's dtype by a power of two before
    they are cast to it."""
    X, C = _data(dtype)
    sw = np.full(X.shape[0], w)
    sw[::7] *= 3.0   # not all equal
    ref_w = np.where(np.arange(X.shape[0]) % 7 == 0, 3.0, 1.0)
    for cls in ESTIMATORS:
        ref = cls(3, init=C, n_init=1, random_state=0, backend="numpy").fit(
            X, sample_weight=ref_w)
        fit = cls(3, init=C, n_init=1, random_state=0, backend="numpy").fit(
            X, sample_weight=sw)
        assert _same_partition(ref.labels_, fit.labels_), (cls.__name__, w)
        assert np.all(np.isfinite(np.asarray(fit.cluster_centers_)))
        np.testing.assert_allclose(np.asarray(fit.cluster_centers_, np.float64),
                                   np.asarray(ref.cluster_centers_, np.float64),
                                   rtol=1e-3, atol=1e-3)


def test_mean_of_float64_near_its_largest():
    """X's float64 column sums would overflow (many values near 1.7e308): the mean comes
    from X times the guard's power of two."""
    X, C = _data(np.float64, n=2001)
    m = 1e306
    ref = KMeans(3, init=C, n_init=1, backend="numpy").fit(X)
    fit = KMeans(3, init=C * m, n_init=1, backend="numpy").fit(X * m)
    assert _same_partition(ref.labels_, fit.labels_)
    np.testing.assert_allclose(fit.cluster_centers_ / m, ref.cluster_centers_, rtol=1e-9)


def test_guard_round_trip():
    """The guard's conversions are exact powers of two and come back."""
    guard, sw = NumericGuard.of(np.float32, 3, 10, np.full(10, 1e30), absmax=1e25)
    assert guard.scale < 1 and guard.w_scale < 1 and sw.dtype == np.float32
    assert np.all(sw * (1 / guard.w_scale) == np.float32(1e30))
    c = np.array([[1.5e25, -2e24, 3e20]], dtype=np.float32)
    assert np.array_equal(guard.centers_out(guard.centers_in(c, np), np), c)
    assert guard.objective(1.0) == pytest.approx(1.0 / guard.scale ** 2 / guard.w_scale)
    assert pickle.loads(pickle.dumps(guard)).scale == guard.scale
