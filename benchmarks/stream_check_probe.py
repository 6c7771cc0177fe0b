"""Correctness of fits of a host X streamed through the GPU at n=1e9 (12 GB) under a 15 GiB
pool limit: the streamed pass's mean against NumPy's float64 one, three times in one process;
then streamed fits (X page-locked twice, then staged) and the in-memory fit from the same
init, which must give the same inertia and labels (--fits-only: the streamed fits alone).

    python benchmarks/stream_check_probe.py [--n 1e9] [--fits-only]
"""
import argparse
import json
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from stream_fit_probe import fit_row  # noqa: E402
from streaming_probe import make_host_data  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, default=1e9)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--fits-only", action="store_true", help="only the fits, X on the host")
    args = ap.parse_args()
    import cupy as cp
    n, k = int(args.n), args.k
    X, init = make_host_data(cp, n, 3, k)
    if not args.fits_only:
        means(cp, X, n)
    fits = [{"stream": True, "pin_input": True}, {"stream": True, "pin_input": True},
            {"stream": True, "pin_input": False}]
    for opts in fits:
        print(json.dumps(fit_row(cp, X, init, "cupy-kernels", 3, options=opts)), flush=True)
    if not args.fits_only:
        print(json.dumps(fit_row(cp, X, init, "cupy-kernels", 3, limit=0,
                                 options={"stream": False})), flush=True)


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
