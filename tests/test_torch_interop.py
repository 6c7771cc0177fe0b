"""torch tensors in and out (issue 15): a CPU tensor goes to the numba backend (numpy where
numba is not installed) under "auto"
and a CUDA tensor to the CuPy backends, both shared through DLPack (no copy of X); labels_,
cluster_centers_, predict and transform come back as tensors on the input's device.

The GPU tests (marker gpu) also need a CUDA build of torch.
"""
import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.contract.selection import select_backend
from kmeans_xp.testing import asymmetric_data
from tests._helpers import AUTO_CPU, spy_to_backend

torch = pytest.importorskip("torch")


def _data(n=3000, d=3, k=6, seed=0):
    return asymmetric_data(n, d, k, dtype=np.float32, seed=seed)


def test_auto_picks_a_cpu_backend_for_cpu_tensor_same_result_as_numpy_input():
    X = _data()
    t = torch.from_numpy(X.copy())
    km_t = KMeans(6, random_state=0).fit(t)
    km_n = KMeans(6, random_state=0).fit(X)
    assert km_t.backend_ == AUTO_CPU == km_n.backend_
    assert "torch input on cpu" in km_t.backend_reason_
    assert isinstance(km_t.labels_, torch.Tensor) and km_t.labels_.device.type == "cpu"
    assert isinstance(km_t.cluster_centers_, torch.Tensor)
    assert km_t.cluster_centers_.dtype == torch.float32
    np.testing.assert_array_equal(km_t.labels_.numpy(), km_n.labels_)
    np.testing.assert_array_equal(km_t.cluster_centers_.numpy(), km_n.cluster_centers_)
    assert km_t.inertia_ == km_n.inertia_
    assert km_t.n_iter_ == km_n.n_iter_


def test_cpu_tensor_is_not_copied(monkeypatch):
    from kmeans_xp_backends.numpy.backend import NumpyPlacement
    seen = spy_to_backend(monkeypatch, NumpyPlacement)
    t = torch.from_numpy(_data())
    KMeans(6, random_state=0).fit(t)
    assert isinstance(seen[0], np.ndarray)
    assert np.shares_memory(seen[0], t.numpy())


def test_np_from_dlpack_of_detached_tensor_shares_memory():
    t = torch.from_numpy(_data()).requires_grad_(False)
    assert np.shares_memory(np.from_dlpack(t.detach()), t.numpy())


def test_tensor_that_requires_grad_and_strided_tensor():
    X = _data()
    t = torch.from_numpy(X.copy()).requires_grad_(True)
    km = KMeans(6, random_state=0).fit(t)
    np.testing.assert_array_equal(km.labels_.numpy(), KMeans(6, random_state=0).fit(X).labels_)
    # a column-major view: shared as it is (the numpy backend reads any strides)
    tf = torch.from_numpy(np.asfortranarray(X)).T.contiguous().T
    assert not tf.is_contiguous()
    km_f = KMeans(6, random_state=0).fit(tf)
    np.testing.assert_array_equal(km_f.labels_.numpy(), km.labels_.numpy())


def test_predict_transform_score_types():
    X = _data()
    t = torch.from_numpy(X.copy())
    km = KMeans(6, random_state=0).fit(t)
    ref = KMeans(6, random_state=0).fit(X)
    labels = km.predict(t)
    assert isinstance(labels, torch.Tensor) and labels.device.type == "cpu"
    assert torch.equal(labels, km.labels_)  # labels_ == predict(X)
    dist = km.transform(t)
    assert isinstance(dist, torch.Tensor) and dist.dtype == torch.float32
    assert tuple(dist.shape) == (len(X), 6)
    np.testing.assert_allclose(dist.numpy(), ref.transform(X), rtol=1e-6, atol=1e-6)
    assert km.score(t) == pytest.approx(ref.score(X))
    assert isinstance(km.fit_predict(t), torch.Tensor)
    # a model fitted on NumPy predicts on a tensor and answers with a tensor, and back
    assert isinstance(ref.predict(t), torch.Tensor)
    assert isinstance(km.predict(X), np.ndarray)


def test_float64_tensor_and_sample_weight_tensor():
    X = _data().astype(np.float64)
    rng = np.random.default_rng(1)
    w = rng.uniform(0.5, 2.0, len(X))
    km_t = KMeans(6, random_state=0).fit(torch.from_numpy(X.copy()),
                                         sample_weight=torch.from_numpy(w))
    km_n = KMeans(6, random_state=0).fit(X, sample_weight=w)
    assert km_t.backend_ == AUTO_CPU
    assert km_t.cluster_centers_.dtype == torch.float64
    np.testing.assert_array_equal(km_t.labels_.numpy(), km_n.labels_)
    np.testing.assert_array_equal(km_t.cluster_centers_.numpy(), km_n.cluster_centers_)
    assert km_t.inertia_ == km_n.inertia_


def test_copy_x_false_leaves_tensor_unchanged():
    X = _data()
    t = torch.from_numpy(X.copy())
    KMeans(6, random_state=0, copy_x=False).fit(t)
    np.testing.assert_array_equal(t.numpy(), X)


def test_named_backends_on_cpu_tensor():
    t = torch.from_numpy(_data())
    assert KMeans(6, random_state=0, backend="numpy").fit(t).backend_ == "numpy"
    km = KMeans(6, random_state=0, backend="array-api").fit(t)
    assert isinstance(km.labels_, torch.Tensor)  # the standard-only path still works


def test_other_torch_devices_go_to_array_api():
    """A tensor neither on the CPU nor on CUDA (here torch's shape-only "meta" device) is not
    taken by the numpy backend: "auto" tries array-api alone for it."""
    from kmeans_xp_backends.numpy.backend import NumpyPlacement
    meta = torch.empty((100, 3), device="meta")
    assert not NumpyPlacement(None).converts_from("torch", meta)
    backend, why = select_backend("auto", meta, n_clusters=2)
    assert backend.name == "array-api"
    assert "torch input on meta" in why


def test_torch_not_imported_for_numpy_fit():
    import subprocess
    import sys
    code = ("import sys, numpy as np\nfrom kmeans_xp import KMeans\n"
            "KMeans(2, random_state=0).fit(np.random.rand(50, 3))\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- GPU: CUDA tensors to the CuPy backends ----------------------------------------------------
def _cuda_torch():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch and a GPU")
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_cuda_tensor_auto_runs_on_cupy_fused_like_cupy_input(monkeypatch):
    cp = _cuda_torch()
    from kmeans_xp_backends.cupy.placement import CupyPlacement
    X = _data(20000, 3, 16)
    t = torch.from_numpy(X).cuda()
    seen = spy_to_backend(monkeypatch, CupyPlacement)
    km_t = KMeans(16, random_state=0).fit(t)
    km_c = KMeans(16, random_state=0).fit(cp.asarray(X))
    assert km_t.backend_ == "cupy-fused" == km_c.backend_
    assert seen[0].data.ptr == t.data_ptr()  # shared through DLPack, not copied
    for a in (km_t.labels_, km_t.cluster_centers_, km_t.predict(t), km_t.transform(t)):
        assert isinstance(a, torch.Tensor) and a.device == t.device
    np.testing.assert_array_equal(km_t.labels_.cpu().numpy(), cp.asnumpy(km_c.labels_))
    np.testing.assert_array_equal(km_t.cluster_centers_.cpu().numpy(),
                                  cp.asnumpy(km_c.cluster_centers_))
    assert torch.equal(km_t.predict(t), km_t.labels_.to(km_t.predict(t).dtype))


@pytest.mark.gpu
def test_cuda_tensor_strided_and_weighted():
    cp = _cuda_torch()
    X = _data(20000, 3, 16)
    w = np.random.default_rng(0).uniform(0.5, 2, len(X)).astype(np.float32)
    tf = torch.from_numpy(X).cuda().T.contiguous().T  # not C-contiguous: copied once
    assert not tf.is_contiguous()
    km_t = KMeans(16, random_state=0).fit(tf, sample_weight=torch.from_numpy(w).cuda())
    km_c = KMeans(16, random_state=0).fit(cp.asarray(X), sample_weight=cp.asarray(w))
    assert km_t.backend_ == "cupy-fused"
    np.testing.assert_array_equal(km_t.labels_.cpu().numpy(), cp.asnumpy(km_c.labels_))
    for name in ("cupy-chunked", "cupy-kernels"):
        km = KMeans(16, random_state=0, backend=name).fit(tf)
        assert isinstance(km.labels_, torch.Tensor) and km.labels_.is_cuda
