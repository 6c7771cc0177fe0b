"""Where cupy-fused's W1 Lloyd time goes, device X against host X (new code only): host
seconds inside each backend/placement call the driver makes, per fit, median of 10 fits."""
import collections
import functools
import statistics
import time

import cupy as cp
from kmeans_xp_backends.cupy import fused, host_centers, placement
from regression_probe import WORKLOADS, data  # (this script's folder is on sys.path)

from kmeans_xp import KMeans

spent = collections.defaultdict(float)


def timed(cls, name):
    fn = getattr(cls, name)

    @functools.wraps(fn)
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t0
    setattr(cls, name, wrapper)


for n in ("lloyd_iter", "assign", "inertia", "farthest", "_pack", "_assign_pass", "_finalize"):
    timed(fused.CupyFusedBackend, n)
timed(host_centers.HostCenters, "read")
for n in ("fetch", "persist", "small", "synchronize"):
    timed(placement.CupyPlacement, n)

X, init = data(*WORKLOADS["W1"])
for where, Xin in (("device", cp.asarray(X)), ("host", X), ("device", cp.asarray(X))):
    rows = collections.defaultdict(list)
    for r in range(12):
        spent.clear()
        km = KMeans(200, init=init, n_init=1, max_iter=10, tol=0, backend="cupy-fused").fit(Xin)
        if r >= 2:
            rows["lloyd (timings_)"].append(km.timings_["lloyd"])
            for k, v in spent.items():
                rows[k].append(v)
    print(where, "ms per fit:", ", ".join(f"{k} {statistics.median(v) * 1e3:.3f}"
                                          for k, v in rows.items()), flush=True)
