"""Correctness of fits of a host X streamed through the GPU at n=1e9 (12 GB): the streamed
pass's mean against NumPy's (float64, exact to rounding), three times in one process; then
streamed fits (page-locked X, staged X) against the in-memory fit from the same init.

    python benchmarks/stream_check_probe.py [--n 1e9]
"""
import argparse
import hashlib
import json
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from streaming_probe import make_host_data  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, default=1e9)
    ap.add_argument("--k", type=int, default=1000)
    args = ap.parse_args()
    import cupy as cp

    from kmeans_xp import KMeans, get_backend
    n, k = int(args.n), args.k
    X, init = make_host_data(cp, n, 3, k)
    t0 = time.perf_counter()
    exact = np.zeros(3)
    for s in range(0, n, 1 << 26):
        exact += X[s:s + (1 << 26)].sum(axis=0, dtype=np.float64)
    exact /= n
    print(json.dumps({"numpy_mean": exact.tolist(), "s": time.perf_counter() - t0}), flush=True)
    for pin in (True, True, False):
        b = get_backend("cupy-kernels")(stream=True, pin_input=pin)
        mean, tol = b.placement.feature_stats(X, 1e-4, xp=np)
        b.placement.finish()
        print(json.dumps({"pin_input": pin, "stream_mean": np.asarray(mean).tolist(),
                          "rel_err": float(np.max(np.abs(mean - exact) / np.abs(exact))),
                          "tol": tol}), flush=True)
    cp.get_default_memory_pool().set_limit(size=15 << 30)
    for opts in ({"stream": True, "pin_input": True}, {"stream": True, "pin_input": False},
                 {"stream": True, "pin_input": True}, {"stream": False}):
        if opts.get("stream") is False:
            cp.get_default_memory_pool().set_limit(size=0)
        t0 = time.perf_counter()
        km = KMeans(k, init=init, n_init=1, max_iter=3, tol=0, backend="cupy-kernels",
                    backend_options=opts).fit(X)
        lab = np.asarray(km.labels_[: 10**7])
        print(json.dumps({"options": opts, "s": time.perf_counter() - t0,
                          "inertia": km.inertia_, "mean": np.asarray(km._X_mean).tolist(),
                          "labels_dtype": str(km.labels_.dtype),
                          "labels_sha": hashlib.sha1(lab.tobytes()).hexdigest()[:10],
                          "centers0": np.asarray(km.cluster_centers_[:2]).tolist(),
                          "timings": {a: round(float(v), 3) for a, v in km.timings_.items()}}),
              flush=True)
        del km
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
