"""Shared test setup: GPU tests (marker `gpu`) skip where CuPy or a CUDA device is missing."""
import functools

import pytest


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
