"""CPU check of `cupy-fused`'s device-side Lloyd loop: its control flow (one transfer per
iteration, the shift test read one iteration late, strict convergence, max_iter, relocation)
must reproduce `kmeans_xp.lloyd.kmeans_single_lloyd` exactly. The kernels are replaced by
numpy stand-ins with the same data flow, so this runs without CuPy or a GPU."""
import types

import numpy as np
import pytest
from kmeans_xp_backends.cupy_fused import CupyFusedBackend
from kmeans_xp_backends.numpy_ import NumpyBackend

from kmeans_xp.namespaces import array_namespace
from kmeans_xp.lloyd import inertia, kmeans_single_lloyd, new_centers, relocate_empty, tolerance
from kmeans_xp.testing import asymmetric_data

ROWS = 4096


class _Host(np.ndarray):
    """A NumPy array with CuPy's .get()."""

    def get(self):
        return np.array(self)


class _EmulatedBackend(CupyFusedBackend):
    """The real `_lloyd_loop`; every kernel launch replaced by the numpy computation it does."""

    def __init__(self):  # no CuPy
        self._cp = types.SimpleNamespace(int64=np.int64)
        self.reference = NumpyBackend(n_threads=1)

    def _assign_pass(self, st, *, min_sq=None, count_changed=False, accumulate=False):
        it = self.reference.lloyd_iter(st.X, st.w, st.packed)
        labels = it.labels.astype(np.int32)
        if count_changed:
            st.stats.view(np.uint64)[0] += np.count_nonzero(labels != st.labels)
        st.labels[:] = labels
        st.pass_inertia = float(np.sum(it.min_sq_dist.astype(np.float64) * st.w.astype(np.float64)))
        st.sums, st.weights = it.weighted_sums, it.weight_in_clusters
        st.passes += 1

    def _finalize(self, st, *, inertia=True):
        st.stats.view(np.uint64)[1] += np.count_nonzero(st.weights == 0)
        st.stats[2] = st.pass_inertia

    def _relocate(self, st, centers, m):
        assert m == np.count_nonzero(st.weights == 0)
        xp = array_namespace(st.X)
        st.sums, st.weights = relocate_empty(st.X, st.w, centers, st.labels.astype(np.int64),
                                             st.sums, st.weights, xp, ROWS)
        st.relocations += 1

    def _update(self, st, c_old, c_new):
        xp = array_namespace(st.X)
        c_new[...] = new_centers(st.sums, st.weights, c_old, xp)
        st.stats[3] = float(np.sum((c_new - c_old) ** 2))
        st.stats.view(np.uint64)[:2] = 0
        st.packed = c_new

    def _direct_inertia(self, st, centers):
        xp = array_namespace(st.X)
        return inertia(st.X, st.w, centers, st.labels.astype(np.int64), xp, ROWS)


def _run_both(X, w, init, max_iter, tol):
    xp = array_namespace(X)
    ref = kmeans_single_lloyd(NumpyBackend(n_threads=1), X, w, init.copy(), xp=xp,
                              max_iter=max_iter, tol=tol, rows=ROWS)
    emu = _EmulatedBackend()
    st = types.SimpleNamespace(X=X, w=w, packed=init.copy(), labels=np.full(len(X), -1, np.int32),
                               stats=np.zeros(8).view(_Host), passes=0, relocations=0)
    got = emu._lloyd_loop(st, init.copy(), np.empty_like(init), max_iter, tol, 0)
    return ref, got, st


def _data(n, d, k, seed, dtype=np.float64):
    X = asymmetric_data(n, d, k, dtype=dtype, seed=seed)
    return X - X.mean(axis=0)


@pytest.mark.parametrize("tol_factor", [0.0, 1e-4, 1e-2])
@pytest.mark.parametrize("max_iter", [1, 2, 3, 300])
@pytest.mark.parametrize("seed", [0, 1])
def test_loop_reproduces_the_driver(tol_factor, max_iter, seed):
    X = _data(1500, 3, 8, seed)
    w = np.random.default_rng(seed).uniform(0.5, 2, len(X))
    init = X[np.random.default_rng(seed + 10).choice(len(X), 8, replace=False)].copy()
    tol = tolerance(X, tol_factor, array_namespace(X))
    ref, got, st = _run_both(X, w, init, max_iter, tol)
    assert got.n_iter == ref.n_iter
    assert np.array_equal(got.labels, ref.labels)
    assert np.array_equal(got.centers, ref.centers)
    assert got.inertia == ref.inertia
    assert got.history == ref.history
    # one pass per iteration plus the final assignment, which strict convergence skips
    strict = len(ref.history["inertia"]) == ref.n_iter and ref.n_iter < max_iter and \
        st.passes == ref.n_iter
    assert st.passes in (ref.n_iter, ref.n_iter + 1)
    assert strict or st.passes == ref.n_iter + 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_loop_relocates_empty_clusters_like_the_driver(dtype):
    X = _data(2001, 2, 6, 3, dtype)
    w = np.random.default_rng(3).uniform(0.5, 2, len(X)).astype(dtype)
    w[:40] = 0  # zero-weight points are never taken
    init = X[np.random.default_rng(4).choice(len(X), 6, replace=False)].copy()
    init[1] = X.max(axis=0) * 50   # far from everything: empty at the first pass
    init[4] = X.min(axis=0) * 50
    ref, got, st = _run_both(X, w, init, 100, 0.0)
    assert st.relocations >= 1
    assert got.n_iter == ref.n_iter
    assert np.array_equal(got.labels, ref.labels)
    assert np.array_equal(got.centers, ref.centers)
    assert got.history == ref.history
