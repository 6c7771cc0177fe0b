"""Small device probes behind the fit profile: where the fixed costs of a short cupy-fused
fit go (each backend call timed between two device synchronisations), and what one k-means++
candidate step costs on the host and on the device (cupyx.profiler.benchmark); `torch_w3`
(not run by default) times a W3 fit from a CUDA torch tensor against the same CuPy input.

    python benchmarks/micro_probe.py --out micro.txt
"""
from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from regression_probe import WORKLOADS, data  # noqa: E402


def fit_breakdown(cp, out):
    from kmeans_xp_backends.cupy import fused

    from kmeans_xp import KMeans
    n, d, k = WORKLOADS["W1"]
    X, init = data(n, d, k)
    Xg = cp.asarray(X)
    spent = collections.defaultdict(float)
    calls = collections.Counter()
    cls = fused.CupyFusedBackend
    names = ("lloyd_iter", "assign", "inertia", "_plan_for", "_workspace", "_scales")
    saved = {m: getattr(cls, m) for m in names}

    def timed(name, fn):
        def wrapper(*a, **kw):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            r = fn(*a, **kw)
            cp.cuda.Device().synchronize()
            spent[name] += time.perf_counter() - t
            calls[name] += 1
            return r
        return wrapper
    km = KMeans(k, init=init, n_init=1, max_iter=10, tol=0, backend="cupy-fused")
    km.fit(Xg)
    for m in names:
        setattr(cls, m, timed(m, saved[m]))
    try:
        km.fit(Xg)
    finally:
        for m in names:
            setattr(cls, m, saved[m])
    out.write(f"W1 cupy-fused fit, backend calls between syncs: lloyd "
              f"{km.timings_['lloyd'] * 1e3:.2f} ms; " + ", ".join(
                  f"{m} {calls[m]}x {spent[m] * 1e3:.3f} ms" for m in names) + "\n")


def candidate_step(cp, out):
    from cupyx.profiler import benchmark

    from kmeans_xp.algorithms.init import sq_dist
    X, _ = data(500_000, 3, 500, seed=1)
    Xg = cp.asarray(X)
    XT = cp.ascontiguousarray(Xg.T)
    P = Xg[:8].copy()
    closest = cp.full(len(X), 10.0, dtype=cp.float32)

    def direct():
        return sq_dist(Xg, P, cp)

    def transposed():  # (L, n): contiguous rows of X's transpose
        acc = None
        for j in range(3):
            diff = XT[j][None, :] - P[:, j][:, None]
            acc = diff * diff if acc is None else acc + diff * diff
        return acc

    def step():
        dist = cp.minimum(sq_dist(Xg, P, cp), closest[:, None])
        return cp.sum(dist, axis=0, dtype=cp.float64)

    def cumsum():
        return cp.cumsum(closest, dtype=cp.float64)
    for name, fn in (("sq_dist (n, 8) direct", direct), ("transposed (8, n)", transposed),
                     ("min + potentials", step), ("cumsum f64", cumsum)):
        r = benchmark(fn, n_repeat=50, n_warmup=5)
        out.write(f"{name}: cpu {np.mean(r.cpu_times) * 1e6:.0f} us, gpu "
                  f"{np.mean(r.gpu_times) * 1e6:.0f} us\n")


def big_host_fit(cp, out, n=200_000_000, k=1000, iters=3):
    """NumPy X of n x 3 float32 (2.4 GB) fitted on the device: the whole fit of `iters`
    iterations and the transfer's effective rate."""
    from kmeans_xp import KMeans, estimate_memory
    X = np.random.default_rng(0).standard_normal((n, 3), dtype=np.float32)
    init = X[:k].copy()
    for backend in ("cupy-fused", "cupy-kernels"):
        KMeans(k, init=init, n_init=1, max_iter=1, tol=0, backend=backend).fit(X[:1_000_000])
        t = time.perf_counter()
        km = KMeans(k, init=init, n_init=1, max_iter=iters, tol=0, backend=backend).fit(X)
        cp.cuda.Device().synchronize()
        wall = time.perf_counter() - t
        tm = km.timings_
        est = estimate_memory(n, 3, k, dtype="float32", backend=backend).total
        out.write(f"n={n} from NumPy, {backend}, {iters} iterations: fit {wall:.3f} s, transfer "
                  f"{X.nbytes / tm['transfer'] / 1e9:.1f} GB/s; " + ", ".join(
                      f"{key} {v:.3f}" for key, v in tm.items()) +
                  f"; pool peak {max(km.memory_report_.values()) / 2**30:.2f} GiB, estimate "
                  f"{est / 2**30:.2f} GiB\n")
        out.flush()
        del km
        cp.get_default_memory_pool().free_all_blocks()


def torch_w3(cp, out, iters=10, repeats=3):
    """W3 (n=20M, d=3, k=1000 float32) fitted with backend="auto" from a CUDA torch tensor
    (shared with CuPy through DLPack) and from the same data as a CuPy array: whole-fit wall
    time of `iters` iterations (tol=0, init from X's rows), median of `repeats` after a
    warm-up each, the device synchronised before and after. Not run by default (needs torch
    with CUDA)."""
    import statistics

    import torch

    from kmeans_xp import KMeans
    n, d, k = WORKLOADS["W3"]
    X, init = data(n, d, k)
    Xg = cp.asarray(X)
    Xt = torch.from_dlpack(Xg)  # the same device memory, as a torch tensor
    assert Xt.is_cuda and Xt.data_ptr() == Xg.data.ptr

    def fit(Xin):
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
        t = time.perf_counter()
        km = KMeans(k, init=init, n_init=1, max_iter=iters, tol=0, backend="auto").fit(Xin)
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
        return time.perf_counter() - t, km

    walls, names = {}, {}
    for where, Xin in (("cupy", Xg), ("torch", Xt)):
        fit(Xin)  # warm-up: kernels compile, pools grow
        runs = [fit(Xin) for _ in range(repeats)]
        walls[where] = statistics.median(r[0] for r in runs)
        names[where] = runs[-1][1].backend_
        assert runs[-1][1].n_iter_ == iters
    out.write(f"W3 n={n} d={d} k={k} float32, {iters} iterations, auto: CuPy input "
              f"({names['cupy']}) {walls['cupy']:.4f} s, CUDA torch tensor ({names['torch']}) "
              f"{walls['torch']:.4f} s, torch/cupy {walls['torch'] / walls['cupy']:.3f}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import cupy as cp
    with open(args.out, "w") as out:
        for probe in (fit_breakdown, candidate_step, big_host_fit, torch_w3):
            try:
                probe(cp, out)
            except Exception as exc:  # a probe's failure must not hide the others
                out.write(f"{probe.__name__} failed: {exc!r}\n")
            out.flush()
    print(open(args.out).read())


if __name__ == "__main__":
    main()
