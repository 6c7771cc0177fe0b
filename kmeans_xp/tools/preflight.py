"""Before the command allocates anything: do the sizes it was asked for fit in the host's
memory?

`kmeans-xp run --n 1e10` would otherwise die in NumPy's allocator with a MemoryError
traceback, or swap the machine for minutes first. The need counted here is what the command
holds at once on the host, from the planner's own figures:
- making the data (`tools.data.seed_data_peak_bytes`; a .npy file: its rows read into X);
- the fit: X, the driver's centered copy and labels (`contract.memory.driver_bytes`, random
  init: no seeding buffer), and the working memory of a host backend (its own estimate,
  which max_memory bounds). A GPU backend's fit holds X on the host, its work on the device
  (the device's memory is the fit's own check, `KMeansMemoryError`).
The larger of the two is compared with the available memory (`contract.host_memory`:
psutil, /proc/meminfo or sysconf). Where no source answers, nothing is refused and the
command says the sizes were not checked.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.host_memory import host_memory
from kmeans_xp.contract.memory import compute_itemsize, driver_bytes, format_bytes


class TooLarge(Exception):
    """The sizes asked for need more host memory than is available (a usage error)."""


def data_bytes(n, d, dtype, data="seed") -> int:
    """Peak host bytes while the data are made: generated ("seed", "blobs") or read."""
    from kmeans_xp.tools.data import seed_data_peak_bytes
    x = n * d * np.dtype(dtype).itemsize
    if data == "seed":
        return seed_data_peak_bytes(n, d, dtype)
    if data == "blobs":  # drawn in float64, then X
        return n * d * 8 + x
    return x  # a .npy file: memory-mapped, its rows copied into X


def fit_bytes(n, d, k, dtype, backend="numpy", max_memory="auto") -> dict:
    """The host bytes a fit holds at once, part by part (see the module's docstring)."""
    from kmeans_xp.contract.registry import list_backends
    x = n * d * np.dtype(dtype).itemsize
    info = list_backends().get(backend)
    if info is not None and info.gpu:
        return {"X": x}
    parts = {"X": x, **driver_bytes(n, d, k, compute_itemsize(dtype), weighted=False,
                                    seeding=0)}
    parts["working"] = _working_bytes(n, d, k, dtype, backend, max_memory)
    return parts


def _working_bytes(n, d, k, dtype, backend, max_memory):
    """A host backend's working memory (its estimate without the driver's parts); "auto"
    plans as the numpy backend does; 0 where a backend gives no estimate."""
    from kmeans_xp.contract.planning import estimate_memory
    name = "numpy" if backend in (None, "auto") else backend
    try:
        est = estimate_memory(n, d, k, dtype=dtype, backend=name, max_memory=max_memory)
    except Exception:  # noqa: BLE001 - a plugin without an estimate: count the rest only
        return 0
    return sum(v for p, v in est.parts.items() if not p.startswith("driver_"))


def check_host_memory(what, n, d, k, dtype, *, data="seed", backend="auto",
                      max_memory="auto", memory=None):
    """Raise TooLarge (one line: what was asked, what it needs, what is available, the
    largest n that fits) when the command would not fit; return the need in bytes, or None
    where the host's memory is unknown (nothing checked)."""
    memory = memory or host_memory()
    make = data_bytes(n, d, dtype, data)
    fit = sum(fit_bytes(n, d, k, dtype, backend, max_memory).values())
    need = max(make, fit)
    if not memory.known or need <= memory.available:
        return need if memory.known else None
    of_total = f" of {format_bytes(memory.total)}" if memory.total else ""
    fits = _largest_n(n, memory.available, need)
    hint = (f"ask for at most about --n {fits:,}" if fits >= k
            else "use a machine with more memory")
    raise TooLarge(
        f"{what} n={n:,} d={d} k={k} {dtype} needs about {format_bytes(need)} of host memory "
        f"(making the data {format_bytes(make)}, the fit {format_bytes(fit)}) and "
        f"{format_bytes(memory.available)} is available{of_total}; {hint}")


def _largest_n(n, available, need):
    """The n whose need fits `available`, at two significant digits (the need grows with n
    nearly in proportion)."""
    guess = int(n * available / need)
    if guess < 100:
        return guess
    scale = 10 ** (len(str(guess)) - 2)
    return guess // scale * scale
