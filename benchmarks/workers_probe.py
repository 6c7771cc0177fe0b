"""Where the numpy backend's worker processes (`numpy_pool`) spend a Lloyd run: each pass's
wall time in the parent beside the threads' passes, and per pass each worker's wall and CPU
time (a CPU time past the wall time: more than one thread, such as BLAS's own), the
attach, and how long the pool took to start.

    python benchmarks/workers_probe.py [--workloads W1,d128] [--iters 10] [--out F.json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from cpu_probe import WORKLOADS, data


def _timed(cls, name, log, label=None):
    orig = getattr(cls, name)

    def timed(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            log.append((label or kw.get("mode", name), (time.perf_counter() - t0) * 1e3))
    setattr(cls, name, timed)
    return orig


def run(name, iters, processes, passes, workers):
    from kmeans_xp import KMeans
    n, d, k = WORKLOADS[name]
    X, init = data(n, d, k)
    fit = lambda: KMeans(k, init=init, max_iter=iters, tol=0, backend="numpy",  # noqa
                         backend_options={"processes": processes}).fit(X)
    fit()   # warm-up
    passes.clear()
    workers.clear()
    t0 = time.perf_counter()
    km = fit()
    wall = (time.perf_counter() - t0) * 1e3
    return {"wall_ms": wall, "timings_ms": {a: b * 1e3 for a, b in km.timings_.items()},
            "passes_ms": list(passes), "worker_times_ms": list(workers)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="W1,d128")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import kmeans_xp_backends.numpy.backend as nb
    import kmeans_xp_backends.numpy.pool as npool
    from kmeans_xp_backends.cpu_threads import thread_count
    t0 = time.perf_counter()
    ok = npool.start_pool(thread_count(), timeout=60)
    out = {"pool_start_s": time.perf_counter() - t0, "pool_ready": ok}
    print(f"pool of {thread_count()} ready: {ok} in {out['pool_start_s']:.2f} s")
    passes, workers = [], []
    _timed(nb.NumpyBackend, "_run", passes)
    run_orig = npool.RunWorkers.run

    def run_logged(self, *a, **kw):
        r = run_orig(self, *a, **kw)
        workers.append([(w * 1e3, c * 1e3) for w, c in self._run[0].last_times]
                       if self._run else [])
        return r
    npool.RunWorkers.run = run_logged
    attach = []
    _timed(npool.RunWorkers, "_attach", attach, "attach")
    for name in args.workloads.split(","):
        row = {"threads": run(name, args.iters, False, passes, workers)}
        attach.clear()
        row["processes"] = run(name, args.iters, True, passes, workers)
        row["attach_ms"] = list(attach)
        out[name] = row
        th, pr = row["threads"], row["processes"]
        wt = [np.array(p) for p in pr["worker_times_ms"] if p]
        print(f"{name}: threads fit {th['wall_ms']:.0f} ms, processes fit {pr['wall_ms']:.0f}"
              f" ms (attach {[round(a[1], 1) for a in attach]} ms)")
        print(f"  passes threads {[round(p[1], 1) for p in th['passes_ms']]}")
        print(f"  passes processes {[round(p[1], 1) for p in pr['passes_ms']]}")
        print(f"  worker wall median {[round(float(np.median(a[:, 0])), 1) for a in wt]}")
        print(f"  worker wall max {[round(float(a[:, 0].max()), 1) for a in wt]}")
        print(f"  worker cpu/wall {[round(float(np.median(a[:, 1] / a[:, 0])), 2) for a in wt]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
