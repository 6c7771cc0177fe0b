"""
The same fit on the CPU and on the GPU
======================================

Needs CuPy and a CUDA GPU. The seed's workload (n points in 3 dimensions) fitted from the
same initial centers on the ``numpy`` backend and on ``cupy-fused``: the same partition,
and the time and device memory of each.
"""
import time

import cupy
import numpy as np

from kmeans_xp import KMeans

n, k = 2_000_000, 200
X = np.random.default_rng(0).standard_normal((n, 3), dtype=np.float32)
C0 = X[np.random.default_rng(1).choice(n, k, replace=False)]

fits = {}
for backend in ("numpy", "cupy-fused"):
    km = KMeans(k, init=C0, n_init=1, max_iter=20, tol=0, backend=backend)
    km.fit(X[:10_000])                      # warm-up: kernels compiled and loaded
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    fits[backend] = km.fit(X)
    cupy.cuda.Device().synchronize()
    print(f"{backend:11} {time.perf_counter() - t0:6.3f} s  inertia {km.inertia_:.6g}  "
          f"memory {km.memory_report_}")

agree = (fits["numpy"].labels_ == fits["cupy-fused"].labels_).mean()
print(f"label agreement: {agree:.5f}")
