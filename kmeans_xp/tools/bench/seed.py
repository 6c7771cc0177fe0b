"""The seed's original KMeans (`fit_xp` in ../shared/seed/), kept as a benchmark reference.

It is reproduced on purpose with the memory behaviour that made the seed fail: the (n, k, d)
broadcast in the distance step, the (k, n) boolean mask and the (k, n, d) `where` in the update,
float64 throughout. It is not a backend; `kmeans_xp.tools.bench` runs it as an optional row
(`--include-seed`) so users see its time, its memory and its OutOfMemoryError next to ours.

Changes from the seed, each so that the comparison is of the same work:
- the initial centers are given (the bench's shared init), not drawn with `xp.random.choice`;
- an empty cluster keeps its center instead of becoming NaN (sums / 0): with a NaN center,
  argmin would send every point to it on NumPy, which would compare garbage, not speed;
- after the loop, one more assignment against the final centers, as the kmeans_xp driver does,
  so the labels belong to the returned centers (the seed returned the previous iteration's).
The loop still stops when no label changes, as the seed's did and as the driver does.

Written against NumPy/CuPy (the seed used `cupy.get_array_module`), so one function runs on both.
`SeedEntry` at the end is its row in the comparison: on CuPy ("gpu") or NumPy ("cpu").
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import time

import numpy as np

from kmeans_xp.contract.memory import format_bytes, host_available_memory, parse_memory
from kmeans_xp.tools.bench.machine import cupy_gpu
from kmeans_xp.tools.bench.protocol import CupyPeak, Entry, Fitted, NoPeak, Unavailable, chain

#: the row's name in a comparison ("seed-reference[cupy]", "seed-reference[numpy]")
SEED_ROW = "seed-reference"

#: bytes per float64 element, the seed's dtype
F64 = 8


def peak_bytes(n_samples, n_clusters, n_features):
    """Working memory of the seed's distance step beyond X, in bytes: the (n, k, d) float64
    difference, its (n, k, d) square inside `linalg.norm`, and the (n, k) distances. It gives
    20.9 GiB at n=2M, d=3, k=200 and 52 GiB at k=500, the peaks measured with CuPy on the
    H200 (a library that keeps the previous `distances` alive needs n*k*8 bytes more)."""
    nk = n_samples * n_clusters
    return 2 * nk * n_features * F64 + nk * F64


def diff_bytes(n_samples, n_clusters, n_features):
    """Size of the first huge temporary, the (n, k, d) float64 difference."""
    return n_samples * n_clusters * n_features * F64


def array_module(X):
    """numpy or cupy for X, as the seed's `cupy.get_array_module` (no CuPy import needed)."""
    if type(X).__module__.split(".")[0] == "cupy":
        return sys.modules["cupy"]
    return np


def _update(X, pred, centers, n_clusters, xp):
    # the seed's update step: (k, n) mask and (k, n, d) where; an empty cluster keeps its center
    i = xp.arange(n_clusters)
    mask = pred == i[:, None]
    sums = xp.where(mask[:, :, None], X, 0).sum(axis=1)
    counts = xp.count_nonzero(mask, axis=1).reshape((n_clusters, 1))
    return xp.where(counts > 0, sums / xp.maximum(counts, 1), centers)


def fit_xp(X, init, iterations):
    """The seed's `fit_xp` from given initial centers: returns (centers, labels, n_iter).

    X: (n, d) float64 NumPy or CuPy array; init: (k, d) array of the same module. The loop
    body is the seed's, so temporaries live as long as they did there (`distances` included)."""
    assert X.ndim == 2
    xp = array_module(X)
    n_clusters = init.shape[0]
    pred = xp.zeros(len(X))
    centers = init
    n_iter = 0
    for _ in range(iterations):
        distances = xp.linalg.norm(X[:, None, :] - centers[None, :, :], axis=2)
        new_pred = xp.argmin(distances, axis=1)
        if xp.all(new_pred == pred):
            break
        pred = new_pred
        centers = _update(X, pred, centers, n_clusters, xp)
        n_iter += 1
    # the driver's final pass: labels that belong to the returned centers
    distances = xp.linalg.norm(X[:, None, :] - centers[None, :, :], axis=2)
    return centers, xp.argmin(distances, axis=1), max(n_iter, 1)


class EmulatedOutOfMemory(MemoryError):
    """What a device with `cap` bytes would raise; used on the CPU, where the seed's
    allocations would otherwise swap the machine or wake the OOM killer."""


def check_host_cap(n_samples, n_clusters, n_features, cap):
    """Refuse, as a card with `cap` bytes would, when the seed's working memory exceeds it."""
    need = peak_bytes(n_samples, n_clusters, n_features)
    if need > cap:
        first = diff_bytes(n_samples, n_clusters, n_features)
        raise EmulatedOutOfMemory(
            f"Out of memory allocating {format_bytes(first)} for the (n, k, d) float64 "
            f"difference: one seed iteration needs "
            f"{format_bytes(need)}, the cap is {format_bytes(cap)} (emulated on the CPU)")


@contextlib.contextmanager
def cupy_pool_limit(cap):
    """Run with the CuPy pool limited to `cap` bytes (None: unchanged), as on a smaller card;
    the previous limit is restored and cached blocks are released afterwards."""
    cp = sys.modules["cupy"]
    pool = cp.get_default_memory_pool()
    old = pool.get_limit()
    if cap is not None:
        pool.set_limit(size=int(cap))
    try:
        yield
    finally:
        pool.set_limit(size=old)
        pool.free_all_blocks()


# --------------------------------------------------------------------------------------------
# the seed's row in the comparison


class SeedEntry(Entry):
    """The seed's broadcasting KMeans (float64), on CuPy ("gpu") or NumPy ("cpu")."""

    library = "seed"
    dtype = "float64"            # the seed's data were float64, whatever the workload's
    timed = "fit_xp (the seed's loop + a final labelling pass), / iterations"
    memory_measured = "measured: peak of the CuPy pool (includes X in float64)"

    def __init__(self, device, w):
        self.device = device
        self.name = f"{SEED_ROW}[{'cupy' if device == 'gpu' else 'numpy'}]"
        self.w = w

    def check(self):
        if self.device == "gpu":
            if not cupy_gpu():
                raise Unavailable("needs CuPy and a CUDA GPU")
            self.xp = importlib.import_module("cupy")
        else:
            self.xp = np
        cap = parse_memory(self.w.max_memory)
        self.cap = None if cap == "auto" else cap
        if self.device == "cpu" and self.cap is None:
            # never let the host swap or meet the OOM killer: refuse as a card of that size would
            free = host_available_memory()
            if free is None:
                raise Unavailable("free host memory is unknown here (pip install psutil); "
                                  "give --max-memory to cap the seed's row")
            self.cap = int(free * 0.8)

    def sync(self):
        if self.device == "gpu":
            self.xp.cuda.get_current_stream().synchronize()

    def memory_scope(self, peak=True):
        if self.device == "gpu":  # the cap acts as a smaller card; the peak is measured
            return chain(cupy_pool_limit(self.cap), CupyPeak(peak))
        return NoPeak()

    def to_input(self, X):
        return self.xp.asarray(X.astype(np.float64))  # the seed's data were float64

    def fit(self, Xb, C, iters) -> Fitted:
        n, d = Xb.shape
        if self.device == "cpu":
            check_host_cap(n, len(C), d, self.cap)
        Cd = self.xp.asarray(C.astype(np.float64))
        t0 = time.perf_counter()
        centers, labels, n_iter = fit_xp(Xb, Cd, iters)
        self.sync()
        return Fitted(labels, centers, None, n_iter, time.perf_counter() - t0, {})

    def estimate(self):
        return int(peak_bytes(self.w.n, self.w.k, self.w.d))

    def data_bytes(self, w):
        return w.n * w.d * 8
