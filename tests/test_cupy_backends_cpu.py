"""CPU checks of the CuPy backends: registry entries, the error without CuPy or a GPU, the chunk
plan, cupy-chunked's chunk/tile/OOM-halving loop, and whole fits and the contract suite,
driven through a NumPy stand-in for CuPy whose kernels are the real CUDA ones run on the CPU
(tests/_fake_cupy.py, tests/_cuda_emulator.py; GEMM is NumPy's), where no GPU is."""
import numpy as np
import pytest
from kmeans_xp_backends.cupy import nearest as kernels
from kmeans_xp_backends.cupy.chunked import (
    MAX_BLOCK_BYTES,
    TILE_MIN_ROWS,
    CupyChunkedBackend,
    plan_chunks,
)
from kmeans_xp_backends.cupy.common import MIN_CHUNK_ROWS

from kmeans_xp import (
    BackendNotAvailableError,
    KMeans,
    KMeansMemoryError,
    get_backend,
    list_backends,
)
from kmeans_xp.testing import asymmetric_data
from tests import _fake_cupy
from tests.conftest import gpu_available

CUPY_BACKENDS = ("cupy-kernels", "cupy-chunked")
ALL_CUPY = CUPY_BACKENDS + ("cupy-fused",)


# -- registry ---------------------------------------------------------------------------------
def test_cupy_backends_are_listed():
    infos = list_backends()
    for name in ALL_CUPY:
        assert name in infos
        assert infos[name].gpu
        assert infos[name].target.startswith("kmeans_xp_backends.cupy.")


@pytest.mark.skipif(gpu_available(), reason="CuPy and a GPU are present")
@pytest.mark.parametrize("name", CUPY_BACKENDS)
def test_without_cupy_or_gpu_get_backend_says_why(name):
    with pytest.raises(BackendNotAvailableError) as info:
        get_backend(name)
    msg = str(info.value)
    assert f"backend {name!r} is not available" in msg
    assert "cupy is not installed" in msg or "no usable CUDA device" in msg
    assert "Installed backends" in msg and "'numpy'" in msg
    if "not installed" in msg:
        assert "pip install 'kmeans_xp[cuda12]' or pip install 'kmeans_xp[cuda13]'" in msg


def test_backend_modules_import_without_touching_cupy():
    import importlib
    import sys
    for mod in ("kernels", "chunked", "fused", "streaming", "placement", "budget"):
        importlib.import_module(f"kmeans_xp_backends.cupy.{mod}")
    # CuPy is imported only when a backend is instantiated
    assert "cupy" not in sys.modules or gpu_available() or isinstance(
        sys.modules["cupy"], _fake_cupy.FakeCupy)


# -- chunk plan -----------------------------------------------------------------------------
@pytest.mark.parametrize("n,d,k,itemsize,budget", [
    (2_000_000, 3, 200, 4, 2 << 30),
    (20_000_000, 3, 1000, 4, 12 << 30),
    (3001, 3, 500, 4, 2_000_000),           # check_backend's 2MB: centers get tiled
    (1_000_000, 128, 4096, 4, 256 << 20),
    (10_000, 2, 1_000_000, 8, 64 << 20),    # huge k: tiles of k
    (100_000, 3, 1_000_000, 4, 100 << 30),  # huge k, huge budget: tiles keep blocks ~1 GiB
    (97, 1, 1, 8, 1 << 20),
])
def test_plan_fits_the_budget(n, d, k, itemsize, budget):
    plan = plan_chunks(n, d, k, itemsize, budget)
    assert 1 <= plan.k_tile <= k
    assert min(n, MIN_CHUNK_ROWS) <= plan.rows <= n
    assert plan.buffer_bytes(itemsize) + k * itemsize <= budget
    assert plan.rows * plan.k_tile * itemsize <= max(MAX_BLOCK_BYTES, TILE_MIN_ROWS * plan.k_tile
                                                     * itemsize)
    room = min(budget - k * itemsize, MAX_BLOCK_BYTES)
    if plan.k_tile < k:  # tiled only when all k would leave too few rows
        assert room // ((k + 1) * itemsize) < min(n, TILE_MIN_ROWS)
    else:
        assert room // ((k + 1) * itemsize) >= min(n, TILE_MIN_ROWS)


def test_plan_refuses_a_budget_below_the_floor():
    with pytest.raises(KMeansMemoryError, match="max_memory allows"):
        plan_chunks(10**6, 3, 100, 4, 1000)


def test_init_bytes_grow_with_n_and_estimates_count_x_on_the_device(fake_cupy):
    from kmeans_xp_backends.cupy.seeding import device_seeding_bytes

    from kmeans_xp import estimate_memory
    one, two = device_seeding_bytes(10**6, 3, 10, 4), device_seeding_bytes(2 * 10**6, 3, 10, 4)
    assert two - one == 10**6 * (one - device_seeding_bytes(0, 3, 10, 4)) // 10**6 > 4 * 10**6
    assert device_seeding_bytes(1000, 4000, 10, 4) is None  # candidates past shared memory
    for name in ALL_CUPY:
        # the estimate counts the device steps, not the xp steps and their chunks
        est = estimate_memory(10**6, 3, 10, backend=name)
        assert est.parts["driver_labels_or_init"] == max(3 * 8 * 10**6, one), name
        streamed = estimate_memory(10**6, 3, 10, backend=name,
                                   backend_options={"stream": True})
        assert streamed.parts["driver_labels_or_init"] > 3 * one, name  # the xp steps
        from kmeans_xp import get_backend as gb
        est = gb(name).estimate_memory(1000, 3, 10, itemsize=4)
        assert est.parts["data"] == 1000 * 3 * 4, name
        assert "labels" not in est.parts and "centered_copy" not in est.parts  # the core's


# -- the backends' Python paths on a NumPy stand-in for CuPy ---------------------------------
@pytest.fixture
def fake_chunked(monkeypatch):
    from tests._cuda_emulator import EmulatedKernels
    if not EmulatedKernels.available():
        pytest.skip("needs g++ to run the CUDA kernels on the CPU")

    def make(max_memory, max_alloc=1 << 40):
        fake = _fake_cupy.install(monkeypatch, max_alloc)
        b = CupyChunkedBackend(max_memory=max_memory)
        return b, fake
    yield make
    _fake_cupy.uninstall()


def _reference(X, C):
    d = ((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
    return d.argmin(1), d


@pytest.mark.parametrize("n,d,k,max_memory", [
    (5003, 3, 7, "10MB"),      # one chunk, one tile
    (20011, 3, 500, "2MB"),    # chunks and center tiles
    (3001, 17, 64, 300_000),   # tiles with an uneven last tile
])
def test_chunked_assign_loop_gives_the_argmin(fake_chunked, n, d, k, max_memory):
    b, fake = fake_chunked(max_memory)
    X = asymmetric_data(n, d, k, dtype=np.float64, seed=n)
    C = X[np.random.default_rng(k).choice(n, k, replace=False)] + 0.01
    labels, min_sq = b.assign(X, C)
    ref, dist = _reference(X, C)
    np.testing.assert_array_equal(labels, ref)
    np.testing.assert_allclose(min_sq, dist[np.arange(n), ref], rtol=1e-12)
    plan = b._plan[1]
    assert plan.buffer_bytes(8) + k * 8 <= b.memory.bytes(reserve=n * 12)
    blocks = b._blocks
    b.assign(X, C)
    assert b._blocks[3] is blocks[3], "the distance block is reused across iterations"


def test_chunked_assign_halves_the_chunk_on_oom(fake_chunked):
    n, d, k = 40_009, 3, 50
    b, fake = fake_chunked("64MB", max_alloc=2048 * k * 8)  # blocks of <= 2048 rows fit
    X = asymmetric_data(n, d, k, dtype=np.float64, seed=1)
    C = X[:k] + 0.5
    planned = plan_chunks(n, d, k, 8, b.memory.bytes(reserve=n * 12)).rows
    labels, _ = b.assign(X, C)
    np.testing.assert_array_equal(labels, _reference(X, C)[0])
    rows = b._plan[1].rows
    assert rows < planned and rows * k * 8 <= fake.max_alloc
    n_allocs = len(fake.allocations)
    b.assign(X, C)  # starts from the chunk that fitted: no new blocks, no new failures
    # only this call's labels, distances and center norms
    assert len(fake.allocations) == n_allocs + 3


def test_chunked_assign_below_the_floor_raises_memory_error(fake_chunked):
    b, fake = fake_chunked("64MB", max_alloc=200_000)  # labels fit, no block of 1024 rows does
    X = asymmetric_data(20_000, 3, 400, dtype=np.float64, seed=2)
    with pytest.raises(KMeansMemoryError, match=f"chunk of {MIN_CHUNK_ROWS} rows"):
        b.assign(X, X[:400])


def _beside_driver(name, X, k, budget):
    """max_memory leaving `budget` bytes to the backend beside the driver's arrays (it
    bounds both)."""
    from kmeans_xp import get_backend
    from kmeans_xp.contract.fitmemory import least_max_memory
    return least_max_memory(get_backend(name), *X.shape, k, X.dtype.itemsize) + budget


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ALL_CUPY)
def test_fit_with_the_real_kernels_is_the_numpy_backends(emulated_cupy, name, dtype):
    """The backends' launch code and the CUDA kernels themselves (run on the CPU): the numpy
    backend's fit (float32 too: numpy's arithmetic, sums with float64 products as numpy's
    bincount of float32 products rounds them alike for these data)."""
    X = asymmetric_data(1201, 3, 6, dtype=dtype, seed=21)
    init = X[:6] + dtype(0.1)
    ref = KMeans(6, init=init, backend="numpy", max_iter=6, tol=0).fit(X)
    # (40 KB for the backend's chunks beside the driver's arrays; fused: O(k d) memory)
    budget = _beside_driver(name, X, 6, 40_000) if name != "cupy-fused" else "auto"
    got = KMeans(6, init=init, backend=name, max_iter=6, tol=0, max_memory=budget).fit(X)
    agree = np.mean(got.labels_ == ref.labels_)
    assert agree == 1.0, f"{name} {np.dtype(dtype)}: {1 - agree:.4%} labels differ"
    assert got.n_iter_ == ref.n_iter_
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=rtol)


@pytest.mark.parametrize("name", CUPY_BACKENDS)
def test_fit_through_the_estimator_matches_numpy(fake_cupy, name):
    X = asymmetric_data(3001, 3, 9, dtype=np.float64, seed=11)
    init = X[:9] + 0.1
    ref = KMeans(9, init=init, backend="numpy").fit(X)
    got = KMeans(9, init=init, backend=name,
                 max_memory=_beside_driver(name, X, 9, 200_000)).fit(X)
    assert got.backend_ == name
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
    assert got.n_iter_ == ref.n_iter_
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)
    assert {"init", "assign", "update"} <= set(got.memory_report_)
    assert got.memory_report_["assign"] >= 3001 * 12  # its labels and distances, at least
    np.testing.assert_array_equal(got.predict(X), got.labels_)


@pytest.mark.parametrize("name", ALL_CUPY)
def test_free_memory_frees_the_pool_when_fit_ends(fake_cupy, name):
    X = asymmetric_data(501, 2, 3, dtype=np.float32, seed=12)
    KMeans(3, backend=name, random_state=0).fit(X)
    assert fake_cupy.pool.frees == 0
    KMeans(3, backend=name, random_state=0, backend_options={"free_memory": True}).fit(X)
    assert fake_cupy.pool.frees == 1


def test_backend_options_are_checked(fake_cupy):
    with pytest.raises(TypeError, match="free_memory"):
        CupyChunkedBackend(free_memory="yes")
    for bad in ({"stream": "yes"}, {"pin_input": 1}, {"stream_rows": 0}):
        with pytest.raises(TypeError, match=next(iter(bad))):
            CupyChunkedBackend(**bad)
    for name in CUPY_BACKENDS:
        with pytest.raises(TypeError, match=r"knows: \['free_memory', 'pin_input', "
                                            r"'stream', 'stream_rows'\]"):
            get_backend(name)(chunk=3)
    with pytest.raises(TypeError, match="knows: .*'precision'"):
        get_backend("cupy-fused")(stream=True)  # the fused backend does not stream


def test_nested_stages_report_their_own_peaks(fake_cupy):
    b = CupyChunkedBackend()
    with b.stage("outer"):
        fake_cupy.empty((1000,), np.float64)
        with b.stage("inner"):
            fake_cupy.empty((10,), np.float64)
        fake_cupy.empty((10_000,), np.float64)
    assert b.memory_report["inner"] == 8080
    assert b.memory_report["outer"] == 8080 + 80_000


def test_nearest_kernel_by_width_and_dtype():
    name = kernels.nearest_kernel_name
    assert [name(d, np.float32) for d in (1, 4, 5, 8, 9, 17, 128, 129)] == [
        "nearest_small<float, 1, 4>", "nearest_small<float, 4, 4>", "nearest_tiled<float, 8>",
        "nearest_tiled<float, 8>", "nearest_tiled<float, 16>", "nearest_tiled<float, 32>",
        "nearest_tiled<float, 128>", "nearest_mem<float>"]
    assert name(3, np.float64) == "nearest_small<double, 3, 2>"
    assert name(64, np.float64) == "nearest_tiled<double, 64>"
    assert name(65, np.float64) == "nearest_mem<double>"
    names = [n for _, n in kernels.kernel_instances()]
    assert all(name(d, dt) in names for d in range(1, 300) for dt in (np.float32, np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 2, 3, 5, 17])
def test_center_operands_are_numpys(fake_cupy, dtype, d):
    """-2 c exactly and ||c||^2 in np.einsum's order (pack_centers on the device, numpy's
    SIMD order), padded to 16 bytes: the kernels' GEMM expansion is then numpy's, operand for
    operand."""
    rng = np.random.default_rng(d)
    C = (rng.normal(size=(37, d)) * rng.uniform(0.1, 100, size=(37, d))).astype(dtype)
    ops = kernels.center_operands(C, dtype)
    stride = kernels.ops_stride(d, np.dtype(dtype).itemsize)
    assert ops.shape == (37, stride) and ops.dtype == dtype
    assert stride * np.dtype(dtype).itemsize % 16 == 0 and stride >= d + 1
    np.testing.assert_array_equal(ops[:, :d], -2 * C)
    np.testing.assert_array_equal(ops[:, d], np.einsum("ij,ij->i", C, C))
    assert not ops[:, d + 1:].any()
    np.testing.assert_array_equal(kernels.center_norms(C, dtype), ops[:, d])


@pytest.mark.parametrize("name", ALL_CUPY)
def test_contract_suite_on_the_emulated_device(fake_cupy, name):
    """kmeans_xp.testing.check_backend with the real kernels run on the CPU (the GPU tests run
    it on the device too): primitives, iterations, inertia, farthest, memory bound and the
    driver's case matrix against the numpy backend."""
    from kmeans_xp.testing import check_backend
    dtypes = (np.float64,) if name == "cupy-chunked" else (np.float32, np.float64)
    assert check_backend(get_backend(name), dtypes=dtypes) > 0


def test_label_store_dtype_holds_k():
    assert kernels.label_store_dtype(256) == np.uint8
    assert kernels.label_store_dtype(257) == np.uint16
    assert kernels.label_store_dtype(65536) == np.uint16
    assert kernels.label_store_dtype(65537) == np.int32


def test_label_counts_are_counted_on_the_device(fake_cupy):
    from kmeans_xp import get_backend as gb
    labels = np.random.default_rng(3).integers(0, 37, 5003).astype(np.int32)
    labels[labels == 5] = 6  # an empty cluster
    got = gb("cupy-kernels")().placement.label_counts(labels, 40)
    np.testing.assert_array_equal(got, np.bincount(labels, minlength=40))


def test_kernels_of_a_group_compile_in_one_nvrtc_run(monkeypatch):
    """A fit's helper kernels compile per file and value type in one module; an untyped one
    comes from the group already compiled; any other instance alone."""
    import sys

    from kmeans_xp_backends.cupy import common
    made = []

    class RawModule:
        def __init__(self, code, options, name_expressions):
            made.append(tuple(name_expressions))
            self.names = name_expressions

        def get_function(self, name):
            assert name in self.names
            return name

    monkeypatch.setitem(sys.modules, "cupy", _cupy_compiling_with(RawModule))
    monkeypatch.setattr(common, "_MODULES", {})
    common.raw_kernel.cache_clear()
    try:
        for name in ("seeding_update<double>", "seeding_draw", "seeding_potentials<double>"):
            assert common.raw_kernel("seeding.cu", name) == name
        common.raw_kernel("stats.cu", "weighted_total<double>")
        common.raw_kernel("stats.cu", "count_changed")
        common.raw_kernel("stats.cu", "store_labels<int>")
        common.raw_kernel("fused_small.cu", "assign_small<float, 3, 4, true>")
    finally:
        common.raw_kernel.cache_clear()
    assert made == [
        ("seeding_draw", "seeding_potentials<double>", "seeding_update<double>"),
        ("weighted_total<double>", "count_changed", "column_absmax<double>",
         "fixed_point_scales", "count_labels", "column_moments<double>"),
        ("store_labels<int>",), ("assign_small<float, 3, 4, true>",)]


def _cupy_compiling_with(raw_module):
    """A stand-in for the parts of CuPy that compile: RawModule, and the current device."""
    import contextlib
    import types

    class Device(contextlib.nullcontext):
        id = 0

        def __init__(self, device_id=0):
            super().__init__()

    return types.SimpleNamespace(RawModule=raw_module, cuda=types.SimpleNamespace(Device=Device))


def test_prefetched_kernels_compile_together_on_other_threads(monkeypatch):
    """prefetch starts each group's compile on the compile threads at once (a cold fit's
    compiles overlap instead of each first launch waiting for its own); raw_kernel then waits
    for that compile instead of starting a second one; a failed compile is tried again."""
    import sys
    import threading

    from kmeans_xp_backends.cupy import common
    both = threading.Barrier(2, timeout=10)  # passes only if two compiles run at once
    made, threads = [], set()

    class RawModule:
        def __init__(self, code, options, name_expressions):
            self.names = tuple(name_expressions)
            made.append(self.names)

        def get_function(self, name):
            if threading.current_thread() is not threading.main_thread() and len(made) <= 2:
                threads.add(threading.current_thread().name)
                both.wait()
            if "count_changed" in self.names and made.count(self.names) == 1:
                raise RuntimeError("NVRTC failed")  # the first compile of that group
            return name

    monkeypatch.setitem(sys.modules, "cupy", _cupy_compiling_with(RawModule))
    monkeypatch.setattr(common, "_MODULES", {})
    common.raw_kernel.cache_clear()
    try:
        common.prefetch([("direct.cu", "direct_inertia<float>"),
                         ("fused_small.cu", "assign_small<float, 3, 4, true>")])
        assert common.raw_kernel("direct.cu", "labelled_sq_dist<float>") == \
            "labelled_sq_dist<float>"
        assert common.raw_kernel("fused_small.cu", "assign_small<float, 3, 4, true>")
        with pytest.raises(RuntimeError, match="NVRTC"):
            common.raw_kernel("stats.cu", "count_changed")
        assert common.raw_kernel("stats.cu", "count_changed") == "count_changed"
    finally:
        common.raw_kernel.cache_clear()
    assert len(threads) == 2 and all(t.startswith("kmeans_xp-nvrtc") for t in threads)
    assert made.count(("assign_small<float, 3, 4, true>",)) == 1  # compiled once
    assert made.count(common.together("direct.cu", "direct_inertia<float>")) == 1



@pytest.mark.parametrize("name", ALL_CUPY)
@pytest.mark.parametrize("d,k,init,dtype", [
    (3, 7, "k-means++", np.float32), (3, 300, "array", np.float64),
    (40, 9, "k-means||", np.float32), (5, 6, "random", np.float64),
    (40, 300, "array", np.float32)])
def test_warm_up_compiles_ahead_what_the_fit_asks_for(emulated_cupy, name, d, k, init, dtype):
    """The kernels a fit's placement compiles ahead (`warm_up`) are those the fit asks for:
    every kernel it looks up is in a module compiled ahead, and none of those goes unused (a
    compile for nothing costs a cold fit a CPU core for 0.1-0.3 s). What only some fits ask
    for is left to compile on first use: relocation (no empty cluster here) and streaming.
    (d=40, k=300: cupy-fused's sums in cluster order, a group of their own.)"""
    from kmeans_xp_backends.cupy.common import together
    X = asymmetric_data(1500, d, k, dtype=dtype, seed=3, offset=2.0)
    init = X[:k].copy() if init == "array" else init
    del _fake_cupy.LOOKED_UP[:]
    KMeans(k, init=init, n_init=1, max_iter=4, random_state=0, backend=name).fit(X)
    ahead = emulated_cupy.prefetched
    groups = {(f, together(f, n)) for f, n in ahead}

    def covered(file, inst):
        return any(f == file and inst in names for f, names in groups)

    asked = set(_fake_cupy.LOOKED_UP)
    assert ahead and all(covered(f, n) for f, n in asked), \
        sorted(x for x in asked if not covered(*x))
    used = {(f, names) for f, names in groups if any(f == af and n in names for af, n in asked)}
    assert used == groups, sorted(groups - used)


def test_warm_up_compiles_the_tensor_core_kernel_of_a_tf32_fit(emulated_cupy):
    """A precision="tf32" fit's tensor-core kernel compiles ahead too (while X moves), and is
    the one the fit asks for."""
    from kmeans_xp_backends.cupy.common import together
    X = asymmetric_data(1500, 40, 9, dtype=np.float32, seed=3, offset=2.0)
    del _fake_cupy.LOOKED_UP[:]
    KMeans(9, init="k-means++", n_init=1, max_iter=4, random_state=0, backend="cupy-fused",
           precision="tf32").fit(X)
    groups = {(f, together(f, n)) for f, n in emulated_cupy.prefetched}
    asked = [(f, n) for f, n in _fake_cupy.LOOKED_UP if "assign_mma" in n]
    assert asked and all(any(f == g and n in names for g, names in groups) for f, n in asked)


def test_device_feature_stats_are_the_numpy_backends(fake_cupy):
    """A float32 device X's mean from the column_moments kernel (partials added on the host)
    is the numpy backend's bit for bit, and tol (one pass, about the first rows' mean) its
    two-pass float64 one, at an offset that would spoil a naive sum of squares."""
    from kmeans_xp import get_backend as gb
    from kmeans_xp.contract.chunks import feature_mean, tolerance
    X = asymmetric_data(70_001, 3, 5, dtype=np.float32, seed=2) + np.float32(1e4)
    backend = gb("cupy-kernels")()  # (its placement holds it weakly)
    place = backend.placement
    mean, tol = place.feature_stats(X, 1e-4, xp=np)
    ref_mean = feature_mean(X, np)
    assert mean.dtype == np.float32
    np.testing.assert_array_equal(mean, ref_mean)
    assert tol == pytest.approx(tolerance(X, ref_mean, 1e-4, np, 1 << 14), rel=1e-9)
    assert place.feature_stats(X, 0, xp=np)[1] == 0.0


@pytest.mark.parametrize("tol", [1e-4, 0.0])
@pytest.mark.parametrize("dense", [False, True])
def test_device_batch_stats_are_each_problems(fake_cupy, tol, dense):
    """A batch's statistics (each pass's kernels launched for every problem, or one launch
    for a dense batch's evenly spaced problems, read back in one copy) are each problem's
    own `feature_stats`: the mean bit for bit, tol to rounding; problems longer and
    shorter than the rows the shift is taken over, at different offsets; a float64
    problem among them sends the batch through the per-problem default."""
    from kmeans_xp import get_backend as gb
    backend = gb("cupy-kernels")()
    place = backend.placement
    if dense:   # (views of one (3, n, d) array: one launch; n past the shift's rows)
        block = np.stack([asymmetric_data(70_001, 3, 4, dtype=np.float32, seed=s)
                          for s in range(3)]) + np.float32([1e4, -3.0, 0.5])[:, None, None]
        problems = [block[b] for b in range(3)]
    else:
        problems = [asymmetric_data(n, 3, 4, dtype=np.float32, seed=n) + np.float32(off)
                    for n, off in ((70_001, 1e4), (5, -3.0), (1000, 0.5))]
    from kmeans_xp_backends.cupy import reductions
    launches = []
    real = reductions.moments_partials
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reductions, "moments_partials",
                   lambda *a, **k: launches.append(a[2] if len(a) > 2 else 1) or real(*a, **k))
        got = place.batch_feature_stats(problems, tol, xp=np)
    passes = 2 if tol else 1
    assert launches == ([3] * passes if dense else [1] * 3 * passes)
    for X, (mean, t) in zip(problems, got):
        ref_mean, ref_tol = place.feature_stats(X, tol, xp=np)
        np.testing.assert_array_equal(mean, ref_mean)
        assert t == pytest.approx(ref_tol, rel=1e-9) and (t > 0) == (tol > 0)
    mixed = problems[:2] + [problems[2].astype(np.float64)]
    for X, (mean, t) in zip(mixed, place.batch_feature_stats(mixed, tol, xp=np)):
        np.testing.assert_array_equal(mean, place.feature_stats(X, tol, xp=np)[0])


@pytest.mark.parametrize("dtype,d,grid,rows", [(np.float32, 20, 3, 7), (np.float64, 20, 7, 64),
                                               (np.float64, 3, 1, 5), (np.float32, 301, 2, 9),
                                               (np.float32, 1028, 1, 40)])
def test_global_and_sorted_sums_are_the_shared_ones_bits(emulated_cupy, monkeypatch, dtype, d,
                                                         grid, rows):
    """accumulate_global (a thread an element of the grid-stride loop) and accumulate_sorted
    (rows counting-sorted by cluster, summed in registers) give the shared kernel's
    fixed-point sums bit for bit (integer adds, in any order), with zero weights among the
    points, empty clusters (duplicated centers: ties go to the first), clusters spanning
    several of the sorted kernel's blocks or blocks of several clusters, rows loaded a feature
    at a time (d=3, 301) and by 16-byte vectors (d=20, 1028), features beyond one block's
    threads (d=301: 256 features a sweep; d=1028: 257 vectors); a global stride that is and
    is not a multiple of d + 1; all are the float64 sums of the same labels."""
    from kmeans_xp_backends.cupy import fused_plan
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    n, k = (1201, 37) if d < 100 else (203, 11)
    X = asymmetric_data(n, d, 7, dtype=dtype, seed=5)
    X -= X.mean(axis=0)
    w = np.random.default_rng(5).random(n)
    w[::7] = 0
    C = np.ascontiguousarray(X[:k] + dtype(0.01))
    C[5] = C[4]   # cluster 5 stays empty
    got, plan = {}, fused_plan.plan
    for mode in ("shared", "global", "sorted"):
        def forced(*args, mode=mode, **kwargs):
            p = plan(*args, **kwargs)
            if mode == "global":
                p = p._replace(acc_mode=mode, acc_grid=grid, acc_smem=0, fuse=False)
            elif mode == "sorted":
                p = p._replace(acc_mode=mode, acc_grid=-(-n // rows), acc_rows=rows,
                               acc_smem=0, fuse=False)
            elif p.acc_mode != "shared":  # (the small-d pass's sums taken out of it; or
                # d=1028's 181 KB, past the plan's cap, which the emulator does not have)
                p = p._replace(acc_mode=mode, acc_grid=2, fuse=False,
                               acc_smem=k * (d + 1) * 16 + (d + 1) * 8)
            return p
        monkeypatch.setattr(fused_plan, "plan", forced)
        be = CupyFusedBackend()
        it = be.lloyd_iter(X, w, C, None)
        assert be._ws.plan.acc_mode == mode
        got[mode] = [np.asarray(a).copy() for a in (it.weighted_sums, it.weight_in_clusters,
                                                     it.labels)]
        if mode == "sorted":  # a second pass: sort_offsets left the counts zeroed
            again = be.lloyd_iter(X, w, C, None)
            np.testing.assert_array_equal(np.asarray(again.weighted_sums), got[mode][0])
    for other in ("global", "sorted"):
        for a, b in zip(got["shared"], got[other]):
            np.testing.assert_array_equal(a, b)
    sums, weights, labels = got["sorted"]
    counts = np.bincount(labels, minlength=k)
    assert counts[5] == 0
    # clusters spanning several blocks, or blocks holding several clusters
    assert counts.max() > 2 * rows or rows > 2 * np.median(counts)
    wx = w.astype(dtype).astype(np.float64)  # (the backend keeps weights in X's dtype)
    ref = np.zeros((k, d))
    np.add.at(ref, labels, X.astype(np.float64) * wx[:, None])
    np.testing.assert_allclose(sums, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(weights, np.bincount(labels, wx, minlength=k), rtol=1e-12)


@pytest.mark.parametrize("n,k,hist_k", [(1201, 37, 16384), (1201, 37, 8), (5, 3, 16384),
                                         (3000, 1000, 16384)])
def test_counting_sort_of_rows_by_label(emulated_cupy, monkeypatch, n, k, hist_k):
    """fused_sums.sort_rows: every row once, cluster c's rows in sort_starts[c]..sort_starts[c + 1], the
    counts left zeroed for the next pass; each block counting its rows in shared memory (k
    up to SORT_HIST_K) or one global atomic a row (past it), with empty clusters, blocks of
    several clusters and clusters over several blocks."""
    import types

    from kmeans_xp_backends.cupy import fused_plan, fused_sums
    monkeypatch.setattr(fused_plan, "SORT_HIST_K", hist_k)
    rng = np.random.default_rng(n + k)
    labels = rng.integers(0, k, size=n).astype(np.int32)
    labels[labels == k // 2] = 0   # an empty cluster
    ws = types.SimpleNamespace(n=n, k=k, sort_counts=np.zeros(k, np.int32),
                               sort_starts=np.empty(k + 1, np.int32),
                               sort_cursor=np.empty(k, np.int32),
                               sort_order=np.full(n, -1, np.int32))
    for _ in range(2):   # (a second pass reuses the zeroed counts)
        fused_sums.sort_rows(ws, labels)
        counts = np.bincount(labels, minlength=k)
        np.testing.assert_array_equal(ws.sort_starts, np.concatenate([[0], np.cumsum(counts)]))
        assert sorted(ws.sort_order) == list(range(n))
        np.testing.assert_array_equal(labels[ws.sort_order], np.sort(labels))
        assert not ws.sort_counts.any()


def test_the_plan_sorts_the_sums_where_they_pay():
    """Sums whose k*(d+1) pairs miss shared memory: counting-sorted by cluster for d > 16
    (its buffers counted in the working memory), global atomics for few features."""
    from kmeans_xp_backends.cupy import fused_plan
    h200 = fused_plan.NOMINAL
    p = fused_plan.plan(10**6 + 3, 128, 4096, "float32", h200, precision="tf32")
    assert p.acc_mode == "sorted" and p.acc_rows == fused_plan.sorted_rows(128, 4) == 512
    assert p.acc_grid == -(-(10**6 + 3) // 512)
    assert p.fixed_bytes["sort_buffers"] == 4 * (10**6 + 3) + 4 * (3 * 4096 + 1)
    assert fused_plan.sorted_rows(17) == 15 * 64 and fused_plan.sorted_rows(300) == 64
    assert fused_plan.sorted_vector("float64", 18) == 2
    assert fused_plan.sorted_vector("float32", 18) == 1
    p = fused_plan.plan(2 * 10**6, 3, 100_000, "float32", h200)
    assert p.acc_mode == "global" and "sort_buffers" not in p.fixed_bytes
    assert fused_plan.plan(10**6, 128, 10, "float32", h200).acc_mode == "shared"
    # compiled apart from the other sums' group, which every fit compiles
    from kmeans_xp_backends.cupy.common import together
    assert "sort_count" not in together("fused_sums.cu", "finalize_sums")
    assert together("fused_sums.cu", "accumulate_sorted<float,4>") == together(
        "fused_sums.cu", "sort_count") == ("accumulate_sorted<float,1>",
                                           "accumulate_sorted<float,4>", "sort_count",
                                           "sort_offsets", "sort_place")
