"""flash-kmeans (`pip install flash-kmeans`: torch + Triton kernels on a CUDA GPU) as rows of the
comparison, in float32 (its GEMM under TF32 math) and float16.

`flash_kmeans.batch_kmeans_Euclid(x, k, max_iters, tol, init_centroids)` on X of shape
(1, n, d) in the row's dtype from the shared init: it runs `max_iters` iterations unless its
own center-shift test (`max ||c_new - c|| < tol`) stops it, so with tol=0 it runs them all.
Its labels are those of the last assignment (before the last update): the inertia column,
computed on the host in float64 afterwards, pairs them with the returned centers. The row's
clock covers the call, the device synchronised; the copy of X to the device and into the
row's dtype is the timed transfer. Imported only when the row runs.
"""
from __future__ import annotations

import importlib
import importlib.util
import time

import numpy as np

from kmeans_xp.tools.bench.protocol import Entry, Fitted, TorchPeak, Unavailable

FLASH_FP32_ROW = "flash-kmeans[fp32]"
FLASH_FP16_ROW = "flash-kmeans[fp16]"
_DTYPES = {FLASH_FP32_ROW: "float32", FLASH_FP16_ROW: "float16"}


class FlashEntry(Entry):
    """flash-kmeans' batched Triton Lloyd on one problem, in float32 or float16."""

    library = "flash-kmeans"
    device = "gpu"
    timed = "batch_kmeans_Euclid (iterations; labels of the last assignment), / iterations"
    memory_measured = "measured: torch.cuda.max_memory_allocated (includes X)"

    def __init__(self, w, spec=FLASH_FP32_ROW):
        self.w, self.name = w, spec
        self.dtype = _DTYPES[spec]

    def check(self):
        for module in ("torch", "flash_kmeans"):
            if importlib.util.find_spec(module) is None:
                raise Unavailable(f"{module} is not installed (pip install flash-kmeans)")
        self.torch = importlib.import_module("torch")
        if not self.torch.cuda.is_available():
            raise Unavailable("flash-kmeans runs on a CUDA GPU; torch sees none")
        self.flash = importlib.import_module("flash_kmeans")
        self.tdtype = getattr(self.torch, self.dtype)

    def sync(self):
        self.torch.cuda.synchronize()

    def memory_scope(self, peak=True):
        return TorchPeak(self.torch, peak)

    def to_input(self, X):
        return self.torch.from_numpy(X).to("cuda").to(self.tdtype)[None]

    def fit(self, Xb, C, iters) -> Fitted:
        init = self.torch.from_numpy(np.ascontiguousarray(C)).to("cuda").to(self.tdtype)[None]
        self.sync()
        t0 = time.perf_counter()
        labels, centers, n_iter = self.flash.batch_kmeans_Euclid(
            Xb, len(C), max_iters=iters, tol=float(self.w.tol), init_centroids=init)
        self.sync()
        elapsed = time.perf_counter() - t0
        return Fitted(labels[0], centers[0].float(), None, int(n_iter), elapsed, {},
                      f"flash-kmeans {self.dtype}")

    def data_bytes(self, w):
        return w.n * w.d * np.dtype(self.dtype).itemsize
