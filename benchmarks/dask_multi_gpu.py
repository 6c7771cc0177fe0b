"""One GPU vs several through dask-cuda: time per Lloyd iteration, same data, same init.

    python benchmarks/dask_multi_gpu.py OUT.json                 # n=200M, d=3, k=1000 float32
    python benchmarks/dask_multi_gpu.py OUT.json --n 200000000 400000000   # two sizes
    python benchmarks/dask_multi_gpu.py OUT.json --n 20000000 --iters 5 --workers 1 2
    python benchmarks/dask_multi_gpu.py OUT.json --engine graph actors   # both (the default)

Needs CuPy, dask, distributed and dask-cuda, and a machine with as many GPUs as the largest
--workers value (the 2-worker case is skipped, and says so, on one GPU). `--cpu` runs the same
protocol on the CPU (NumPy blocks, the numpy backend, a `LocalCluster` of one-thread
workers): how the test keeps this script working on a machine without a GPU. What it measures:

1. single GPU: the best single-GPU backend installed (cupy-fused, else cupy-chunked), X made
   on GPU 0 block by block with the same generator the workers use (so it is the same X).
2. dask: `LocalCUDACluster` with 1, then 2 workers (one per GPU); X's CuPy blocks are made on
   the workers by `map_blocks` (nothing is shipped from the client), persisted once.

Each case runs the same loop from the same initial centers, with unit weights
(sample_weight=None): `backend.lloyd_iter` (labels, per-cluster sums, inertia and changed
labels against the last iteration's labels, in one round trip) then the driver's
`new_centers` (on the GPU for the single-GPU case, in NumPy on the client for dask, where
the statistics arrive), `--warmup` iterations first, then `--iters` timed iterations with
the device synchronised. The final centers of every case are compared with the single-GPU
ones (same work, same answer). With --fit, a whole `KMeans(...).fit` (tol=0,
max_iter=--iters) is also timed per case: the driver's loop, one round trip per iteration.

--engine picks the dask backend's engines measured on the same persisted X, one after the
other, same protocol: "graph" (a task graph per iteration through the scheduler; results under
"dask_2_workers") and "actors" (one dask Actor per worker holds its blocks, an iteration is a
direct call per worker; results under "dask_2_workers_actors"; its first warm-up iteration
includes creating the actors).

Each dask iteration explains itself (the backend's `timings` option): every block's own time
on its worker (device synchronised before and after), when the graph was sent and when the
partial sums were known on the client, so the iteration splits into: launch (graph sent ->
first block starts), the busiest worker's block time, tail (last block ends -> sums known to
the client), gather and the rest on the client (new_centers, graph build). Printed as one
line per case and stored under "breakdown".

Several --n values run one after the other (each cluster started once for all of them); the
bigger the blocks, the smaller a fixed per-iteration overhead is next to them. Writes
everything, errors included, to OUT.json, results under "cases" keyed by n; prints progress
as it goes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

import numpy as np

SINGLE_GPU_BACKENDS = ("cupy-fused", "cupy-chunked")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fail(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


# -- data: the same rows whichever process makes them -----------------------------------------
def block_bounds(n, n_blocks):
    """Row counts of n_blocks nearly equal blocks."""
    base, extra = divmod(n, n_blocks)
    return [base + (1 if i < extra else 0) for i in range(n_blocks)]


def make_block(rows, d, block_index, n_blocks, seed, dtype="float32", cpu=False):
    """Block `block_index` of X, made on the current GPU (NumPy with `cpu`): unit Gaussians
    centred at +1 in the first half of the blocks, -1 in the second (the seed's workload),
    feature j scaled by 1 + 0.5 j so the features differ."""
    if cpu:
        cp = np
    else:
        import cupy as cp
    rng = cp.random.default_rng(seed * 1_000_003 + block_index)
    x = rng.standard_normal((rows, d), dtype=cp.float32)
    x *= cp.asarray(1.0 + 0.5 * np.arange(d), dtype=cp.float32)
    x += 1.0 if block_index < n_blocks / 2 else -1.0
    return x.astype(dtype, copy=False)


def _dask_block(block_info=None, *, d, n_blocks, seed, out_dtype, cpu=False):
    loc = block_info[None]
    rows = loc["chunk-shape"][0]
    return make_block(rows, d, loc["chunk-location"][0], n_blocks, seed, out_dtype, cpu)


def initial_centers(k, d, seed, dtype):
    rng = np.random.default_rng(seed + 7)
    c = rng.standard_normal((k, d)) * (1.0 + 0.5 * np.arange(d))
    c += np.where(np.arange(k) < k // 2, 1.0, -1.0)[:, None]
    return c.astype(dtype)


# -- the timed loop -------------------------------------------------------------------------
def lloyd_loop(backend, X, sw, centers, xp, iters, warmup, sync, details=None):
    """`warmup` + `iters` iterations of lloyd_iter + new_centers; (seconds per timed
    iteration, final centers as NumPy, per-iteration seconds). With `details` (a list), each
    timed iteration's backend.last_iter_timings is appended, with the iteration's start and
    end (this host's clock)."""
    from kmeans_xp.algorithms.lloyd import new_centers
    from kmeans_xp.contract.namespaces import to_numpy

    per_iter = []
    labels = None
    for i in range(warmup + iters):
        started = time.time()
        t0 = time.perf_counter()
        it = backend.lloyd_iter(X, sw, centers, labels, xp=xp)
        labels = it.labels
        centers = new_centers(it.weighted_sums, it.weight_in_clusters, centers, xp)
        sync()
        dt = time.perf_counter() - t0
        extra = ""
        if i >= warmup:
            per_iter.append(dt)
            if details is not None and getattr(backend, "last_iter_timings", None):
                info = dict(backend.last_iter_timings, iteration_s=dt, started_at=started)
                details.append(info)
                extra = "  " + breakdown_line(split_iteration(info))
        log(f"    {'warm-up' if i < warmup else 'iteration'} {i - warmup if i >= warmup else i}: "
            f"{dt * 1e3:.1f} ms{extra}")
    return sum(per_iter) / len(per_iter), to_numpy(centers), per_iter


def split_iteration(info):
    """One dask iteration's time split (seconds) from the backend's timings: client build +
    submit, launch (sent -> first block starts), busiest worker (its blocks' own times
    added), tail (last block ends -> sums known on the client), gather, and what is left on
    the client (new_centers, host centers, ...). `overhead` = iteration - busiest worker."""
    blocks = info.get("block_times") or []
    total = info["iteration_s"]
    out = {"iteration": total, "client_build_submit": info["build_s"] + info["submit_s"],
           "gather": info["gather_s"] + info["add_s"]}
    if blocks:
        busy = {}
        for b in blocks:
            busy[b["worker"]] = busy.get(b["worker"], 0.0) + b["seconds"]
        out["busiest_worker"] = max(busy.values())
        out["block_min"] = min(b["seconds"] for b in blocks)
        out["block_max"] = max(b["seconds"] for b in blocks)
        out["launch"] = min(b["start"] for b in blocks) - info["submitted_at"]
        out["tail"] = info["received_at"] - max(b["stop"] for b in blocks)
        out["overhead"] = total - out["busiest_worker"]
    calls = info.get("actor_calls") or []
    if calls and blocks:
        # the actors engine: message in (sent -> method entered), before the first block,
        # after the last block (statistics, the fetch), message out (left -> received)
        out["message_in"] = max(c["entered"] for c in calls) - info["submitted_at"]
        out["before_blocks"] = min(b["start"] for b in blocks) - min(
            c["entered"] for c in calls)
        out["after_blocks"] = max(c["left"] for c in calls) - max(b["stop"] for b in blocks)
        out["message_out"] = info["received_at"] - max(c["left"] for c in calls)
    out["client_rest"] = total - info["total_s"]
    return out


def breakdown_line(split):
    keys = ("busiest_worker", "block_max", "launch", "tail", "gather", "client_build_submit",
            "client_rest", "overhead", "message_in", "before_blocks", "after_blocks",
            "message_out")
    return " ".join(f"{k}={split[k] * 1e3:.1f}" for k in keys if k in split) + " (ms)"


def summarize_breakdown(details):
    """Median of each part over the timed iterations, and the per-block times."""
    splits = [split_iteration(d) for d in details]
    keys = sorted({k for s_ in splits for k in s_})
    med = {k: float(np.median([s_[k] for s_ in splits if k in s_])) for k in keys}
    return {"median_s": med, "iterations": splits,
            "block_times": [d.get("block_times") for d in details],
            "reduce": details[0].get("reduce") if details else None}


def time_fit(X, init, iters, backend_name, backend_options=None):
    from kmeans_xp import KMeans
    km = KMeans(init.shape[0], init=init, n_init=1, max_iter=iters, tol=0,
                backend=backend_name, backend_options=backend_options)
    t0 = time.perf_counter()
    km.fit(X)
    return {"fit_s": time.perf_counter() - t0, "n_iter": km.n_iter_,
            "per_iteration_s": km.timings_["per_iteration"], "timings": km.timings_,
            "inertia": km.inertia_}


def run_single_cpu(args, n, init, result):
    """--cpu: the single-device case on the numpy backend."""
    from array_api_compat import numpy as np_xp

    from kmeans_xp import get_backend
    X = np.concatenate([make_block(r, args.d, i, args.blocks, args.seed, args.dtype, True)
                        for i, r in enumerate(block_bounds(n, args.blocks))])
    per_iter, final, times = lloyd_loop(get_backend("numpy")(), X, None, init.copy(), np_xp,
                                        args.iters, args.warmup, lambda: None)
    out = {"backend": "numpy", "per_iteration_s": per_iter, "iterations_s": times,
           "final_centers_checksum": float(np.abs(final).sum())}
    log(f"single CPU (numpy): {per_iter * 1e3:.1f} ms per iteration")
    if args.fit:
        out["fit"] = time_fit(X, init, args.iters, "numpy")
    result["single_gpu"] = out
    return final


def run_single_gpu(args, n, init, result):
    if args.cpu:
        return run_single_cpu(args, n, init, result)
    import cupy as cp
    from array_api_compat import cupy as cp_xp

    from kmeans_xp.contract.registry import available_backends, get_backend

    have = available_backends()
    name = args.single_backend or next((b for b in SINGLE_GPU_BACKENDS if b in have), None)
    if name is None:
        raise RuntimeError(f"no single-GPU backend installed: need one of "
                           f"{SINGLE_GPU_BACKENDS}; installed: {have}")
    log(f"single GPU: backend {name}, making X ({n:,} x {args.d}) on GPU 0")
    with cp.cuda.Device(0):
        blocks = [make_block(r, args.d, i, args.blocks, args.seed, args.dtype)
                  for i, r in enumerate(block_bounds(n, args.blocks))]
        X = cp.concatenate(blocks)
        del blocks
        cp.cuda.Device(0).synchronize()
        sw = None  # unit weights
        backend = get_backend(name)()
        centers = cp.asarray(init)
        per_iter, final, times = lloyd_loop(
            backend, X, sw, centers, cp_xp, args.iters, args.warmup,
            lambda: cp.cuda.Device(0).synchronize())
        out = {"backend": name, "per_iteration_s": per_iter, "iterations_s": times,
               "final_centers_checksum": float(np.abs(final).sum())}
        log(f"single GPU ({name}): {per_iter * 1e3:.1f} ms per iteration")
        if args.fit:
            log("single GPU: whole KMeans.fit")
            out["fit"] = time_fit(X, init, args.iters, name)
        del X, sw
        cp.get_default_memory_pool().free_all_blocks()
    result["single_gpu"] = out
    return final


def run_dask(args, ns, init, n_workers, results, references):
    """One LocalCUDACluster of `n_workers` workers, every n of `ns` on it in turn; each
    case's result goes to results[n][key] (errors to results[n]["errors"][key])."""
    from distributed import Client

    key = f"dask_{n_workers}_worker" + ("s" if n_workers > 1 else "")
    t0 = time.perf_counter()
    if args.cpu:
        from distributed import LocalCluster
        log(f"{key}: starting a LocalCluster of {n_workers} one-thread workers")
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=False,
                               dashboard_address=None)
    else:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as exc:
            raise RuntimeError("dask-cuda is not installed: pip install dask-cuda "
                               "(or the wheel in shared/wheels/dask/)") from exc
        devices = ",".join(str(i) for i in range(n_workers))
        log(f"{key}: starting LocalCUDACluster on GPUs {devices}")
        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, n_workers=n_workers,
                                   threads_per_worker=1, dashboard_address=None)
    client = Client(cluster)
    start_s = time.perf_counter() - t0
    try:
        client.wait_for_workers(n_workers, timeout=300)
        for n in ns:
            case = results[str(n)]
            try:
                run_dask_case(args, n, init, client, key, case, references.get(n),
                              {"workers": n_workers, "cluster_start_s": start_s})
            except Exception as exc:
                case["errors"][key] = traceback.format_exc()
                log(f"{key} n={n:,} failed: {type(exc).__name__}: {exc}")
            yield
    finally:
        client.close()
        cluster.close()


def engine_key(key, engine):
    return key if engine == "graph" else f"{key}_{engine}"


def run_dask_case(args, n, init, client, key, case, reference, common):
    """X made and persisted once on the workers, then each --engine in turn on it; each
    engine's result under case[engine_key(key, engine)] (errors under case["errors"])."""
    import dask.array as da
    from distributed import futures_of, wait
    from kmeans_xp_backends.dask.backend import DaskBackend
    if args.cpu:
        meta = np.empty((0, 0), dtype=args.dtype)
    else:
        import cupy as cp
        meta = cp.empty((0, 0), dtype=args.dtype)

    # the same rows as the single-GPU X: the same blocks in the same order
    n_blocks = args.blocks
    chunks = (tuple(block_bounds(n, n_blocks)), (args.d,))
    log(f"{key}: n={n:,}: making X on the workers in {n_blocks} blocks")
    X = da.map_blocks(_dask_block, dtype=np.dtype(args.dtype), chunks=chunks, meta=meta,
                      d=args.d, n_blocks=n_blocks, seed=args.seed, out_dtype=args.dtype,
                      cpu=args.cpu)
    maker = DaskBackend()
    place = maker.placement
    t0 = time.perf_counter()
    X = place.to_backend(X)  # NaN/inf check + persist, once
    setup = dict(common, make_and_persist_s=time.perf_counter() - t0)
    xp = place.namespace(X)
    sw = None  # unit weights: nothing per sample besides X
    counts = _blocks_per_worker(client, X)
    if len(counts) < min(len(client.scheduler_info()["workers"]), n_blocks) or (
            max(counts.values()) - min(counts.values()) > 1):
        log(f"{key}: blocks per worker {counts} are unbalanced; rebalancing")
        client.rebalance(futures_of(X))
        counts = _blocks_per_worker(client, X)
    setup["blocks_per_worker"] = counts
    wait(futures_of(X))
    log(f"{key}: X persisted in {setup['make_and_persist_s']:.1f} s; blocks per worker "
        f"{counts}")
    for engine in args.engine:
        ekey = engine_key(key, engine)
        try:
            out = dict(setup, engine=engine)
            run_dask_engine(args, engine, ekey, n, init, X, sw, xp, out, reference)
            case[ekey] = out
        except Exception as exc:
            case["errors"][ekey] = traceback.format_exc()
            log(f"{ekey} n={n:,} failed: {type(exc).__name__}: {exc}")
    place.finish()
    del X


def run_dask_engine(args, engine, key, n, init, X, sw, xp, out, reference):
    import array_api_compat.numpy as host
    from kmeans_xp_backends.dask.backend import DaskBackend

    backend = DaskBackend(timings=not args.no_timings, engine=engine)
    log(f"{key}: engine {engine}")
    details = []
    # the client keeps the k x d centers in NumPy: the partial sums arrive there as NumPy
    # (the single-GPU loop keeps them on its device, where its sums are)
    per_iter, final, times = lloyd_loop(backend, X, sw, init.copy(), host, args.iters,
                                        args.warmup, lambda: None, details)
    out.update(per_iteration_s=per_iter, iterations_s=times,
               max_abs_center_diff_vs_single_gpu=(
                   None if reference is None else float(np.abs(final - reference).max())))
    if details:
        out["breakdown"] = summarize_breakdown(details)
        log(f"{key}: n={n:,}: {per_iter * 1e3:.1f} ms per iteration; median split: "
            f"{breakdown_line(out['breakdown']['median_s'])}")
    else:
        log(f"{key}: n={n:,}: {per_iter * 1e3:.1f} ms per iteration")
    backend.placement.finish()
    if args.fit:
        log(f"{key}: whole KMeans.fit")
        out["fit"] = time_fit(X, init, args.iters, "dask", {"engine": engine})


def _blocks_per_worker(client, X):
    from distributed import futures_of
    counts = {}
    who = client.who_has(futures_of(X))
    for workers in who.values():
        for w in workers:
            counts[w] = counts.get(w, 0) + 1
    return counts


def machine_info():
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__}
    try:
        import cupy as cp
        info["cupy"] = cp.__version__
        n = cp.cuda.runtime.getDeviceCount()
        info["gpus"] = []
        for i in range(n):
            props = cp.cuda.runtime.getDeviceProperties(i)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            info["gpus"].append({"index": i, "name": name,
                                 "memory_bytes": int(props["totalGlobalMem"])})
    except Exception as exc:  # reported, not fatal here
        info["gpu_error"] = f"{type(exc).__name__}: {exc}"
    for mod in ("dask", "distributed", "dask_cuda"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    return info


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="path of the JSON file to write")
    p.add_argument("--n", type=int, nargs="+", default=[200_000_000],
                   help="number of points; several values run one after the other")
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--iters", type=int, default=10, help="timed iterations")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--blocks", type=int, default=None,
                   help="row blocks of X (default: the largest --workers value, one block per "
                        "GPU: a worker runs its blocks one after the other on one GPU, so more "
                        "blocks only add per-block calls; a multiple of every --workers value "
                        "keeps the GPUs balanced)")
    p.add_argument("--single-backend", default=None,
                   help="single-GPU backend (default: cupy-fused, else cupy-chunked)")
    p.add_argument("--fit", action="store_true",
                   help="also time a whole KMeans.fit per case")
    p.add_argument("--engine", nargs="+", default=["graph", "actors"],
                   choices=["graph", "actors"],
                   help="dask backend engines measured, one after the other on the same "
                        "persisted X (default: both)")
    p.add_argument("--no-timings", action="store_true",
                   help="do not record the per-block / per-phase breakdown of dask iterations")
    p.add_argument("--skip-single", action="store_true",
                   help="skip the single-GPU baseline (no speedups then)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true",
                   help="NumPy blocks on a LocalCluster of CPU workers (the test's mode)")
    args = p.parse_args(argv)
    if args.blocks is None:
        args.blocks = max(args.workers)
    if min(args.n) < args.k or args.k < 1 or args.d < 1 or args.iters < 1 or args.blocks < 1:
        fail("need n >= k >= 1, d >= 1, iters >= 1, blocks >= 1")
    try:
        if args.cpu:
            n_gpus = os.cpu_count()  # "devices" here: CPU workers
        else:
            import cupy as cp
            n_gpus = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        fail(f"CuPy with a CUDA GPU is needed ({type(exc).__name__}: {exc}); "
             f"pip install 'kmeans_xp[cuda12]' (or [cuda13]), or run with --cpu")
    for mod in ("dask", "distributed"):
        try:
            __import__(mod)
        except ImportError:
            fail(f"{mod} is not installed: pip install 'kmeans_xp[dask]'")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)

    itemsize = np.dtype(args.dtype).itemsize
    log(f"n={', '.join(f'{n:,}' for n in args.n)} d={args.d} k={args.k} {args.dtype}: X is "
        f"{', '.join(f'{n * args.d * itemsize / 2**30:.2f}' for n in args.n)} GiB; {n_gpus} "
        f"GPU(s); {args.blocks} blocks; {args.iters} timed iterations after {args.warmup} "
        f"warm-up")
    result = {"benchmark": "dask_multi_gpu", "machine": machine_info(),
              "settings": vars(args), "cases": {}}
    cases = result["cases"]
    for n in args.n:
        cases[str(n)] = {"n": n, "errors": {}, "skipped": {}}

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2, default=str)

    init = initial_centers(args.k, args.d, args.seed, args.dtype)
    references = {}
    for n in args.n:
        if args.skip_single:
            break
        try:
            references[n] = run_single_gpu(args, n, init, cases[str(n)])
        except Exception as exc:
            cases[str(n)]["errors"]["single_gpu"] = traceback.format_exc()
            log(f"single GPU n={n:,} failed: {type(exc).__name__}: {exc}")
        save()
    for w in args.workers:
        if w > n_gpus:
            for n in args.n:
                cases[str(n)]["skipped"][f"dask_{w}_workers"] = \
                    f"needs {w} GPUs, this machine has {n_gpus}"
            log(f"skipping dask with {w} workers: only {n_gpus} GPU(s)")
            continue
        try:
            for _ in run_dask(args, args.n, init, w, cases, references):
                save()
        except Exception as exc:
            for n in args.n:
                cases[str(n)]["errors"].setdefault(f"dask_{w}", traceback.format_exc())
            log(f"dask with {w} worker(s) failed: {type(exc).__name__}: {exc}")
        save()

    failed = False
    for n in args.n:
        case = cases[str(n)]
        failed = failed or bool(case["errors"])
        single = case.get("single_gpu", {}).get("per_iteration_s")
        speedups = {}
        for key, val in case.items():
            if key.startswith("dask_") and isinstance(val, dict) and "per_iteration_s" in val:
                if single:
                    speedups[f"{key}_vs_single_gpu"] = single / val["per_iteration_s"]
        for engine in args.engine:
            one_key, two_key = (engine_key("dask_1_worker", engine),
                                engine_key("dask_2_workers", engine))
            one = case.get(one_key, {}).get("per_iteration_s")
            two = case.get(two_key, {}).get("per_iteration_s")
            if one and two:
                speedups[f"{two_key}_vs_{one_key}"] = one / two
        graph2 = case.get("dask_2_workers", {}).get("per_iteration_s")
        actors2 = case.get("dask_2_workers_actors", {}).get("per_iteration_s")
        if graph2 and actors2:
            speedups["dask_2_workers_actors_vs_graph"] = graph2 / actors2
        case["speedups"] = speedups
        case["pairs_per_second"] = {
            key: n * args.k / val["per_iteration_s"] for key, val in case.items()
            if isinstance(val, dict) and isinstance(val.get("per_iteration_s"), float)}
        for k_, v in speedups.items():
            log(f"n={n:,}: speedup {k_}: {v:.2f}x")
    save()
    log(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
