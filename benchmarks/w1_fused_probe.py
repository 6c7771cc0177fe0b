"""cupy-fused at W1 (n=2M, d=3, k=200, float32, 10 iterations from a given init, tol=0), device
and host X: ms per iteration (timings_["lloyd"] / n_iter_) over many fits, min and median.
Run for the old and the new code alternately in one device call (gpu_session.sh `w1`): the
machine's speed drifts by tens of percent within minutes.

    python w1_fused_probe.py LABEL REPEATS [--centers host|device|both]

--centers (new code only): where the driver's center math runs, on the host (the default
below FusedPlacement.SHORT_PASS) or on the device (`small_on_host = 0`), alternated fit by fit
in one process with "both"."""
import argparse
import json
import statistics

import cupy as cp
from regression_probe import WORKLOADS, data  # (this script's folder is on sys.path)

from kmeans_xp import KMeans

p = argparse.ArgumentParser()
p.add_argument("label")
p.add_argument("repeats", type=int)
p.add_argument("--centers", default=None, choices=("host", "device", "both"))
args = p.parse_args()
modes = {None: [None], "host": ["host"], "device": ["device"],
         "both": ["host", "device"]}[args.centers]
X, init = data(*WORKLOADS["W1"])


def fit(Xin, mode):
    km = KMeans(200, init=init, n_init=1, max_iter=10, tol=0, backend="cupy-fused")
    if mode is not None:
        from kmeans_xp_backends.cupy.fused import FusedPlacement
        FusedPlacement.small_on_host = 0 if mode == "device" else 1 << 16
    km.fit(Xin)
    return km.timings_["lloyd"] / km.n_iter_ * 1e3


row = {"label": args.label}
for where, Xin in (("device", cp.asarray(X)), ("host", X)):
    per = {m: [] for m in modes}
    for r in range(args.repeats + 2):
        for m in modes:
            t = fit(Xin, m)
            if r >= 2:  # two warm-ups
                per[m].append(t)
    for m in modes:
        key = where if m is None else f"{where}/{m}-centers"
        row[key] = {"min": min(per[m]), "median": statistics.median(per[m])}
print(json.dumps(row))
