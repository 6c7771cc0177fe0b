"""One W1 cupy-fused fit from device X as a host timeline (start offset and host time of each
backend and driver call, microseconds), then each host piece of an iteration timed alone
(1000 calls): where the host's turn-around between two 0.2 ms passes goes.

    python benchmarks/w1_timeline.py [WORKLOAD [OPTIONS_JSON]]

Another workload (W3, W5; backend options as JSON, e.g. '{"precision": "tf32"}') gives the
timeline alone: where a W5 iteration's time goes beyond its device work (relocations,
`relocate_empty`, show in it)."""
import functools
import json
import sys
import time

import cupy as cp
import numpy as np
from host_calls import host_us_per_call  # (this script's folder is on sys.path)
from kmeans_xp_backends.cupy import fused, host_centers, placement, reductions
from regression_probe import WORKLOADS, data

import kmeans_xp.algorithms.lloyd as lloyd
from kmeans_xp import KMeans

events, depth = [], [0]


def timed(owner, name):
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*a, **k):
        t0 = time.perf_counter_ns()
        depth[0] += 1
        try:
            return fn(*a, **k)
        finally:
            depth[0] -= 1
            events.append((t0, time.perf_counter_ns() - t0, depth[0], name))
    setattr(owner, name, wrapper)


for n in ("lloyd_iter", "_workspace", "_pack", "_assign_pass", "_finalize", "_scales",
          "inertia", "assign", "_host_centers"):
    timed(fused.CupyFusedBackend, n)
for n in ("read", "upload_operands"):
    timed(host_centers.HostCenters, n)
for n in ("fetch", "persist", "small", "synchronize", "center", "finish"):
    timed(placement.CupyPlacement, n)
for n in ("_update", "kmeans_single_lloyd", "relocate_empty", "to_numpy"):
    timed(lloyd, n)
timed(fused.CupyFusedBackend, "farthest")  # a relocation's parts
for n in ("farthest", "relocation_keys", "gather_farthest"):
    timed(reductions, n)
timed(reductions.TopKeys, "add")

WORKLOAD = sys.argv[1] if len(sys.argv) > 1 else "W1"
OPTIONS = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
X, init = data(*WORKLOADS[WORKLOAD])
Xg = cp.asarray(X)
for _r in range(6):
    events.clear()
    km = KMeans(init.shape[0], init=init, n_init=1, max_iter=10, tol=0, backend="cupy-fused",
                backend_options=OPTIONS).fit(Xg)
print("timings_ (ms):", {k: round(v * 1e3, 3) for k, v in km.timings_.items()})
t_first = min(e[0] for e in events)
for t0, dt, dep, name in sorted(events):
    print(f"{(t0 - t_first) / 1e3:9.1f} {dt / 1e3:8.1f}  {'  ' * dep}{name}")
if WORKLOAD != "W1":
    sys.exit(0)


def per_call(label, fn, reps=1000):
    print(f"{label:55s} {host_us_per_call(cp, fn, reps):8.1f} us")


be = fused.CupyFusedBackend()
Xc = Xg - Xg.mean(axis=0)
c = np.ascontiguousarray(init - X.mean(axis=0))
it = be.lloyd_iter(Xc, None, c, None)
ws = be._ws
out = cp.zeros(200 * 4 + 2, dtype=cp.float64)
pinned = cp.cuda.alloc_pinned_memory(out.nbytes)
host = np.frombuffer(pinned, dtype=np.float64, count=out.size)
labels = cp.empty(ws.n, dtype=cp.int32)
per_call("out.get(out=pinned) of a ready k*(d+1)+2 array", lambda: out.get(out=host))
per_call("cp.empty(n, int32)", lambda: cp.empty(ws.n, dtype=cp.int32))
per_call("_pack (host centers: operands uploaded)", lambda: be._pack(ws, c))
per_call("_finalize launch", lambda: be._finalize(ws, out, stats=True), reps=200)
per_call("_assign_pass launch (+ its run, queued)", lambda: be._assign_pass(
    ws, labels, labels_old=it.labels, accumulate=True), reps=50)
per_call("ws.fn_pack launch (device centers)", lambda: fused.launch(
    ws.fn_pack, ws.pack_grid, (cp.asarray(c), *ws.pack_args)))
per_call("be.lloyd_iter, host centers (blocking read)", lambda: be.lloyd_iter(
    Xc, None, c, it.labels), reps=200)
centers64 = c.astype(np.float64)
per_call("driver _update, host statistics", lambda: lloyd._update(
    be, Xc, None, c, centers64, it, xp=cp, cxp=np, relocate=False))
small = np.zeros(4)
per_call("placement.fetch of a host array + wait", lambda: be.placement.fetch(small)())
per_call("time.perf_counter x2", lambda: (time.perf_counter(), time.perf_counter()))
