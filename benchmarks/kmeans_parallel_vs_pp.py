"""k-means|| vs k-means++: init time, and inertia and iterations of the fit that follows.

    python benchmarks/kmeans_parallel_vs_pp.py                      # n=1M, d=3, k=200
    python benchmarks/kmeans_parallel_vs_pp.py --n 100000 --k 50 --seeds 0 --out /tmp/r.json

Two workloads: the seed's data (two unit Gaussians at +-1, `kmeans_xp.tools.data.seed_data`) and
asymmetric blobs with k centers (`kmeans_xp.tools.data.blobs`). For each seed, both inits run
through `KMeans(..., init=..., random_state=seed, max_iter=300)` on one backend, so the two
differ only in their initial centers. Writes JSON (machine, settings, every run, a summary).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np


def machine():
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine()}
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["cpu_model"] = names[0]
    except (OSError, AttributeError):
        pass
    return info


def workload(name, n, d, k, dtype):
    from kmeans_xp.tools.data import blobs, seed_data
    if name == "seed":
        return seed_data(n, d, dtype=dtype)
    if name == "blobs":
        return blobs(n, d, k, dtype=dtype, random_state=1)
    raise ValueError(f"unknown workload {name!r}: 'seed' or 'blobs'")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--k", type=int, default=200)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--max-iter", type=int, default=300)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--workloads", nargs="+", default=["seed", "blobs"])
    p.add_argument("--warmup", action="store_true",
                   help="first fit both inits on a small slice (GPU backends compile their "
                        "kernels on first use, which would land in the first timed init)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                 "kmeans_parallel_cpu.json"))
    args = p.parse_args(argv)

    from kmeans_xp import KMeans

    try:
        load_start = os.getloadavg()
    except (OSError, AttributeError):
        load_start = None
    runs = []
    for wl in args.workloads:
        X = workload(wl, args.n, args.d, args.k, np.dtype(args.dtype))
        if args.warmup:
            for init in ("k-means||", "k-means++"):
                KMeans(args.k, init=init, random_state=0, max_iter=2,
                       backend=args.backend).fit(X[:max(20 * args.k, 10_000)])
        for seed in args.seeds:
            for init in ("k-means||", "k-means++"):
                t0 = time.perf_counter()
                km = KMeans(args.k, init=init, random_state=seed, max_iter=args.max_iter,
                            backend=args.backend).fit(X)
                run = {"workload": wl, "seed": seed, "init": init,
                       "init_s": km.timings_["init"], "lloyd_s": km.timings_["lloyd"],
                       "fit_s": time.perf_counter() - t0, "n_iter": km.n_iter_,
                       "inertia": km.inertia_}
                runs.append(run)
                print(f"{wl:6s} seed {seed} {init:10s} init {run['init_s']:8.2f} s   lloyd "
                      f"{run['lloyd_s']:8.2f} s ({run['n_iter']:3d} it)   inertia "
                      f"{run['inertia']:.6g}", flush=True)

    summary = {}
    for wl in args.workloads:
        pairs = [(a, b) for a in runs for b in runs if a["workload"] == b["workload"] == wl
                 and a["seed"] == b["seed"] and a["init"] == "k-means||"
                 and b["init"] == "k-means++"]
        summary[wl] = {
            "init_speedup_median": statistics.median(b["init_s"] / a["init_s"] for a, b in pairs),
            "inertia_ratio_par_over_pp": [a["inertia"] / b["inertia"] for a, b in pairs],
            "inertia_ratio_mean": statistics.fmean(a["inertia"] / b["inertia"] for a, b in pairs),
            "init_s_par": [a["init_s"] for a, _ in pairs],
            "init_s_pp": [b["init_s"] for _, b in pairs],
            "fit_s_par": [a["fit_s"] for a, _ in pairs],
            "fit_s_pp": [b["fit_s"] for _, b in pairs],
        }
        s = summary[wl]
        print(f"{wl}: k-means|| init {s['init_speedup_median']:.1f}x faster (median); inertia "
              f"after fit k-means|| / k-means++ = {s['inertia_ratio_mean']:.4f} (mean)")
    info = machine()
    info["load_average_at_start"] = load_start
    try:
        info["load_average_at_end"] = os.getloadavg()
    except (OSError, AttributeError):
        pass
    from kmeans_xp.algorithms.init import KMEANS_PARALLEL_OVERSAMPLING, KMEANS_PARALLEL_ROUNDS
    result = {"benchmark": "kmeans_parallel_vs_pp", "machine": info,
              "settings": {**vars(args), "oversampling_factor": KMEANS_PARALLEL_OVERSAMPLING,
                           "rounds": KMEANS_PARALLEL_ROUNDS,
                           "argv": sys.argv[1:] if argv is None else list(argv)},
              "runs": runs, "summary": summary}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
