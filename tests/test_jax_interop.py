"""JAX arrays (CPU) through DLPack: the numba backend (numpy without numba) under "auto", no
copy of X, results
as JAX arrays; without x64 the array-api backend refuses them, saying why. Skipped without
JAX."""
import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
from tests._helpers import AUTO_CPU, spy_to_backend

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def test_cpu_jax_array_fits_on_numpy_without_a_copy(monkeypatch):
    X = asymmetric_data(3001, 3, 7, dtype=np.float32, seed=4)
    Xj = jnp.asarray(X)
    init = X[:7].copy()
    ref = KMeans(7, init=init, backend="numpy").fit(X)
    from kmeans_xp_backends.numpy import backend as numpy_
    seen = spy_to_backend(monkeypatch, numpy_.NumpyPlacement)
    km = KMeans(7, init=init).fit(Xj)
    assert km.backend_ == AUTO_CPU and "jax input on cpu" in km.backend_reason_
    assert np.shares_memory(seen[0], np.asarray(Xj))  # the array's own memory
    assert isinstance(km.labels_, jax.Array) and isinstance(km.cluster_centers_, jax.Array)
    np.testing.assert_array_equal(np.asarray(km.labels_), ref.labels_)
    np.testing.assert_allclose(np.asarray(km.cluster_centers_), ref.cluster_centers_, rtol=1e-6)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-6)
    assert isinstance(km.predict(Xj), jax.Array)
    np.testing.assert_array_equal(np.asarray(km.predict(Xj)), ref.labels_)


def test_array_api_backend_on_jax_without_x64_says_what_precision_it_would_have():
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is enabled in this process")
    Xj = jnp.asarray(asymmetric_data(301, 3, 4, dtype=np.float32, seed=2))
    with pytest.raises(ValueError, match=r"JAX without x64 .* float32.*jax_enable_x64"):
        KMeans(4, backend="array-api").fit(Xj)
