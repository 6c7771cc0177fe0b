"""GPU tests of SphericalKMeans (marker gpu: skipped without CuPy and a GPU): cupy-kernels,
cupy-chunked and cupy-fused give the numpy backend's spherical partition from the same
initial centers, from NumPy and from CuPy X (never written), with weights and relocated
empty clusters, streamed from the host, and on both sides of cupy-fused's host-centers
threshold. `same_spherical_fit` also runs on the CPU through the emulated CuPy
(test_spherical.py), at small sizes. check_backend's spherical checks run in the backends'
contract tests (test_cupy_backends.py, test_cupy_fused.py)."""
import warnings

import numpy as np
import pytest

from kmeans_xp import SphericalKMeans
from kmeans_xp.testing import asymmetric_data
from tests._helpers import directions

pytestmark = pytest.mark.gpu

BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")


_REFERENCES = {}  # the numpy backend's fits, by key: parametrized tests share them


def _reference(key, X, init, w, max_iter):
    if key is not None and key in _REFERENCES:
        return _REFERENCES[key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = SphericalKMeans(len(init), init=init, backend="numpy", max_iter=max_iter,
                              tol=0).fit(X, sample_weight=w)
    if key is not None:
        _REFERENCES[key] = ref
    return ref


def same_spherical_fit(cp, name, X, init, w=None, *, on_device, options=None, max_iter=50,
                       exact=True, key=None):
    """Fit on backend `name` (X as CuPy when on_device) and compare with the numpy backend's
    fit (cached under `key`): the same labels, iterations, unit centers and inertia (exact
    False: float32 beyond d=3, where GEMM rounding may split a near-tie: 0.1% of labels)."""
    ref = _reference(key, X, init, w, max_iter)
    X_in = cp.asarray(X) if on_device else X
    w_in = None if w is None else (cp.asarray(w) if on_device else w)
    before = X_in.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = SphericalKMeans(len(init), init=init, backend=name, backend_options=options,
                              max_iter=max_iter, tol=0).fit(X_in, sample_weight=w_in)
    where = f"{name} {X.shape} k={len(init)} {X.dtype} on_device={on_device} {options}"
    assert got.backend_ == name, where
    assert bool((X_in == before).all()), f"{where}: the caller's X was written"
    if cp.ndarray is not np.ndarray:  # (the emulated CuPy's arrays are NumPy's)
        assert isinstance(got.labels_, cp.ndarray) == on_device, where
    labels = cp.asnumpy(got.labels_)
    centers = cp.asnumpy(got.cluster_centers_).astype(np.float64)
    f32 = X.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(centers, axis=1), 1.0,
                               atol=1e-6 if f32 else 1e-14, err_msg=where)
    if exact:
        np.testing.assert_array_equal(labels, ref.labels_, err_msg=where)
        assert got.n_iter_ == ref.n_iter_, f"{where}: n_iter {got.n_iter_} != {ref.n_iter_}"
        rtol = 1e-5 if f32 else 1e-10
        np.testing.assert_allclose(centers, ref.cluster_centers_, rtol=0, atol=rtol * 10,
                                   err_msg=where)
    else:
        differ = np.mean(labels != ref.labels_)
        assert differ <= 1e-3, f"{where}: {differ:.4%} labels differ from numpy's"
        rtol = 1e-4
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol), where
    np.testing.assert_array_equal(cp.asnumpy(got.predict(X_in)), labels, err_msg=where)
    return got, ref


def _exact(name, dtype, d):
    """Where a backend's float32 distances are numpy's bit for bit (d <= 3: cupy-kernels'
    and cupy-fused's arithmetic; cuBLAS's GEMM rounds otherwise), and in float64."""
    return dtype == np.float64 or (d <= 3 and name != "cupy-chunked")


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", [(20011, 3, 50), (10007, 17, 200), (10007, 128, 300),
                                   (200003, 8, 1000)])
@pytest.mark.parametrize("name", BACKENDS)
def test_spherical_fit_is_numpys(cp, name, n, d, k, dtype, on_device):
    X = directions(n, d, k, seed=n + d + k, spread=0.1).astype(dtype)
    init = X[np.random.default_rng(k).choice(n, k, replace=False)]
    exact = _exact(name, dtype, d)
    got, ref = same_spherical_fit(cp, name, X, init, on_device=on_device, exact=exact,
                                  key=(n, d, k, np.dtype(dtype).str))
    D = cp.asnumpy(got.transform(cp.asarray(X[:2000]) if on_device else X[:2000]))
    np.testing.assert_allclose(D, ref.transform(X[:2000]), atol=1e-5 if exact else 1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", BACKENDS)
def test_weights_and_relocated_empty_clusters(cp, name, dtype):
    """Directions in a cone; three centers pointing away from it lose every point."""
    X = asymmetric_data(30011, 3, 12, dtype=dtype, seed=4, offset=12.0)
    w = np.random.default_rng(5).uniform(0.5, 2.0, len(X)).astype(dtype)
    w[::7] = 0
    init = X[np.random.default_rng(6).choice(len(X), 12, replace=False)].copy()
    init[:3] *= -1
    for on_device in (False, True):
        same_spherical_fit(cp, name, X, init, w, on_device=on_device,
                           exact=_exact(name, dtype, 3), key=("cone", np.dtype(dtype).str))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ("cupy-kernels", "cupy-chunked"))
def test_streamed_host_x(cp, name, dtype):
    X = directions(100003, 3, 40, seed=7, spread=0.1).astype(dtype)
    init = X[:40]
    got, _ = same_spherical_fit(cp, name, X, init, on_device=False,
                                options={"stream": True, "stream_rows": 16384},
                                exact=_exact(name, dtype, 3), key=("stream", np.dtype(dtype).str))
    assert "stream" in got.memory_report_


@pytest.mark.parametrize("n,k", [(20011, 100), (2_000_003, 1000)])
def test_fused_centers_on_the_host_and_on_the_device(cp, n, k):
    """cupy-fused keeps small centers on the host below n k = 2e9 (FusedPlacement): the
    projection onto the sphere runs in NumPy there, in CuPy above."""
    X = directions(n, 3, k, seed=8, spread=0.1).astype(np.float32)
    init = X[np.random.default_rng(9).choice(n, k, replace=False)]
    same_spherical_fit(cp, "cupy-fused", X, init, on_device=True, max_iter=8,
                       key=("fused", n, k))


@pytest.mark.parametrize("name", BACKENDS)
def test_device_x_is_normalised_in_place_only_when_the_fit_owns_it(cp, name):
    """NumPy X: its device copy is the fit's and is normalised in place (the device holds X
    once); CuPy X: the caller's, normalised on a copy and never written."""
    X = directions(50021, 3, 10, seed=10, spread=0.1).astype(np.float32)
    Xd = cp.asarray(X)
    km = SphericalKMeans(10, random_state=0, backend=name).fit(Xd)
    np.testing.assert_array_equal(cp.asnumpy(Xd), X)
    host = SphericalKMeans(10, random_state=0, backend=name).fit(X)
    np.testing.assert_array_equal(cp.asnumpy(km.labels_), host.labels_)
    assert host.score(X) == pytest.approx(float(km.score(Xd)), rel=1e-6)


@pytest.mark.parametrize("name", ("cupy-kernels", "cupy-chunked"))
def test_device_x_without_room_for_its_unit_copy(cp, pool, name):
    """A CuPy X whose unit-row copy does not fit beside it: a KMeansMemoryError before any
    work, saying what to do; its rows scaled beforehand, copy_x=False fits it as given."""
    from kmeans_xp import KMeansMemoryError
    n = 2_000_003
    X = cp.asarray(directions(n, 3, 20, seed=11, spread=0.1).astype(np.float32))
    init = cp.asnumpy(X[:20])
    pool.free_all_blocks()
    pool.set_limit(size=pool.used_bytes() + n * 12 + (96 << 20))  # labels, not a copy
    with pytest.raises(KMeansMemoryError, match="unit-row copy of X.*copy_x=False"):
        SphericalKMeans(20, init=init, backend=name, max_iter=2).fit(X)
    X /= cp.linalg.norm(X, axis=1, keepdims=True)
    km = SphericalKMeans(20, init=init, backend=name, max_iter=2, copy_x=False).fit(X)
    assert km.n_iter_ >= 1
