"""Time a backend's primitives alone, beside the driver's iteration: `assign` (distances and
argmin), `reduce` (per-cluster sums), `lloyd_iter` (the fused pass), and a fit's
`timings_["per_iteration"]`. The gap between the pass and the driver's iteration is what
the loop around the kernels costs.

    python benchmarks/time_kernels.py                              # installed backends, W1
    python benchmarks/time_kernels.py --backends cupy-fused,cupy-kernels --workload W5
    python benchmarks/time_kernels.py --backends numpy --n 100k --d 3 --k 64 --repeats 5

Each primitive runs once untimed, then `--repeats` times with the device synchronised around
each call; the median is printed (ms). X is centered as the driver centers it, on the
backend's device (CuPy for the GPU backends). Only the contract's primitives and the public
API are used.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

WORKLOADS = {"W1": (2_000_000, 3, 200), "W3": (20_000_000, 3, 1000),
             "W5": (1_000_000, 128, 4096), "small": (200_000, 3, 100)}


def size(text):
    text = str(text).strip().lower()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def data(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(k, d)) * (1.0 + 0.5 * np.arange(d))
    X = (centers[rng.integers(0, k, size=n)] + rng.normal(size=(n, d))).astype(np.float32)
    return X, X[rng.choice(n, k, replace=False)].copy()


def default_backends():
    import kmeans_xp
    return [name for name, info in kmeans_xp.list_backends().items()
            if info.available and name not in ("array-api", "dask")]


def on_device(backend_name, X, C):
    """X and C on the backend's device, with their namespace and a synchronise function."""
    import array_api_compat
    import kmeans_xp
    info = kmeans_xp.list_backends()[backend_name]
    if info.gpu:
        import cupy
        X, C = cupy.asarray(X), cupy.asarray(C)

        def sync():
            cupy.cuda.Device().synchronize()
    else:
        def sync():
            pass
    return X, C, array_api_compat.array_namespace(X), sync


def timed(fn, sync, repeats):
    result = fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def time_backend(name, X_host, C_host, args):
    from kmeans_xp import KMeans, get_backend
    mean = X_host.mean(axis=0, dtype=np.float64).astype(np.float32)
    X, C, xp, sync = on_device(name, X_host - mean, C_host - mean)
    b = get_backend(name)()
    k = C.shape[0]
    row = {"backend": name}
    row["assign_ms"], res = timed(lambda: b.assign(X, C, xp=xp), sync, args.repeats)
    labels = res.labels
    row["reduce_ms"], _ = timed(lambda: b.reduce(X, labels, None, k, xp=xp), sync, args.repeats)
    row["lloyd_iter_ms"], _ = timed(lambda: b.lloyd_iter(X, None, C, labels, xp=xp), sync,
                                    args.repeats)
    Xfit, _, _, _ = on_device(name, X_host, C_host)
    fits = []
    for i in range(args.repeats + 1):
        km = KMeans(k, init=C_host, n_init=1, max_iter=args.iters, tol=0, backend=name)
        km.fit(Xfit)
        if i:
            fits.append(km.timings_["per_iteration"])
    row["driver_iteration_ms"] = statistics.median(fits)
    for key in list(row):
        if key.endswith("_ms"):
            row[key] *= 1e3
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", help="comma-separated (default: installed, but array-api, "
                                       "dask)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default=None)
    ap.add_argument("--n", type=size, default=None)
    ap.add_argument("--d", type=int, default=None)
    ap.add_argument("--k", type=size, default=None)
    ap.add_argument("--iters", type=int, default=10, help="iterations of the driver's fits")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--numba-widths", default=None,
                    help="the numba backend's register kernels to use, of 4,8, or 'none': "
                         "GEMM tiles at every d (default: all)")
    args = ap.parse_args(argv)
    if args.numba_widths is not None:
        import kmeans_xp_backends.numba.backend as numba_backend
        widths = tuple(int(w) for w in args.numba_widths.split(",") if w not in ("", "none"))
        if not set(widths) <= set(numba_backend.REGISTER_WIDTHS):
            ap.error(f"--numba-widths: of {numba_backend.REGISTER_WIDTHS} or none")
        numba_backend.REGISTER_WIDTHS = widths
    n, d, k = WORKLOADS[args.workload or "W1"]
    n, d, k = args.n or n, args.d or d, args.k or k
    names = args.backends.split(",") if args.backends else default_backends()
    X, C = data(n, d, k)
    print(f"n={n:,} d={d} k={k} float32; median of {args.repeats} (ms)")
    cols = ("assign_ms", "reduce_ms", "lloyd_iter_ms", "driver_iteration_ms")
    print(f"{'backend':<14}" + "".join(f"{c[:-3]:>18}" for c in cols))
    rows = []
    for name in names:
        try:
            row = time_backend(name, X, C, args)
        except Exception as exc:  # one backend's failure is its row, not the end of the run
            row = {"backend": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name:<14}  {row['error']}", flush=True)
        else:
            print(f"{name:<14}" + "".join(f"{row[c]:18.3f}" for c in cols), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "d": d, "k": k, "rows": rows}, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
