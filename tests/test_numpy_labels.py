"""The numpy backend's labels: compact between iterations (the smallest type that holds k),
int32 for the user (labels_, predict, fit_predict) whichever way the fit ends (on every CPU
backend), and a final pass that keeps no n distances."""
import tracemalloc

import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp import KMeans
from kmeans_xp.contract.backend import compact_labels_dtype, user_labels
from kmeans_xp.testing import asymmetric_data


@pytest.mark.parametrize("k,compact", [(3, np.uint8), (256, np.uint8), (257, np.uint16),
                                       (65536, np.uint16), (65537, np.int32)])
def test_compact_labels_dtype(k, compact):
    assert compact_labels_dtype(k) == compact
    labels = np.arange(min(k, 300)).astype(compact)
    got = user_labels(labels)
    assert got.dtype == np.int32 and np.array_equal(got, labels)
    int32 = np.arange(5, dtype=np.int32)
    assert user_labels(int32) is int32  # int32 labels as they are
    assert user_labels(np.arange(5)).dtype == np.int32  # a plugin's int64 labels: int32


@pytest.mark.parametrize("k", [5, 300])
def test_iteration_labels_compact_assign_and_final_int32(k):
    X = asymmetric_data(20_011, 3, 7, seed=2, dtype=np.float32)
    C = X[:k].copy()
    b = NumpyBackend(max_memory="1MB")
    it = b.lloyd_iter(X, None, C, None)
    assert it.labels.dtype == compact_labels_dtype(k)
    lab = b.assign(X, C).labels
    assert lab.dtype == np.int32 and np.array_equal(lab, it.labels)
    w = np.random.default_rng(0).uniform(0.5, 2, len(X)).astype(np.float32)
    final, inertia = b.labels_inertia(X, w, C)
    assert final.dtype == np.int32 and np.array_equal(final, lab)
    direct = float(np.sum(np.sum((X.astype(np.float64) - C[lab]) ** 2, axis=1) * w))
    assert float(inertia) == pytest.approx(direct, rel=1e-6)
    # inertia of given labels of any integer type, by differences
    for labels in (it.labels, lab, lab.astype(np.int64)):
        assert float(b.inertia(X, w, C, labels)) == pytest.approx(direct, rel=1e-6)
    it2 = b.lloyd_iter(X, w, C * 1.5, it.labels)
    assert it2.n_changed == np.count_nonzero(it2.labels != it.labels)


@pytest.mark.parametrize("backend", ["numpy", "numba", "array-api"])
@pytest.mark.parametrize("k", [4, 300])   # compact labels of one and of two bytes
@pytest.mark.parametrize("max_iter", [1, 300])  # ends on max_iter / on strict convergence
def test_fit_labels_are_int32_as_predict(backend, k, max_iter):
    if backend == "numba":
        pytest.importorskip("numba")
    X = asymmetric_data(5003, 3, 4, seed=1)
    kw = dict(init=X[:k].copy(), backend=backend)
    km = KMeans(k, max_iter=max_iter, tol=0, **kw).fit(X)
    assert km.labels_.dtype == np.int32
    assert km.predict(X).dtype == np.int32
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    assert KMeans(k, **kw).fit_predict(X).dtype == np.int32


def test_final_pass_keeps_no_distances():
    """labels_inertia allocates its int32 labels and nothing of n beyond them."""
    n = 400_009
    X = asymmetric_data(n, 3, 8, seed=4, dtype=np.float32)
    C = X[:8].copy()
    # on any threads of the process's pass pool: the jobs take the sets the first call made
    b = NumpyBackend(max_memory="2MB", n_threads=2)
    b.labels_inertia(X, None, C)  # buffers: made once
    tracemalloc.start()
    try:
        labels, _ = b.labels_inertia(X, None, C)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * n + (256 << 10), f"{peak} bytes for {4 * n} bytes of labels"
