"""MiniBatchKMeans on the CuPy backends (marker `gpu`, skipped without CuPy and a GPU): a CuPy
X is gathered and updated on its device, a NumPy X streamed batch by batch; both give the
numpy backend's steps from the same seed, fit and partial_fit alike."""
import numpy as np
import pytest

from kmeans_xp import MiniBatchKMeans
from kmeans_xp.testing import asymmetric_data, check_backend

pytestmark = pytest.mark.gpu
BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")


def _same(got, ref, dtype):
    from kmeans_xp.contract.namespaces import to_numpy
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    assert got.n_steps_ == ref.n_steps_ and got.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(to_numpy(got.cluster_centers_), ref.cluster_centers_,
                               rtol=rtol, atol=rtol * 10)
    np.testing.assert_allclose(to_numpy(got._counts), ref._counts, rtol=rtol)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol * 10)
    agree = np.mean(to_numpy(got.labels_) == ref.labels_)
    assert agree > (0.999 if dtype == np.float32 else 1 - 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("where", ["device X", "host X"])
def test_fit_gives_the_numpy_backends_steps(cp, name, dtype, where):
    X = asymmetric_data(20_011, 3, 40, dtype=dtype, seed=5)
    w = np.random.default_rng(1).uniform(0.5, 2, len(X)).astype(dtype)
    p = dict(n_clusters=40, batch_size=1024, random_state=3, reassignment_ratio=0.05)
    ref = MiniBatchKMeans(backend="numpy", **p).fit(X, sample_weight=w)
    Xin = cp.asarray(X) if where == "device X" else X
    got = MiniBatchKMeans(backend=name, **p).fit(Xin, sample_weight=w)
    assert got.backend_ == name
    assert isinstance(got.cluster_centers_, cp.ndarray) == (where == "device X")
    _same(got, ref, dtype)


@pytest.mark.parametrize("name", BACKENDS)
def test_partial_fit_on_device_batches(cp, name):
    X = asymmetric_data(6000, 3, 20, dtype=np.float32, seed=6)
    ref = MiniBatchKMeans(20, random_state=2, backend="numpy")
    got = MiniBatchKMeans(20, random_state=2, backend=name)
    for start in range(0, len(X), 1000):
        ref.partial_fit(X[start:start + 1000])
        got.partial_fit(cp.asarray(X[start:start + 1000]))
    ref.n_iter_ = got.n_iter_ = None
    _same(got, ref, np.float32)


def test_contract_suite_includes_minibatch(cp):
    from kmeans_xp import get_backend
    assert check_backend(get_backend("cupy-kernels"), cases=[(1031, 3, 13)]) > 0


def test_large_fit_is_on_the_device(cp):
    """n=2M, k=1000, batch 65536 from a device X: the steps agree with the numpy backend's."""
    X = asymmetric_data(2_000_000, 3, 1000, dtype=np.float32, seed=7)
    init = X[np.random.default_rng(0).choice(len(X), 1000, replace=False)]
    p = dict(n_clusters=1000, init=init, batch_size=65536, max_iter=2, random_state=0,
             max_no_improvement=None, compute_labels=False)
    ref = MiniBatchKMeans(backend="numpy", **p).fit(X)
    got = MiniBatchKMeans(backend="cupy-kernels", **p).fit(cp.asarray(X))
    assert got.n_steps_ == ref.n_steps_ == 2 * 2_000_000 // 65536
    np.testing.assert_allclose(cp.asnumpy(got.cluster_centers_), ref.cluster_centers_,
                               rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_steps_reuse_one_workspace(cp, dtype):
    """cupy-fused serves every batch of a fit from one workspace (plan, buffers, pinned
    centers: rebuilding them each step cost as much as the step), and a batch's statistics
    are those of a fresh backend's."""
    from kmeans_xp import get_backend
    X = asymmetric_data(8192 * 3, 3, 40, dtype=dtype, seed=8)
    C = X[:40].copy()
    be, fresh = get_backend("cupy-fused")(), get_backend("cupy-fused")
    seen = set()
    for start in range(0, len(X), 8192):
        Xb = cp.asarray(X[start:start + 8192])
        got = be.lloyd_iter(Xb, None, C, None)
        seen.add(id(be._ws))
        ref = fresh().lloyd_iter(Xb, None, C, None)
        np.testing.assert_array_equal(cp.asnumpy(got.labels), cp.asnumpy(ref.labels))
        np.testing.assert_array_equal(np.asarray(cp.asnumpy(got.weighted_sums)),
                                      np.asarray(cp.asnumpy(ref.weighted_sums)))
        assert float(got.inertia) == float(ref.inertia)
    assert len(seen) == 1
