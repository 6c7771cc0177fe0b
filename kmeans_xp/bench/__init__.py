"""A fair CPU/GPU comparison, as a library: `compare(...)` and `sweep(...)`.

The protocol, the same for every row:
- one data set, generated once on the host;
- ONE set of initial centers, computed once and handed to every backend (`init=array`), so
  every row does the same work from the same start;
- a fixed iteration budget (tol=0, max_iter=iters; the driver still stops early only when no
  label changes, and the row says how many iterations ran);
- a warm-up fit per row first: kernel compilation and pool growth are not the fit;
- the device synchronised before every clock read;
- the host-to-device copy timed apart from the fit (`transfer`), and end to end as well;
- the median of `repeats` timed fits.
A row that is not installed, runs out of memory, or fails is a row with a status and the
message, never a crash of the whole comparison.

Rows are "entries": a kmeans_xp backend by name (optionally "name@namespace" to feed it arrays
of another library, e.g. "array-api@cupy"), the seed's original algorithm
(`kmeans_xp.bench.seed`) and a torch chunked-GEMM baseline (`kmeans_xp.bench.torch_rows`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import importlib
import importlib.util
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..namespaces import to_numpy
from ..memory import format_bytes, host_available_memory, parse_memory

SCHEMA = "kmeans_xp.bench/1"
#: the named workloads of issues 3-5 (d=3 unless said; float32)
WORKLOADS = {
    "W1": dict(n=2_000_000, d=3, k=200),
    "W2": dict(n=2_000_000, d=3, k=500),
    "W3": dict(n=20_000_000, d=3, k=1000),
    "W5": dict(n=1_000_000, d=128, k=4096),
}
SEED_ROW = "seed-reference"
TORCH_ROW = "torch-gemm"


class Unavailable(Exception):
    """The entry cannot run here (library or device missing); the row says why."""


# --------------------------------------------------------------------------------------------
# inputs


@dataclasses.dataclass
class Workload:
    """What every row computes: data, k, iterations, dtype and the protocol's knobs."""
    n: int = 200_000
    d: int = 3
    k: int = 100
    iters: int = 10
    dtype: str = "float32"
    data: str = "seed"           # "seed", "blobs", or a path to a .npy file
    init: str = "random"         # "random" (the seed's) or "k-means++", computed once
    seed: int = 0
    repeats: int = 3
    warmup_iters: int = 2
    cpu_repeats: int | None = None   # timed fits for CPU rows (None: `repeats`); slow rows
    max_memory: Any = "auto"

    def repeats_for(self, device):
        return self.cpu_repeats if device == "cpu" and self.cpu_repeats else self.repeats

    def pairs(self, n_iter):
        return self.n * self.k * n_iter


def make_data(w: Workload) -> np.ndarray:
    """The host data of the workload (updates w.n and w.d when read from a file)."""
    from ..data import blobs, seed_data
    dtype = np.dtype(w.dtype)
    if w.data == "seed":
        return seed_data(w.n, w.d, dtype=dtype, random_state=w.seed)
    if w.data == "blobs":
        return blobs(w.n, w.d, max(w.k, 1), dtype=dtype, random_state=w.seed)
    path = Path(w.data)
    if path.suffix != ".npy" or not path.exists():
        raise ValueError(f"--data must be 'seed', 'blobs' or an existing .npy file; got {w.data!r}")
    X = np.load(path, mmap_mode="r")
    if X.ndim != 2:
        raise ValueError(f"{path} holds an array of shape {X.shape}; need (n_samples, n_features)")
    X = np.ascontiguousarray(X[: w.n] if w.n and w.n < len(X) else X, dtype=dtype)
    w.n, w.d = X.shape
    return X


def shared_init(X, w: Workload) -> np.ndarray:
    """The one set of initial centers every row starts from (host, X's dtype)."""
    if w.init == "random":
        idx = np.random.default_rng(w.seed).choice(len(X), w.k, replace=False)
        return np.ascontiguousarray(X[np.sort(idx)])
    if w.init == "k-means++":
        from array_api_compat import array_namespace

        from ..init import kmeans_plusplus
        from ..validation import check_random_state
        xp = array_namespace(X)
        rows = max(256, (64 << 20) // (8 * max(w.k, 1)))
        C, _ = kmeans_plusplus(X, w.k, sample_weight=np.ones(len(X), X.dtype),
                               random_state=check_random_state(w.seed), xp=xp, rows=rows)
        return np.ascontiguousarray(C)
    raise ValueError(f"init must be 'random' or 'k-means++', got {w.init!r}")


def fingerprint(a) -> str:
    """Short hash of an array's bytes: the JSON shows every row started from the same init."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# rows


class Measurement(NamedTuple):
    labels: np.ndarray
    inertia: float
    n_iter: int
    transfer_s: float
    fit_s: float
    lloyd_s: float
    end_to_end_s: float
    peak_bytes: int | None       # measured on the device, None where nothing measures it
    memory_report: dict


@dataclasses.dataclass
class Row:
    name: str
    status: str = "ok"           # ok | unavailable | oom | error
    message: str = ""
    device: str = "cpu"          # cpu | gpu
    device_name: str = ""
    dtype: str = ""
    n_iter: int | None = None
    time_per_iter_s: float | None = None
    pairs_per_s: float | None = None
    fit_s: float | None = None
    end_to_end_s: float | None = None
    transfer_s: float | None = None
    peak_memory_bytes: int | None = None
    memory_source: str = ""      # "measured: ..." or "estimate: ..."
    memory_estimate_bytes: int | None = None   # before running: working memory + X
    memory_report: dict = dataclasses.field(default_factory=dict)
    inertia: float | None = None
    agreement: float | None = None
    speedup: float | None = None           # over the slowest CPU row
    speedup_vs_numpy: float | None = None
    times_per_iter_s: list = dataclasses.field(default_factory=list)  # every timed repeat

    @property
    def ok(self):
        return self.status == "ok"


def _median(values):
    return float(statistics.median(values)) if values else None


def _sync_namespace(ns):
    """Wait for the library's device work (for namespaces whose backend may not sync)."""
    if ns == "cupy" and "cupy" in sys.modules:
        sys.modules["cupy"].cuda.get_current_stream().synchronize()
    elif ns == "torch" and "torch" in sys.modules:
        t = sys.modules["torch"]
        if t.cuda.is_available():
            t.cuda.synchronize()


def _converter(ns):
    """Host -> `ns` array copy, for "backend@ns" entries and backends that do not copy in."""
    if ns == "numpy":
        return lambda X: X
    if ns == "cupy":
        return lambda X: importlib.import_module("cupy").asarray(X)
    if ns == "torch":
        def to_torch(X):
            t = importlib.import_module("torch")
            return t.from_numpy(X).to("cuda" if t.cuda.is_available() else "cpu")
        return to_torch
    if ns == "array_api_strict":
        return lambda X: importlib.import_module("array_api_strict").asarray(X)
    if ns == "dask.array":
        def to_dask(X):
            da = importlib.import_module("dask.array")
            return da.from_array(X, chunks=(max(1, len(X) // (os.cpu_count() or 1)), -1))
        return to_dask
    raise Unavailable(f"no converter from NumPy to {ns!r}")


def _release_device_memory():
    """Drop cached device blocks between rows, so one row's pool is not the next one's."""
    gc.collect()
    if "cupy" in sys.modules:
        try:
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
        except Exception:  # no device: nothing was cached
            pass
    if "torch" in sys.modules:
        t = sys.modules["torch"]
        if t.cuda.is_available():
            t.cuda.empty_cache()


def is_out_of_memory(exc) -> bool:
    """MemoryError (KMeansMemoryError, emulated caps) or a library's OutOfMemoryError."""
    return isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__


class Fitted(NamedTuple):
    """What an entry's fit leaves on its device, before anything comes back to the host."""
    labels: Any
    centers: Any
    inertia: float | None     # None: computed on the host afterwards, untimed
    n_iter: int
    lloyd_s: float
    memory_report: dict


class Entry:
    """One row of the comparison. Subclasses say how data gets in (`to_input`), how the fit
    runs (`fit`), how to wait for the device (`sync`) and what memory they need (`estimate`);
    `run` is the protocol's clocking, the same for all."""

    name = ""
    device = "cpu"
    memory_measured = "measured"

    def check(self):
        """Raise Unavailable when the entry cannot run here; bind what `run` needs."""

    def sync(self):
        """Wait for the device's queued work."""

    def to_input(self, X):
        return X

    def fit(self, Xb, C, iters) -> Fitted:
        raise NotImplementedError

    def estimate(self):
        """Working memory beyond X in bytes, before running (None: no estimate)."""
        return

    def data_bytes(self, w):
        """X as the entry holds it (the seed converts to float64)."""
        return w.n * w.d * np.dtype(w.dtype).itemsize

    def memory_scope(self):
        """Context around one whole run (copy + fit) yielding a dict that gets "peak" bytes."""
        return _null({})

    def run(self, X, C, iters) -> Measurement:
        with self.memory_scope() as measured:
            self.sync()
            t0 = time.perf_counter()
            Xb = self.to_input(X)
            self.sync()
            t1 = time.perf_counter()
            fitted = self.fit(Xb, C, iters)
            self.sync()
            t2 = time.perf_counter()
            labels, centers = to_numpy(fitted.labels), to_numpy(fitted.centers)
            t3 = time.perf_counter()
            fitted = fitted._replace(labels=None, centers=None)  # free the device now
            del Xb
        report = dict(fitted.memory_report)
        if measured.get("peak"):
            report["fit"] = int(measured["peak"])
        inertia = fitted.inertia if fitted.inertia is not None else host_inertia(
            X, centers, labels)
        return Measurement(np.asarray(labels), float(inertia), fitted.n_iter, t1 - t0,
                           t2 - t1, fitted.lloyd_s, t3 - t0,
                           max((v for key, v in report.items() if not key.endswith("_host")),
                               default=None),  # "pinned_host" is host memory
                           report)


class BackendEntry(Entry):
    """A kmeans_xp backend, fitted through `KMeans` (the product path); the copy in is the
    backend's own `to_backend` (or, for "name@ns", a plain copy into that namespace)."""

    memory_measured = "measured: peak of the device pool over the fit's stages (includes X)"

    def __init__(self, spec, w: Workload):
        self.name = spec
        self.backend_name, _, self.namespace = spec.partition("@")
        self.w = w
        from ..registry import list_backends
        info = list_backends().get(self.backend_name)
        self.device = "gpu" if (info is not None and info.gpu) or self.namespace == "cupy" \
            else "cpu"

    def check(self):
        from ..registry import get_backend, list_backends
        info = list_backends().get(self.backend_name)
        if info is None:
            raise Unavailable(f"unknown backend; known: {sorted(list_backends())}")
        if not info.available:
            raise Unavailable(info.reason + (f" ({info.install})" if info.install else ""))
        self.cls = get_backend(self.backend_name)
        self.device = "gpu" if (self.cls.device == "gpu" or self.namespace == "cupy" or (
            self.namespace == "torch" and _torch_cuda())) else "cpu"
        self.backend = self.cls(max_memory=self.w.max_memory)

    def to_input(self, X):
        if self.namespace:
            return _converter(self.namespace)(X)
        if self.backend.reject_reason(X, n_clusters=self.w.k) is None:
            return self.backend.to_backend(X)
        return _converter(sorted(self.cls.namespaces)[0])(X)

    def memory_scope(self):
        # the library's own counters where the backend reports none (array-api on a GPU)
        if self.namespace in ("cupy", "torch"):
            self.memory_measured = (f"measured: peak of the {self.namespace} allocator over "
                                    f"copy and fit (includes X)")
        if self.namespace == "cupy":
            return _CupyPeak()
        if self.namespace == "torch" and self.device == "gpu":
            return _TorchPeak(importlib.import_module("torch"))
        return _null({})

    def sync(self):
        # the backend's own sync, and the namespace's for "name@ns" (array-api's is a no-op)
        self.backend.synchronize()
        _sync_namespace(self.namespace)

    def fit(self, Xb, C, iters) -> Fitted:
        from ..estimator import KMeans
        km = KMeans(self.w.k, init=C, n_init=1, max_iter=iters, tol=0, random_state=0,
                    backend=self.backend_name, max_memory=self.w.max_memory).fit(Xb)
        # the copy-in stage was recorded by our own instance (to_input), the rest by the fit's
        stages = {**self.backend.memory_report, **km.memory_report_}
        report = {k: int(v) for k, v in stages.items()}
        return Fitted(km.labels_, km.cluster_centers_, km.inertia_, km.n_iter_,
                      km.timings_["lloyd"], report)

    def estimate(self):
        from ..memory import estimate_memory
        try:
            est = estimate_memory(self.w.n, self.w.d, self.w.k, dtype=self.w.dtype,
                                  backend=self.backend_name, max_memory=self.w.max_memory)
        except Exception:  # no estimate (plugin without one, or the budget refuses)
            return None
        return int(est.total)


def _torch_cuda():
    if importlib.util.find_spec("torch") is None:
        return False
    return importlib.import_module("torch").cuda.is_available()


def host_inertia(X, centers, labels, rows=1 << 20) -> float:
    """Sum of squared distances in float64 on the host (for the reference rows; untimed)."""
    total = 0.0
    C = np.asarray(centers, np.float64)
    for s in range(0, len(X), rows):
        diff = X[s:s + rows].astype(np.float64) - C[labels[s:s + rows]]
        total += float(np.einsum("ij,ij->", diff, diff))
    return total


class SeedEntry(Entry):
    """The seed's broadcasting KMeans (float64), on CuPy ("gpu") or NumPy ("cpu")."""

    memory_measured = "measured: peak of the CuPy pool (includes X in float64)"

    def __init__(self, device, w: Workload):
        self.device = device
        self.name = f"{SEED_ROW}[{'cupy' if device == 'gpu' else 'numpy'}]"
        self.w = w

    def check(self):
        from . import seed
        self.mod = seed
        if self.device == "gpu":
            if not _cupy_gpu():
                raise Unavailable("needs CuPy and a CUDA GPU")
            self.xp = importlib.import_module("cupy")
        else:
            self.xp = np
        cap = parse_memory(self.w.max_memory)
        self.cap = None if cap == "auto" else cap
        if self.device == "cpu" and self.cap is None:
            # never let the host swap or meet the OOM killer: refuse as a card of that size would
            self.cap = int(host_available_memory() * 0.8)

    def sync(self):
        if self.device == "gpu":
            self.xp.cuda.get_current_stream().synchronize()

    def memory_scope(self):
        if self.device == "gpu":  # the cap acts as a smaller card; the peak is measured
            return _chain(self.mod.cupy_pool_limit(self.cap), _CupyPeak())
        return _null({})

    def to_input(self, X):
        return self.xp.asarray(X.astype(np.float64))  # the seed's data were float64

    def fit(self, Xb, C, iters) -> Fitted:
        n, d = Xb.shape
        if self.device == "cpu":
            self.mod.check_host_cap(n, len(C), d, self.cap)
        Cd = self.xp.asarray(C.astype(np.float64))
        t0 = time.perf_counter()
        centers, labels, n_iter = self.mod.fit_xp(Xb, Cd, iters)
        self.sync()
        return Fitted(labels, centers, None, n_iter, time.perf_counter() - t0, {})

    def estimate(self):
        return int(self.mod.peak_bytes(self.w.n, self.w.k, self.w.d))

    def data_bytes(self, w):
        return w.n * w.d * 8


class TorchEntry(Entry):
    """Chunked GEMM + argmin Lloyd in torch (CUDA when available, else CPU)."""

    name = TORCH_ROW
    memory_measured = "measured: torch.cuda.max_memory_allocated (includes X)"

    def __init__(self, w: Workload):
        self.w = w

    def check(self):
        if importlib.util.find_spec("torch") is None:
            raise Unavailable("torch is not installed (pip install torch)")
        from . import torch_rows
        self.mod = torch_rows
        self.dev = self.mod.default_device()
        self.device = "gpu" if self.dev == "cuda" else "cpu"
        self.name = f"{TORCH_ROW}[{self.dev}]"
        cap = parse_memory(self.w.max_memory)
        self.budget = None if cap == "auto" else cap

    def sync(self):
        self.mod.synchronize(self.dev)

    def memory_scope(self):
        return _TorchPeak(self.mod.torch()) if self.dev == "cuda" else _null({})

    def to_input(self, X):
        return self.mod.torch().from_numpy(X).to(self.dev)

    def fit(self, Xb, C, iters) -> Fitted:
        Ct = self.mod.torch().from_numpy(C).to(self.dev)
        t0 = time.perf_counter()
        centers, labels, inertia, n_iter = self.mod.fit(Xb, Ct, iters, budget=self.budget)
        self.sync()
        return Fitted(labels, centers, inertia, n_iter, time.perf_counter() - t0, {})

    def estimate(self):
        itemsize = np.dtype(self.w.dtype).itemsize
        return int(self.mod.memory_estimate(self.w.n, self.w.k, self.w.d, itemsize, self.budget))


class _CupyPeak:
    """Peak used bytes of CuPy's default pool inside the block, seen by a memory hook on every
    allocation (so short-lived temporaries count); yields a dict that gets "peak"."""

    def __enter__(self):
        cp = importlib.import_module("cupy")
        pool, out = cp.get_default_memory_pool(), {}
        out["peak"] = pool.used_bytes()

        class Peak(cp.cuda.memory_hook.MemoryHook):
            name = "kmeans_xp_bench_peak"

            def malloc_postprocess(self, **kwargs):  # CuPy passes keywords only
                out["peak"] = max(out["peak"], pool.used_bytes())

        self.hook = Peak()
        self.hook.__enter__()
        return out

    def __exit__(self, *exc):
        self.hook.__exit__(*exc)
        return False


class _TorchPeak:
    def __init__(self, torch):
        self.torch, self.out = torch, {}

    def __enter__(self):
        self.torch.cuda.reset_peak_memory_stats()
        return self.out

    def __exit__(self, *exc):
        self.out["peak"] = int(self.torch.cuda.max_memory_allocated())
        return False


class _null:
    """A do-nothing context manager that yields `value` (contextlib.nullcontext, reusable)."""

    def __init__(self, value=None):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


@contextlib.contextmanager
def _chain(outer, inner):
    with outer, inner as value:
        yield value


def _cupy_gpu() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        return importlib.import_module("cupy").cuda.runtime.getDeviceCount() > 0
    except Exception:  # a broken driver is "no GPU" here
        return False


# --------------------------------------------------------------------------------------------
# the protocol


def measure(entry, X, C, w: Workload, progress=None) -> Row:
    """One row: check, warm up, time `repeats` fits, take medians. Never raises."""
    row = Row(entry.name, device=getattr(entry, "device", "cpu"), dtype=w.dtype)
    try:
        entry.check()
        row.device = entry.device
        est = entry.estimate()
        # peaks measured on a device include X, so estimates include it too: same quantity
        row.memory_estimate_bytes = None if est is None else est + entry.data_bytes(w)
        if isinstance(entry, SeedEntry):
            row.dtype = "float64"
        _tick(progress, f"{entry.name}: warm-up")
        entry.run(X, C, min(w.warmup_iters, w.iters))
        runs, repeats = [], w.repeats_for(entry.device)
        for r in range(repeats):
            _tick(progress, f"{entry.name}: run {r + 1}/{repeats}")
            runs.append(entry.run(X, C, w.iters))
        _summarise(row, runs, entry, w)
        row.labels = runs[-1].labels
    except Unavailable as exc:
        row.status, row.message = "unavailable", str(exc)
    except Exception as exc:  # the row reports it; the comparison goes on
        row.status = "oom" if is_out_of_memory(exc) else "error"
        row.message = f"{type(exc).__name__}: {exc}".strip()
    finally:
        _release_device_memory()
    row.device_name = _device_name(row.device)
    return row


def _summarise(row, runs, entry, w):
    last = runs[-1]
    per_iter = [m.lloyd_s / max(m.n_iter, 1) for m in runs]
    row.n_iter = last.n_iter
    row.times_per_iter_s = per_iter
    row.time_per_iter_s = _median(per_iter)
    row.pairs_per_s = w.pairs(1) / row.time_per_iter_s if row.time_per_iter_s else None
    row.fit_s = _median([m.fit_s for m in runs])
    row.end_to_end_s = _median([m.end_to_end_s for m in runs])
    row.transfer_s = _median([m.transfer_s for m in runs])
    row.inertia = float(last.inertia)
    row.memory_report = last.memory_report
    peaks = [m.peak_bytes for m in runs if m.peak_bytes]
    if peaks:
        row.peak_memory_bytes, row.memory_source = max(peaks), entry.memory_measured
    elif row.memory_estimate_bytes is not None:
        row.peak_memory_bytes = row.memory_estimate_bytes
        row.memory_source = "estimate: the backend's working memory plus X, before running"


def _tick(progress, text):
    if progress is not None:
        progress.set_description_str(text[:48])
        progress.update(1)


_CPU_NAME = None


def _device_name(kind):
    if kind == "gpu":
        gpus = gpu_info()
        return gpus[0]["name"] if gpus and "name" in gpus[0] else "GPU"
    return cpu_model()


def make_entries(backends, w: Workload, *, include_seed=False, seed_device="auto",
                 include_torch=False):
    """Entries for backend specs plus the optional reference rows."""
    entries = [BackendEntry(b, w) for b in backends]
    if include_seed:
        devices = {"auto": ["gpu" if _cupy_gpu() else "cpu"], "both": ["gpu", "cpu"],
                   "gpu": ["gpu"], "cpu": ["cpu"]}[seed_device]
        entries += [SeedEntry(dev, w) for dev in devices]
    if include_torch:
        entries.append(TorchEntry(w))
    return entries


def resolve_backends(spec) -> list:
    """'all', 'auto' or 'a,b,c' -> backend specs. 'all' lists every known backend (missing
    ones become rows that say so) and the generic array-api path on CuPy when CuPy imports."""
    from ..registry import list_backends
    if spec in (None, "auto"):
        infos = list_backends()
        if any(i.available and i.gpu for i in infos.values()):
            spec = "all"
        else:
            return [n for n in ("numpy", "array-api") if n in infos]
    if spec == "all":
        names = list(list_backends())
        if importlib.util.find_spec("cupy") is not None:
            names.insert(names.index("array-api") + 1, "array-api@cupy")
        return names
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("--backends is empty; give names such as numpy,cupy-chunked or 'all'")
    return names


def compare(backends="auto", workload=None, *, include_seed=False, seed_device="auto",
            include_torch=False, progress=False, X=None, **workload_args):
    """Run the protocol on every backend (and reference) and return a result dict:
    {"schema", "kind": "compare", "inputs", "machine", "rows": [...]}.

    workload: a `Workload` (or its fields as keyword arguments); X: host data to use instead
    of generating it. progress: show a tqdm bar (when tqdm is installed)."""
    w = workload or Workload(**workload_args)
    X = make_data(w) if X is None else np.ascontiguousarray(X, dtype=w.dtype)
    w.n, w.d = X.shape
    C = shared_init(X, w)
    entries = _numpy_first(make_entries(resolve_backends(backends), w,
                                        include_seed=include_seed, seed_device=seed_device,
                                        include_torch=include_torch))
    bar = _progress_bar(sum(1 + w.repeats_for(e.device) for e in entries), progress)
    try:
        rows = _measure_all(entries, X, C, w, bar)
    finally:
        if bar is not None:
            bar.close()
    _speedups(rows)
    return {"schema": SCHEMA, "kind": "compare", "inputs": _inputs(w, C),
            "machine": machine_info(), "rows": [row_dict(r) for r in rows]}


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
    if any(r.ok for r in rows) and ref is None:
        ref = _reference_labels(X, C, w)
    for row in rows:
        labels = getattr(row, "labels", None)
        if row.ok and ref is not None and labels is not None:
            row.agreement = float(np.mean(labels == ref))
        row.__dict__.pop("labels", None)  # n labels per row: do not keep them all
    return rows


def _reference_labels(X, C, w):
    """numpy backend labels from the same init, untimed, when no numpy row ran."""
    from ..estimator import KMeans
    try:
        km = KMeans(w.k, init=C, n_init=1, max_iter=w.iters, tol=0, backend="numpy",
                    max_memory=w.max_memory).fit(X)
    except Exception:  # no reference: agreement stays None, and the rows say nothing false
        return None
    return np.asarray(km.labels_)


def _speedups(rows):
    ok = [r for r in rows if r.ok and r.time_per_iter_s]
    cpu = [r.time_per_iter_s for r in ok if r.device == "cpu"]
    numpy_row = next((r for r in ok if r.name == "numpy"), None)
    for r in ok:
        if cpu:
            r.speedup = max(cpu) / r.time_per_iter_s
        if numpy_row is not None:
            r.speedup_vs_numpy = numpy_row.time_per_iter_s / r.time_per_iter_s


def _inputs(w, C):
    d = dataclasses.asdict(w)
    d["max_memory"] = str(w.max_memory)
    d["init_sha256_16"] = fingerprint(C)
    d["protocol"] = ("same data; one shared init; tol=0 and max_iter=iters; one warm-up fit "
                     "per row; device synchronised before each clock read; host->device copy "
                     "timed apart; median of repeats; time_per_iter = Lloyd time / iterations "
                     "(includes the final labelling pass and inertia, amortised)")
    return d


def row_dict(row: Row) -> dict:
    d = dataclasses.asdict(row)
    d.pop("labels", None)
    return d


def sweep(vary, values, backends="auto", workload=None, *, include_seed=False,
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
    return {"schema": SCHEMA, "kind": "sweep", "vary": vary, "values": [int(v) for v in values],
            "inputs": runs[0]["inputs"] if runs else {}, "machine": machine_info(),
            "rows": rows, "runs": [{"inputs": r["inputs"]} for r in runs]}


def _progress_bar(total, enabled):
    """A tqdm bar on a terminal; None when disabled, not a terminal, or tqdm is missing."""
    if not enabled or not sys.stdout.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="fit", leave=False)


# --------------------------------------------------------------------------------------------
# the machine


def cpu_model() -> str:
    global _CPU_NAME
    if _CPU_NAME is None:
        _CPU_NAME = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        _CPU_NAME = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
    return _CPU_NAME


def blas_info() -> list:
    """BLAS libraries and their threads: threadpoolctl when importable, else numpy's config."""
    try:
        from threadpoolctl import threadpool_info
        return [{k: v for k, v in lib.items() if k in (
            "user_api", "internal_api", "version", "num_threads", "threading_layer",
            "architecture", "prefix")} for lib in threadpool_info()]
    except ImportError:
        pass
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return [{"user_api": "blas", "internal_api": blas.get("name"),
                 "version": blas.get("version"), "num_threads": os.environ.get(
                     "OMP_NUM_THREADS", "unknown (threadpoolctl not installed)")}]
    except Exception:  # very old numpy: no dict config
        return []


def gpu_info() -> list:
    """Name and memory of each CUDA device, via CuPy; [] where there is none."""
    if not _cupy_gpu():
        return []
    cp = importlib.import_module("cupy")
    out = []
    try:
        for i in range(cp.cuda.runtime.getDeviceCount()):
            props = cp.cuda.runtime.getDeviceProperties(i)
            name = props["name"]
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "memory_bytes": int(props["totalGlobalMem"]),
                        "compute_capability": f"{props['major']}.{props['minor']}",
                        "multiprocessors": int(props["multiProcessorCount"]),
                        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
                        "cuda_driver": cp.cuda.runtime.driverGetVersion()})
    except Exception as exc:  # report, do not fail the comparison over a property
        out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


_VERSIONED = ("kmeans_xp", "numpy", "array-api-compat", "array-api-strict", "cupy",
              "cupy-cuda12x", "cupy-cuda13x", "torch", "dask", "distributed", "scikit-learn",
              "threadpoolctl", "matplotlib")


def library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": platform.python_version()}
    for dist in _VERSIONED:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def _git_commit():
    import subprocess
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    mem_total = None
    try:
        mem_total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        pass
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "platform": platform.platform(),
            "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count(),
                    "usable_cores": usable},
            "host_memory_bytes": mem_total, "blas": blas_info(), "gpus": gpu_info(),
            "versions": library_versions(), "kmeans_xp_commit": _git_commit()}


# --------------------------------------------------------------------------------------------
# the terminal table


_COLUMNS = ("backend", "device", "ms/iter", "pairs/s", "e2e s", "copy s", "peak memory",
            "inertia", "agree", "speed-up")


def _fmt_row(r: dict) -> list:
    if r["status"] != "ok":
        return [r["name"], r["device"], f"{r['status'].upper()}: {_short(r['message'])}"]
    mem = "-"
    if r["peak_memory_bytes"] is not None:
        mem = format_bytes(r["peak_memory_bytes"]) + (
            " (est)" if r["memory_source"].startswith("estimate") else "")
    agree = "-" if r["agreement"] is None else f"{r['agreement']:.4f}"
    speed = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
    return [r["name"], r["device"], f"{1e3 * r['time_per_iter_s']:.3f}",
            f"{r['pairs_per_s']:.3g}", f"{r['end_to_end_s']:.3f}", f"{r['transfer_s']:.3f}",
            mem, f"{r['inertia']:.6g}", agree, speed]


def _short(text, width=100):
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(result: dict) -> str:
    """The rows as an aligned text table (failed rows: status and message)."""
    rows = result["rows"]
    sweep_col = result.get("kind") == "sweep"
    header = ([result.get("vary", "value")] if sweep_col else []) + list(_COLUMNS)
    body = [([str(r["value"])] if sweep_col else []) + _fmt_row(r) for r in rows]
    ncol = len(header)
    # a failed row's message spans the columns after its device: it sets no width
    widths = [max(len(line[i]) for line in [header] + body
                  if i < len(line) and (len(line) == ncol or i < len(line) - 1))
              for i in range(ncol)]
    out = []
    for line in [header] + body:
        if len(line) < ncol:  # failed row: the message spans the rest
            cells = [c.ljust(widths[i]) for i, c in enumerate(line[:-1])] + [line[-1]]
        else:
            cells = [c.ljust(widths[i]) if i < 2 + sweep_col else c.rjust(widths[i])
                     for i, c in enumerate(line)]
        out.append("  ".join(cells).rstrip())
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


def describe(result: dict) -> str:
    """A header line: the workload and where it ran."""
    i, m = result["inputs"], result["machine"]
    gpu = ", ".join(g.get("name", "?") for g in m["gpus"]) or "no GPU"
    return (f"n={i['n']:,} d={i['d']} k={i['k']} iters={i['iters']} {i['dtype']} "
            f"data={i['data']} init={i['init']} repeats={i['repeats']} | "
            f"{m['cpu']['model']} ({m['cpu']['usable_cores']} cores), {gpu}")
