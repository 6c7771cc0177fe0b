"""GPU tests of a device X centered chunk by chunk (`staging.DeviceRows`, marker gpu): when a
CuPy X's centered copy would not fit beside it (or with stream=True), cupy-kernels and
cupy-chunked stream it through the pipeline of host streaming from device memory, so the
device holds X once; cupy-fused, which cannot, says so before any work, and copy_x=False
computes on X as given without a copy.

The fit must be the numpy backend's and the in-memory fit's, X must come back bit for bit,
and n=500M (6 GB) must fit under a 15 GiB pool limit (a 16 GB card) within the estimate.
"""
import numpy as np
import pytest

from kmeans_xp import KMeans, KMeansMemoryError, estimate_memory
from kmeans_xp.testing import asymmetric_data

pytestmark = pytest.mark.gpu

BACKENDS = ("cupy-kernels", "cupy-chunked")
GiB = 2**30


def _problem(n, d, k, dtype, seed):
    X = asymmetric_data(n, d, k, dtype=dtype, seed=seed, offset=3.0)
    init = X[np.random.default_rng(seed).choice(n, k, replace=False)].copy()
    return X, init


def _streamed(name, **kw):
    return KMeans(backend=name, backend_options={"stream": True, "stream_rows": 65_521}, **kw)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_device_x_streamed_gives_the_numpy_backends_fit(cp, name, weighted):
    """float64, n prime (a short last chunk), an empty cluster to relocate (the farthest
    points are gathered from the un-centered X and centered), default tol."""
    n, d, k = 300_007, 3, 40
    X, init = _problem(n, d, k, np.float64, seed=1)
    init[7] = X.max(axis=0) * 50  # empty at the first assignment
    w = np.random.default_rng(2).uniform(0.5, 2.0, n) if weighted else None
    ref = KMeans(k, init=init, backend="numpy", max_iter=40).fit(X, sample_weight=w)
    Xd = cp.asarray(X)
    got = _streamed(name, n_clusters=k, init=init, max_iter=40).fit(
        Xd, sample_weight=None if w is None else cp.asarray(w))
    labels = cp.asnumpy(got.labels_)
    if name == "cupy-kernels":
        np.testing.assert_array_equal(labels, ref.labels_)
    else:
        assert np.mean(labels != ref.labels_) == 0
    np.testing.assert_allclose(cp.asnumpy(got.cluster_centers_), ref.cluster_centers_,
                               rtol=1e-12)
    assert got.n_iter_ == ref.n_iter_
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    assert "stream" in got.memory_report_ and got.labels_.dtype == cp.int32
    np.testing.assert_array_equal(cp.asnumpy(Xd), X)  # never written
    np.testing.assert_array_equal(cp.asnumpy(got.predict(Xd)), labels)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("init", ["array", "k-means++"])
def test_device_x_streamed_is_the_in_memory_fit(cp, name, dtype, init):
    """Streamed from the device and centered on a copy, the same backend gives the same fit
    (the same centered values, bit for bit), k-means++ drawing the same centers."""
    n, d, k = 500_009, 5, 64
    X, C = _problem(n, d, k, dtype, seed=3)
    Xd = cp.asarray(X)
    kw = dict(n_clusters=k, init=C if init == "array" else init, max_iter=6, tol=0,
              random_state=0, n_init=1)
    mem = KMeans(backend=name, backend_options={"stream": False}, **kw).fit(Xd)
    st = _streamed(name, **kw).fit(Xd)
    a, b = cp.asnumpy(st.labels_), cp.asnumpy(mem.labels_)
    if name == "cupy-kernels":
        np.testing.assert_array_equal(a, b)
    else:  # cuBLAS may pick another GEMM for other row counts: float32 near-ties only
        assert np.mean(a != b) <= 1e-4
    np.testing.assert_allclose(cp.asnumpy(st.cluster_centers_),
                               cp.asnumpy(mem.cluster_centers_), rtol=1e-4, atol=1e-4)
    assert st.n_iter_ == mem.n_iter_


@pytest.mark.parametrize("name", ["cupy-kernels", "cupy-chunked", "cupy-fused"])
def test_copy_x_false_computes_on_device_x_without_a_copy(cp, pool, name):
    """copy_x=False: no centered copy of a device X (d=64: X is far larger than the labels
    and distances); copy_x=True: one."""
    X = cp.asarray(asymmetric_data(400_003, 64, 16, dtype=np.float32, seed=6))
    init = cp.asnumpy(X[:16])
    peaks = {}
    for copy_x in (True, False):
        pool.free_all_blocks()
        base = pool.used_bytes()
        km = KMeans(16, init=init, max_iter=3, tol=0, copy_x=copy_x, backend=name,
                    backend_options={"stream": False} if name != "cupy-fused" else None).fit(X)
        peaks[copy_x] = max(km.memory_report_.values()) - base
        del km
    assert peaks[True] >= X.nbytes > 2 * peaks[False], peaks


def _seed_like(cp, n):
    rs = cp.random.RandomState(0)
    X = rs.standard_normal((n, 3), dtype=cp.float32)
    X *= cp.asarray([1.0, 1.7, 2.4], dtype=cp.float32)
    X += cp.asarray([0.0, 3.0, -6.0], dtype=cp.float32)
    return X


@pytest.mark.parametrize("n", [200_000_000, 500_000_000])
def test_large_device_x_fits_under_15GiB_within_the_estimate(cp, pool, n):
    """n=200M and n=500M (2.4 and 6 GB, float32, d=3) on the device under a 15 GiB pool limit,
    k=1000, 3 iterations. At 500M the centered copy does not fit beside X: cupy-kernels and
    cupy-chunked center chunk by chunk, cupy-fused refuses before any work naming what
    would fit, and fits with copy_x=False; backend="auto" takes one that fits. Every fit's
    measured pool peak stays within estimate_memory, X comes back unchanged and the labels
    are int32."""
    k = 1000
    pool.set_limit(size=15 * GiB)
    X = _seed_like(cp, n)
    checksum = float(X.sum(dtype=cp.float64))
    init = cp.asnumpy(X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))])
    kw = dict(init=init, n_init=1, max_iter=3, tol=0)
    runs = [("cupy-kernels", {}), ("cupy-chunked", {}), ("auto", {}), ("cupy-fused", {})]
    if n >= 500_000_000:
        with pytest.raises(KMeansMemoryError, match=r"centered copy.*cupy-kernels.*copy_x=False"):
            KMeans(k, backend="cupy-fused", **kw).fit(X)
        runs[-1] = ("cupy-fused", {"copy_x": False})
    for name, extra in runs:
        pool.free_all_blocks()
        base = pool.used_bytes()  # X and what the test holds
        km = KMeans(k, backend=name, **kw, **extra).fit(X)
        assert km.labels_.shape == (n,) and km.labels_.dtype == cp.int32 and km.n_iter_ == 3
        est = estimate_memory(n, 3, k, dtype="float32", backend=km.backend_)
        peak = max(km.memory_report_.values())
        assert peak - base + X.nbytes <= est.total, (name, km.memory_report_, est)
        del km
    assert float(X.sum(dtype=cp.float64)) == checksum


@pytest.mark.parametrize("name", ["cupy-kernels", "cupy-chunked", "cupy-fused"])
@pytest.mark.parametrize("copy_x", [True, False])
def test_rescaled_device_x_with_zero_mean_is_never_written(cp, name, copy_x):
    """Values whose squared distances overflow float32 (rescaled by a power of two) and a
    mean of exactly zero: the rescaling works on the fit's own copy, never on X."""
    rng = np.random.default_rng(7)
    half = rng.uniform(1, 2, size=(5001, 2)).astype(np.float32) * np.float32(3e19)
    Xh = np.concatenate([half, -half])  # mean exactly 0
    X = cp.asarray(Xh)
    km = KMeans(4, n_init=1, random_state=0, copy_x=copy_x, backend=name).fit(X)
    np.testing.assert_array_equal(cp.asnumpy(X), Xh)
    km.predict(X)
    km.score(X)
    np.testing.assert_array_equal(cp.asnumpy(X), Xh)
    assert np.isfinite(km.inertia_) and np.all(np.isfinite(cp.asnumpy(km.cluster_centers_)))
