"""Where a whole numpy-backend fit's time goes on all cores (`timings_`: validation, stats,
init, Lloyd, final pass), beside scikit-learn's fit of the same data, init and iterations.

    python benchmarks/cpu_fit_parts.py [--only W1,d128] [--iters 10] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from cpu_probe import WORKLOADS, data, median_time, start_worker_pool


def parts(X, init, iters, repeats, backend="numpy"):
    from kmeans_xp import KMeans
    runs = []
    for _ in range(repeats + 1):   # the first is a warm-up
        t0 = time.perf_counter()
        km = KMeans(init.shape[0], init=init, max_iter=iters, tol=0, backend=backend).fit(X)
        wall = time.perf_counter() - t0
        runs.append({"wall": wall, **{k: v for k, v in km.timings_.items()
                                      if isinstance(v, float)}})
    runs = runs[1:]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def sklearn_fit(X, init, iters, repeats):
    from sklearn.cluster import KMeans as SK
    return median_time(lambda: SK(init.shape[0], init=init, n_init=1, max_iter=iters, tol=0,
                                  algorithm="lloyd").fit(X), repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default="W1,d128")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    start_worker_pool()
    for name in args.only.split(","):
        X, init = data(*WORKLOADS[name])
        ours = parts(X, init, args.iters, args.repeats)
        sk = sklearn_fit(X, init, args.iters, args.repeats)
        print(name, json.dumps({"numpy": {k: round(v * 1e3, 1) for k, v in ours.items()},
                                "sklearn fit ms": round(sk * 1e3, 1)}), flush=True)


if __name__ == "__main__":
    main()
