"""A torch baseline for `kmeans_xp.tools.bench` (`--include-torch`): chunked GEMM + argmin Lloyd.

This is the best *general* GPU code a user would write without custom kernels (issue 4 measured
it at 154 ms per iteration on n=20M, k=1000): per row chunk, distances as
||c||^2 - 2 x.c by one GEMM (`addmm`), argmin, then per-cluster sums with `index_add_`.
It follows the kmeans_xp driver's semantics so its answer is comparable: X mean-centered,
the same initial centers, sums in float64, stop when no label changes, an empty cluster keeps
its center, and a final assignment so the labels belong to the returned centers. FP32 GEMMs run
at full precision (no TF32), as the other rows do.

Runs on CUDA when torch sees a GPU, else on the CPU. torch is imported only when called.
`TorchEntry` at the end is its row in the comparison.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import time

import numpy as np

from kmeans_xp.contract.memory import parse_memory
from kmeans_xp.tools.bench.protocol import Entry, Fitted, NoPeak, TorchPeak, Unavailable

#: the row's name in a comparison ("torch-gemm[cuda]", "torch-gemm[cpu]")
TORCH_ROW = "torch-gemm"

#: working-memory bound when none is given: a (rows, k) float32 block this large is plenty
DEFAULT_BUDGET = 1 << 30
MIN_ROWS = 1024


def torch():
    return importlib.import_module("torch")


def default_device() -> str:
    return "cuda" if torch().cuda.is_available() else "cpu"


def synchronize(device):
    if str(device).startswith("cuda"):
        torch().cuda.synchronize()


def chunk_rows(n_samples, n_clusters, n_features, itemsize, budget=None) -> int:
    """Rows per chunk so the (rows, k) distances, their argmin and a float64 copy of the
    chunk fit the budget."""
    per_row = 2 * n_clusters * itemsize + n_features * 8 + 16
    rows = int((budget or DEFAULT_BUDGET) // per_row)
    return max(MIN_ROWS, min(rows, n_samples))


def memory_estimate(n_samples, n_clusters, n_features, itemsize, budget=None) -> int:
    """Bytes beyond X: the chunk buffers, the centered copy of X, the float64 sums, labels."""
    rows = chunk_rows(n_samples, n_clusters, n_features, itemsize, budget)
    return (rows * (2 * n_clusters * itemsize + n_features * 8 + 16)
            + n_samples * n_features * itemsize + n_samples * 16
            + 3 * n_clusters * (n_features + 1) * 8)


@contextlib.contextmanager
def _full_fp32():
    # TF32 would be faster and not bit-comparable; every other row computes in real FP32
    t = torch()
    old = t.get_float32_matmul_precision()
    t.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        t.set_float32_matmul_precision(old)


def _assign(Xc, centers, rows):
    t = torch()
    c_norm = (centers * centers).sum(dim=1)
    labels = t.empty(Xc.shape[0], dtype=t.int64, device=Xc.device)
    for s in range(0, Xc.shape[0], rows):
        dist = t.addmm(c_norm, Xc[s:s + rows], centers.T, alpha=-2.0)
        labels[s:s + rows] = t.argmin(dist, dim=1)
    return labels


def _update(Xc, labels, centers, rows):
    t = torch()
    k, d = centers.shape
    sums = t.zeros((k, d), dtype=t.float64, device=Xc.device)
    for s in range(0, Xc.shape[0], rows):
        sums.index_add_(0, labels[s:s + rows], Xc[s:s + rows].double())
    counts = t.bincount(labels, minlength=k).double()[:, None]
    new = t.where(counts > 0, sums / counts.clamp(min=1), centers.double())
    return new.to(centers.dtype)


def _inertia(Xc, centers, labels, rows) -> float:
    total = 0.0
    for s in range(0, Xc.shape[0], rows):
        diff = (Xc[s:s + rows] - centers[labels[s:s + rows]]).double()
        total += float((diff * diff).sum())
    return total


def fit_torch(X, init, iterations, *, budget=None):
    """Lloyd from `init` on torch tensor X (any device): (centers, labels, inertia, n_iter).

    X: (n, d) float32/float64 tensor; init: (k, d) tensor on X's device and dtype."""
    t = torch()
    n, d = X.shape
    k = init.shape[0]
    rows = chunk_rows(n, k, d, X.element_size(), budget)
    with _full_fp32(), t.no_grad():
        mean = X.double().mean(dim=0).to(X.dtype)  # float64 mean, as the driver's precision
        Xc = X - mean
        centers = init - mean
        labels_old = None
        n_iter = 0
        for n_iter in range(1, iterations + 1):  # noqa: B007 (n_iter is read after the loop)
            labels = _assign(Xc, centers, rows)
            centers = _update(Xc, labels, centers, rows)
            if labels_old is not None and t.equal(labels, labels_old):
                break
            labels_old = labels
        labels = _assign(Xc, centers, rows)
        inertia = _inertia(Xc, centers, labels, rows)
    return centers + mean, labels, inertia, n_iter


# --------------------------------------------------------------------------------------------
# the torch row in the comparison


class TorchEntry(Entry):
    """Chunked GEMM + argmin Lloyd in torch (CUDA when available, else CPU)."""

    name = TORCH_ROW
    library = "torch"
    timed = "fit_torch (centering, iterations, final labelling and inertia), / iterations"
    memory_measured = "measured: torch.cuda.max_memory_allocated (includes X)"

    def __init__(self, w):
        self.w = w

    def check(self):
        if importlib.util.find_spec("torch") is None:
            raise Unavailable("torch is not installed (pip install torch)")
        self.dev = default_device()
        self.device = "gpu" if self.dev == "cuda" else "cpu"
        self.name = f"{TORCH_ROW}[{self.dev}]"
        cap = parse_memory(self.w.max_memory)
        self.budget = None if cap == "auto" else cap

    def sync(self):
        synchronize(self.dev)

    def memory_scope(self, peak=True):
        return TorchPeak(torch(), peak) if self.dev == "cuda" else NoPeak()

    def to_input(self, X):
        return torch().from_numpy(X).to(self.dev)

    def fit(self, Xb, C, iters) -> Fitted:
        Ct = torch().from_numpy(C).to(self.dev)
        t0 = time.perf_counter()
        centers, labels, inertia, n_iter = fit_torch(Xb, Ct, iters, budget=self.budget)
        self.sync()
        return Fitted(labels, centers, inertia, n_iter, time.perf_counter() - t0, {})

    def estimate(self):
        itemsize = np.dtype(self.w.dtype).itemsize
        return int(memory_estimate(self.w.n, self.w.k, self.w.d, itemsize, self.budget))
