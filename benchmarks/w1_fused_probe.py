"""cupy-fused at W1 (n=2M, d=3, k=200, float32, 10 iterations from a given init, tol=0), device
and host X: ms per iteration (timings_["lloyd"] / n_iter_) over many fits, min and median.
Run for the old and the new code alternately in one device call (gpu_session.sh `w1`): the
machine's speed drifts by tens of percent within minutes."""
import json
import statistics
import sys

import cupy as cp

from regression_probe import WORKLOADS, data  # (this script's folder is on sys.path)

from kmeans_xp import KMeans

label, repeats = sys.argv[1], int(sys.argv[2])
X, init = data(*WORKLOADS["W1"])
row = {"label": label}
for where, Xin in (("device", cp.asarray(X)), ("host", X)):
    per = []
    for r in range(repeats + 2):
        km = KMeans(200, init=init, n_init=1, max_iter=10, tol=0, backend="cupy-fused").fit(Xin)
        if r >= 2:  # two warm-ups
            per.append(km.timings_["lloyd"] / km.n_iter_ * 1e3)
    row[where] = {"min": min(per), "median": statistics.median(per)}
print(json.dumps(row))
