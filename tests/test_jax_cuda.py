"""JAX arrays on a CUDA device reach the CuPy backends zero-copy through DLPack and come back
as JAX arrays on that device (GPU; skipped without a CUDA build of JAX)."""
import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
from tests._helpers import spy_to_backend

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def _gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA device here")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["auto", "cupy-fused", "cupy-kernels", "cupy-chunked"])
def test_cuda_jax_array_runs_on_cupy_like_cupy_input(monkeypatch, name):
    cp = pytest.importorskip("cupy")
    dev = _gpu()
    X = asymmetric_data(20_011, 3, 16, dtype=np.float32, seed=8)
    Xj = jax.device_put(jnp.asarray(X), dev)
    from kmeans_xp_backends.cupy.placement import CupyPlacement
    seen = spy_to_backend(monkeypatch, CupyPlacement)
    km_j = KMeans(16, random_state=0, backend=name).fit(Xj)
    km_c = KMeans(16, random_state=0, backend=name).fit(cp.asarray(X))
    assert km_j.backend_ == km_c.backend_ and km_j.backend_.startswith("cupy")
    assert seen[0].data.ptr == Xj.unsafe_buffer_pointer()  # shared, not copied
    for a in (km_j.labels_, km_j.cluster_centers_, km_j.predict(Xj)):
        assert isinstance(a, jax.Array) and a.devices() == {dev}
    np.testing.assert_array_equal(np.asarray(km_j.labels_), cp.asnumpy(km_c.labels_))
    np.testing.assert_array_equal(np.asarray(km_j.cluster_centers_),
                                  cp.asnumpy(km_c.cluster_centers_))
    np.testing.assert_array_equal(np.asarray(km_j.predict(Xj)), cp.asnumpy(km_c.labels_))
