"""GPU tests of host streaming in cupy-kernels and cupy-chunked (marker gpu): NumPy X (array or
memmap) goes through the GPU in chunks every pass instead of being copied whole.

The streamed fit must be the numpy backend's (same labels, centers, iterations from the same
init) and the in-memory fit's; a memmap must work without a copy; and a fit of an X larger
than the pool limit (12 GB under a 4 GiB cap) must complete within the limit.
"""
import time

import numpy as np
import pytest

from kmeans_xp import KMeans, KMeansMemoryError
from kmeans_xp.testing import asymmetric_data

pytestmark = pytest.mark.gpu

BACKENDS = ("cupy-kernels", "cupy-chunked")
GiB = 2**30




def _same_fit(name, got, ref, dtype=np.float32):
    """cupy-kernels: bit for bit (the same kernels on the same values). cupy-chunked: cuBLAS
    may pick another GEMM kernel for another number of rows (streamed chunks), so a float32
    near-tie may go the other way: a few labels in 1e4 at most."""
    if name == "cupy-kernels":
        np.testing.assert_array_equal(got.labels_, ref.labels_)
        np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_,
                                   rtol=0 if dtype == np.float32 else 1e-13)
    else:
        assert np.mean(got.labels_ != ref.labels_) <= 1e-4
        np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-4,
                                   atol=1e-4)


def _problem(n, d, k, dtype, seed):
    X = asymmetric_data(n, d, k, dtype=dtype, seed=seed, offset=3.0)
    init = X[np.random.default_rng(seed).choice(n, k, replace=False)].copy()
    return X, init


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_streamed_fit_gives_the_numpy_backends_labels(cp, name, weighted):
    """float64, n prime (the last chunk is short), default tol: the numpy backend's labels,
    centers, iterations and inertia (cupy-kernels computes numpy's distances exactly;
    cupy-chunked's cuBLAS GEMM can differ only on near-ties, which float64 data here has
    none of)."""
    n, d, k = 300_007, 3, 40
    X, init = _problem(n, d, k, np.float64, seed=1)
    w = np.random.default_rng(2).uniform(0.5, 2.0, n) if weighted else None
    ref = KMeans(k, init=init, backend="numpy", max_iter=40).fit(X, sample_weight=w)
    got = KMeans(k, init=init, backend=name, max_iter=40,
                 backend_options={"stream": True, "stream_rows": 65_521}).fit(
                     X, sample_weight=w)
    assert np.mean(got.labels_ != ref.labels_) == 0, f"{name}: labels differ from numpy"
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
    assert got.n_iter_ == ref.n_iter_
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    # X's own pages are page-locked (pin_input="auto"): no pinned staging buffers
    assert "stream" in got.memory_report_ and "pinned_host" in got.memory_report_
    np.testing.assert_array_equal(got.predict(X), got.labels_)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pin_input", [True, False])
def test_streamed_fit_is_the_in_memory_fit(cp, name, dtype, pin_input):
    """Streamed (X page-locked or staged through pinned buffers) and in memory, the same
    backend gives the same fit: the same kernels on the same centered values."""
    n, d, k = 500_009, 5, 64
    X, init = _problem(n, d, k, dtype, seed=3)
    kw = dict(init=init, backend=name, max_iter=6, tol=0)
    mem = KMeans(k, backend_options={"stream": False}, **kw).fit(X)
    st = KMeans(k, backend_options={"stream": True, "stream_rows": 100_003,
                                    "pin_input": pin_input}, **kw).fit(X)
    _same_fit(name, st, mem, dtype)
    assert st.labels_.dtype == np.int32 and st.n_iter_ == mem.n_iter_
    if not pin_input:
        assert st.memory_report_["pinned_host"] > 0  # staged through pinned buffers
    assert st.inertia_ == pytest.approx(mem.inertia_, rel=1e-5)


@pytest.mark.parametrize("name", BACKENDS)
def test_memmap_input_is_streamed(cp, name, tmp_path):
    n, d, k = 400_031, 3, 25
    X, init = _problem(n, d, k, np.float32, seed=4)
    path = tmp_path / "X.f32"
    mm = np.memmap(path, dtype=np.float32, mode="w+", shape=X.shape)
    mm[...] = X
    mm.flush()
    del mm
    ro = np.memmap(path, dtype=np.float32, mode="r", shape=X.shape)
    kw = dict(init=init, backend=name, max_iter=10, tol=0)
    ref = KMeans(k, backend_options={"stream": False}, **kw).fit(X)
    got = KMeans(k, backend_options={"stream": True, "stream_rows": 50_000}, **kw).fit(ro)
    _same_fit(name, got, ref)


@pytest.mark.parametrize("name", BACKENDS)
def test_limit_below_the_data_streams_or_says_why(cp, pool, name):
    """A pool limit below X: stream=False fails before any work saying X does not fit and
    what to change; the default ("auto") streams and gives the unconstrained fit's labels;
    a limit below even streaming's smallest chunks fails with the device's numbers. The pool
    stays usable throughout."""
    X = asymmetric_data(2_000_003, 3, 20, dtype=np.float32, seed=4)  # 24 MB on the host
    init = X[:20].copy()
    free_fit = KMeans(20, init=init, backend=name, max_iter=3, tol=0).fit(X)
    pool.free_all_blocks()
    pool.set_limit(size=pool.used_bytes() + X.nbytes // 2)
    with pytest.raises(KMeansMemoryError) as info:
        KMeans(20, init=init, backend=name, max_iter=3, tol=0,
               backend_options={"stream": False}).fit(X)
    msg = str(info.value)
    assert "does not fit on the GPU" in msg and "pool limit" in msg and "float32" in msg
    assert "'stream': True" in msg
    del info
    streamed = KMeans(20, init=init, backend=name, max_iter=3, tol=0).fit(X)
    assert "stream" in streamed.memory_report_
    assert max(v for key, v in streamed.memory_report_.items()
               if not key.endswith("_host")) <= pool.get_limit()
    _same_fit(name, streamed, free_fit)
    pool.set_limit(size=pool.used_bytes() + 32 * 1024)
    with pytest.raises(KMeansMemoryError) as info:
        KMeans(20, init=init, backend=name, max_iter=3, tol=0).fit(X)
    msg = str(info.value)
    assert "streaming X" in msg and "pool limit" in msg and "free of" in msg
    del info
    pool.set_limit(size=0)
    y = cp.arange(10**7, dtype=cp.float64)
    assert float(y.sum()) == 10**7 * (10**7 - 1) / 2


def test_auto_budget_error_states_the_device(cp, pool):
    """CuPy X on the device and a pool limit that leaves cupy-chunked no room for its chunk
    buffers: the early check says what was asked, what the device has, the pool limit and
    what to change (not "max_memory allows 1 B")."""
    n = 2_000_003
    X = cp.asarray(asymmetric_data(n, 3, 20, dtype=np.float32, seed=9))
    pool.set_limit(size=pool.used_bytes() + n * 8)  # less than its labels and distances
    with pytest.raises(KMeansMemoryError) as info:
        KMeans(20, backend="cupy-chunked", max_iter=2).fit(X)
    msg = str(info.value)
    assert "needs at least" in msg and "max_memory='auto'" in msg and "free of" in msg
    assert "pool limit" in msg and "set_limit" in msg and "allows 1 B" not in msg


@pytest.mark.parametrize("name", [*BACKENDS, "auto"])
def test_x_of_12GB_under_a_4GiB_pool_limit(cp, pool, name):
    """X of 12 GB (n = 5e8, d = 6, float32) streamed under a 4 GiB pool limit: the fit
    completes, the device peak stays under the limit, and the final labels are the nearest
    centers (checked on a sample). Kept short: 2 iterations, k = 64. backend="auto" passes
    over cupy-fused (which cannot stream) to a backend that streams."""
    n, d, k = 500_000_000, 6, 64
    t0 = time.perf_counter()
    X = np.empty((n, d), dtype=np.float32)
    rs = cp.random.RandomState(0)
    scale = cp.asarray([1.0, 1.7, 2.4, 0.6, 3.1, 1.3], dtype=cp.float32)
    shift = cp.asarray([0.0, 3.0, -6.0, 1.0, 0.5, -2.0], dtype=cp.float32)
    step = 25_000_000
    for s in range(0, n, step):
        block = rs.standard_normal((min(step, n - s), d), dtype=cp.float32) * scale + shift
        block.get(out=X[s:s + block.shape[0]])
    del block
    init = X[np.random.default_rng(0).choice(n, k, replace=False)].copy()
    pool.free_all_blocks()
    pool.set_limit(size=4 * GiB)
    t1 = time.perf_counter()
    km = KMeans(k, init=init, backend=name, max_iter=2, tol=0,
                backend_options={"free_memory": True}).fit(X)
    t2 = time.perf_counter()
    assert km.labels_.shape == (n,) and km.n_iter_ == 2
    assert km.backend_ in BACKENDS, km.backend_reason_
    report = km.memory_report_
    assert report["stream"] <= 4 * GiB and "pinned_host" in report
    idx = np.random.default_rng(1).choice(n, 100_000, replace=False)
    sample = X[idx].astype(np.float64)
    C = km.cluster_centers_.astype(np.float64)
    dist = ((sample[:, None, :] - C[None]) ** 2).sum(-1)
    two = np.partition(dist, 1, axis=1)[:, :2]
    clear = two[:, 1] - two[:, 0] > 1e-3 * (1 + two[:, 0])
    assert np.array_equal(km.labels_[idx][clear], dist.argmin(1)[clear])
    print(f"\n{name}: data {t1 - t0:.1f}s, fit {t2 - t1:.1f}s, "
          f"{km.timings_['per_iteration'] * 1e3:.0f} ms/iteration, report {report}")
    assert t2 - t1 < 120


def test_page_locked_x_streamed_in_many_chunks_is_the_in_memory_fit(cp, pool):
    """A page-locked X is copied in as soon as a slot is free: many short chunks and passes
    issued back to back, the fit of the in-memory X (at n=1e9 a race between a pass's first
    copies and the previous pass's compute gave a 1.8x inertia). Added after the device run
    that found it."""
    n, d, k = 50_000_003, 3, 100
    rs = cp.random.RandomState(5)
    X = (rs.standard_normal((n, d), dtype=cp.float32)
         * cp.asarray([1.0, 1.7, 2.4], dtype=cp.float32)).get()
    init = X[np.random.default_rng(2).choice(n, k, replace=False)].copy()
    kw = dict(init=init, n_init=1, max_iter=4, tol=0, backend="cupy-kernels")
    ref = KMeans(k, backend_options={"stream": False}, **kw).fit(X)
    got = KMeans(k, backend_options={"stream": True, "pin_input": True,
                                     "stream_rows": 1 << 21}, **kw).fit(X)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-6)
    assert np.mean(np.asarray(got.labels_) != cp.asnumpy(ref.labels_)) <= 1e-5
