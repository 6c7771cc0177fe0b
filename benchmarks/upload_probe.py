"""The transfer of a NumPy X to the device and of labels back (`staging.upload`, `download`)
by staging chunk size and number of pinned buffers, and whole fits from NumPy X at n=200M
(d=3 float32, k=1000, 3 iterations, cupy-kernels and cupy-fused): the whole-fit issue's
"transfer >= 20 GB/s effective, whole fit of 3 iterations <= 1.0 s".

    python benchmarks/upload_probe.py --out upload.json [--n 2e8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def timed(cp, fn, repeats):
    times = []
    for _ in range(repeats):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        out = fn()
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t)
        del out
    return statistics.median(times), times


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=float, default=2e8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import cupy as cp
    from kmeans_xp_backends.cupy import staging

    from kmeans_xp import KMeans
    n = int(args.n)
    X = np.random.default_rng(0).standard_normal((n, 3), dtype=np.float32)
    labels = cp.asarray(np.random.default_rng(1).integers(0, 1000, n).astype(np.uint16))
    out = {"n": n, "bytes": X.nbytes, "upload": [], "download": [], "fits": []}
    default = (staging.UPLOAD_CHUNK_BYTES, staging.UPLOAD_BUFFERS)
    for chunk_mib in (16, 32, 64, 128):
        for buffers in (2, 3):
            staging.UPLOAD_CHUNK_BYTES, staging.UPLOAD_BUFFERS = chunk_mib << 20, buffers
            staging.upload(cp, X[: n // 10])  # warm-up: threads, pinned blocks
            up, ups = timed(cp, lambda: staging.upload(cp, X), args.repeats)
            down, downs = timed(cp, lambda: staging.download(cp, labels, np.int32),
                                args.repeats)
            row = {"chunk_mib": chunk_mib, "buffers": buffers, "upload_gbs": X.nbytes / up / 1e9,
                   "upload_s": ups, "labels_download_s": downs}
            out["upload"].append(row)
            print(json.dumps(row), flush=True)
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()
    staging.UPLOAD_CHUNK_BYTES, staging.UPLOAD_BUFFERS = default
    init = X[:1000].copy()
    for backend in ("cupy-kernels", "cupy-fused", "cupy-kernels"):
        KMeans(1000, init=init, n_init=1, max_iter=1, tol=0, backend=backend).fit(X[:10**6])
        t = time.perf_counter()
        km = KMeans(1000, init=init, n_init=1, max_iter=3, tol=0, backend=backend).fit(X)
        cp.cuda.Device().synchronize()
        wall = time.perf_counter() - t
        tm = {k: float(v) for k, v in km.timings_.items()}
        row = {"backend": backend, "fit_s": wall, "transfer_gbs": X.nbytes / tm["transfer"] / 1e9,
               "timings": tm, "inertia": float(km.inertia_)}
        out["fits"].append(row)
        print(json.dumps(row), flush=True)
        del km
        cp.get_default_memory_pool().free_all_blocks()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
