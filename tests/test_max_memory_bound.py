"""max_memory bounds everything a fit allocates beyond X (issue 37): the driver's arrays
(centered copy, labels, init's O(n) arrays and chunks) as well as the backend's buffers, on
every backend; `estimate_memory` shows each part, their sum stays within the bound, and a
fit that cannot fit is refused before any work with what it needs and what to change."""
import importlib.util
import tracemalloc

import numpy as np
import pytest

from kmeans_xp import KMeans, KMeansMemoryError, estimate_memory
from kmeans_xp.contract.memory import format_bytes
from kmeans_xp.testing import asymmetric_data

CPU_BACKENDS = ["numpy"] + (["numba"] if importlib.util.find_spec("numba") else [])
EVERY_BACKEND = CPU_BACKENDS + ["array-api", "cupy-fused", "cupy-kernels", "cupy-chunked"]


def least_max_memory(n, d, k, backend, dtype="float32", **kw):
    """The least max_memory estimate_memory accepts for this fit (from its refusal)."""
    with pytest.raises(KMeansMemoryError) as info:
        estimate_memory(n, d, k, backend=backend, dtype=dtype, max_memory=64, **kw)
    return info.value.needed


def test_the_issues_plan_fits_in_its_bound():
    """cupy-chunked at n=20M, d=3, k=1000 under 1 GiB planned 2.20 GiB: the driver's labels
    and init buffer (690 MiB) and the centered copy (229 MiB) were outside the bound."""
    est = estimate_memory(20_000_000, 3, 1000, backend="cupy-chunked", max_memory=2**30)
    assert est.total - est.parts["data"] <= 2**30, est
    for part in ("driver_centered_copy", "driver_labels_or_init", "chunk_buffers", "data"):
        assert est.parts[part] > 0, part
    assert est.parts["data"] == 20_000_000 * 3 * 4    # X itself: shown, not bounded


@pytest.mark.parametrize("backend", EVERY_BACKEND)
@pytest.mark.parametrize("n,d,k,dtype", [(100_003, 3, 50, "float32"),
                                         (2_000_003, 3, 1000, "float32"),
                                         (300_007, 20, 200, "float64")])
def test_every_part_beyond_x_is_within_max_memory(backend, n, d, k, dtype):
    """At the least max_memory the fit is planned in, and at twice it, the parts beyond X
    sum to at most max_memory; one byte less is refused, saying what it needs."""
    least = least_max_memory(n, d, k, backend, dtype)
    for bound in (least, 2 * least):
        est = estimate_memory(n, d, k, backend=backend, dtype=dtype, max_memory=bound)
        assert est.total - est.parts.get("data", 0) <= bound, est
        assert "driver_centered_copy" in est.parts and "driver_labels_or_init" in est.parts
    with pytest.raises(KMeansMemoryError) as info:
        estimate_memory(n, d, k, backend=backend, dtype=dtype, max_memory=least - 1)
    msg = str(info.value)
    assert format_bytes(least - 1) in msg and format_bytes(least) in msg   # asked, needed
    assert "centered copy" in msg and "Raise max_memory" in msg and "copy_x=False" in msg


def test_copy_x_false_needs_no_centered_copy():
    with_copy = least_max_memory(500_000, 3, 100, "numpy")
    without = least_max_memory(500_000, 3, 100, "numpy", copy_x=False)
    assert with_copy - without == 500_000 * 3 * 4


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("n", [60_001, 200_003, 600_011])
def test_whole_fit_peak_is_within_max_memory_on_the_host(backend, n):
    """A whole fit (checks, centering, k-means++, Lloyd, final pass, labels_) under a
    max_memory a quarter above the least it can be planned in: the traced host peak beyond
    X stays within max_memory (before, the driver's arrays came on top of it)."""
    X = asymmetric_data(n, 3, 40, dtype=np.float32, seed=3)
    bound = int(least_max_memory(n, 3, 40, backend) * 1.25)
    km = KMeans(40, n_init=1, max_iter=4, tol=0, random_state=0, backend=backend,
                max_memory=bound)
    km.fit(X[:3000])   # imports, kernels, thread pools: there before the measured fit
    tracemalloc.start()
    try:
        km.fit(X)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= bound, f"measured {format_bytes(peak)} > max_memory {format_bytes(bound)}"


def test_a_fit_that_cannot_fit_is_refused_before_any_work(monkeypatch):
    import kmeans_xp.algorithms.init as init_mod

    def boom(*a, **k):
        raise AssertionError("k-means++ ran before the memory check")

    monkeypatch.setattr(init_mod, "kmeans_plusplus", boom)
    X = asymmetric_data(200_003, 3, 20, dtype=np.float32, seed=1)
    least = least_max_memory(200_003, 3, 20, "numpy")
    with pytest.raises(KMeansMemoryError, match="Raise max_memory to at least"):
        KMeans(20, max_memory=least - 1, backend="numpy").fit(X)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cupy-kernels", "cupy-chunked", "cupy-fused"])
@pytest.mark.parametrize("n,k", [(1_000_003, 100), (4_000_037, 500), (10_000_019, 1000)])
def test_gpu_pool_peak_is_within_max_memory(cp, backend, n, k):
    """The CuPy pool's peak used bytes during a fit of a device X, less X itself, stay
    within max_memory (a third above the least it is planned in) and within estimate_memory's
    total beyond X."""
    class PoolPeak(cp.cuda.memory_hook.MemoryHook):
        """The pool's peak used bytes over the whole fit. Its own name: CuPy refuses a second
        active hook of a name, and the fit's stages install the library's "kmeans_xp_peak"
        (`peak_hook_class`) inside this one."""
        name = "kmeans_xp_test_pool_peak"

        def __init__(self):
            self.peak = 0

        def malloc_postprocess(self, **kwargs):
            self.peak = max(self.peak, cp.get_default_memory_pool().used_bytes())

    X = cp.asarray(asymmetric_data(n, 3, 40, dtype=np.float32, seed=4))
    bound = int(least_max_memory(n, 3, k, backend) * 1.33)
    est = estimate_memory(n, 3, k, backend=backend, max_memory=bound)
    km = KMeans(k, n_init=1, max_iter=5, tol=0, random_state=0, backend=backend,
                max_memory=bound)
    km.fit(X[:20_000])   # kernels compiled
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()   # X and what the test holds
    hook = PoolPeak()
    with hook:
        km.fit(X)
        cp.cuda.get_current_stream().synchronize()
    peak = max(hook.peak, pool.used_bytes()) - base
    assert peak <= bound, f"pool peak {format_bytes(peak)} > max_memory {format_bytes(bound)}"
    assert peak <= est.total - est.parts["data"], (format_bytes(peak), est)
