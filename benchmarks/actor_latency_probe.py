"""Where the actors engine's per-iteration overhead goes on dask-cuda: the same Lloyd loop
(lloyd_iter, one round trip with its statistics, + new_centers in NumPy on the client) on 2
GPUs at n=200M, d=3, k=1000 float32, under variants of how the actor calls run on the
workers.

    python benchmarks/actor_latency_probe.py OUT.json [--n 200000000] [--iters 10]

Variants: the actor thread (default) or the worker's event loop (`separate_thread=False`);
Python's GIL switch interval at its default (5 ms) or 0.2 ms on client and workers; the
workers' statistical profiler on or off (a cluster each). Prints ms per iteration and the
median split (launch, busiest worker, tail, client) per variant; writes them to OUT.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dask_multi_gpu import (  # noqa: E402
    _dask_block,
    block_bounds,
    initial_centers,
    lloyd_loop,
    log,
    machine_info,
    summarize_breakdown,
)


def measure(client, X, sw, init, iters, separate_thread, timings=True):
    import array_api_compat.numpy as host
    from kmeans_xp_backends.dask.backend import DaskBackend
    backend = DaskBackend(engine="actors", timings=timings)
    backend.actors.separate_thread = separate_thread
    details = []
    per_iter, _, times = lloyd_loop(backend, X, sw, init.copy(), host, iters, 2,
                                    lambda: None, details)
    backend.placement.finish()
    return {"per_iteration_s": per_iter, "iterations_s": times,
            "median_split_s": summarize_breakdown(details)["median_s"] if details else {}}


def ping_round_trip(client, engine, state, separate_thread, payload=(), calls=200):
    """Median seconds of one call to every actor at once that sends `payload` and gets it
    back (empty: the framework's floor)."""
    engine.separate_thread = separate_thread
    for _ in range(20):
        engine.call(client, state["actors"], "ping", *payload)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        engine.call(client, state["actors"], "ping", *payload)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_cluster(args, profile, out):
    import cupy as cp
    import dask
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client
    from kmeans_xp_backends.dask.backend import DaskBackend

    with dask.config.set({"distributed.worker.profile.enabled": profile}):
        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,1", n_workers=2,
                                   threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
    try:
        chunks = (tuple(block_bounds(args.n, 2)), (3,))
        X = da.map_blocks(_dask_block, dtype=np.float32, chunks=chunks,
                          meta=cp.empty((0, 0), dtype=np.float32), d=3, n_blocks=2, seed=0,
                          out_dtype="float32")
        maker = DaskBackend()
        X = maker.placement.to_backend(X)
        sw = None  # unit weights
        init = initial_centers(args.k, 3, 0, np.float32)
        tag = "profiler on" if profile else "profiler off"
        probe = DaskBackend(engine="actors")
        _, state = probe.actors.prepare(X, None)
        # an iteration's payload: the centers out, sums and weights back
        sized = (init.astype(np.float64), np.zeros((args.k, 3)), np.zeros(args.k))
        for sep in (True, False):
            for what, payload in (("empty call", ()), ("call with an iteration's arrays",
                                                       sized)):
                rtt = ping_round_trip(client, probe.actors, state, sep, payload)
                where = "actor thread" if sep else "event loop"
                out[f"{tag}, {what}, {where}"] = {"round_trip_s": rtt}
                log(f"{tag}: {what} to both actors, {where}: {rtt * 1e3:.2f} ms")
        probe.placement.finish()
        for switch in ((None, 2e-4) if profile else (None,)):
            if switch:
                client.run(sys.setswitchinterval, switch)
                sys.setswitchinterval(switch)
            for sep in (True, False):
                name = (f"{tag}, {'actor thread' if sep else 'event loop'}, switch interval "
                        f"{switch or sys.getswitchinterval()}")
                r = measure(client, X, sw, init, args.iters, sep)
                out[name] = r
                med = r["median_split_s"]
                parts = " ".join(f"{key} {med.get(key, 0) * 1e3:.2f}" for key in (
                    "launch", "busiest_worker", "tail", "client_rest", "message_in",
                    "before_blocks", "after_blocks", "message_out"))
                log(f"{name}: {r['per_iteration_s'] * 1e3:.1f} ms/iteration; {parts} ms")
        sys.setswitchinterval(0.005)
        if profile:
            client.run(sys.setswitchinterval, 0.005)
            for sep in (True, False):
                name = f"{tag}, {'actor thread' if sep else 'event loop'}, no timings"
                r = measure(client, X, sw, init, args.iters, sep, timings=False)
                out[name] = r
                log(f"{name}: {r['per_iteration_s'] * 1e3:.1f} ms/iteration")
        maker.placement.finish()
    finally:
        client.close()
        cluster.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--n", type=int, default=200_000_000)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args(argv)
    result = {"machine": machine_info(), "settings": vars(args), "variants": {}}
    t0 = time.perf_counter()
    for profile in (True, False):
        run_cluster(args, profile, result["variants"])
    result["seconds"] = time.perf_counter() - t0
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
