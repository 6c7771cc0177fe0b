"""Per-iteration and whole-fit time of the CuPy backends, through the public API only, so the
same script times two versions of the code side by side (the one-loop issue's check).

    python benchmarks/regression_probe.py --label new --out results.json

Per workload and backend: the median over `--repeats` fits (after one warm-up fit) of
`timings_["lloyd"] / n_iter_` (the loop, the final pass and inertia included) and of the whole
`fit` wall time, from device-resident X (CuPy) and from host X (NumPy). Same data, same init,
tol=0 and a fixed iteration count, device synchronised before every clock read.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

import numpy as np

WORKLOADS = {"W1": (2_000_000, 3, 200), "W3": (20_000_000, 3, 1000),
             "W5": (1_000_000, 128, 4096)}
BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")


def data(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(k, d)).astype(np.float32)
    X = centers[rng.integers(0, k, size=n)] + rng.normal(size=(n, d)).astype(np.float32)
    init = X[rng.choice(n, k, replace=False)].copy()
    return X.astype(np.float32), init


def time_fit(KMeans, cp, X, init, backend, iters):
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    km = KMeans(init.shape[0], init=init, n_init=1, max_iter=iters, tol=0,
                backend=backend).fit(X)
    cp.cuda.Device().synchronize()
    wall = time.perf_counter() - t0
    labels = km.labels_.get() if hasattr(km.labels_, "get") else np.asarray(km.labels_)
    return (wall, km.timings_["lloyd"] / km.n_iter_, km.n_iter_, km.inertia_, labels,
            {k: float(v) for k, v in km.timings_.items()})


def run(args):
    import cupy as cp

    from kmeans_xp import KMeans
    out = {"label": args.label, "rows": []}
    for wname in args.workloads:
        n, d, k = WORKLOADS[wname]
        X, init = data(n, d, k)
        Xg = cp.asarray(X)
        for backend in args.backends:
            row = {"workload": wname, "backend": backend, "n": n, "d": d, "k": k}
            for where, Xin in (("device", Xg), ("host", X)):
                time_fit(KMeans, cp, Xin, init, backend, 2)  # warm-up: kernels compile
                runs = [time_fit(KMeans, cp, Xin, init, backend, args.iters)
                        for _ in range(args.repeats)]
                row[f"{where}_fit_s"] = statistics.median(r[0] for r in runs)
                row[f"{where}_per_iter_ms"] = statistics.median(r[1] for r in runs) * 1e3
                row["n_iter"], row["inertia"] = runs[-1][2], float(runs[-1][3])
                row["labels_sha1"] = hashlib.sha1(
                    runs[-1][4].astype(np.int64).tobytes()).hexdigest()[:12]
                row[f"{where}_timings"] = runs[-1][5]
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            cp.get_default_memory_pool().free_all_blocks()
    if args.init:
        out["init"] = init_times(KMeans, cp, args.repeats)
        print(json.dumps(out["init"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


def init_times(KMeans, cp, repeats, n=500_000, k=500):
    """Seconds of init (timings_["init"]) for k-means++ and k-means|| on device X."""
    X, _ = data(n, 3, k, seed=1)
    Xg = cp.asarray(X)
    rows = {}
    for backend in ("cupy-fused",):
        for method in ("k-means++", "k-means||"):
            def fit(method=method, backend=backend):
                return KMeans(k, init=method, n_init=1, max_iter=1, random_state=0,
                              backend=backend).fit(Xg).timings_["init"]
            fit()
            rows[f"{backend} {method}"] = statistics.median(fit() for _ in range(repeats))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--init", action="store_true", help="also time k-means++ / k-means||")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
