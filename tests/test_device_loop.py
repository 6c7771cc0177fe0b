"""The device-resident Lloyd loop (used by the CuPy backends) must give the driver's run.

Run on the CPU: the loop is driven with the numpy backend and NumPy versions of the
reductions the CuPy backends provide as kernels, and compared with
`kmeans_xp.lloyd.kmeans_single_lloyd` step for step.
"""
import numpy as np
import pytest
from kmeans_xp_backends._device_loop import HostReductions, lloyd_with_reductions
from kmeans_xp_backends.numpy_ import NumpyBackend

from kmeans_xp.lloyd import kmeans_single_lloyd
from kmeans_xp.testing import asymmetric_data


def _problem(n, d, k, dtype, seed, zero_weights=False):
    X = asymmetric_data(n, d, k, dtype=dtype, seed=seed)
    X -= X.mean(axis=0)
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 2.0, size=n).astype(dtype)
    if zero_weights:
        w[rng.random(n) < 0.2] = 0
    C = X[rng.choice(n, k, replace=False)].copy()
    return X, w, C


def _both(X, w, C, max_iter, tol):
    backend = NumpyBackend(max_memory="1MB", n_threads=1)
    ref = kmeans_single_lloyd(backend, X, w, C, xp=np, max_iter=max_iter, tol=tol, rows=97)
    got = lloyd_with_reductions(backend, X, w, C, xp=np, max_iter=max_iter, tol=tol, rows=97,
                                reductions=HostReductions())
    return ref, got


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k,max_iter,tol", [
    (1031, 3, 13, 300, 0.0),      # runs to strict convergence
    (1031, 3, 13, 3, 0.0),        # stops on max_iter: the final assignment runs
    (2049, 17, 40, 300, 1e-2),    # stops on the tolerance
    (257, 2, 1, 10, 0.0),         # one cluster
])
def test_loop_matches_driver(dtype, n, d, k, max_iter, tol):
    X, w, C = _problem(n, d, k, dtype, seed=n + k)
    tol_abs = float(np.mean(np.var(X, axis=0))) * tol
    ref, got = _both(X, w, C, max_iter, tol_abs)
    assert got.n_iter == ref.n_iter
    np.testing.assert_array_equal(got.labels, ref.labels)
    np.testing.assert_array_equal(got.centers, ref.centers)
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(got.history["inertia"], ref.history["inertia"], rtol=1e-6)
    np.testing.assert_allclose(got.history["center_shift"], ref.history["center_shift"],
                               rtol=1e-4, atol=1e-12)


def test_loop_relocates_empty_clusters_like_the_driver():
    X, w, C = _problem(3001, 3, 20, np.float64, seed=5, zero_weights=True)
    C[5:10] = C[0] + 1e6  # far away: these clusters start empty
    ref, got = _both(X, w, C, 50, 0.0)
    assert got.n_iter == ref.n_iter
    np.testing.assert_array_equal(got.labels, ref.labels)
    np.testing.assert_array_equal(got.centers, ref.centers)
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-12)
