"""Memory as a feature: max_memory parsing, estimates before the fit, and a measured peak."""
import threading
import tracemalloc

import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

import kmeans_xp.algorithms.init as init_mod
from kmeans_xp import KMeans, KMeansMemoryError, MemoryEstimate, estimate_memory
from kmeans_xp.contract.backend import compact_labels_dtype
from kmeans_xp.contract.memory import chunk_rows, format_bytes, parse_memory, resolve_budget
from kmeans_xp.contract.namespaces import array_namespace
from kmeans_xp.testing import asymmetric_data
from kmeans_xp.testing.label_bounds import fit_differences


@pytest.mark.parametrize("value,expected", [
    ("2GB", 2 * 10**9), ("2gb", 2 * 10**9), ("512MiB", 512 * 2**20), ("1.5 GiB", 3 * 2**29),
    ("64KB", 64_000), ("10k", 10_000), ("1TiB", 2**40), ("4096", 4096), ("100B", 100),
    (" 3 MB ", 3 * 10**6), (1, 1), (123456789, 123456789), (1e9, 10**9), (2.7, 2),
    (np.float32(8.0), 8),
    (np.int64(77), 77), ("auto", "auto"), ("AUTO", "auto"),
])
def test_parse_memory(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("bad", ["lots", "2XB", "-1GB", "", "GB", "2 G B", "1e9", "0GB",
                                 "0.1B", 0, -5, 0.0, 0.5, True, None, [1], b"2GB",
                                 float("nan"), float("inf")])
def test_parse_memory_rejects(bad):
    with pytest.raises(ValueError, match="max_memory"):
        parse_memory(bad)


def test_resolve_budget():
    assert resolve_budget("1MB", available=10**12) == 10**6
    assert resolve_budget(4096, available=1) == 4096  # an explicit bound is the user's call
    assert resolve_budget("auto", available=8 * 10**9) == 4 * 10**9
    assert resolve_budget("auto", available=8 * 10**9, cap=2**30) == 2**30


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(5 * 2**40) == "5.00 TiB"


def test_chunk_rows():
    assert chunk_rows(10_000, 100, 0, n_samples=10**6) == 100
    assert chunk_rows(10_000, 100, 5_000, n_samples=10**6) == 50
    assert chunk_rows(10**9, 100, n_samples=1234) == 1234  # never more than n
    with pytest.raises(KMeansMemoryError, match=r"needs at least .* Raise max_memory"):
        chunk_rows(1000, 100, 950, n_samples=10, what="the test")


@pytest.mark.parametrize("backend", ["numpy", "array-api"])
def test_estimate_memory_parts_and_total(backend):
    est = estimate_memory(100_003, 3, 200, dtype="float32", backend=backend, max_memory="64MB")
    assert isinstance(est, MemoryEstimate)
    assert est.parts and all(isinstance(v, int) and v > 0 for v in est.parts.values())
    assert est.total == sum(est.parts.values())
    assert 1 <= est.chunk_rows <= 100_003
    assert est.parts["driver_labels_or_init"] >= 3 * 100_003 * 8  # the driver's labels
    assert est.parts["driver_centered_copy"] == 100_003 * 3 * 4
    working = sum(v for p, v in est.parts.items() if not p.startswith("driver_")
                  and p not in ("min_sq_dist", "assign_outputs"))
    assert working <= 64 * 10**6  # working memory within the bound
    assert "MiB" in str(est) and "chunk of" in str(est)
    # more clusters need more; float64 needs at least as much as float32
    # (with "auto": bytes given are filled up to the bound, the parts shifting between
    # the driver's arrays and the backend's chunks)
    est = estimate_memory(100_003, 3, 200, dtype="float32", backend=backend)
    more = estimate_memory(100_003, 3, 2000, dtype="float32", backend=backend)
    assert more.total > est.total
    f64 = estimate_memory(100_003, 3, 200, dtype="float64", backend=backend)
    assert f64.total >= est.total


@pytest.mark.parametrize("backend", ["numpy", "array-api"])
def test_estimate_memory_dtype_is_the_computation_dtype(backend):
    def total(dtype):
        return estimate_memory(10_007, 5, 50, dtype=dtype, backend=backend).total

    assert total("float16") == total("float32")
    assert total("int8") == total(np.int64) == total(bool) == total("float64")


def test_estimate_memory_chunk_shrinks_with_budget():
    big = estimate_memory(1_000_003, 3, 500, dtype="float32", backend="numpy", max_memory="1GB")
    small = estimate_memory(1_000_003, 3, 500, dtype="float32", backend="numpy",
                            max_memory="80MB")
    assert small.chunk_rows < big.chunk_rows
    assert small.total <= 80 * 10**6   # all of it: the driver's arrays too


@pytest.mark.parametrize("kwargs,match", [
    ({"n_samples": 0}, "n_samples"), ({"n_features": -1}, "n_features"),
    ({"n_clusters": 2.5}, "n_clusters"), ({"n_clusters": True}, "n_clusters"),
    ({"backend": "nope"}, "unknown backend"), ({"max_memory": "lots"}, "max_memory"),
])
def test_estimate_memory_errors(kwargs, match):
    args = {"n_samples": 1000, "n_features": 3, "n_clusters": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        estimate_memory(args.pop("n_samples"), args.pop("n_features"), args.pop("n_clusters"),
                        **args)


@pytest.mark.parametrize("backend", ["numpy", "array-api"])
def test_tiny_max_memory_raises_memory_error_with_message(backend):
    with pytest.raises(KMeansMemoryError) as info:
        estimate_memory(1000, 3, 10, backend=backend, max_memory=16)
    msg = str(info.value)
    assert "max_memory" in msg and "Raise max_memory" in msg and backend in msg
    assert isinstance(info.value, MemoryError)


def test_tiny_max_memory_fails_fit_before_any_work(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("k-means++ ran before the memory check")

    monkeypatch.setattr(init_mod, "kmeans_plusplus", boom)
    X = np.random.default_rng(0).normal(size=(500, 3))
    with pytest.raises(KMeansMemoryError, match="max_memory"):
        KMeans(3, max_memory=32, backend="numpy").fit(X)
    with pytest.raises(KMeansMemoryError, match="max_memory"):
        KMeans(3, max_memory="100B", backend="array-api").fit(X)


def test_small_max_memory_fit_gives_the_same_answer():
    """Chunking is a memory matter only: the result does not depend on max_memory."""
    X = asymmetric_data(5003, 3, 20, seed=2)
    init = X[:20].copy()
    small = KMeans(20, init=init, max_memory="640KB").fit(X)
    big = KMeans(20, init=init, max_memory="1GB").fit(X)
    # GEMMs of other row counts may round otherwise on some BLAS builds
    assert not fit_differences(X, small, big)


# -- measured peak under the estimate ------------------------------------------------------
def _quiet_process():
    """Wait for the numba backend's background compiles that earlier tests started
    (`NumbaPlacement.warm_up`): tracemalloc counts every thread's allocations, and a cold
    compile allocates megabytes."""
    for t in threading.enumerate():
        if t.name.startswith("kmeans_xp-numba-compile"):
            t.join()


def _peak_lloyd_iters(backend, X, w, C, iters=3):
    """Peak bytes traced while `iters` Lloyd iterations run; X, w, C exist before tracing."""
    xp = array_namespace(X)
    backend.lloyd_iter(X, w, C, None, xp=xp)  # warm-up: thread pool and BLAS buffers exist
    _quiet_process()
    tracemalloc.start()
    try:
        labels = None
        for _ in range(iters):
            it = backend.lloyd_iter(X, w, C, labels, xp=xp)
            labels = it.labels
            C = (it.weighted_sums / np.maximum(it.weight_in_clusters, 1)[:, None]).astype(X.dtype)
            del it
        del labels
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("n,d,k,dtype,max_memory", [
    (7919, 40, 37, np.float64, "4MB"),
    (12007, 8, 64, np.float64, "auto"),
    # the seed's shape, and many clusters under a tight budget
    (200_003, 3, 200, np.float32, "16MB"),
    (30011, 3, 500, np.float32, "3MiB"),
])
def test_numpy_backend_peak_under_estimate(n, d, k, dtype, max_memory):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d)).astype(dtype)
    w = np.ones(n, dtype=dtype)
    C = X[rng.choice(n, k, replace=False)].copy()
    est = estimate_memory(n, d, k, dtype=dtype, backend="numpy", max_memory=max_memory)
    peak = _peak_lloyd_iters(NumpyBackend(max_memory=max_memory), X, w, C)
    # the measurement sees the backend's allocations: two generations of compact labels
    assert peak >= 2 * n * compact_labels_dtype(k).itemsize
    assert peak <= est.total, f"measured {format_bytes(peak)} > estimate {est}"


def test_numpy_backend_holds_one_buffer_set_per_thread_on_a_larger_pool():
    """The process's pass threads grow to the most threads any fit asked for (8 here); a
    2-thread backend's passes then land on any 2 of them. What it holds stays within its
    estimate for 2 threads, pass after pass (its buffers follow its jobs, not the OS
    threads: kept per thread, they piled up to one set per pool thread)."""
    rng = np.random.default_rng(1)
    # a pass of 8 jobs (max_memory small enough for 8 blocks): the pool has 8 threads
    NumpyBackend(max_memory="2MB", n_threads=8).lloyd_iter(*_blobs(rng, 70_001, 3, 8), None)
    X, w, C = _blobs(rng, 60_013, 3, 64)
    est = NumpyBackend.estimate_memory(60_013, 3, 64, itemsize=4, max_memory="8MB",
                                       n_threads=2)
    b = NumpyBackend(max_memory="8MB", n_threads=2)
    _quiet_process()
    tracemalloc.start()
    try:
        for _ in range(24):
            it = b.lloyd_iter(X, w, C, None)
            del it
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held <= est.parts["chunk_buffers"] + est.parts["shared"], (
        f"{format_bytes(held)} held after 24 passes; estimate {est}")


def _blobs(rng, n, d, k):
    X = rng.normal(size=(n, d)).astype(np.float32)
    return X, np.ones(n, dtype=np.float32), X[rng.choice(n, k, replace=False)].copy()


@pytest.mark.parametrize("n,d,k,dtype,max_memory,weighted,init", [
    (2_000_000, 3, 500, np.float64, "320MB", False, "array"),
    (100_003, 3, 50, np.float32, "8MB", True, "k-means++"),
    (50_021, 16, 64, np.float64, "11MB", False, "k-means++"),
])
def test_whole_fit_peak_under_estimate(n, d, k, dtype, max_memory, weighted, init):
    """A whole fit (validation, centering, init, Lloyd, final pass) on the numpy backend stays
    within estimate_memory, the driver's own O(n) arrays included (X itself not counted)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d)).astype(dtype)
    init = X[rng.choice(n, k, replace=False)].copy() if init == "array" else init
    w = rng.uniform(0.5, 2, n).astype(dtype) if weighted else None
    est = estimate_memory(n, d, k, dtype=dtype, backend="numpy", max_memory=max_memory,
                          weighted=weighted)
    km = KMeans(k, init=init, max_iter=3, max_memory=max_memory, backend="numpy",
                random_state=0)
    km.fit(X[:1000], sample_weight=None if w is None else w[:1000])  # pool, BLAS, imports
    _quiet_process()
    tracemalloc.start()
    try:
        km.fit(X, sample_weight=w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    labels_out = n * 8  # labels_ is kept by the estimator
    assert peak <= est.total + labels_out, f"measured {format_bytes(peak)} > estimate {est}"


def test_early_memory_check_plans_with_the_backend_options():
    from kmeans_xp.contract import registry

    seen = []

    class Recording(NumpyBackend):
        name = "recording-numpy"

        @classmethod
        def estimate_memory(cls, *args, n_threads=None, **kwargs):
            seen.append(n_threads)
            return super().estimate_memory(*args, n_threads=n_threads, **kwargs)

    registry.register_backend(Recording)
    try:
        X = asymmetric_data(301, 3, 3, seed=0)
        KMeans(3, backend="recording-numpy", backend_options={"n_threads": 1},
               random_state=0).fit(X)
        assert seen and set(seen) == {1}   # (planned more than once: fitmemory)
    finally:
        registry._runtime.pop("recording-numpy")
        registry.list_backends.cache_clear()


def test_backend_without_estimate_still_fits():
    """estimate_memory is optional: the base class raises NotImplementedError, and then
    the memory check is the backend's own, at its first chunk."""
    from kmeans_xp import KMeansBackend
    from kmeans_xp.contract import registry

    class NoEstimate(NumpyBackend):
        name = "no-estimate"
        estimate_memory = KMeansBackend.estimate_memory

    registry.register_backend(NoEstimate)
    try:
        X = asymmetric_data(301, 3, 3, seed=0)
        km = KMeans(3, backend="no-estimate", random_state=0).fit(X)
        assert km.backend_ == "no-estimate"
        with pytest.raises(NotImplementedError):
            estimate_memory(301, 3, 3, backend="no-estimate")
    finally:
        registry._runtime.pop("no-estimate")
        registry.list_backends.cache_clear()


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_cpu_estimate_stays_bounded_at_index_scale_k(backend):
    """n=1M, d=128, k=16384 (an IVF index's training size) fits the CPU backends in bounded
    memory: the working chunks stay within the budget whatever n (they tile the rows, and
    a row's k distances are one sub-chunk row), and with max_memory given the whole fit
    does. The fit itself is a benchmark (benchmarks/large_k.py), not a test."""
    from kmeans_xp import estimate_memory
    n, d, k = 1_000_000, 128, 16384
    est = estimate_memory(n, d, k, backend=backend, max_memory="auto")
    assert est.total < 2 << 30
    chunks = {p: v for p, v in est.parts.items() if not p.startswith("driver_")}
    bigger = estimate_memory(10 * n, d, k, backend=backend, max_memory="auto")
    grown = sum(v for p, v in bigger.parts.items() if not p.startswith("driver_")) - \
        sum(chunks.values())
    assert grown <= 16 * 9 * n   # (a few bytes a row: per-row results, never rows * k)
    given = estimate_memory(n, d, k, backend=backend, max_memory="1.5GB")
    assert given.total <= 1.5e9
