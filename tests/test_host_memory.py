"""Host memory on every platform: psutil where installed, /proc/meminfo or sysconf else, and
a plain "unknown" (never an invented size) where nothing answers; the planner and the bench
say so instead of guessing."""
import sys
import warnings

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.contract import host_memory as hm
from kmeans_xp.contract import memory
from kmeans_xp.tools.bench import machine_info

UNKNOWN = hm.HostMemory(None, None, hm.UNKNOWN)


@pytest.fixture
def nothing_answers(monkeypatch):
    """A platform with no psutil, no /proc/meminfo and no sysconf names (Windows or macOS
    without psutil)."""
    for probe in ("_psutil", "_proc_meminfo", "_sysconf"):
        monkeypatch.setattr(hm, probe, lambda: None)


def test_psutil_answers_when_installed():
    psutil = pytest.importorskip("psutil")
    found = hm.host_memory()
    assert found.source == "psutil" and found.known
    assert 0 < found.available <= found.total == psutil.virtual_memory().total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/meminfo: Linux")
def test_without_psutil_linux_reads_proc_meminfo(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    found = hm.host_memory()
    assert found.source == "/proc/meminfo"
    assert 0 < found.available <= found.total


def test_unknown_is_none_and_says_what_to_install(nothing_answers):
    found = hm.host_memory()
    assert found == UNKNOWN and not found.known
    assert "pip install psutil" in found.source
    assert memory.host_available_memory() is None          # no invented 4 GiB
    assert memory.host_available_memory(default=123) == 123


def test_auto_budget_with_unknown_free_memory_takes_the_cap_and_says_so(nothing_answers):
    with pytest.warns(RuntimeWarning, match="unknown.*pip install psutil"):
        assert memory.resolve_budget("auto", None, cap=1 << 30) == 1 << 30
    with pytest.raises(memory.KMeansMemoryError, match="give max_memory"):
        memory.resolve_budget("auto", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # a given bound needs no guess
        assert memory.resolve_budget("64MB", None) == 64 * 10**6


def test_a_fit_still_runs_where_host_memory_is_unknown(nothing_answers):
    X = np.random.default_rng(0).normal(size=(3001, 3)).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="free host memory is unknown"):
        km = KMeans(4, n_init=1, random_state=0, backend="numpy").fit(X)
    ref = KMeans(4, n_init=1, random_state=0, backend="numpy", max_memory="1GiB").fit(X)
    np.testing.assert_array_equal(km.labels_, ref.labels_)


def test_machine_info_reports_host_memory_and_its_source(monkeypatch):
    info = machine_info()
    found = hm.host_memory()
    assert info["host_memory_source"] == found.source
    assert info["host_memory_bytes"] == found.total
    monkeypatch.setattr("kmeans_xp.tools.bench.machine.host_memory", lambda: UNKNOWN)
    info = machine_info()
    assert info["host_memory_bytes"] is None and info["host_memory_available_bytes"] is None
    assert "unknown" in info["host_memory_source"]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_fit_reads_the_host_memory_a_fixed_number_of_times(backend, monkeypatch):
    """The CPU backends plan a pass once per shape and fit (psutil's read costs 0.07-0.15
    ms): the reads do not grow with the iterations, and the next
    fit reads again (it plans with the free memory of its time)."""
    if backend == "numba":
        pytest.importorskip("numba")
    calls = []
    real = memory.host_memory
    monkeypatch.setattr(memory, "host_memory", lambda: calls.append(1) or real())
    X = np.random.default_rng(0).normal(size=(20_000, 3)).astype(np.float32)
    counts = []
    for iters in (3, 20):
        calls.clear()
        KMeans(8, n_init=1, max_iter=iters, tol=0, random_state=0, backend=backend).fit(X)
        counts.append(len(calls))
    assert 0 < counts[0] == counts[1]
