"""The CPU libraries users already run, as rows of the comparison: scikit-learn and faiss-cpu.

Each does the same work as the kmeans_xp rows: the shared init handed in as an array, one run
(n_init=1), `iters` Lloyd iterations with no tolerance stop, the final labels those of the
returned centers. What each clock covers is the row's `timed` text:
- scikit-learn: `KMeans(algorithm="lloyd", init=C, n_init=1, max_iter=iters, tol=0)`, the
  whole `fit()` (its validation and centering of X, O(n d), included; its final labelling pass
  too). It stops early, as the kmeans_xp driver does, only when no label changes.
- scikit-learn-elkan: the same with `algorithm="elkan"` (its bounds pay in fits to
  convergence: with `Workload.tol` > 0 both stop by scikit-learn's tol rule).
- faiss-cpu: `faiss.Kmeans(d, k, niter=iters, seed=..., max_points_per_centroid=10**9)` (no
  subsampling) trained with `init_centroids=C`, then one `index.search` for the labels of the
  final centers. faiss always runs `niter` iterations, computes in float32 (a float64 workload
  is copied to float32 in the timed transfer), has no tolerance (a fit to convergence
runs all `iters`), and splits a large cluster into an empty one
  where the others move an empty cluster's center to the farthest point.
Neither library exposes a measured peak, so their memory is an estimate of their arrays.
The libraries are imported only when their row runs.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import time

import numpy as np

from kmeans_xp.contract.chunks import usable_cores
from kmeans_xp.tools.bench.protocol import Entry, Fitted, Unavailable

SKLEARN_ROW = "scikit-learn"
SKLEARN_ELKAN_ROW = "scikit-learn-elkan"
FAISS_ROW = "faiss-cpu"


class SklearnEntry(Entry):
    """scikit-learn's KMeans(algorithm="lloyd") from the shared init."""

    name = SKLEARN_ROW
    algorithm = "lloyd"
    library = "scikit-learn"
    module = "sklearn"
    install = "pip install scikit-learn"
    timed = "the whole fit() (validation and centering of X included), / iterations"
    memory_estimated = ("estimate: scikit-learn's centered copy of X, weights, labels and "
                        "per-thread distance chunks, plus X")

    def __init__(self, w):
        self.w = w

    def check(self):
        if importlib.util.find_spec(self.module) is None:
            raise Unavailable(f"{self.library} is not installed ({self.install})")
        self.KMeans = importlib.import_module("sklearn.cluster").KMeans

    def fit(self, Xb, C, iters) -> Fitted:
        km = self.KMeans(self.w.k, init=C, n_init=1, max_iter=iters, tol=self.w.tol,
                         algorithm=self.algorithm, random_state=self.w.seed)
        t0 = time.perf_counter()
        km.fit(Xb)
        elapsed = time.perf_counter() - t0
        # inertia None: computed on the host in float64 afterwards, untimed, as for every
        # reference row, so the inertia column compares the partitions, not the summations
        return Fitted(km.labels_, km.cluster_centers_, None, int(km.n_iter_), elapsed, {})

    def estimate(self):
        n, d, k = self.w.n, self.w.d, self.w.k
        item = np.dtype(self.w.dtype).itemsize
        chunk = 256  # sklearn's lloyd works on blocks of 256 samples per thread
        return int(n * d * item + n * item + 2 * n * 4
                   + usable_cores() * chunk * (k + d) * item + 4 * k * (d + 1) * item)


class SklearnElkanEntry(SklearnEntry):
    """scikit-learn's KMeans(algorithm="elkan"): triangle-inequality bounds, the same
    partition; it pays in fits to convergence, once the centers settle."""

    name = SKLEARN_ELKAN_ROW
    algorithm = "elkan"

    def estimate(self):
        # Lloyd's arrays and Elkan's (n, k) lower bounds, upper bounds and center distances
        n, k = self.w.n, self.w.k
        item = np.dtype(self.w.dtype).itemsize
        return int(super().estimate() + n * k * item + n * item + k * k * item)


class FaissEntry(Entry):
    """faiss-cpu's Kmeans trained from the shared init, all points (no subsampling)."""

    name = FAISS_ROW
    library = "faiss"
    module = "faiss"
    install = "pip install faiss-cpu"
    dtype = "float32"            # faiss computes in float32 only
    timed = "train(init_centroids=...) + index.search for the final labels, / iterations"
    memory_estimated = ("estimate: faiss's assignment and distance blocks and centroids, "
                        "plus X in float32")

    def __init__(self, w):
        self.w = w

    def check(self):
        if importlib.util.find_spec(self.module) is None:
            raise Unavailable(f"{self.library} is not installed ({self.install})")
        self.faiss = importlib.import_module("faiss")

    def to_input(self, X):
        return np.ascontiguousarray(X, dtype=np.float32)

    @contextlib.contextmanager
    def threads_scope(self, threads):
        # faiss's own OpenMP setting, and threadpoolctl's for the BLAS it calls
        if threads is None:
            yield
            return
        before = self.faiss.omp_get_max_threads()
        self.faiss.omp_set_num_threads(int(threads))
        try:
            with super().threads_scope(threads):
                yield
        finally:
            self.faiss.omp_set_num_threads(before)

    def fit(self, Xb, C, iters) -> Fitted:
        n, d = Xb.shape
        km = self.faiss.Kmeans(d, len(C), niter=iters, seed=self.w.seed,
                               max_points_per_centroid=10**9, min_points_per_centroid=1)
        init = np.ascontiguousarray(C, dtype=np.float32)
        t0 = time.perf_counter()
        km.train(Xb, init_centroids=init)
        _, labels = km.index.search(Xb, 1)  # the index holds the final centroids
        elapsed = time.perf_counter() - t0
        # (faiss stops once the objective no longer changes: the iterations it ran are its
        # objective's entries, not niter)
        ran = len(getattr(km, "obj", ())) or iters
        return Fitted(labels[:, 0], km.centroids, None, ran, elapsed, {})

    def estimate(self):
        n, d, k = self.w.n, self.w.d, self.w.k
        block = 4096 * min(k, 1024) * 4  # IndexFlatL2's blocks of queries x centroids
        return int(n * (8 + 4) * 2 + usable_cores() * block + 4 * k * d * 4)

    def data_bytes(self, w):
        return w.n * w.d * 4
