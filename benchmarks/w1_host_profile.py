"""Where the host's time goes in a W1 cupy-fused fit from device X (new code only): cProfile
over 30 fits (top functions by own time), then the GPU time of one iteration's launches
(CUDA events) against the host time of `lloyd_iter` alone and of a whole fit's iteration."""
import cProfile
import pstats
import time

import cupy as cp
import numpy as np
from kmeans_xp_backends.cupy.fused import CupyFusedBackend
from regression_probe import WORKLOADS, data  # (this script's folder is on sys.path)

from kmeans_xp import KMeans

X, init = data(*WORKLOADS["W1"])
Xg = cp.asarray(X)


def fit():
    return KMeans(200, init=init, n_init=1, max_iter=10, tol=0, backend="cupy-fused").fit(Xg)


for _ in range(3):
    fit()
prof = cProfile.Profile()
prof.enable()
for _ in range(30):
    fit()
prof.disable()
st = pstats.Stats(prof)
st.sort_stats("tottime").print_stats(45)
st.sort_stats("cumulative").print_stats(45)

try:
    # the backend's iteration alone, host centers, no driver
    be = CupyFusedBackend()
    Xc = Xg - Xg.mean(axis=0)
    c = np.ascontiguousarray(init - X.mean(axis=0))
    it = be.lloyd_iter(Xc, None, c, None)
    for label, _sync in (("lloyd_iter only (reads, host centers)", False),):
        t0 = time.perf_counter()
        for _ in range(200):
            it = be.lloyd_iter(Xc, None, c, it.labels)
        print(label, f"{(time.perf_counter() - t0) / 200 * 1e6:.1f} us per call")
    cd = cp.asarray(c)
    it = be.lloyd_iter(Xc, None, cd, None)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        it = be.lloyd_iter(Xc, None, cd, it.labels)
    t_host = (time.perf_counter() - t0) / 200
    cp.cuda.Device().synchronize()
    t_all = (time.perf_counter() - t0) / 200
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(200):
        it = be.lloyd_iter(Xc, None, cd, it.labels)
    e1.record()
    e1.synchronize()
    print(f"lloyd_iter, device centers: host {t_host * 1e6:.1f} us per call to issue, "
          f"{t_all * 1e6:.1f} us per call issued and run; "
          f"GPU {cp.cuda.get_elapsed_time(e0, e1) / 200 * 1e3:.1f} us per iteration")
    km = fit()
    print("fit: lloyd ms", km.timings_["lloyd"] * 1e3, "per iteration us",
          km.timings_["lloyd"] / km.n_iter_ * 1e6)
except Exception as exc:  # (the profile above is the point)
    print('backend-only timing failed:', repr(exc))
