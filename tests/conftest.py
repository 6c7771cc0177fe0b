"""Shared test setup: GPU tests (marker `gpu`) skip where CuPy or a CUDA device is missing;
the quick tier is `pytest -m "not slow"` (the tests in SLOW are marked `slow`); tests of
gigabytes (marker `large`) run only when asked for."""
import functools
import os
import threading

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
    # the quick tier's budget (3 minutes on 2 cores): each of these has a quick sibling on
    # another dtype, parameter or backend, or is a tool rather than the library
    "tests/test_bounds.py::test_bounds_give_lloyds_run[float32-numba-1.0]",
    "tests/test_bounds.py::test_bounds_give_lloyds_run[float64-numba-1.0]",
    "tests/test_bounds.py::test_bounds_give_lloyds_run[float64-numba-0.0]",
    "tests/test_bounds.py::test_bounded_run_breaks_near_ties_as_the_plain_pass[2.0-numpy]",
    "tests/test_bounds.py::test_bounded_run_breaks_near_ties_as_the_plain_pass[0.0-numpy]",
    "tests/test_bounds.py::test_bounded_run_breaks_near_ties_as_the_plain_pass[2.0-numba]",
    "tests/test_numba_backend.py::test_one_thread_passes_contract",
    "tests/test_docs.py::test_docs_build_without_warnings",
    "tests/test_docs.py::test_api_reference_is_generated_from_the_docstrings",
    "tests/test_docs.py::test_gallery_ran_its_cpu_examples",
    "tests/test_docs.py::test_results_page_includes_every_results_file",
    "tests/test_readme.py::test_doc_blocks_run_as_pasted[spherical.md]",
    "tests/test_readme.py::test_doc_blocks_run_as_pasted[memory.md]",
    "tests/test_readme.py::test_doc_blocks_run_as_pasted[dask.md]",
    "tests/test_cupy_backends_cpu.py::test_contract_suite_on_the_emulated_device[cupy-kernels]",
    "tests/test_cli.py::test_each_run_gets_its_own_results_folder",
    "tests/test_cli.py::test_compare_writes_json_and_plots",
    "tests/test_cli_items.py::test_sweep_says_true_things_at_the_end_in_its_json_and_in_its_header",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps"
    "[small batches, reassignments-float32-unweighted]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps"
    "[small batches, reassignments-float64-unweighted]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps[random, n_init=3-float32-weighted]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps[callable-float32-unweighted]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps[callable-float64-weighted]",
    "tests/test_minibatch.py::test_memmap_is_read_batch_by_batch",
    "tests/test_bench_spread.py::test_jit_compilation_lands_in_the_warm_up_not_the_timed_fits",
    "tests/test_precision.py::test_half_x_costs_one_float32_copy_and_is_left_as_given"
    "[array-api]",
    "tests/test_benchmark_tools.py::test_surface_sweep_writes_its_section_table_and_heat_map",
    "tests/test_resources.py::test_fitted_models_hold_no_threads_nor_scratch_buffers"
    "[numba-MiniBatchKMeans]",
    "tests/test_resources.py::test_fitted_models_hold_no_threads_nor_scratch_buffers"
    "[numba-KMeans]",
    "tests/test_resources.py::test_ctrl_c_stops_the_pass_in_flight_at_once[False]",
    "tests/test_typing.py::test_public_modules_pass_mypy_strict",
    "tests/test_benchmark_tools.py::test_benchmark_command_rewrites_one_results_file_per_kind",
    "tests/test_registry.py::test_plugin_distribution_installed_with_pip",
    "tests/test_dask_reliability.py::test_zero_row_blocks_on_a_cluster[k-means++-actors]",
    "tests/test_dask_reliability.py::test_zero_row_blocks_on_a_cluster[k-means||-graph]",
    "tests/test_dask_reliability.py::test_zero_row_blocks_persisted_with_weights[actors]",
    "tests/test_resources.py::test_fitted_models_hold_no_threads_nor_scratch_buffers"
    "[numpy-KMeans]",
    "tests/test_numpy_memmap.py::test_memmap_fit_reads_blocks_and_gives_the_in_memory_fit"
    "[array-numpy]",
    "tests/test_readme.py::test_doc_blocks_run_as_pasted[bounds.md]",
    "tests/test_dask_reliability.py::test_zero_row_blocks_persisted_with_weights[graph]",
    "tests/test_dask_reliability.py::test_zero_row_blocks_on_a_cluster[k-means||-actors]",
    "tests/test_cuda_compile.py::test_tensor_core_module_compiles_below_sm80",
    "tests/test_cupy_streaming_cpu.py::test_streamed_fit_is_the_numpy_backends[False-cupy-chunked]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps[random, n_init=3-float64-weighted]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps[callable-float64-unweighted]",
    "tests/test_minibatch.py::test_fit_gives_sklearns_steps"
    "[batch larger than 10 k-float32-unweighted]",
    "tests/test_cli.py::test_plot_redraws_a_saved_result",
    "tests/test_cli.py::test_include_seed_with_a_tiny_cap_reports_its_oom",
    "tests/test_cli.py::test_sweep_one_row_per_value",
    "tests/test_memory.py::test_whole_fit_peak_under_estimate"
    "[2000000-3-500-float64-320MB-False-array]",
    "tests/test_benchmark_tools.py::test_bounds_fit_compares_bounds_with_lloyd_and_sklearn",
    "tests/test_benchmark_tools.py::test_dask_multi_gpu_runs_its_protocol_on_cpu_workers",
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


@pytest.fixture(autouse=True)
def _no_background_compile_outlives_its_test():
    """A fit on the numba backend compiles its kernels on a thread of its own while X is
    validated (`NumbaPlacement.warm_up`); one still running when its test ends would call
    the kernels under the next test's spies and patches, and allocate under its memory
    traces (a k=300 compile once met a k=7 test's spy): wait for it."""
    yield
    for thread in threading.enumerate():
        if thread.name == "kmeans_xp-numba-compile":
            thread.join()


@pytest.fixture(autouse=True)
def _auto_as_in_a_fresh_process(monkeypatch):
    """`auto` takes numba wherever numba's kernels are loaded in the process
    (`selection.numba_loaded`) or the process's numpy fits have done enough work
    (`selection.NUMPY_FIT_WORK`); tests share worker processes, so they see the choice of a
    fresh process whatever ran before them (test_registry tests both cases)."""
    from kmeans_xp.contract import selection
    monkeypatch.setattr(selection, "numba_loaded", lambda: False)
    monkeypatch.setattr(selection, "NUMPY_FIT_WORK", selection.FitWork())
