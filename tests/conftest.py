"""Shared test setup: GPU tests (marker `gpu`) skip where CuPy or a CUDA device is missing;
the quick tier is `pytest -m "not slow"` (the tests in SLOW are marked `slow`); tests of
gigabytes (marker `large`) run only when asked for."""
import functools
import os

import pytest

# JAX on a GPU takes 75% of its memory at first use unless told not to: CuPy tests in the same
# process need it
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


#: tests marked `slow` here, by node id (a test's name alone: all its parameters): the
#: slowest of the full suite on 2 cores (`pytest --durations`), each with a quick sibling
#: that still covers its backend or estimator in the quick tier
SLOW = (
    # (these five share one ptxas run of every instance, 40 s)
    "tests/test_cuda_compile.py::test_every_instance_compiles_for_sm90",
    "tests/test_cuda_compile.py::test_small_d_kernels_do_not_spill",
    "tests/test_cuda_compile.py::test_float32_large_d_kernels_do_not_spill",
    "tests/test_cuda_compile.py::test_tensor_core_v2_kernels_do_not_spill",
    "tests/test_cuda_compile.py::test_wgmma_kernels_do_not_spill",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps"
    "[small batches, reassignments-float32-weighted]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps"
    "[small batches, reassignments-float64-weighted]",
    "tests/test_numba_backend.py::test_passes_contract",
    "tests/test_numba_backend.py::test_gemm_path_passes_contract_at_every_d",
    "tests/test_numba_backend.py::test_memmap_fit_equals_in_memory_fit",
    "tests/test_numba_backend.py::test_strided_and_fortran_input",
    "tests/test_cupy_backends_cpu.py::test_contract_suite_on_the_emulated_device[cupy-chunked]",
    "tests/test_cupy_backends_cpu.py::test_contract_suite_on_the_emulated_device[cupy-fused]",
    "tests/test_cupy_backends_cpu.py::test_chunked_assign_loop_gives_the_argmin[20011-3-500-2MB]",
    "tests/test_cupy_streaming_cpu.py::test_auto_streams_only_what_does_not_fit[cupy-chunked]",
    "tests/test_cupy_streaming_cpu.py::test_streaming_buffers_stay_within_the_plan[cupy-chunked]",
    "tests/test_cupy_streaming_cpu.py::test_streamed_fit_is_the_numpy_backends[True-cupy-chunked]",
    "tests/test_numpy_memmap.py::test_memmap_fit_reads_blocks_and_gives_the_in_memory_fit"
    "[k-means++-numpy]",
    "tests/test_numpy_memmap.py::test_memmap_fit_reads_blocks_and_gives_the_in_memory_fit"
    "[k-means++-numba]",
    "tests/test_spherical.py::test_cupy_backends_emulated[cupy-chunked]",
    "tests/test_spherical.py::test_cupy_backends_emulated[cupy-fused]",
    "tests/test_cli.py::test_main_job_saves_its_results_and_names_the_best_cpu_row",
    "tests/test_dask_backend.py::test_contract_suite",
)


def _listed_slow(nodeid):
    return nodeid in SLOW or nodeid.partition("[")[0] in SLOW


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _listed_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)
    # tests of gigabytes (marker `large`) run when asked for by -m or KMEANS_XP_LARGE=1
    if "large" not in (config.getoption("markexpr", "") or "") and \
            not os.environ.get("KMEANS_XP_LARGE"):
        skip_large = pytest.mark.skip(reason="large: run with -m large or KMEANS_XP_LARGE=1")
        for item in items:
            if "large" in item.keywords:
                item.add_marker(skip_large)
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_cupy(monkeypatch):
    """A NumPy stand-in installed as `cupy` (tests/_fake_cupy.py) with the backends' real CUDA
    kernels run on the CPU (tests/_cuda_emulator.py; needs g++), for CPU tests of the CuPy
    backends."""
    from tests import _fake_cupy
    from tests._cuda_emulator import EmulatedKernels
    if not EmulatedKernels.available():
        pytest.skip("needs g++ to run the CUDA kernels on the CPU")
    fake = _fake_cupy.install(monkeypatch)
    yield fake
    _fake_cupy.uninstall()


@pytest.fixture
def emulated_cupy(fake_cupy):
    """The same stand-in (the kernels are always the real ones, emulated)."""
    yield fake_cupy


@pytest.fixture
def pool(cp):
    """CuPy's default pool, cleared, with its limit restored whatever the test does."""
    pool = cp.get_default_memory_pool()
    old = pool.get_limit()
    pool.free_all_blocks()
    try:
        yield pool
    finally:
        pool.set_limit(size=old)
        pool.free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()


@pytest.fixture
def cp():
    """The cupy module, for tests marked gpu."""
    import cupy
    yield cupy
    cupy.get_default_memory_pool().free_all_blocks()


@pytest.fixture(scope="module")
def client():
    """A distributed LocalCluster of two single-thread worker processes and its Client (the
    current one while a module's tests run)."""
    import logging
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=logging.ERROR)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()
