"""The numpy backend against scikit-learn's KMeans(algorithm="lloyd"), same work on both.

Same data, same initial centers, n_init=1, a fixed number of iterations (tol=0, max_iter=5),
float32, d=3, k=200, on the same machine and threads. Small by default (n=200_000); the seed's
n=2M behind ``--big``:

    pytest benchmarks/test_bench_numpy.py --big \\
        --benchmark-json benchmarks/results/numpy_vs_sklearn_cpu.json

Each case first checks that both fits give the same partition (exactly, on small asymmetric
data; label agreement > 0.999 on the benchmark data, where float32 near-ties may break either
way), then times its own fit with ``benchmark.pedantic`` while the other library's fit runs in
the untimed ``setup`` before every round, so the two are measured interleaved, in the same
process, under the same machine load. ``extra_info`` holds the time per iteration (median) of
both, their ratio, the numpy backend's working memory (estimate and measured peak) against
``max_memory``, process CPU time per iteration (less sensitive to other load on the machine),
and the machine. Runs (each fit once) under ``--benchmark-disable`` too.
"""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
import tracemalloc

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.tools.data import seed_data
from kmeans_xp.contract.memory import host_available_memory, resolve_budget
from kmeans_xp.testing import asymmetric_data

sklearn_cluster = pytest.importorskip("sklearn.cluster")

N_SMALL, N_BIG = 200_000, 2_000_000
K, D, MAX_ITER = 200, 3, 5
DTYPE = np.float32
MAX_MEMORY = "auto"
ROUNDS_SMALL, ROUNDS_BIG = 7, 7


# -- the two fits ------------------------------------------------------------------------------
def fit_numpy(X, init):
    return KMeans(K, init=init, n_init=1, max_iter=MAX_ITER, tol=0, backend="numpy",
                  max_memory=MAX_MEMORY).fit(X)


def fit_sklearn(X, init):
    return sklearn_cluster.KMeans(K, init=init, n_init=1, max_iter=MAX_ITER, tol=0,
                                  algorithm="lloyd").fit(X)


FITS = {"numpy": fit_numpy, "sklearn": fit_sklearn}


# -- machine ----------------------------------------------------------------------------------
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_details():
    """SIMD flags and cache sizes, since a VM's model name may say little ("AMD EPYC")."""
    out = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    out["simd"] = sorted(f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f",
                                                     "avx512bw", "avx512vl") if f in flags)
                    break
    except OSError:
        pass
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            with open(f"{base}/{idx}/level") as f1, open(f"{base}/{idx}/type") as f2, \
                    open(f"{base}/{idx}/size") as f3:
                out[f"L{f1.read().strip()}_{f2.read().strip().lower()}"] = f3.read().strip()
    except OSError:
        pass
    return out


def machine():
    import sklearn
    info = {"cpu_model": cpu_model(), **cpu_details(), "cpu_count": os.cpu_count(),
            "numpy": np.__version__, "sklearn": sklearn.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        info["cores_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        info["cores_usable"] = os.cpu_count()
    try:
        from threadpoolctl import threadpool_info
        info["threadpools"] = [
            {k: lib.get(k) for k in ("user_api", "internal_api", "version", "num_threads",
                                     "threading_layer", "architecture", "filepath")}
            for lib in threadpool_info()]
    except ImportError:
        info["threadpools"] = "threadpoolctl not installed"
    return info


def loadavg():
    try:
        return os.getloadavg()
    except OSError:
        return None


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workload(big):
    n = N_BIG if big else N_SMALL
    X = seed_data(n, D, dtype=DTYPE)
    init = X[np.random.default_rng(0).choice(n, K, replace=False)].copy()
    return X, init


@pytest.fixture(scope="module")
def checked(workload):
    """Both fits agree before anything is timed."""
    # exact on small asymmetric data (no float32 near-ties to break differently)
    Xs = asymmetric_data(4001, D, 12, dtype=DTYPE, seed=3)
    init_s = Xs[np.random.default_rng(1).choice(len(Xs), 24, replace=False)]
    ours = KMeans(24, init=init_s, n_init=1, max_iter=100, backend="numpy").fit(Xs)
    ref = sklearn_cluster.KMeans(24, init=init_s, n_init=1, max_iter=100,
                                 algorithm="lloyd").fit(Xs)
    assert np.array_equal(ours.labels_, ref.labels_), "partition differs from sklearn's"
    assert ours.n_iter_ == ref.n_iter_

    X, init = workload
    a, b = fit_numpy(X, init), fit_sklearn(X, init)
    agreement = float(np.mean(a.labels_ == b.labels_))
    assert agreement > 0.999, f"labels agree on only {agreement:.5f} of points"
    assert a.n_iter_ == b.n_iter_ == MAX_ITER
    rel_inertia = abs(a.inertia_ - b.inertia_) / b.inertia_
    assert rel_inertia < 1e-3, f"inertia differs by {rel_inertia:.2e}"
    return {"label_agreement": agreement, "inertia_numpy": float(a.inertia_),
            "inertia_sklearn": float(b.inertia_), "rel_inertia_diff": rel_inertia,
            "n_iter": int(a.n_iter_)}


@pytest.fixture(scope="module")
def memory(workload):
    """The numpy backend's working memory: the estimate, and one Lloyd iteration's measured
    peak (tracemalloc, fresh backend so its buffers are counted), against max_memory."""
    from kmeans_xp_backends.numpy.backend import NumpyBackend

    from kmeans_xp import estimate_memory

    X, init = workload
    n = X.shape[0]
    est = estimate_memory(n, D, K, dtype=DTYPE, backend="numpy", max_memory=MAX_MEMORY)
    Xc = X - X.mean(axis=0)
    backend = NumpyBackend(max_memory=MAX_MEMORY)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    it = backend.lloyd_iter(Xc, None, init, None, xp=np)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    outputs = it.labels.nbytes + n * Xc.itemsize  # labels, and the distances inside
    budget = resolve_budget(MAX_MEMORY, host_available_memory(), cap=1 << 30)
    working_est = sum(v for p, v in est.parts.items()
                      if not p.startswith("driver_") and p != "min_sq_dist")
    assert peak <= est.total, f"measured {peak} B > estimate {est.total} B"
    assert working_est <= budget
    return {"max_memory": MAX_MEMORY, "max_memory_bytes": budget,
            "working_memory_estimate_bytes": working_est,
            "working_memory_measured_bytes": peak - outputs,
            "outputs_bytes": outputs, "estimate_parts": dict(est.parts),
            "chunk_rows": est.chunk_rows, "threads": backend.threads}


# -- the benchmark ----------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["numpy", "sklearn"])
def test_numpy_vs_sklearn(benchmark, big, workload, checked, memory, impl):
    X, init = workload
    load_at_start = loadavg()
    other = "sklearn" if impl == "numpy" else "numpy"
    times = {impl: [], other: []}
    cpu = {impl: [], other: []}

    def timed(name):
        c0, t0 = time.process_time(), time.perf_counter()
        model = FITS[name](X, init)
        times[name].append((time.perf_counter() - t0) / model.n_iter_)
        cpu[name].append((time.process_time() - c0) / model.n_iter_)
        return model

    def setup():  # untimed by pytest-benchmark: the other library, interleaved
        timed(other)

    disabled = benchmark.disabled
    rounds = 1 if disabled else (ROUNDS_BIG if big else ROUNDS_SMALL)
    benchmark.group = f"kmeans lloyd n={X.shape[0]} d={D} k={K} float32"
    benchmark.pedantic(lambda: timed(impl), setup=setup, rounds=rounds,
                       warmup_rounds=0 if disabled else 1, iterations=1)

    # warmup rounds are recorded too: drop them so both lists hold the timed rounds only
    own, partner = times[impl][-rounds:], times[other][-rounds:]
    med_own, med_other = statistics.median(own), statistics.median(partner)
    ours = med_own if impl == "numpy" else med_other
    theirs = med_other if impl == "numpy" else med_own
    cpu_own = statistics.median(cpu[impl][-rounds:])
    cpu_other = statistics.median(cpu[other][-rounds:])
    info = machine()
    info["loadavg_at_start"], info["loadavg_at_end"] = load_at_start, loadavg()
    benchmark.extra_info.update({
        "impl": impl, "n_samples": int(X.shape[0]), "n_features": D, "n_clusters": K,
        "dtype": "float32", "max_iter": MAX_ITER, "tol": 0, "n_init": 1, "rounds": rounds,
        "time_per_iter_s": med_own, "time_per_iter_s_all": own,
        f"{other}_interleaved_time_per_iter_s": med_other,
        f"{other}_interleaved_time_per_iter_s_all": partner,
        "ratio_numpy_over_sklearn": ours / theirs,
        # process CPU seconds (all threads) per iteration: less sensitive to other load
        "cpu_per_iter_s": cpu_own, f"{other}_interleaved_cpu_per_iter_s": cpu_other,
        "check": checked, "memory": memory, "machine": info,
    })
