"""The comparison protocol: an entry's clocking (`Entry.run`) and one row (`measure`).

For every row: a warm-up fit first (kernel compilation and pool growth are not the fit; its
one-time cost is kept apart, `spread.one_time_cost`); the device synchronised before every
clock read; the host-to-device copy timed apart from the fit (`transfer`), and end to end as
well; the median of `repeats` timed fits, their min and max beside it (`spread`); peaks
measured where a library can measure them. A row that is not installed, runs out of memory,
or fails is a row with a status and the message, never a crash of the whole comparison.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import statistics
import sys
import time
from typing import Any, NamedTuple

import numpy as np

from kmeans_xp.contract.namespaces import to_numpy
from kmeans_xp.tools.bench.machine import device_name
from kmeans_xp.tools.bench.spread import one_time_cost, spread


class Unavailable(Exception):
    """The entry cannot run here (library or device missing); the row says why."""


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
    engine: str = ""


@dataclasses.dataclass
class Row:
    name: str
    status: str = "ok"           # ok | unavailable | oom | error
    message: str = ""
    library: str = ""            # kmeans_xp | scikit-learn | faiss | torch | seed
    device: str = "cpu"          # cpu | gpu
    device_name: str = ""
    dtype: str = ""
    n_iter: int | None = None
    timed: str = ""              # what the Lloyd clock of the row covers
    time_per_iter_s: float | None = None
    pairs_per_s: float | None = None
    fit_s: float | None = None
    end_to_end_s: float | None = None
    transfer_s: float | None = None
    peak_memory_bytes: int | None = None
    memory_source: str = ""      # "measured: ..." or "estimate: ..."
    memory_estimate_bytes: int | None = None   # before running: working memory + X
    memory_report: dict = dataclasses.field(default_factory=dict)
    engine: str = ""                       # what ran inside the row (auto's choice, a path)
    threads: int | None = None             # the threads the row was held to (None: all)
    inertia: float | None = None
    agreement: float | None = None
    speedup: float | None = None           # over the fastest CPU row (result["baseline"])
    speedup_vs_numpy: float | None = None
    times_per_iter_s: list = dataclasses.field(default_factory=list)  # every timed repeat
    time_per_iter_min_s: float | None = None
    time_per_iter_max_s: float | None = None
    spread: float | None = None            # slowest / fastest repeat (`spread.BUSY_SPREAD`)
    warmup_s: float | None = None          # the untimed warm-up fit, wall clock
    one_time_s: float | None = None        # what the warm-up took beyond a warm fit

    @property
    def ok(self):
        return self.status == "ok"


class Fitted(NamedTuple):
    """What an entry's fit leaves on its device, before anything comes back to the host."""
    labels: Any
    centers: Any
    inertia: float | None     # None: computed on the host afterwards, untimed
    n_iter: int
    lloyd_s: float
    memory_report: dict
    engine: str = ""          # what ran inside the row, where it chose (auto's backend)


class Entry:
    """One row of the comparison. Subclasses say how data gets in (`to_input`), how the fit
    runs (`fit`), how to wait for the device (`sync`) and what memory they need (`estimate`);
    `run` is the protocol's clocking, the same for all."""

    name = ""
    library = ""                 # whose code the row runs
    device = "cpu"
    dtype = None                 # the dtype the entry computes in (None: the workload's)
    timed = "the fit's Lloyd loop, / iterations"
    memory_measured = "measured"
    memory_estimated = "estimate: the row's working memory plus X, before running"

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

    def memory_scope(self, peak=True):
        """Context around one whole run (copy + fit) yielding a dict that gets "peak" bytes
        where `peak`; limits the row runs under (a pool cap) hold either way. The timed runs
        pass peak=False: a peak's instrumentation is not in their times."""
        return NoPeak()

    def measures_peak(self):
        """Whether `memory_scope` measures a peak here (a scope that is not `NoPeak`)."""
        return not isinstance(self.memory_scope(), NoPeak)

    def threads_scope(self, threads):
        """Context around a row's fits holding it to `threads` (None: as it is): BLAS and
        OpenMP through threadpoolctl; entries with a thread option of their own override."""
        if threads is None:
            return contextlib.nullcontext()
        from threadpoolctl import threadpool_limits
        return threadpool_limits(limits=int(threads))

    def run(self, X, C, iters, peak=True) -> Measurement:
        with self.memory_scope(peak) as measured:
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
        return _measurement(X, labels, centers, fitted, measured, (t0, t1, t2, t3))


def _measurement(X, labels, centers, fitted, measured, clock) -> Measurement:
    """A run's numbers from its host copies, its `Fitted`, its measured peak and its clock."""
    t0, t1, t2, t3 = clock
    report = dict(fitted.memory_report)
    if measured.get("peak"):
        report["fit"] = int(measured["peak"])
    inertia = fitted.inertia if fitted.inertia is not None else host_inertia(
        X, centers, labels)
    return Measurement(np.asarray(labels), float(inertia), fitted.n_iter, t1 - t0,
                       t2 - t1, fitted.lloyd_s, t3 - t0,
                       max((v for key, v in report.items() if not key.endswith("_host")),
                           default=None),  # "pinned_host" is host memory
                       report, fitted.engine)


def host_inertia(X, centers, labels, rows=1 << 20) -> float:
    """Sum of squared distances in float64 on the host (for the reference rows; untimed)."""
    total = 0.0
    C = np.asarray(centers, np.float64)
    for s in range(0, len(X), rows):
        diff = X[s:s + rows].astype(np.float64) - C[labels[s:s + rows]]
        total += float(np.einsum("ij,ij->", diff, diff))
    return total


# --------------------------------------------------------------------------------------------
# one row


def measure(entry, X, C, w, progress=None) -> Row:
    """One row: check, warm up, time `repeats` fits, take medians. Never raises."""
    row = Row(entry.name, library=entry.library, device=getattr(entry, "device", "cpu"),
              dtype=w.dtype)
    try:
        _prepare(row, entry, w)
        with entry.threads_scope(w.threads):
            warm, runs, measured = _timed_runs(entry, X, C, w, progress)
        _summarise(row, runs, measured, entry, w)
        if warm is not None:
            row.warmup_s = warm[0]
            row.one_time_s = one_time_cost(*warm, {"end_to_end_s": row.end_to_end_s,
                                                   "time_per_iter_s": row.time_per_iter_s,
                                                   "n_iter": row.n_iter})
        row.labels = runs[-1].labels
    except Unavailable as exc:
        row.status, row.message = "unavailable", str(exc)
    except Exception as exc:  # the row reports it; the comparison goes on
        row.status = "oom" if is_out_of_memory(exc) else "error"
        row.message = f"{type(exc).__name__}: {exc}".strip()
    finally:
        release_device_memory()
    row.device_name = device_name(row.device)
    return row


def _timed_runs(entry, X, C, w, progress):
    """The warm-up fit ((seconds, iterations) or None), the timed runs of a row, and the run
    whose memory peak was measured: the warm-up, or without one a run after the timed ones
    (none where the entry measures no peak: the last timed run stands for it). (CuPy's peak
    is seen by a memory hook, Python at every allocation: the timed runs measure the fit,
    not the hook.)"""
    _tick(progress, f"{entry.name}: warm-up")
    warm = measured = None
    if w.warmup_iters > 0:
        t0 = time.perf_counter()
        measured = entry.run(X, C, min(w.warmup_iters, w.iters))
        warm = (time.perf_counter() - t0, measured.n_iter)
    runs, repeats = [], w.repeats_for(entry.device)
    for r in range(repeats):
        _tick(progress, f"{entry.name}: run {r + 1}/{repeats}")
        runs.append(entry.run(X, C, w.iters, peak=False))
    if measured is None and entry.measures_peak():
        _tick(progress, f"{entry.name}: memory peak")
        measured = entry.run(X, C, w.iters)
    return warm, runs, measured or runs[-1]


def _prepare(row, entry, w):
    """Check the entry (raises Unavailable) and record its device, estimate and dtype."""
    entry.check()
    row.name, row.device = entry.name, entry.device  # check() may name the device
    row.library, row.timed = entry.library, entry.timed
    est = entry.estimate()
    # peaks measured on a device include X, so estimates include it too: same quantity
    row.memory_estimate_bytes = None if est is None else est + entry.data_bytes(w)
    if getattr(entry, "dtype", None):
        row.dtype = entry.dtype


def _summarise(row, runs, measured, entry, w):
    last = runs[-1]
    per_iter = [m.lloyd_s / max(m.n_iter, 1) for m in runs]
    row.n_iter = last.n_iter
    row.engine, row.threads = last.engine, w.threads
    row.times_per_iter_s = per_iter
    times = spread(per_iter)
    row.time_per_iter_s = times["median"]
    row.time_per_iter_min_s, row.time_per_iter_max_s = times["min"], times["max"]
    row.spread = times["ratio"]
    row.pairs_per_s = w.pairs(1) / row.time_per_iter_s if row.time_per_iter_s else None
    row.fit_s = _median([m.fit_s for m in runs])
    row.end_to_end_s = _median([m.end_to_end_s for m in runs])
    row.transfer_s = _median([m.transfer_s for m in runs])
    row.inertia = float(last.inertia)
    row.memory_report = measured.memory_report
    peaks = [m.peak_bytes for m in runs + [measured] if m.peak_bytes]
    if peaks:
        row.peak_memory_bytes, row.memory_source = max(peaks), entry.memory_measured
    elif row.memory_estimate_bytes is not None:
        row.peak_memory_bytes = row.memory_estimate_bytes
        row.memory_source = entry.memory_estimated


def _median(values):
    return float(statistics.median(values)) if values else None


def _tick(progress, text):
    if progress is not None:
        progress.set_description_str(text[:48])
        progress.update(1)


def is_out_of_memory(exc) -> bool:
    """MemoryError (KMeansMemoryError, emulated caps) or a library's OutOfMemoryError."""
    return isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__


# --------------------------------------------------------------------------------------------
# the device: synchronising, releasing, peaks


def sync_namespace(ns):
    """Wait for the library's device work (for namespaces whose backend may not sync)."""
    if ns == "cupy" and "cupy" in sys.modules:
        sys.modules["cupy"].cuda.get_current_stream().synchronize()
    elif ns == "torch" and "torch" in sys.modules:
        t = sys.modules["torch"]
        if t.cuda.is_available():
            t.cuda.synchronize()


def release_device_memory():
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


class CupyPeak:
    """Peak used bytes of CuPy's default pool inside the block, seen by a memory hook on every
    allocation (so short-lived temporaries count); yields a dict that gets "peak". Not
    `active`: nothing is hooked, the dict stays empty."""

    def __init__(self, active=True):
        self.active, self.hook = active, None

    def __enter__(self):
        if not self.active:
            return {}
        import cupy as cp
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
        if self.hook is not None:
            self.hook.__exit__(*exc)
        return False


class TorchPeak:
    """torch.cuda.max_memory_allocated over the block; yields a dict that gets "peak" (none
    when not `active`)."""

    def __init__(self, torch, active=True):
        self.torch, self.active, self.out = torch, active, {}

    def __enter__(self):
        if self.active:
            self.torch.cuda.reset_peak_memory_stats()
        return self.out

    def __exit__(self, *exc):
        if self.active:
            self.out["peak"] = int(self.torch.cuda.max_memory_allocated())
        return False


class NoPeak:
    """Where nothing measures a peak: yields an empty dict (reusable, unlike nullcontext)."""

    def __enter__(self):
        return {}

    def __exit__(self, *exc):
        return False


@contextlib.contextmanager
def chain(outer, inner):
    """`with outer, inner as value`, as one context manager."""
    with outer, inner as value:
        yield value
