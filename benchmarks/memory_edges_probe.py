"""The measured pool peak of device-X fits against `estimate_memory`, under a 15 GiB pool
limit (a 16 GB card): W1-W3 and n = 200M, 500M (d=3, float32, 3 iterations from a given init,
k-means++ at W1), every CuPy backend and "auto". One JSON row per fit: the fit's own peak
(pool peak - what was held before + X), the estimate's total, the backend that ran, whether X
was centered chunk by chunk, seconds."""
import json
import sys
import time

import cupy as cp
import numpy as np

from kmeans_xp import KMeans, KMeansMemoryError, estimate_memory

GiB = 2**30
CASES = [(2_000_000, 200, "k-means++"), (2_000_000, 500, "array"), (20_000_000, 1000, "array"),
         (200_000_000, 1000, "array"), (500_000_000, 1000, "array")]
pool = cp.get_default_memory_pool()
pool.set_limit(size=15 * GiB)
for n, k, init in CASES:
    pool.free_all_blocks()
    rs = cp.random.RandomState(0)
    X = rs.standard_normal((n, 3), dtype=cp.float32)
    X *= cp.asarray([1.0, 1.7, 2.4], dtype=cp.float32)
    X += cp.asarray([0.0, 3.0, -6.0], dtype=cp.float32)
    if init == "array":
        init = cp.asnumpy(X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))])
    for name in ("cupy-kernels", "cupy-chunked", "cupy-fused", "auto"):
        for copy_x in (True, False):
            if copy_x is False and name != "cupy-fused":
                continue
            pool.free_all_blocks()
            base = pool.used_bytes()
            row = {"n": n, "k": k, "backend": name, "copy_x": copy_x}
            t0 = time.perf_counter()
            try:
                km = KMeans(k, init=init, n_init=1, max_iter=3, tol=0, copy_x=copy_x,
                            backend=name, random_state=0).fit(X)
            except KMeansMemoryError as exc:
                row["error"] = str(exc)[:200]
                print(json.dumps(row), flush=True)
                continue
            cp.cuda.Device().synchronize()
            est = estimate_memory(n, 3, k, dtype="float32", backend=km.backend_)
            row.update(ran=km.backend_, seconds=round(time.perf_counter() - t0, 3),
                       fit_peak_GB=round(
                           (max(km.memory_report_.values()) - base + X.nbytes) / 1e9, 3),
                       estimate_GB=round(est.total / 1e9, 3),
                       chunkwise="stream" in km.memory_report_,
                       per_iteration_ms=round(km.timings_["per_iteration"] * 1e3, 2))
            row["within"] = row["fit_peak_GB"] <= row["estimate_GB"]
            print(json.dumps(row), flush=True)
            del km
    del X
print("done", file=sys.stderr)
