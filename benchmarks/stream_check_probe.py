"""Correctness of fits of a host X streamed through the GPU at n=1e9 (12 GB) under a 15 GiB
pool limit: the streamed pass's mean against NumPy's float64 one, three times in one process;
then streamed fits (X page-locked twice, then staged) and the in-memory fit from the same
init, which must give the same inertia and labels (--fits-only: the streamed fits alone).

    python benchmarks/stream_check_probe.py [--n 1e9] [--fits-only]
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
    ap.add_argument("--fits-only", action="store_true", help="only the fits, X on the host")
    args = ap.parse_args()
    import cupy as cp

    from kmeans_xp import KMeans
    from kmeans_xp.namespaces import to_numpy
    n, k = int(args.n), args.k
    X, init = make_host_data(cp, n, 3, k)
    if not args.fits_only:
        means(cp, X, n)
    fits = [{"stream": True, "pin_input": True}, {"stream": True, "pin_input": True},
            {"stream": True, "pin_input": False}]
    if not args.fits_only:
        fits.append({"stream": False})
    cp.get_default_memory_pool().set_limit(size=15 << 30)
    for opts in fits:
        if opts.get("stream") is False:
            cp.get_default_memory_pool().set_limit(size=0)
        t0 = time.perf_counter()
        km = KMeans(k, init=init, n_init=1, max_iter=3, tol=0, backend="cupy-kernels",
                    backend_options=opts).fit(X)
        lab = to_numpy(km.labels_[: 10**7])
        print(json.dumps({"options": opts, "s": time.perf_counter() - t0,
                          "inertia": km.inertia_, "mean": to_numpy(km._X_mean).tolist(),
                          "labels_sha": hashlib.sha1(lab.tobytes()).hexdigest()[:10],
                          "timings": {a: round(float(v), 3) for a, v in km.timings_.items()}}),
              flush=True)
        del km
        cp.get_default_memory_pool().free_all_blocks()


def means(cp, X, n):
    from kmeans_xp import get_backend
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


if __name__ == "__main__":
    main()
