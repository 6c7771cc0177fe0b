"""Memory as a feature: budgets, estimates before anything runs, and the memory error.

`max_memory` bounds everything a fit allocates beyond X: the driver's arrays (centered copy,
labels, init) and the backend's buffers (`fitmemory` splits it between them). Backends size
their chunks from their share with `chunk_rows`, so memory stays bounded whatever n and k are.
"""
from __future__ import annotations

import contextlib
import functools
import math
import numbers
import re
import traceback
import warnings
from typing import Any, Callable, NamedTuple, TypeVar

from kmeans_xp.contract.host_memory import UNKNOWN, host_memory
from kmeans_xp.contract.seeding import local_trials

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}

#: fraction of free memory "auto" may use, leaving room for the rest of the process
AUTO_FRACTION = 0.5
#: "auto" on the host never takes more than this: bigger chunks stop paying once out of cache
HOST_AUTO_CAP = 1 << 30


class KMeansMemoryError(MemoryError):
    """The fit cannot run within the memory it may use; the message says what to change.

    `needed` and `allowed` (bytes, None where unknown) let a backend restate the error in
    terms of its device (free memory, pool limit) when the budget came from "auto"."""

    def __init__(self, *args, needed=None, allowed=None):
        super().__init__(*args)
        self.needed, self.allowed = needed, allowed


class MemoryEstimate(NamedTuple):
    parts: dict      # name -> bytes
    total: int
    chunk_rows: int  # rows per chunk the backend would use

    def __str__(self):
        rows = ", ".join(f"{k}={format_bytes(v)}" for k, v in self.parts.items())
        return f"{format_bytes(self.total)} ({rows}; chunk of {self.chunk_rows} rows)"


def format_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def parse_memory(value):
    """'auto', a byte count, or a string like '2GB' / '512MiB' -> 'auto' or int bytes."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", text)
        if not m or m.group(2) not in _UNITS:
            raise ValueError(
                f"max_memory={value!r} is not understood; give 'auto', a number of bytes, "
                f"or a string such as '2GB' or '512MiB'")
        nbytes = int(float(m.group(1)) * _UNITS[m.group(2)])
        if nbytes <= 0:  # "0GB" would pass the pattern and give a budget of nothing
            raise ValueError(f"max_memory={value!r} is less than one byte; give 'auto', a "
                             f"positive number of bytes, or a string such as '2GB'")
        return nbytes
    # numbers.Real takes NumPy scalars (np.int64 from arithmetic on shapes) too; bools are not
    # byte counts, and nan/inf are not either
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value < 1):
        raise ValueError(
            f"max_memory={value!r} must be 'auto', a positive number of bytes, or a string "
            f"such as '2GB'")
    return int(value)


def host_available_memory(default=None):
    """Free host memory in bytes (`host_memory`: psutil, /proc/meminfo or sysconf), or
    `default` (None: unknown) where no source answers; nothing invents a size."""
    found = host_memory().available
    return default if found is None else found


def resolve_budget(max_memory, available: int | None, cap: int | None = None) -> int:
    """Bytes of working memory a fit may use (`available` None: unknown, see
    `_unknown_free_budget`)."""
    value = parse_memory(max_memory)
    if value == "auto" and available is None:
        return _unknown_free_budget(cap)
    if value == "auto":
        value = int(available * AUTO_FRACTION)
        if cap is not None:
            value = min(value, cap)
    return max(int(value), 1)


def _unknown_free_budget(cap):
    """"auto" where free memory is unknown: the cap alone, said once, or a clear refusal."""
    if cap is None:
        raise KMeansMemoryError("max_memory='auto' needs the free memory, which is unknown "
                                "here (pip install psutil), so give max_memory in bytes "
                                "or as '2GB'")
    warnings.warn(f"free host memory is unknown here ({UNKNOWN}); max_memory='auto' uses its "
                  f"cap, {format_bytes(cap)}: give max_memory to choose", RuntimeWarning,
                  stacklevel=3)
    return int(cap)


def chunk_rows(budget: int, bytes_per_row: int, fixed: int = 0, *, n_samples: int,
               floor: int = 1, what: str = "the fit") -> int:
    """Rows per chunk so that fixed + rows * bytes_per_row <= budget (at most n_samples)."""
    rows = (budget - fixed) // max(bytes_per_row, 1)
    if rows < floor:
        needed = fixed + floor * bytes_per_row
        raise KMeansMemoryError(
            f"{what} needs at least {format_bytes(needed)} of working "
            f"memory ({floor} rows of {bytes_per_row} B plus {format_bytes(fixed)} fixed), "
            f"but max_memory allows {format_bytes(budget)}. Raise max_memory, use float32, "
            f"or use fewer clusters.", needed=needed, allowed=budget)
    return int(min(rows, max(n_samples, 1)))


def compute_itemsize(dtype) -> int:
    """Bytes per element of the dtype a fit computes in for input of `dtype`, as
    `check_array` converts: float32 kept, float16 and bfloat16 in float32, float64, ints and
    bools in float64 (so an int8 input costs 8 bytes per value, not 1)."""
    import numpy as np

    from kmeans_xp.contract.precision import half_kind
    if half_kind(dtype) is not None:
        return 4
    dt = np.dtype(str(dtype).split(".")[-1]) if not isinstance(dtype, (type, np.dtype)) \
        else np.dtype(dtype)
    return 4 if dt.kind == "f" and dt.itemsize <= 4 else 8


def accepted_options(fn, options):
    """The backend_options `fn` takes (all of them when it takes **kwargs)."""
    takes_any, names = _parameters(fn)
    if takes_any:
        return dict(options)
    return {k: v for k, v in options.items() if k in names}


@functools.lru_cache(maxsize=256)
def _parameters(fn):
    """(takes **kwargs, parameter names) of fn, once each (inspect.signature costs ~0.1 ms,
    and every fit asks)."""
    import inspect
    params = inspect.signature(fn).parameters
    return any(p.kind is p.VAR_KEYWORD for p in params.values()), frozenset(params)


def xp_seeding_bytes(n_samples, n_clusters, itemsize, rows=None) -> int:
    """Bytes of k-means++ in xp code (`init.Seeding`): its weights, running distances and
    their cumulative sums (O(n)), and its chunks of distances to the candidates: 2 + log k of
    them, about five such arrays alive, for `rows` rows at a time (None: every row at once,
    as when the budget allows; then the chosen candidate's are kept, no second pass)."""
    n = n_samples
    trials = local_trials(max(n_clusters, 1))
    rows = n if rows is None else min(int(rows), n)
    return 5 * n * 8 + 3 * n * itemsize + rows * trials * (5 * itemsize + 8)


#: the xp passes' chunk (`driver_chunk_rows`) takes this share of the backend's budget, at
#: DRIVER_ROW_VALUES + 4 d values a row, never fewer than DRIVER_MIN_ROWS rows
DRIVER_BUDGET_SHARE = 4
DRIVER_ROW_VALUES = 64
DRIVER_MIN_ROWS = 256


def driver_chunk_rows(n, d, itemsize, budget) -> int:
    """Rows per chunk of the O(n d) passes done in xp code (init, the defaults of the
    contract) for a backend working within `budget` bytes."""
    per_row = (d * 4 + DRIVER_ROW_VALUES) * itemsize
    return int(max(DRIVER_MIN_ROWS, min(n, budget // DRIVER_BUDGET_SHARE // per_row)))


def driver_bytes(n_samples, n_features, n_clusters, itemsize, *, weighted=True,
                 seeding=None, copy_x=True, rows=None) -> dict:
    """What the driver keeps besides a backend's buffers, part by part: the centered copy of X
    the fit computes on (none with copy_x=False); its O(n) arrays (the labels of three
    iterations during Lloyd: the last, the one before and the next one issued ahead on an
    asynchronous device; or, when larger, k-means++'s during init: `seeding`, the bytes of
    the backend's own steps, else `xp_seeding_bytes` in chunks of `rows`); the sample
    weights when given; centers and sums."""
    n = n_samples
    init = xp_seeding_bytes(n, n_clusters, itemsize, rows) if seeding is None else seeding
    parts = {
        "centered_copy": n * n_features * itemsize,
        "labels_or_init": max(3 * n * 8, init),
        "sample_weight": n * itemsize,
        "centers_and_sums": 6 * n_clusters * (n_features + 1) * 8,
    }
    if not weighted:
        del parts["sample_weight"]
    if not copy_x:
        del parts["centered_copy"]
    return parts


class Budget:
    """A fit's memory: `max_memory` in bytes, and the peak bytes measured per stage
    (`report`, the estimator's `memory_report_`). It knows nothing of its backend: the free
    memory it takes a share of comes as a function (the placement's `free_memory`; None: the
    host's available memory, with "auto" capped at HOST_AUTO_CAP). Default: nothing
    measured; device backends measure their pool. The fit's memory check is the backend's
    (`KMeansBackend.check_memory`), given the fit's plan."""

    def __init__(self, max_memory="auto", free_memory=None):
        parse_memory(max_memory)  # a clear error now, not in the first chunk
        self.max_memory = max_memory
        self._free_memory = free_memory
        self.report = {}

    def available(self) -> int:
        """Bytes free where the backend computes."""
        return host_available_memory() if self._free_memory is None else self._free_memory()

    def bytes(self, reserve=0) -> int:
        """Working-memory bound in bytes for this fit ("auto": a share of what is free)."""
        free = self.available()
        return resolve_budget(self.max_memory, None if free is None else max(free - reserve, 0),
                              cap=HOST_AUTO_CAP if self._free_memory is None else None)

    @contextlib.contextmanager
    def stage(self, name):
        """Context of one stage ("transfer", "init", "lloyd", "assign", ...)."""
        yield

    def record(self, name, peak):
        self.report[name] = max(self.report.get(name, 0), int(peak))


_Method = TypeVar("_Method", bound=Callable[..., Any])


def explains_memory_errors(method: _Method) -> _Method:
    """For the estimator's public methods: an out-of-memory error that is not ours (CuPy's
    device one and NumPy's host one are MemoryErrors; torch's is a RuntimeError named
    OutOfMemoryError) leaves as a KMeansMemoryError saying what ran out and what to change.
    Either way the frames of the work that failed are cleared first, so the arrays they held
    (device memory) are freed at once, even while the caller keeps the error (a notebook
    does)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            traceback.clear_frames(exc.__traceback__)
            if isinstance(exc, KMeansMemoryError):
                raise
            raise KMeansMemoryError(
                f"{type(self).__name__}.{method.__name__} ran out of memory "
                f"({type(exc).__module__}.{type(exc).__name__}: {exc}). Lower max_memory, use "
                f"float32, stream X from the host (backend_options={{'stream': True}} on the "
                f"GPU backends that stream) or use the numpy backend.") from exc
    return wrapper


def _out_of_memory(exc) -> bool:
    return isinstance(exc, MemoryError) or (
        type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("torch"))
