"""CPU rows side by side on one machine: the numpy backend against scikit-learn (and faiss-cpu
when installed), per Lloyd iteration and for k-means++, with the numpy backend's block sizes
varied so the best can be chosen from measurements.

    python benchmarks/cpu_probe.py --out cpu.json [--quick]

Same data, same init, tol=0 and a fixed iteration count; per iteration = fit time of `iters`
iterations / iters (sklearn's fit includes its own validation, as ours does), median of
`--repeats`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

WORKLOADS = {"W1": (2_000_000, 3, 200), "W2": (2_000_000, 3, 500),
             "d128": (200_000, 128, 1024)}
if os.environ.get("KMEANS_XP_PROBE_TINY"):   # a smoke run of the script itself
    WORKLOADS = {"W1": (20_000, 3, 20), "d128": (2_000, 128, 16)}


def data(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(k, d)).astype(np.float32)
    X = centers[rng.integers(0, k, size=n)] + rng.normal(size=(n, d)).astype(np.float32)
    return X, X[rng.choice(n, k, replace=False)].copy()


def median_time(fn, repeats, warm=True):
    if warm:
        fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def lloyd_rows(X, init, iters, repeats, variants):
    import kmeans_xp_backends.numpy_ as nb
    from sklearn.cluster import KMeans as SK

    from kmeans_xp import KMeans
    k = init.shape[0]
    rows = {"sklearn": median_time(lambda: SK(k, init=init, n_init=1, max_iter=iters, tol=0,
                                              algorithm="lloyd").fit(X), repeats) / iters}
    try:
        import faiss
        def fa():
            km = faiss.Kmeans(X.shape[1], k, niter=iters, seed=0, max_points_per_centroid=10**9)
            km.train(X, init_centroids=init)
        rows["faiss"] = median_time(fa, repeats) / iters
    except ImportError:
        pass
    defaults = (nb.TARGET_BLOCK_BYTES, nb.TARGET_TASK_ROWS, nb.SORTED_SUMS_MIN_D)
    for block_bytes, task_rows, threads, *sorted_d in variants:
        nb.TARGET_BLOCK_BYTES, nb.TARGET_TASK_ROWS = block_bytes, task_rows
        nb.SORTED_SUMS_MIN_D = sorted_d[0] if sorted_d else defaults[2]
        opts = {} if threads is None else {"n_threads": threads}
        sums = "" if not sorted_d else (" sums=sorted" if sorted_d[0] == 0 else " sums=bincount")
        rows[f"numpy block={block_bytes >> 10}K task={task_rows} threads={threads or 'all'}"
             f"{sums}"] = median_time(lambda: KMeans(
                 k, init=init, max_iter=iters, tol=0, backend="numpy",
                 backend_options=opts).fit(X), repeats) / iters
    nb.TARGET_BLOCK_BYTES, nb.TARGET_TASK_ROWS, nb.SORTED_SUMS_MIN_D = defaults
    return rows


def plusplus_rows(n, k, repeats):
    from array_api_compat import numpy as xp
    from sklearn.cluster import kmeans_plusplus

    from kmeans_xp.init import kmeans_plusplus as ours
    X, _ = data(n, 3, k, seed=1)
    # (plain NumPy on both sides: nothing to compile, no warm-up run)
    return {"sklearn kmeans_plusplus": median_time(lambda: kmeans_plusplus(
                X, k, random_state=0), repeats, warm=False),
            "kmeans_xp kmeans_plusplus": median_time(lambda: ours(
                X, k, sample_weight=None, random_state=np.random.RandomState(0), xp=xp,
                rows=n), repeats, warm=False)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="defaults only, no variants")
    args = ap.parse_args()
    import kmeans_xp_backends.numpy_ as nb
    default = (nb.TARGET_BLOCK_BYTES, nb.TARGET_TASK_ROWS)
    variants = [(*default, None), (*default, 1)]
    if not args.quick:  # the sums both ways; the earlier 512 KiB sub-chunks
        variants += [(*default, None, 0), (*default, None, 10**9),
                     (512 << 10, 1 << 16, None), (4 << 20, 1 << 16, None)]
    out = {"cores": len(os.sched_getaffinity(0)), "iters": args.iters, "workloads": {}}
    for name, (n, d, k) in WORKLOADS.items():
        X, init = data(n, d, k)
        # one thread only where the scaling target is (W1): it is slow
        mine = [v for v in variants if v[2] is None or name == "W1"]
        out["workloads"][name] = lloyd_rows(X, init, args.iters, args.repeats, mine)
        print(name, json.dumps(out["workloads"][name]), flush=True)
    pp_n, pp_k = (500_000, 500) if not os.environ.get("KMEANS_XP_PROBE_TINY") else (5000, 20)
    out["kmeans_plusplus n=500000 k=500"] = plusplus_rows(pp_n, pp_k, 1)
    print(json.dumps(out["kmeans_plusplus n=500000 k=500"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
