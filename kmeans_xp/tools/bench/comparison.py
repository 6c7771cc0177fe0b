"""A fair CPU/GPU comparison, as a library: `compare(...)` and `sweep(...)`.

The protocol, the same for every row:
- one data set, generated once on the host;
- ONE set of initial centers, computed once and handed to every backend (`init=array`), so
  every row does the same work from the same start;
- a fixed iteration budget (tol=0, max_iter=iters; the driver still stops early only when no
  label changes, and the row says how many iterations ran), or with `Workload.tol` > 0 fits
  to convergence, each library by its own rule for that tol (the row says how many ran);
- with `Workload.threads`, every row held to that many threads (`Entry.threads_scope`);
- a warm-up fit per row first: kernel compilation and pool growth are not the fit;
- the device synchronised before every clock read;
- the host-to-device copy timed apart from the fit (`transfer`), and end to end as well;
- the median of `repeats` timed fits, their min and max beside it, and a warning when they
  say the machine was busy (`spread`).
A row that is not installed, runs out of memory, or fails is a row with a status and the
message, never a crash of the whole comparison. Label agreement is computed against the numpy
backend's labels from the same init; speed-ups over the fastest CPU row (`summary`) and over
numpy. `selection` says which rows run by default and which it leaves out.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kmeans_xp.tools.bench.machine import machine_info
from kmeans_xp.tools.bench.progress import progress_for
from kmeans_xp.tools.bench.protocol import measure
from kmeans_xp.tools.bench.report import SCHEMA, row_dict
from kmeans_xp.tools.bench.selection import make_entries, select
from kmeans_xp.tools.bench.summary import add_speedups
from kmeans_xp.tools.bench.workload import Workload, fingerprint, make_data, shared_init


def compare(backends="default", workload=None, *, include_seed=False, seed_device="auto",
            include_torch=False, progress=False, X=None, **workload_args):
    """Run the protocol on every row and return a result dict: {"schema", "kind": "compare",
    "inputs", "machine", "baseline", "skipped", "rows": [...]} (README: the comparison JSON).

    backends: a spec string (`selection`: "default", "all", names, "default,array-api") or a
    list of row specs; workload: a `Workload` (or its fields as keyword arguments); X: host
    data to use instead of generating it; progress: on stderr, a tqdm bar at a terminal and a
    line per fit elsewhere (`progress`)."""
    w = workload or Workload(**workload_args)
    X = make_data(w) if X is None else np.ascontiguousarray(X, dtype=w.dtype)
    if X.ndim != 2 or len(X) < w.k:
        raise ValueError(f"k={w.k} clusters need (n_samples, n_features) data with at least "
                         f"k points; got shape {X.shape}")
    w.n, w.d = X.shape
    C = shared_init(X, w)
    chosen = select(backends) if backends is None or isinstance(backends, str) else \
        select(",".join(backends))
    entries = _numpy_first(make_entries(chosen.specs, w, include_seed=include_seed,
                                        seed_device=seed_device, include_torch=include_torch))
    bar = progress_for(sum(1 + w.repeats_for(e.device) for e in entries), progress)
    try:
        rows = [row_dict(r) for r in _measure_all(entries, X, C, w, bar)]
    finally:
        if bar is not None:
            bar.close()
    baseline = add_speedups(rows)
    return {"schema": SCHEMA, "kind": "compare", "inputs": _inputs(w, C),
            "machine": machine_info(), "baseline": baseline,
            "skipped": [s for s in chosen.skipped if s["name"] not in
                        {e.name for e in entries}], "rows": rows}


def _numpy_first(entries):
    # the numpy row is the agreement reference: run it first so its labels are at hand
    return sorted(entries, key=lambda e: getattr(e, "name", "") != "numpy")


def _measure_all(entries, X, C, w, bar):
    rows, ref = [], None
    for entry in entries:
        row = measure(entry, X, C, w, bar)
        if entry.name == "numpy" and row.ok:
            ref = row.labels
        rows.append(row)
    if any(r.ok for r in rows) and ref is None and w.agreement:
        ref = _reference_labels(X, C, w)
    for row in rows:
        labels = getattr(row, "labels", None)
        if row.ok and ref is not None and labels is not None:
            row.agreement = float(np.mean(labels == ref))
        row.__dict__.pop("labels", None)  # n labels per row: do not keep them all
    return rows


def _reference_labels(X, C, w):
    """numpy backend labels from the same init, untimed, when no numpy row ran."""
    from kmeans_xp.estimators.kmeans import KMeans
    try:
        km = KMeans(w.k, init=C, n_init=1, max_iter=w.iters, tol=w.tol, backend="numpy",
                    max_memory=w.max_memory).fit(X)
    except Exception:  # no reference: agreement stays None, and the rows say nothing false
        return None
    return np.asarray(km.labels_)


def _inputs(w, C):
    d = dataclasses.asdict(w)
    d["max_memory"] = str(w.max_memory)
    d["init_sha256_16"] = fingerprint(C)
    d["protocol"] = ("same data; one shared init; max_iter=iters with tol (0: a fixed "
                     "budget); threads held to `threads` (None: all cores); one warm-up fit "
                     "per row; device synchronised before each clock read; host->device copy "
                     "timed apart; median of repeats; time_per_iter = Lloyd time / iterations "
                     "(includes the final labelling pass and inertia, amortised)")
    return d


def sweep(vary, values, backends="default", workload=None, *, include_seed=False,
          seed_device="auto", include_torch=False, progress=False, **workload_args):
    """The compare protocol for each value of `vary` ("n" or "k"): {"kind": "sweep", "vary",
    "values", "inputs", "machine", "rows": [... each with "value"], "runs": [compare results]}."""
    if vary not in ("n", "k", "d"):
        raise ValueError(f"--vary must be n, k or d, got {vary!r}")
    base = workload or Workload(**workload_args)
    runs, rows = [], []
    for value in values:
        w = dataclasses.replace(base, **{vary: int(value)})
        res = compare(backends, w, include_seed=include_seed, seed_device=seed_device,
                      include_torch=include_torch, progress=progress)
        for row in res["rows"]:
            rows.append({"value": int(value), **row})
        runs.append(res)
    # each value has its own baseline (the fastest CPU row there): no single one at the top
    return {"schema": SCHEMA, "kind": "sweep", "vary": vary, "values": [int(v) for v in values],
            "inputs": _swept(runs[0]["inputs"], vary, values) if runs else {},
            "machine": machine_info(), "skipped": runs[0]["skipped"] if runs else [],
            "baselines": {str(int(v)): r["baseline"] for v, r in zip(values, runs)},
            "rows": rows,
            "runs": [{"inputs": r["inputs"], "baseline": r["baseline"]} for r in runs]}


def _swept(inputs, vary, values):
    """A sweep's inputs: the varied size is the list of its values, not the first one."""
    return {**inputs, vary: [int(v) for v in values]}
