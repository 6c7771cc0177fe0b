"""One GPU vs several through dask-cuda: time per Lloyd iteration, same data, same init.

    python benchmarks/dask_multi_gpu.py OUT.json                 # n=200M, d=3, k=1000 float32
    python benchmarks/dask_multi_gpu.py OUT.json --n 20000000 --iters 5 --workers 1 2

Needs CuPy, dask, distributed and dask-cuda, and a machine with as many GPUs as the largest
--workers value (the 2-worker case is skipped, and says so, on one GPU). What it measures:

1. single GPU: the best single-GPU backend installed (cupy-fused, else cupy-chunked), X made
   on GPU 0 block by block with the same generator the workers use (so it is the same X).
2. dask: `LocalCUDACluster` with 1, then 2 workers (one per GPU); X's CuPy blocks are made on
   the workers by `map_blocks` (nothing is shipped from the client), persisted once.

Each case runs the same loop from the same initial centers: `backend.lloyd_iter` (labels,
distances, per-cluster sums) then the driver's `new_centers` on the client, `--warmup`
iterations first, then `--iters` timed iterations with the device synchronised. The final
centers of every case are compared with the single-GPU ones (same work, same answer).
With --fit, a whole `KMeans(...).fit` (tol=0, max_iter=--iters) is also timed per case.
Writes everything, errors included, to OUT.json; prints progress as it goes.
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


def make_block(rows, d, block_index, n_blocks, seed, dtype="float32"):
    """Block `block_index` of X, made on the current GPU: unit Gaussians centred at +1 in the
    first half of the blocks, -1 in the second (the seed's workload), feature j scaled by
    1 + 0.5 j so the features differ."""
    import cupy as cp
    rng = cp.random.default_rng(seed * 1_000_003 + block_index)
    x = rng.standard_normal((rows, d), dtype=cp.float32)
    x *= cp.asarray(1.0 + 0.5 * np.arange(d), dtype=cp.float32)
    x += 1.0 if block_index < n_blocks / 2 else -1.0
    return x.astype(dtype, copy=False)


def _dask_block(block_info=None, *, d, n_blocks, seed, out_dtype):
    loc = block_info[None]
    rows = loc["chunk-shape"][0]
    return make_block(rows, d, loc["chunk-location"][0], n_blocks, seed, out_dtype)


def initial_centers(k, d, seed, dtype):
    rng = np.random.default_rng(seed + 7)
    c = rng.standard_normal((k, d)) * (1.0 + 0.5 * np.arange(d))
    c += np.where(np.arange(k) < k // 2, 1.0, -1.0)[:, None]
    return c.astype(dtype)


# -- the timed loop -------------------------------------------------------------------------
def lloyd_loop(backend, X, sw, centers, xp, iters, warmup, sync):
    """`warmup` + `iters` iterations of lloyd_iter + new_centers; (seconds per timed
    iteration, final centers as NumPy, per-iteration seconds)."""
    from kmeans_xp._xp import to_numpy
    from kmeans_xp.lloyd import new_centers

    per_iter = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        it = backend.lloyd_iter(X, sw, centers, xp=xp)
        centers = new_centers(it.weighted_sums, it.weight_in_clusters, centers, xp)
        sync()
        dt = time.perf_counter() - t0
        if i >= warmup:
            per_iter.append(dt)
        log(f"    {'warm-up' if i < warmup else 'iteration'} {i - warmup if i >= warmup else i}: "
            f"{dt * 1e3:.1f} ms")
    return sum(per_iter) / len(per_iter), to_numpy(centers), per_iter


def time_fit(X, init, iters, backend_name):
    from kmeans_xp import KMeans
    km = KMeans(init.shape[0], init=init, n_init=1, max_iter=iters, tol=0,
                backend=backend_name)
    t0 = time.perf_counter()
    km.fit(X)
    return {"fit_s": time.perf_counter() - t0, "n_iter": km.n_iter_,
            "per_iteration_s": km.timings_["per_iteration"], "timings": km.timings_,
            "inertia": km.inertia_}


def run_single_gpu(args, init, result):
    import cupy as cp
    from array_api_compat import cupy as cp_xp
    from kmeans_xp.registry import available_backends, get_backend

    have = available_backends()
    name = args.single_backend or next((b for b in SINGLE_GPU_BACKENDS if b in have), None)
    if name is None:
        raise RuntimeError(f"no single-GPU backend installed: need one of "
                           f"{SINGLE_GPU_BACKENDS}; installed: {have}")
    log(f"single GPU: backend {name}, making X ({args.n:,} x {args.d}) on GPU 0")
    with cp.cuda.Device(0):
        blocks = [make_block(r, args.d, i, args.blocks, args.seed, args.dtype)
                  for i, r in enumerate(block_bounds(args.n, args.blocks))]
        X = cp.concatenate(blocks)
        del blocks
        cp.cuda.Device(0).synchronize()
        sw = cp.ones(args.n, dtype=X.dtype)
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


def run_dask(args, init, n_workers, result, reference):
    import dask.array as da
    from distributed import Client
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as exc:
        raise RuntimeError("dask-cuda is not installed: pip install dask-cuda "
                           "(or the wheel in shared/wheels/dask/)") from exc
    import cupy as cp

    from kmeans_xp_backends.dask_ import DaskBackend

    key = f"dask_{n_workers}_worker" + ("s" if n_workers > 1 else "")
    devices = ",".join(str(i) for i in range(n_workers))
    log(f"{key}: starting LocalCUDACluster on GPUs {devices}")
    t0 = time.perf_counter()
    cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, n_workers=n_workers,
                               threads_per_worker=1, dashboard_address=None)
    client = Client(cluster)
    out = {"workers": n_workers, "cluster_start_s": time.perf_counter() - t0}
    try:
        client.wait_for_workers(n_workers, timeout=300)
        # the same rows as the single-GPU X: the same blocks in the same order
        n_blocks = args.blocks
        chunks = (tuple(block_bounds(args.n, n_blocks)), (args.d,))
        log(f"{key}: making X on the workers in {n_blocks} CuPy blocks")
        X = da.map_blocks(_dask_block, dtype=np.dtype(args.dtype), chunks=chunks,
                          meta=cp.empty((0, 0), dtype=args.dtype), d=args.d,
                          n_blocks=n_blocks, seed=args.seed, out_dtype=args.dtype)
        backend = DaskBackend()
        t0 = time.perf_counter()
        X = backend.to_backend(X)  # NaN/inf check + persist, once
        out["make_and_persist_s"] = time.perf_counter() - t0
        xp = backend.array_namespace(X)
        sw = backend.persist(xp.asarray(np.ones(args.n, dtype=args.dtype)))  # made on workers
        counts = _blocks_per_worker(client, X)
        if n_workers > 1 and (len(counts) < n_workers
                              or max(counts.values()) - min(counts.values()) > 1):
            log(f"{key}: blocks per worker {counts} are unbalanced; rebalancing")
            from distributed import futures_of
            client.rebalance(futures_of(X))
            counts = _blocks_per_worker(client, X)
        out["blocks_per_worker"] = counts
        log(f"{key}: X persisted in {out['make_and_persist_s']:.1f} s; blocks per worker "
            f"{counts}")
        centers = cp.asarray(init)
        per_iter, final, times = lloyd_loop(backend, X, sw, centers, xp, args.iters,
                                            args.warmup, lambda: None)
        out.update(per_iteration_s=per_iter, iterations_s=times,
                   max_abs_center_diff_vs_single_gpu=(
                       None if reference is None else float(np.abs(final - reference).max())))
        log(f"{key}: {per_iter * 1e3:.1f} ms per iteration")
        if args.fit:
            log(f"{key}: whole KMeans.fit")
            out["fit"] = time_fit(X, init, args.iters, "dask")
    finally:
        client.close()
        cluster.close()
    result[key] = out


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
    p.add_argument("--n", type=int, default=200_000_000)
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--iters", type=int, default=10, help="timed iterations")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--blocks", type=int, default=None,
                   help="row blocks of X (default: the largest --workers value, one block per "
                        "GPU: fewest tasks per iteration; a multiple of every --workers value "
                        "keeps the GPUs balanced)")
    p.add_argument("--single-backend", default=None,
                   help="single-GPU backend (default: cupy-fused, else cupy-chunked)")
    p.add_argument("--fit", action="store_true",
                   help="also time a whole KMeans.fit per case")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.blocks is None:
        args.blocks = max(args.workers)
    if args.n < args.k or args.k < 1 or args.d < 1 or args.iters < 1 or args.blocks < 1:
        fail("need n >= k >= 1, d >= 1, iters >= 1, blocks >= 1")
    try:
        import cupy as cp
        n_gpus = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        fail(f"CuPy with a CUDA GPU is needed ({type(exc).__name__}: {exc}); "
             f"pip install 'kmeans_xp[cuda12]' (or [cuda13])")
    for mod in ("dask", "distributed"):
        try:
            __import__(mod)
        except ImportError:
            fail(f"{mod} is not installed: pip install 'kmeans_xp[dask]'")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)

    x_bytes = args.n * args.d * np.dtype(args.dtype).itemsize
    log(f"n={args.n:,} d={args.d} k={args.k} {args.dtype}: X is {x_bytes / 2**30:.2f} GiB; "
        f"{n_gpus} GPU(s); {args.iters} timed iterations after {args.warmup} warm-up")
    result = {"benchmark": "dask_multi_gpu", "machine": machine_info(),
              "settings": vars(args), "errors": {}, "skipped": {}}

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2, default=str)

    init = initial_centers(args.k, args.d, args.seed, args.dtype)
    reference = None
    try:
        reference = run_single_gpu(args, init, result)
    except Exception as exc:
        result["errors"]["single_gpu"] = traceback.format_exc()
        log(f"single GPU failed: {type(exc).__name__}: {exc}")
    save()
    for w in args.workers:
        if w > n_gpus:
            result["skipped"][f"dask_{w}_workers"] = f"needs {w} GPUs, this machine has {n_gpus}"
            log(f"skipping dask with {w} workers: only {n_gpus} GPU(s)")
            continue
        try:
            run_dask(args, init, w, result, reference)
        except Exception as exc:
            result["errors"][f"dask_{w}"] = traceback.format_exc()
            log(f"dask with {w} worker(s) failed: {type(exc).__name__}: {exc}")
        save()

    single = result.get("single_gpu", {}).get("per_iteration_s")
    speedups = {}
    for key, val in result.items():
        if key.startswith("dask_") and isinstance(val, dict) and "per_iteration_s" in val:
            if single:
                speedups[f"{key}_vs_single_gpu"] = single / val["per_iteration_s"]
    one = result.get("dask_1_worker", {}).get("per_iteration_s")
    two = result.get("dask_2_workers", {}).get("per_iteration_s")
    if one and two:
        speedups["dask_2_workers_vs_dask_1_worker"] = one / two
    result["speedups"] = speedups
    result["pairs_per_second"] = {
        key: args.n * args.k / val["per_iteration_s"] for key, val in result.items()
        if isinstance(val, dict) and isinstance(val.get("per_iteration_s"), float)}
    save()
    for k_, v in speedups.items():
        log(f"speedup {k_}: {v:.2f}x")
    log(f"wrote {args.out}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
