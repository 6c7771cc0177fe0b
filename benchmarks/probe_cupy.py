"""Timing probe for `cupy-kernels` and `cupy-chunked`: ms per Lloyd iteration on the issue's
workloads (float32), with the issue's targets.

    python benchmarks/probe_cupy.py OUT.json [--quick]

W1 n=2M d=3 k=200, W3 n=20M d=3 k=1000, W5 n=1M d=128 k=4096 (targets: cupy-chunked W3 <=
150 ms, W5 <= 45 ms; cupy-kernels W3 <= 60 ms). One iteration is what a fit does per
iteration through the driver (`kmeans_xp.algorithms.lloyd`): the backend's `lloyd_iter` (assignment,
per-cluster sums, inertia and changed labels), the driver's center update, the one small
fetch of the statistics (and a relocation when a cluster is empty). It is timed as the
difference of two `KMeans.fit` runs from the same centers with tol=0 (max_iter=2 and 2+m,
device-resident X), so setup and the final pass cancel out; warm-up first, the device
synchronised before every clock read, median of repeats. The labels of one assignment are
compared with the numpy backend's on a subsample (cupy-kernels: identical).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import numpy as np
from probe_fused import make_data  # same device data as the fused probe (same folder)

WORKLOADS = {"W1": (2_000_000, 3, 200), "W3": (20_000_000, 3, 1000),
             "W5": (1_000_000, 128, 4096)}
TARGET_MS = {("cupy-chunked", "W3"): 150.0, ("cupy-chunked", "W5"): 45.0,
             ("cupy-kernels", "W3"): 60.0}


def per_iteration(cp, backend, X, w, init, m, repeats):
    from kmeans_xp import KMeans
    C = cp.asnumpy(init)

    def run(iters):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        KMeans(C.shape[0], init=C, n_init=1, max_iter=iters, tol=0.0,
               backend=backend.name).fit(X, sample_weight=w)
        cp.cuda.Device().synchronize()
        return time.perf_counter() - t0

    run(2)  # warm-up: compilation, pool growth
    diffs = [(run(2 + m) - run(2)) / m for _ in range(repeats)]
    return statistics.median(diffs), diffs


def agreement(cp, backend, X, init, sample=200_000):
    """Fraction of a subsample's labels equal to the numpy backend's, same centers."""
    from kmeans_xp import get_backend
    n = X.shape[0]
    idx = np.sort(np.random.default_rng(1).choice(n, min(sample, n), replace=False))
    labels = cp.asnumpy(backend.assign(X, init).labels)[idx]
    Xs, C = cp.asnumpy(X[cp.asarray(idx)]), cp.asnumpy(init)
    ref = get_backend("numpy")().assign(Xs, C).labels
    return float(np.mean(labels == ref))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    args = p.parse_args(argv)
    import cupy as cp

    from kmeans_xp import get_backend

    repeats, m = (2, 3) if args.quick else (3, 5)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    out = {"gpu": name.decode() if isinstance(name, bytes) else name, "cupy": cp.__version__,
           "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "numpy": np.__version__,
           "python": platform.python_version(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "method": f"(t(max_iter=2+{m}) - t(max_iter=2)) / {m}, median of {repeats}",
           "results": {}}
    for wl, (n, d, k) in WORKLOADS.items():
        X, init = make_data(cp, n, d, k)
        w = cp.ones(n, dtype=cp.float32)
        for bname in ("cupy-kernels", "cupy-chunked"):
            b = get_backend(bname)()
            ms, all_s = per_iteration(cp, b, X, w, init, m, repeats)
            ms *= 1e3
            agree = agreement(cp, b, X, init)
            target = TARGET_MS.get((bname, wl))
            out["results"][f"{bname} {wl}"] = {
                "n": n, "d": d, "k": k, "ms_per_iteration": ms,
                "all_ms": [t * 1e3 for t in all_s], "pairs_per_s": n * k / (ms / 1e3),
                "target_ms": target, "meets_target": None if target is None else ms <= target,
                "label_agreement_with_numpy": agree}
            print(f"{bname:13s} {wl}: {ms:8.2f} ms/iteration, {n * k / (ms / 1e3):.2e} "
                  f"pairs/s, agreement with numpy {agree:.6f}"
                  + ("" if target is None else f" (target <= {target:.0f} ms: "
                     f"{'met' if ms <= target else 'MISSED'})"))
            b.finish()
        del X, init, w
        cp.get_default_memory_pool().free_all_blocks()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
