"""GPU tests of cupy-kernels and cupy-chunked (marker gpu: skipped without CuPy and a GPU).

Correctness against the numpy backend and a float64 reference on asymmetric data (the seed's
kernel swapped x and y and dropped a feature; symmetric data hid it), namespaces in and out,
and the seed's own problem: memory, under a 15 GiB pool limit like a 16 GB card.
"""
import warnings

import numpy as np
import pytest

from kmeans_xp import KMeans, KMeansMemoryError, estimate_memory, get_backend
from kmeans_xp.testing import asymmetric_data, check_backend

pytestmark = pytest.mark.gpu

BACKENDS = ("cupy-kernels", "cupy-chunked")
GiB = 2**30
MiB = 2**20


def _centered_problem(n, d, k, dtype, seed):
    X = asymmetric_data(n, d, max(1, k // 2), dtype=dtype, seed=seed)
    X -= X.mean(axis=0)  # backends get mean-centered data from the driver
    rng = np.random.default_rng(seed)
    C = X[rng.choice(n, k, replace=False)] + (rng.normal(size=(k, d)) * 0.01).astype(dtype)
    w = rng.uniform(0.5, 2.0, size=n).astype(dtype)
    w[rng.random(n) < 0.1] = 0
    return X, C, w


def _float64_distances(X, C):
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    d = (X64 * X64).sum(1)[:, None] - 2 * X64 @ C64.T + (C64 * C64).sum(1)[None, :]
    return np.maximum(d, 0)


def _clear_rows(dist, rtol):
    """Rows whose nearest center beats the second by more than rounding could move."""
    if dist.shape[1] == 1:
        return np.ones(dist.shape[0], bool)
    two = np.partition(dist, 1, axis=1)[:, :2]
    return two[:, 1] - two[:, 0] > rtol * (1 + two[:, 0])


# -- the contract suite ---------------------------------------------------------------------
@pytest.mark.parametrize("name", BACKENDS)
def test_contract_suite(cp, name):
    cls = get_backend(name)
    assert check_backend(cls) > 0                                   # NumPy in
    assert check_backend(cls, make_array=cp.asarray, dtypes=(np.float32,)) > 0  # CuPy in


# -- agreement with the numpy backend and a float64 reference --------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 7, 500, 5000])
@pytest.mark.parametrize("d", [1, 2, 3, 17, 128])
def test_one_iteration_agrees_with_numpy(cp, d, k, dtype):
    from array_api_compat import array_namespace
    n = 10007 if k == 5000 else 4099  # primes: no chunk or block size divides them
    X, C, w = _centered_problem(n, d, k, dtype, seed=d * 7919 + k)
    dist = _float64_distances(X, C)
    ref = dist.argmin(1)
    clear = _clear_rows(dist, 1e-4 if dtype == np.float32 else 1e-9)
    np_it = get_backend("numpy")(max_memory="256MB").lloyd_iter(X, w, C, None)
    assert np.array_equal(np_it.labels[clear], ref[clear])
    for name in BACKENDS:
        # a small budget so cupy-chunked works in several row chunks and center tiles
        backend = get_backend(name)(max_memory="4MB")
        Xd, Cd, wd = cp.asarray(X), cp.asarray(C), cp.asarray(w)
        xp = array_namespace(Xd)
        it = backend.lloyd_iter(Xd, wd, Cd, None, xp=xp)
        labels = cp.asnumpy(it.labels)
        where = f"{name} n={n} d={d} k={k} {np.dtype(dtype)}"
        assert labels.dtype == np.int32 and labels.shape == (n,)
        assert np.array_equal(cp.asnumpy(backend.assign(Xd, Cd, xp=xp).labels), labels)
        bad = np.flatnonzero((labels != ref) & clear)
        assert bad.size == 0, f"{where}: {bad.size} labels differ from the argmin"
        if name == "cupy-kernels" and d <= 3:
            # numpy's own arithmetic (fma chain + einsum's ||c||^2): every label, ties too
            differ = np.flatnonzero(labels != np_it.labels)
            assert differ.size == 0, f"{where}: {differ.size} labels differ from numpy"
        else:  # cuBLAS's GEMM order (cupy-chunked) may split a near-tie the other way
            assert np.mean(labels == np_it.labels) > 0.999, f"{where}: disagrees with numpy"
        mins = cp.asnumpy(backend.assign(Xd, Cd, xp=xp).min_sq_dist).astype(np.float64)
        scale = float(np.abs(X).max()) ** 2 + 1
        rtol = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(mins, dist[np.arange(n), labels], rtol=rtol,
                                   atol=rtol * scale, err_msg=where)
        sums = np.zeros((k, d))
        np.add.at(sums, labels, X.astype(np.float64) * w[:, None].astype(np.float64))
        weights = np.bincount(labels, weights=w.astype(np.float64), minlength=k)
        np.testing.assert_allclose(cp.asnumpy(it.weight_in_clusters), weights, rtol=1e-9,
                                   atol=1e-9, err_msg=where)
        np.testing.assert_allclose(cp.asnumpy(it.weighted_sums), sums, rtol=1e-9,
                                   atol=1e-9 * scale * n, err_msg=where)
        inertia = float(np.sum(mins * w.astype(np.float64)))
        assert float(it.inertia) == pytest.approx(inertia, rel=rtol * 10, abs=rtol * scale), \
            where
        assert float(it.n_changed) == n, where


FIT_CASES = ([(d, 7, np.float32) for d in (1, 3, 17, 128)]
             + [(d, k, np.float64) for d in (1, 2, 3, 17, 128) for k in (7, 500)]
             + [(3, 5000, np.float64), (128, 5000, np.float64)])


@pytest.mark.parametrize("d,k,dtype", FIT_CASES)
def test_fit_agrees_with_numpy_from_the_same_init(cp, d, k, dtype):
    n = 10007 if k == 5000 else 4099
    X = asymmetric_data(n, d, k, dtype=dtype, seed=d + k)
    init = X[np.random.default_rng(k).choice(n, k, replace=False)]
    max_iter = 3 if k == 5000 else 30
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # k=5000: fewer distinct clusters is fine here
        ref = KMeans(k, init=init, backend="numpy", max_iter=max_iter).fit(X)
        for name in BACKENDS:
            got = KMeans(k, init=init, backend=name, max_iter=max_iter,
                         max_memory="64MB").fit(cp.asarray(X))
            labels = cp.asnumpy(got.labels_)
            differ = np.mean(labels != ref.labels_)
            where = f"{name} d={d} k={k} {np.dtype(dtype)}"
            if dtype == np.float64:
                assert differ == 0, f"{where}: {differ:.4%} labels differ from numpy"
                assert got.n_iter_ == ref.n_iter_, where
                assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-9), where
            else:  # float32: GEMM expansion and direct differences may split a near-tie
                assert differ <= 1e-3, f"{where}: {differ:.4%} labels differ from numpy"
                assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-4), where
            np.testing.assert_array_equal(cp.asnumpy(got.predict(cp.asarray(X))), labels)


# -- namespaces in and out ------------------------------------------------------------------
@pytest.mark.parametrize("name", BACKENDS)
def test_cupy_in_cupy_out_numpy_in_numpy_out(cp, name):
    X = asymmetric_data(5003, 3, 8, dtype=np.float32, seed=6)
    on_gpu = KMeans(8, backend=name, random_state=0).fit(cp.asarray(X))
    assert isinstance(on_gpu.labels_, cp.ndarray)
    assert isinstance(on_gpu.cluster_centers_, cp.ndarray)
    assert isinstance(on_gpu.predict(cp.asarray(X)), cp.ndarray)
    assert "transfer" not in on_gpu.memory_report_
    assert {"init", "assign", "update"} <= set(on_gpu.memory_report_)
    on_host = KMeans(8, backend=name, random_state=0).fit(X)
    assert isinstance(on_host.labels_, np.ndarray)
    assert isinstance(on_host.cluster_centers_, np.ndarray)
    assert isinstance(on_host.predict(X), np.ndarray)
    assert on_host.timings_["transfer"] > 0 and on_host.memory_report_["transfer"] >= X.nbytes
    np.testing.assert_array_equal(cp.asnumpy(on_gpu.labels_), on_host.labels_)
    np.testing.assert_array_equal(on_host.predict(X), on_host.labels_)


@pytest.mark.parametrize("name", BACKENDS)
def test_float16_is_computed_in_float32(cp, name):
    X = asymmetric_data(4001, 3, 5, dtype=np.float16, seed=7)
    init = X[:5].astype(np.float32)
    half = KMeans(5, init=init, backend=name).fit(cp.asarray(X))
    single = KMeans(5, init=init, backend=name).fit(cp.asarray(X.astype(np.float32)))
    assert half.cluster_centers_.dtype == cp.float32
    np.testing.assert_array_equal(cp.asnumpy(half.labels_), cp.asnumpy(single.labels_))


@pytest.mark.parametrize("name", BACKENDS)
def test_verbose_prints_memory_per_stage(cp, name, capsys):
    X = cp.asarray(asymmetric_data(3001, 3, 4, dtype=np.float32, seed=8))
    KMeans(4, backend=name, verbose=1, random_state=0).fit(X)
    out = capsys.readouterr().out
    assert "memory (peak per stage)" in out and "assign" in out and "update" in out


# -- memory: the seed's workloads on a 16 GB card ------------------------------------------
SEED_WORKLOADS = [(2_000_000, 200, "k-means++"), (2_000_000, 500, "array"),
                  (20_000_000, 1000, "array")]


def _seed_like_data(cp, n):
    """n points in 3-D, features on different scales and offsets (float32, on the device)."""
    rs = cp.random.RandomState(0)
    X = rs.standard_normal((n, 3), dtype=cp.float32)
    X *= cp.asarray([1.0, 1.7, 2.4], dtype=cp.float32)
    X += cp.asarray([0.0, 3.0, -6.0], dtype=cp.float32)
    return X


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("n,k,init", SEED_WORKLOADS)
def test_seed_workloads_fit_under_15GiB_within_the_estimate(cp, pool, name, n, k, init):
    pool.set_limit(size=15 * GiB)
    X = _seed_like_data(cp, n)
    if init == "array":
        init = cp.asnumpy(X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))])
    est = estimate_memory(n, 3, k, dtype="float32", backend=name)
    assert est.total < 15 * GiB, str(est)
    base = pool.used_bytes()  # X and whatever the test holds
    km = KMeans(k, init=init, n_init=1, max_iter=3, tol=0, backend=name,
                random_state=0).fit(X)
    assert km.labels_.shape == (n,) and km.n_iter_ <= 3
    report = km.memory_report_
    assert {"init", "assign", "update"} <= set(report)
    peak = max(report.values())
    assert peak - base + X.nbytes <= est.total, (
        f"{name} n={n} k={k}: measured {report} above the estimate {est} (base {base})")


def test_chunk_halving_survives_a_limit_below_the_working_set(cp, pool):
    n, d, k = 1_000_003, 3, 500
    X = cp.asarray(asymmetric_data(n, d, 50, dtype=np.float64, seed=3))
    init = cp.asnumpy(X[:k])
    # max_memory asks for a 1 GiB distance block; the pool limit below leaves ~192 MiB
    kw = dict(init=init, n_init=1, max_iter=4, tol=0, backend="cupy-chunked",
              max_memory="2GB")
    free = KMeans(k, **kw).fit(X)
    labels_free = cp.asnumpy(free.labels_)
    del free
    pool.free_all_blocks()
    base = pool.used_bytes()
    state = (n * d * 8) + n * 8 + 2 * n * 16  # centered copy, weights, labels and distances
    limit = base + state + 192 * MiB
    pool.set_limit(size=limit)
    tight = KMeans(k, **kw).fit(X)
    np.testing.assert_array_equal(cp.asnumpy(tight.labels_), labels_free)
    assert max(tight.memory_report_.values()) <= limit


# a pool limit below X itself: tests/test_cupy_streaming.py (NumPy X is streamed by default
# when it does not fit; stream=False fails early saying so)


@pytest.mark.parametrize("name", BACKENDS)
def test_limit_below_the_fit_state_centers_chunkwise_or_raises(cp, pool, name):
    """Room for X's centered copy but not for the labels beside it: the fit centers X chunk
    by chunk as it streams from device memory instead, within the limit, with the
    unconstrained fit's labels; a limit below even that fails with the device's numbers."""
    n = 2_000_003
    X = cp.asarray(asymmetric_data(n, 3, 20, dtype=np.float32, seed=9))
    init = cp.asnumpy(X[:20])
    kw = dict(init=init, tol=0, max_iter=2, backend=name,
              backend_options={"stream_rows": 100_003})  # (chunks leave room for labels_)
    free = cp.asnumpy(KMeans(20, **kw).fit(X).labels_)
    pool.free_all_blocks()
    limit = pool.used_bytes() + n * 12 + 2 * MiB
    pool.set_limit(size=limit)
    tight = KMeans(20, **kw).fit(X)
    assert "stream" in tight.memory_report_ and max(tight.memory_report_.values()) <= limit
    labels = cp.asnumpy(tight.labels_)
    assert np.mean(labels != free) <= (0 if name == "cupy-kernels" else 1e-4)
    del tight
    pool.free_all_blocks()
    pool.set_limit(size=pool.used_bytes() + n)  # below three iterations' compact labels
    with pytest.raises(KMeansMemoryError, match=r"needs at least .* of device memory"):
        KMeans(20, **kw).fit(X)


@pytest.mark.parametrize("name", BACKENDS)
def test_free_memory_hands_cached_blocks_back(cp, pool, name):
    X = cp.asarray(asymmetric_data(1_000_003, 3, 10, dtype=np.float32, seed=5))
    kw = dict(backend=name, max_iter=3, random_state=0)
    kept = KMeans(10, **kw).fit(X)  # kept alive: its labels_ live in the pool
    cached = pool.free_bytes()
    assert cached >= X.nbytes  # the centered copy, at least, stays cached by CuPy
    del kept
    pool.free_all_blocks()
    kept = KMeans(10, backend_options={"free_memory": True}, **kw).fit(X)
    # what stays cached is at most the unused tail of a block split for a result array
    assert pool.free_bytes() < min(cached / 2, X.nbytes)
    assert kept.labels_.shape == (X.shape[0],)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_staged_upload_copies_host_x_exactly(dtype):
    """Large host X goes to the device through two pinned buffers (staging.upload): every
    row arrives, including the last chunk's short tail, bit for bit."""
    import cupy as cp
    from kmeans_xp_backends.cupy import staging
    row = 3 * np.dtype(dtype).itemsize
    # full chunks with a short tail; and one short chunk
    for n in (2 * staging.UPLOAD_CHUNK_BYTES // row + 12345,
              staging.UPLOAD_STAGED_BYTES // row + 777):
        X = np.random.default_rng(n).normal(size=(n, 3)).astype(dtype)
        assert X.nbytes > staging.UPLOAD_STAGED_BYTES
        Xd = staging.upload(cp, X)
        assert Xd.dtype == X.dtype and Xd.shape == X.shape
        np.testing.assert_array_equal(Xd.get(), X)


@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_staged_download_copies_device_arrays_exactly(dtype):
    """Large results come back through two pinned buffers (staging.download): every chunk,
    the short tail too, bit for bit, after the work that made them."""
    import cupy as cp
    from kmeans_xp_backends.cupy import staging
    n = 5 * staging.UPLOAD_CHUNK_BYTES // np.dtype(dtype).itemsize + 4321
    a = cp.arange(n, dtype=dtype) * 3  # queued just before the copy starts
    got = staging.download(cp, a)
    np.testing.assert_array_equal(got, np.arange(n, dtype=dtype) * 3)


# -- k-means++ on the device (seeding.DeviceSeeding) ----------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d,k,weighted", [(3, 1, False), (3, 300, False), (3, 120, True),
                                          (5, 60, False), (64, 40, True)])
def test_device_kmeans_plusplus_draws_numpys_rows(cp, dtype, d, k, weighted):
    """The kernels' k-means++ draws the rows the xp steps draw on NumPy from the same random
    state (their sums add in another order: only a near-tie could move a draw); every CuPy
    backend seeds with it."""
    from array_api_compat import cupy as cp_xp
    from array_api_compat import numpy as np_xp
    from kmeans_xp_backends.cupy.seeding import DeviceSeeding

    from kmeans_xp.algorithms.init import kmeans_plusplus
    from kmeans_xp.contract.seeding import local_trials
    X, _, w = _centered_problem(100_003, d, 9, dtype, seed=d + k)
    w = w if weighted else None
    Xd, wd = cp.asarray(X), None if w is None else cp.asarray(w)
    for name in ("cupy-kernels", "cupy-chunked", "cupy-fused"):
        steps = get_backend(name)().seeding(Xd, wd, local_trials(k), xp=cp_xp)
        assert isinstance(steps, DeviceSeeding), name
    got = kmeans_plusplus(Xd, k, sample_weight=wd, random_state=np.random.RandomState(1),
                          xp=cp_xp, rows=X.shape[0], seeding=steps)[1]
    ref = kmeans_plusplus(X, k, sample_weight=w, random_state=np.random.RandomState(1),
                          xp=np_xp, rows=X.shape[0])[1]
    np.testing.assert_array_equal(got, ref)
    if w is not None:
        assert np.all(w[got] > 0)
