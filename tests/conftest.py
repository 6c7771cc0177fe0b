"""Shared test setup: GPU tests (marker `gpu`) skip where CuPy or a CUDA device is missing;
slow tests (marker `slow`) run only when asked for."""
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


def pytest_collection_modifyitems(config, items):
    # slow tests (marker `slow`: minutes, gigabytes) run when asked for by -m or
    # KMEANS_XP_SLOW=1, not in the plain `pytest` of CI
    if "slow" not in (config.getoption("markexpr", "") or "") and \
            not os.environ.get("KMEANS_XP_SLOW"):
        skip_slow = pytest.mark.skip(reason="slow: run with -m slow or KMEANS_XP_SLOW=1")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
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
