"""The measured peak of a fit's working memory against `max_memory` and `estimate_memory`.

For each backend and size: max_memory set a third above the least the fit is planned in
(`estimate_memory` refuses less), then one fit of 5 iterations on X already in place, and the
peak of what it allocated beyond X: the CuPy pool's used bytes for the GPU backends, NumPy's
allocations through tracemalloc for the CPU ones. A row passes when the peak is within both
max_memory and the estimate's total beyond X (the GPU suite asserts the same,
tests/test_max_memory_bound.py).

    python benchmarks/memory_peak.py --results                  # GPU backends, three sizes
    python benchmarks/memory_peak.py --backends numpy --sizes 20000:10 --results /tmp/r
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from results_file import add_arguments, record_if_asked

GPU_BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")
SIZES = ((1_000_003, 100), (4_000_037, 500), (10_000_019, 1000))


def least_max_memory(n, d, k, backend):
    """The least max_memory estimate_memory accepts for this fit (from its refusal)."""
    from kmeans_xp import KMeansMemoryError, estimate_memory
    try:
        estimate_memory(n, d, k, backend=backend, dtype="float32", max_memory=64)
    except KMeansMemoryError as exc:
        return int(exc.needed)
    return 64


def gpu_peak(fit, X):
    """Bytes the CuPy pool held beyond its use before `fit(X)`, at its peak during it."""
    import cupy as cp

    class PoolPeak(cp.cuda.memory_hook.MemoryHook):
        name = "kmeans_xp_bench_pool_peak"   # (the fit installs its own hook inside)

        def __init__(self):
            self.peak = 0

        def malloc_postprocess(self, **kwargs):
            self.peak = max(self.peak, cp.get_default_memory_pool().used_bytes())

    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    hook = PoolPeak()
    with hook:
        fit(X)
        cp.cuda.get_current_stream().synchronize()
    return max(hook.peak, pool.used_bytes()) - base


def host_peak(fit, X):
    """Peak bytes allocated during `fit(X)`: NumPy's buffers (tracemalloc), or, where more,
    the process's resident memory above its level before the fit, sampled every few
    milliseconds (numba's own arrays and BLAS's buffers, which tracemalloc does not see)."""
    import threading
    import tracemalloc
    base, top, done = _resident(), [0], threading.Event()

    def sample():
        while not done.wait(0.005):
            top[0] = max(top[0], _resident() - base)

    watcher = threading.Thread(target=sample, daemon=True)
    tracemalloc.start()
    watcher.start()
    try:
        fit(X)
        return max(tracemalloc.get_traced_memory()[1], top[0])
    finally:
        done.set()
        watcher.join()
        tracemalloc.stop()


def _resident():
    """The process's resident bytes (Linux /proc; 0 elsewhere: tracemalloc alone)."""
    try:
        with open("/proc/self/statm") as f:
            import os
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def measure(backend, n, k, d=3, iters=5, init="k-means++"):
    from kmeans_xp import KMeans, estimate_memory, get_backend
    from kmeans_xp.testing import asymmetric_data
    on_gpu = get_backend(backend).device == "gpu"
    X = asymmetric_data(n, d, 40, dtype=np.float32, seed=4)
    if on_gpu:
        import cupy as cp
        X = cp.asarray(X)
    bound = int(least_max_memory(n, d, k, backend) * 1.33)
    est = estimate_memory(n, d, k, backend=backend, max_memory=bound)
    beyond = est.total - est.parts.get("data", 0)   # (X on the device: not bounded)

    def fit(A):
        return KMeans(k, init=init, n_init=1, max_iter=iters, tol=0, random_state=0,
                      backend=backend, max_memory=bound).fit(A)

    fit(X[:max(20_000, 2 * k)])   # kernels compiled, threads started
    peak = (gpu_peak if on_gpu else host_peak)(fit, X)
    return {"backend": backend, "n": n, "k": k, "max_memory": bound, "estimate": beyond,
            "peak": peak, "ok": peak <= bound and peak <= beyond}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default=",".join(GPU_BACKENDS))
    p.add_argument("--sizes", default=",".join(f"{n}:{k}" for n, k in SIZES),
                   help="n:k pairs, comma-separated")
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--init", default="k-means++", help="k-means++ or random")
    add_arguments(p)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    from kmeans_xp.contract.memory import format_bytes
    sizes = [tuple(int(v) for v in s.split(":")) for s in args.sizes.split(",") if s]
    table = ["| backend | n | k | max_memory | estimate beyond X | measured peak | within both |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    rows = []
    for backend in [b for b in args.backends.split(",") if b]:
        for n, k in sizes:
            r = measure(backend, n, k, args.d, args.iters, args.init)
            rows.append(r)
            table.append(f"| {backend} | {n:,} | {k} | {format_bytes(r['max_memory'])} | "
                         f"{format_bytes(r['estimate'])} | {format_bytes(r['peak'])} | "
                         f"{'yes' if r['ok'] else 'NO'} |")
            print(table[-1], flush=True)
    if args.results is not None:
        head = [f"## max_memory: the measured peak of a fit beyond X, d={args.d} float32", "",
                f"max_memory a third above the least the fit is planned in; init {args.init}, "
                f"{args.iters} iteration{'s' * (args.iters != 1)} on X in place; GPU: the "
                "CuPy pool's peak, CPU: NumPy's allocations (tracemalloc) or the resident "
                "memory's growth, whichever is more.", ""]
        record_if_asked(args, [head + table], script="benchmarks/memory_peak.py", argv=argv,
                        wall_s=time.perf_counter() - t0)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
