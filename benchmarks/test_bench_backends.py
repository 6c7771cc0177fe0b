"""pytest-benchmark suites on `kmeans_xp.tools.bench`'s protocol, one case per (workload, row).

Every case uses the workload's data and its ONE shared init, a fixed iteration count (tol=0),
and checks the fit against the numpy backend (label agreement and inertia) before anything is
timed; that check is also the warm-up (compilation, pool growth). Timed rounds then measure
the fit alone: the host->device copy happens in pedantic's untimed `setup`, which ends with the
device synchronised, and the fit ends with a synchronise, so the benchmark's clock reads
finished work.

    pytest benchmarks --benchmark-disable              # CI: correctness of every case, once
    pytest benchmarks --benchmark-json=out.json        # small workloads, timed
    pytest benchmarks --big -m gpu --benchmark-json=out.json   # W1/W2/W3/W5 on the GPU rows
                                                        # (numpy reference fits run untimed)
    pytest-benchmark compare out.json other.json
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from kmeans_xp.tools import bench
from kmeans_xp.contract.registry import list_backends

#: small by default (seconds in all); the seed's workloads (issues 3-5) behind --big
SMALL = {
    "small-d3": dict(n=20_000, d=3, k=16, iters=5),
    "small-d32": dict(n=4_000, d=32, k=64, iters=5),
}
BIG = {name: dict(size, iters=10) for name, size in bench.WORKLOADS.items()}
#: labels may differ on near-ties between float32 summation orders, and after a few Lloyd
#: iterations such a difference moves a few more points; a wrong kernel agrees far less
MIN_AGREEMENT = {"small": 0.99, "big": 0.95}
INERTIA_RTOL = 1e-3
#: CPU rows timed at the seed's sizes too: the fair baselines of a GPU row
CPU_AT_BIG = ("numpy", bench.SKLEARN_ROW, bench.FAISS_ROW)


def _row_params():
    params = []
    infos = list_backends()
    for name, info in infos.items():
        if name.endswith("-sparse"):   # sparse X only: benchmarks/sparse_tfidf.py
            continue
        params.append(pytest.param(name, id=name, marks=[pytest.mark.gpu] if info.gpu else []))
    params.append(pytest.param("array-api@cupy", id="array-api@cupy", marks=[pytest.mark.gpu]))
    params.append(pytest.param(bench.SEED_ROW, id=bench.SEED_ROW))
    params += [pytest.param(ref, id=ref) for ref in bench.REFERENCES]  # sklearn, faiss, torch
    return params


def _workload_params():
    return ([pytest.param(name, id=name) for name in SMALL]
            + [pytest.param(name, id=name) for name in BIG])


def _entry(spec, w):
    if spec == bench.SEED_ROW:
        return bench.SeedEntry("gpu" if bench.cupy_gpu() else "cpu", w)
    if spec in bench.REFERENCES:
        return bench.REFERENCES[spec][0](w)
    return bench.BackendEntry(spec, w)


@functools.lru_cache(maxsize=2)
def _problem(name):
    """(workload, host X, shared init) generated once per workload."""
    size = {**SMALL, **BIG}[name]
    w = bench.Workload(**size, repeats=3, warmup_iters=2)
    X = bench.make_data(w)
    return w, X, bench.shared_init(X, w)


@functools.lru_cache(maxsize=2)
def _reference(name):
    """The numpy backend's labels and inertia from the shared init (untimed)."""
    w, X, C = _problem(name)
    entry = bench.BackendEntry("numpy", w)
    entry.check()
    m = entry.run(X, C, w.iters)
    return m.labels, m.inertia


@pytest.fixture
def release_memory():
    yield
    bench.release_device_memory()


@pytest.mark.parametrize("row", _row_params())
@pytest.mark.parametrize("workload", _workload_params())
def test_fit(benchmark, workload, row, big, release_memory):
    if workload in BIG and not big:
        pytest.skip("the seed's workloads run with --big")
    w, X, C = _problem(workload)
    entry = _entry(row, w)
    try:
        entry.check()
    except bench.Unavailable as exc:
        pytest.skip(f"{row}: {exc}")
    if workload in BIG and entry.device == "cpu" and row not in CPU_AT_BIG:
        # minutes per fit, five fits per case: `kmeans-xp compare` times such rows once
        pytest.skip(f"{row} on the CPU at {workload}: use kmeans-xp compare --cpu-repeats 1")
    m, agreement = _checked_run(entry, X, C, w, workload)
    benchmark.group = f"{workload} n={w.n} d={w.d} k={w.k} iters={w.iters}"
    benchmark.extra_info.update(
        row=entry.name, device=entry.device, n=w.n, d=w.d, k=w.k, dtype=w.dtype,
        n_iter=m.n_iter, pairs_per_fit=w.pairs(m.n_iter), inertia=m.inertia,
        agreement=agreement, peak_memory_bytes=m.peak_bytes,
        estimate_bytes=entry.estimate(), init_sha256_16=bench.fingerprint(C))

    def setup():
        Xb = entry.to_input(X)  # the copy is not the fit: done here, untimed
        entry.sync()
        return (Xb, C, w.iters), {}

    def fit(Xb, C, iters):
        fitted = entry.fit(Xb, C, iters)
        entry.sync()
        return fitted

    benchmark.pedantic(fit, setup=setup, rounds=w.repeats, warmup_rounds=1, iterations=1)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and m.n_iter:
        benchmark.extra_info["median_s_per_iter"] = stats.stats.median / m.n_iter


def _checked_run(entry, X, C, w, workload):
    """One full run (the warm-up), checked against the numpy backend before any timing."""
    try:
        m = entry.run(X, C, w.iters)
    except Exception as exc:
        if bench.is_out_of_memory(exc):  # the seed at the seed's sizes: its result is the OOM
            pytest.skip(f"{entry.name}: out of memory: {exc}")
        raise
    ref_labels, ref_inertia = _reference(workload)
    agreement = float(np.mean(m.labels == ref_labels))
    floor = MIN_AGREEMENT["big" if workload in BIG else "small"]
    assert agreement >= floor, f"{entry.name}: only {agreement:.4%} of labels match numpy"
    assert abs(m.inertia - ref_inertia) <= INERTIA_RTOL * ref_inertia, \
        f"{entry.name}: inertia {m.inertia:.6g} vs numpy {ref_inertia:.6g}"
    return m, agreement
