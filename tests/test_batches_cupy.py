"""cupy-chunked's batched iteration (backends/cupy/batched.py): one batched GEMM per chunk and
one scatter for all active problems, checked against each problem's own `lloyd_iter` and the
numpy backend's single fits: on the CPU through the NumPy stand-in for CuPy with the real
kernels emulated (tests/_fake_cupy.py), and on the device (marked gpu). The other CuPy
backends batch through the default loop over their own kernels."""
import warnings

import numpy as np
import pytest
from kmeans_xp_backends.cupy import batched

from kmeans_xp import KMeans, get_backend
from kmeans_xp.testing import asymmetric_data
from kmeans_xp.testing.batches import check_batch_fit, check_batch_iteration

CUPY_BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")


def test_runs_of_active_problems():
    assert batched.runs((0, 1, 2)) == [(0, 3, 0)]
    assert batched.runs((0, 2, 3, 7)) == [(0, 1, 0), (1, 3, 2), (3, 4, 7)]
    assert batched.runs((5,)) == [(0, 1, 5)]


def test_chunk_rows_hold_the_budget():
    assert batched.chunk_rows(65_536, 32, 128, 1024, 4, 1 << 40) == \
        batched.MAX_BLOCK_BYTES // (32 * (1024 + 128 + 2) * 4)
    assert batched.chunk_rows(1031, 3, 5, 9, 8, 10_000) == 10_000 // (3 * 16 * 8)
    assert batched.chunk_rows(1031, 3, 5, 9, 8, 1) == 1
    assert batched.chunk_rows(10, 1, 2, 3, 4, 1 << 30) == 10


def _problems(B, n, d, k, dtype):
    return [asymmetric_data(n, d, max(1, k // 2), dtype=dtype, seed=40 + b, offset=2.0 * b)
            for b in range(B)]


def _check_against_numpy(name, dtype, k, max_memory="auto"):
    problems = _problems(4, 1031, 5, k, dtype)
    rng = np.random.default_rng(0)
    inits = np.stack([p[rng.choice(len(p), k, replace=False)] for p in problems])
    inits[2, :2] += 50   # empty clusters in one problem: relocated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = KMeans(k, init=inits, max_iter=40, backend=name,
                     max_memory=max_memory).fit(np.stack(problems))
        for b, X in enumerate(problems):
            ref = KMeans(k, init=inits[b], max_iter=40, backend="numpy").fit(X)
            labels = np.asarray(got.labels_[b].get() if hasattr(got.labels_[b], "get")
                                else got.labels_[b])
            assert np.mean(labels != ref.labels_) <= 1e-3, f"{name} problem {b}"
            assert got.n_iter_[b] == ref.n_iter_ or np.any(labels != ref.labels_)
            assert got.inertia_[b] == pytest.approx(ref.inertia_, rel=1e-4)


@pytest.mark.slow   # (the kernels emulated on the CPU: seconds; the quick tier has the
#                      contract suite's batch checks on the emulated device)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", CUPY_BACKENDS)
def test_emulated_batched_fit_matches_numpy(fake_cupy, name, dtype):
    _check_against_numpy(name, dtype, 7)


@pytest.mark.slow
def test_emulated_batched_iteration_in_small_chunks_equals_lloyd_iter(fake_cupy, monkeypatch):
    """Chunks of a few rows (n not a multiple), an active subset (runs), weights."""
    calls = []
    real = batched.batch_lloyd_iter
    monkeypatch.setattr(batched, "batch_lloyd_iter",
                        lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    monkeypatch.setattr(batched, "MAX_BLOCK_BYTES", 3 * 24 * 8 * 37)
    backend = get_backend("cupy-chunked")()
    for dtype in (np.float32, np.float64):
        assert check_batch_iteration(backend, lambda a: a, dtype) == 8
    assert (0, 2) in calls   # (the dense batches' calls: the override ran)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", CUPY_BACKENDS)
def test_batched_fit_on_the_device_matches_numpy(name, dtype):
    _check_against_numpy(name, dtype, 7)
    _check_against_numpy(name, dtype, 50, max_memory="64MB")


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUPY_BACKENDS)
def test_batch_checks_of_the_contract_on_the_device(name):
    import cupy
    backend = get_backend(name)()
    for dtype in (np.float32, np.float64):
        assert check_batch_iteration(backend, cupy.asarray, dtype) == 8
        assert check_batch_fit(backend, cupy.asarray, dtype) == 1


@pytest.mark.gpu
def test_one_batch_hook_call_per_iteration_on_the_device(monkeypatch):
    """The override runs (not the per-problem loop), once per iteration and once more for
    the final assignment of the problems that stopped at max_iter (tol=0: the others
    converged strictly, their labels are final), and the fitted arrays stay on the device."""
    import cupy
    calls = []
    real = batched.batch_lloyd_iter
    monkeypatch.setattr(batched, "batch_lloyd_iter",
                        lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    X = cupy.asarray(np.stack(_problems(8, 4099, 16, 32, np.float32)))
    km = KMeans(32, random_state=0, max_iter=20, tol=0, backend="cupy-chunked").fit(X)
    at_max = tuple(b for b in range(8) if km.n_iter_[b] == 20)
    assert len(calls) == int(km.n_iter_.max()) + bool(at_max)
    if at_max:
        assert tuple(calls[-1]) == at_max
    assert isinstance(km.labels_, cupy.ndarray) and km.labels_.shape == (8, 4099)
    assert isinstance(km.cluster_centers_, cupy.ndarray)
    assert bool((km.predict(X) == km.labels_).all())
