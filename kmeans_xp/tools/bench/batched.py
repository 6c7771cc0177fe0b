"""Batched workloads: B problems fitted at once (docs/batches.md), timed as `compare` times
one problem: host data and ONE shared init per problem, tol=0 and a fixed iteration count, a
warm-up fit, the device synchronised before every clock read, the median of `repeats`.

Two rows per kmeans_xp backend: the batched fit, and a Python loop of B single fits from the
same centers (what a user without batches writes): their ratio is what batching buys. ms per
iteration is the Lloyd time (init excluded, the final labelling included) over the most
iterations any problem ran.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from kmeans_xp.contract.namespaces import to_numpy
from kmeans_xp.tools.bench.protocol import is_out_of_memory, release_device_memory, sync_namespace
from kmeans_xp.tools.bench.workload import Workload

#: the named batched workloads of issue 35 (float32)
BATCH_WORKLOADS = {"F2": dict(batch=32, n=65_536, d=128, k=1024)}
#: F2's shape scaled to seconds on a CPU (tests, CPU machines)
SMALL_BATCH_WORKLOADS = {"F2s": dict(batch=8, n=4_099, d=32, k=64)}


@dataclasses.dataclass
class BatchWorkload(Workload):
    """B problems of (n, d) with k clusters each, timed over `iters` iterations: a
    `Workload` (its dtype, seed, repeats, max_memory) with a batch size."""
    batch: int = 8
    n: int = 4_099
    d: int = 32
    k: int = 64


def batch_data(w: BatchWorkload) -> tuple[np.ndarray, np.ndarray]:
    """(X (B, n, d), the shared initial centers (B, k, d)): blobs per problem, and k
    distinct rows of each, drawn from the workload's seed."""
    from kmeans_xp.tools.data import blobs
    dtype = np.dtype(w.dtype)
    X = np.stack([blobs(w.n, w.d, w.k, dtype=dtype, random_state=w.seed + b)
                  for b in range(w.batch)])
    rng = np.random.default_rng(w.seed)
    C = np.stack([X[b, np.sort(rng.choice(w.n, w.k, replace=False))]
                  for b in range(w.batch)])
    return X, C


def compare_batched(backends, w: BatchWorkload, *, loop=True) -> dict:
    """{"inputs": the workload, "rows": one dict per row (`row_line`'s fields)}."""
    X, C = batch_data(w)
    rows, labels = [], {}
    for name in backends:
        for batched in ((True, False) if loop else (True,)):
            row, lab = _measure(name, X, C, w, batched)
            rows.append(row)
            if lab is not None:
                labels[row["name"]] = lab
            release_device_memory()
    first = next(iter(labels.values()), None)
    for row in rows:
        if row["name"] in labels:
            row["agreement"] = float(np.mean(labels[row["name"]] == first))
    for row in rows:   # the loop's time over the batched fit's, per backend
        if row["name"].endswith(" batched") and row["status"] == "ok":
            other = next((r for r in rows if r["name"] == row["backend"] + " loop"), None)
            if other and other["status"] == "ok":
                row["speedup"] = other["time_per_iter_s"] / row["time_per_iter_s"]
    return {"inputs": dataclasses.asdict(w), "rows": rows}


def _measure(name, X, C, w, batched):
    from kmeans_xp import list_backends
    info = list_backends().get(_split(name)[0])
    row = {"name": f"{name} {'batched' if batched else 'loop'}", "backend": name,
           "status": "ok", "message": "", "device": "gpu" if info and info.gpu else "cpu",
           "agreement": None, "speedup": None}
    try:
        sync, Xd, transfer_s = _on_device(row["device"], X)
        fit = _batched_fit if batched else _loop_fit
        fit(name, Xd, C, w, max_iter=min(2, w.iters))     # warm-up: compile, pool
        runs = []
        for _ in range(w.repeats):
            sync()
            t0 = time.perf_counter()
            lloyd_s, n_iter, inertia, labels = fit(name, Xd, C, w, max_iter=w.iters)
            sync()
            runs.append((time.perf_counter() - t0, lloyd_s / max(n_iter, 1)))
    except Exception as exc:  # noqa: BLE001 - a row that cannot run says why
        row.update(status="oom" if is_out_of_memory(exc) else "error",
                   message=f"{type(exc).__name__}: {exc}")
        return row, None
    fit_s = statistics.median(r[0] for r in runs)
    row.update(time_per_iter_s=statistics.median(r[1] for r in runs),
               times_per_iter_s=[r[1] for r in runs], fit_s=fit_s,
               end_to_end_s=fit_s + transfer_s, n_iter=n_iter, inertia=inertia)
    return row, labels


def _on_device(device, X):
    """(synchronise, X where the row computes, the copy's seconds)."""
    if device != "gpu":
        return (lambda: None), X, 0.0
    import cupy
    t0 = time.perf_counter()
    Xd = cupy.asarray(X)
    sync_namespace("cupy")
    return (lambda: sync_namespace("cupy")), Xd, time.perf_counter() - t0


def _split(spec):
    """"name" or "name[precision=fp16,option=value]" -> (name, the rows' precision (KMeans'
    own option), the backend's options)."""
    from kmeans_xp.tools.bench.entries import split_options
    name, options = split_options(spec)
    precision = str(options.pop("precision", "exact"))
    return name, precision, options


def _batched_fit(spec, X, C, w, *, max_iter):
    from kmeans_xp import KMeans
    name, precision, options = _split(spec)
    km = KMeans(w.k, init=C, n_init=1, max_iter=max_iter, tol=0, backend=name,
                max_memory=w.max_memory, precision=precision,
                backend_options=options or None).fit(X)
    labels = np.stack([to_numpy(km.labels_[b]) for b in range(len(C))])
    return km.timings_["lloyd"], int(km.n_iter_.max()), float(km.inertia_.sum()), labels


def _loop_fit(spec, X, C, w, *, max_iter):
    from kmeans_xp import KMeans
    name, precision, options = _split(spec)
    fits = [KMeans(w.k, init=C[b], n_init=1, max_iter=max_iter, tol=0, backend=name,
                   max_memory=w.max_memory, precision=precision,
                   backend_options=options or None).fit(X[b])
            for b in range(len(C))]
    labels = np.stack([to_numpy(f.labels_) for f in fits])
    return (sum(f.timings_["lloyd"] for f in fits), max(f.n_iter_ for f in fits),
            float(sum(f.inertia_ for f in fits)), labels)
