"""Balanced and hierarchical fits on the CuPy backends: the auction runs in CuPy on the
device, the caps hold, and the fits agree with the numpy backend's."""
import math

import numpy as np
import pytest

from kmeans_xp import KMeans

pytestmark = pytest.mark.gpu

BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")


def _gaussian(n, dtype, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 5)) * [1.0, 3.0, 0.5, 2.0, 1.0] + [0, 5, 0, 0, 1]).astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_balanced_fit_on_the_gpu_caps_clusters_and_agrees_with_numpy(cp, backend, dtype):
    n, k = 20_011, 100
    X = _gaussian(n, dtype)
    ref = KMeans(k, random_state=0, backend="numpy", max_iter=15, balance=1.1).fit(X)
    km = KMeans(k, random_state=0, backend=backend, max_iter=15, balance=1.1).fit(
        cp.asarray(X))
    sizes = np.bincount(cp.asnumpy(km.labels_), minlength=k)
    assert sizes.max() <= math.ceil(1.1 * n / k)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hierarchical_and_soft_balance_on_the_gpu(cp, backend):
    X = cp.asarray(_gaussian(30_011, np.float32, seed=2))
    flat = KMeans(256, random_state=0, backend=backend, max_iter=10, tol=0).fit(X)
    hier = KMeans(256, init="hierarchical", random_state=0, backend=backend, max_iter=10,
                  tol=0).fit(X)
    assert hier.inertia_ <= flat.inertia_ * 1.05
    soft = KMeans(256, random_state=0, backend=backend, max_iter=10,
                  balance={"penalty": 1.0}).fit(X)
    spread = lambda km: np.bincount(cp.asnumpy(km.labels_), minlength=256).max()  # noqa: E731
    assert spread(soft) < spread(flat)
