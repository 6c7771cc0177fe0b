"""CPU rows side by side on one machine: the numpy backend and the numba backend (when numba
is installed) against scikit-learn (and faiss-cpu when installed), per Lloyd iteration and for
k-means++, with the numpy backend's knobs varied so the best can be chosen from measurements.

    python benchmarks/cpu_probe.py --out cpu.json [--quick] [--old PATH/TO/old/numpy_.py]

Same data, same init, tol=0 and a fixed iteration count; per iteration = fit time of `iters`
iterations / iters (sklearn's fit includes its own validation, as ours does), median of
`--repeats`. W1 also runs on one core (n_threads=1 and BLAS held to one thread: the scaling
target's denominator) and on one pool thread with BLAS left free (how earlier sessions
measured "one thread"). `--old` times a copy of an earlier numpy_.py beside the new one in
the same process (rows "numpy-old ..."). The last lines printed are the summary (ratios).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time

import numpy as np

WORKLOADS = {"W1": (2_000_000, 3, 200), "W2": (2_000_000, 3, 500),
             "d128": (200_000, 128, 1024)}
if os.environ.get("KMEANS_XP_PROBE_TINY"):   # a smoke run of the script itself
    WORKLOADS = {"W1": (20_000, 3, 20), "W2": (20_000, 3, 50), "d128": (2_000, 128, 16)}

#: variants of the numpy backend: label -> module attributes of kmeans_xp_backends.numpy.backend set
#: for the row (the defaults are restored after it); rows of each workload. Every variant
#: gives the default's labels (tests/test_numpy_variants.py)
SORTED = {"SORTED_SUMS_MIN_D": 0}                  # label-grouped sums for every d
SUB16 = {"SUB_NS_PER_THREAD": 10**9, "TARGET_BLOCK_BYTES": 16 << 20}
#: (label-grouped sums for d < 16 reach another partition than the default's in the contract's
#: float64 'duplicates' case: tests/test_numpy_variants.py KNOWN_DIFFERENCES). Chunk GEMMs
#: threaded by BLAS itself ran 2.2-3.9x slower on the H200 host (cpu_probe_call3.json of
#: benchmarks/results/h200-2026-12-02f) and are gone
THREADS_ONLY = {"PROCESS_MIN_NS": float("inf")}   # no worker processes
WORKER_BIG_SUB = {"PROCESS_SUB_THREADS": 16}       # workers' sub-chunks sized as threads'
VARIANTS = {
    "W1": {"threads only (before 12-03b)": THREADS_ONLY,
           "workers: sub-chunks of 16 threads": WORKER_BIG_SUB,
           "sums=sorted (all d; partition differs on a tie case)": SORTED,
           "sub=8MiB": {"SUB_NS_PER_THREAD": 10**9},
           "sub=16MiB": SUB16,
           "sub_ns=120000": {"SUB_NS_PER_THREAD": 120_000}},
    "W2": {"threads only (before 12-03b)": THREADS_ONLY,
           "sums=sorted (all d; partition differs on a tie case)": SORTED,
           "sub=8MiB": {"SUB_NS_PER_THREAD": 10**9},
           "sub_ns=120000": {"SUB_NS_PER_THREAD": 120_000}},
    "d128": {"workers (not 'auto' at d >= 16)": {"PROCESS_MAX_D": 1 << 30},
             "gemm=K=d+add (no [x, 1] copy)": {"AUGMENT_MAX_D": 32},
             "sub=256rows (before 12-03)": {"MIN_ROWS": 256},
             "sub=1024rows": {"MIN_ROWS": 1024},
             "sub=8MiB": {"SUB_NS_PER_THREAD": 10**9},
             "sums: 32 features cast at a time": {"SORTED_SUMS_GROUP": 32},
             "sums: 8 features cast at a time": {"SORTED_SUMS_GROUP": 8}},
}
#: variants that change the one-thread path too, so the W1 scaling target would be measured
#: against their own one-core time: that row as well ("threads=1 one-core")
ONE_CORE_VARIANTS = {"W1": ("sums=sorted (all d; partition differs on a tie case)",)}
#: workloads whose iteration is broken down by stage (benchmarks/numpy_stages.py) on all
#: cores and on one, default constants
STAGES = ("W1", "d128")

#: variants of the numba backend (module kmeans_xp_backends.numba.backend), as VARIANTS
NUMBA_VARIANTS = {
    "W1": {"tile=128": {"NARROW_TILE": 128}, "tile=512": {"NARROW_TILE": 512},
           "tasks<=16": {"MAX_TASKS": 16}, "tasks<=256": {"MAX_TASKS": 256}},
    "W2": {"tile=128": {"NARROW_TILE": 128}, "tile=512": {"NARROW_TILE": 512}},
    "d128": {"tile=256KiB": {"WIDE_TILE_BYTES": 256 << 10},
             "tile=512KiB": {"WIDE_TILE_BYTES": 512 << 10},
             "tile=2MiB": {"WIDE_TILE_BYTES": 2 << 20},
             "tasks<=16": {"MAX_TASKS": 16}, "tasks<=128 64MiB": {
                 "MAX_TASKS": 128, "ACCUMULATOR_BYTES": 64 << 20}},
}


def data(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(k, d)).astype(np.float32)
    X = centers[rng.integers(0, k, size=n)] + rng.normal(size=(n, d)).astype(np.float32)
    return X, X[rng.choice(n, k, replace=False)].copy()


def median_time(fn, repeats, warm=True):
    if warm:
        fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fit(backend, X, init, iters, threads=None):
    from kmeans_xp import KMeans
    opts = {} if threads is None else {"n_threads": threads}
    return lambda: KMeans(init.shape[0], init=init, max_iter=iters, tol=0, backend=backend,
                          backend_options=opts).fit(X)


def _one_core(fit):
    from threadpoolctl import threadpool_limits

    def run():
        with threadpool_limits(1):
            return fit()
    return run


def _patched(module, attrs, fn):
    def run():
        saved = {a: getattr(module, a) for a in attrs}
        try:
            for a, v in attrs.items():
                setattr(module, a, v)
            return fn()
        finally:
            for a, v in saved.items():
                setattr(module, a, v)
    return run


def start_worker_pool():
    """The numpy backend's worker processes, started and ready before anything is timed (a
    process's first fit starts them in the background: workers_probe.py times that)."""
    from kmeans_xp_backends.numpy import pool as numpy_pool
    from kmeans_xp_backends.cpu_threads import thread_count
    if numpy_pool.available() and thread_count() > 1:
        t0 = time.perf_counter()
        ready = numpy_pool.start_pool(thread_count(), timeout=120)
        print(f"worker pool of {thread_count()}: ready={ready} in "
              f"{time.perf_counter() - t0:.2f} s", flush=True)


def lloyd_rows(name, X, init, iters, repeats, quick, old):
    import kmeans_xp_backends.numpy.backend as nb
    from sklearn.cluster import KMeans as SK
    k = init.shape[0]
    rows = {"sklearn": median_time(lambda: SK(k, init=init, n_init=1, max_iter=iters, tol=0,
                                              algorithm="lloyd").fit(X), repeats) / iters}
    try:
        import faiss
        def fa():
            km = faiss.Kmeans(X.shape[1], k, niter=iters, seed=0, max_points_per_centroid=10**9)
            km.train(X, init_centroids=init)
        rows["faiss"] = median_time(fa, repeats) / iters
    except ImportError:
        pass
    backends = [("numpy", "numpy")] + ([("numba", "numba")] if _has_numba() else []) + (
        [("numpy-old", old.name)] if old else [])
    for label, backend in backends:
        rows[f"{label} default threads=all"] = median_time(
            _fit(backend, X, init, iters), repeats) / iters
        if name == "W1":  # the scaling target's denominator: one core
            rows[f"{label} default threads=1 one-core"] = median_time(
                _one_core(_fit(backend, X, init, iters, threads=1)), repeats) / iters
            rows[f"{label} default threads=1 blas=free"] = median_time(
                _fit(backend, X, init, iters, threads=1), repeats) / iters
    if not quick:
        for variant, attrs in VARIANTS.get(name, {}).items():
            rows[f"numpy {variant} threads=all"] = median_time(
                _patched(nb, attrs, _fit("numpy", X, init, iters)), repeats) / iters
            if variant in ONE_CORE_VARIANTS.get(name, ()):
                rows[f"numpy {variant} threads=1 one-core"] = median_time(_patched(
                    nb, attrs, _one_core(_fit("numpy", X, init, iters, threads=1))),
                    repeats) / iters
        if _has_numba() and not os.environ.get("KMEANS_XP_PROBE_NO_NUMBA_VARIANTS"):
            import kmeans_xp_backends.numba.backend as nu
            for variant, attrs in NUMBA_VARIANTS.get(name, {}).items():
                rows[f"numba {variant} threads=all"] = median_time(
                    _patched(nu, attrs, _fit("numba", X, init, iters)), repeats) / iters
    return rows


def _has_numba():
    return importlib.util.find_spec("numba") is not None


def plusplus_rows(n, k, repeats):
    from array_api_compat import numpy as xp
    from sklearn.cluster import kmeans_plusplus

    from kmeans_xp.algorithms.init import kmeans_plusplus as ours
    X, _ = data(n, 3, k, seed=1)
    # (plain NumPy on both sides: nothing to compile, no warm-up run)
    return {"sklearn kmeans_plusplus": median_time(lambda: kmeans_plusplus(
                X, k, random_state=0), repeats, warm=False),
            "kmeans_xp kmeans_plusplus": median_time(lambda: ours(
                X, k, sample_weight=None, random_state=np.random.RandomState(0), xp=xp,
                rows=n), repeats, warm=False)}


class _Old:
    """An earlier numpy_.py, loaded from its file and registered as backend 'numpy-old'."""

    name = "numpy-old"

    def __init__(self, path):
        from kmeans_xp import register_backend
        spec = importlib.util.spec_from_file_location("kmeans_xp_probe_old_numpy", path)
        self.module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.module)
        cls = type("OldNumpyBackend", (self.module.NumpyBackend,), {"name": self.name})
        register_backend(cls, replace=True)


def summary(out):
    lines = []
    w = out["workloads"]
    for name, rows in w.items():
        ours, sk = rows.get("numpy default threads=all"), rows.get("sklearn")
        if ours and sk:
            old = rows.get("numpy-old default threads=all")
            lines.append(f"{name}: numpy {ours * 1e3:.1f} ms/iter, sklearn {sk * 1e3:.1f} "
                         f"({ours / sk:.2f}x sklearn's time)"
                         + (f", old numpy {old * 1e3:.1f}" if old else ""))
        best = min(((v, k) for k, v in rows.items() if k.startswith("numpy ")
                    and k.endswith(" threads=all")), default=None)
        if best and sk:
            lines.append(f"{name}: fastest numpy row {best[1][6:-12]!r} {best[0] * 1e3:.1f} "
                         f"ms/iter ({best[0] / sk:.2f}x sklearn's time)")
        nb = rows.get("numba default threads=all")
        if nb and sk:
            ref = min(sk, rows.get("faiss", sk))
            lines.append(f"{name}: numba {nb * 1e3:.1f} ms/iter: {nb / sk:.2f}x sklearn's time, "
                         f"{nb / ref:.2f}x the faster of sklearn and faiss-cpu "
                         f"({ref * 1e3:.1f}), {nb / ours:.2f}x the numpy backend's")
    w1 = w.get("W1", {})
    for variant in ONE_CORE_VARIANTS.get("W1", ()):
        one = w1.get(f"numpy {variant} threads=1 one-core")
        many = w1.get(f"numpy {variant} threads=all")
        if one and many:
            lines.append(f"W1 scaling of {variant!r}: one core {one * 1e3:.1f} ms / all "
                         f"{many * 1e3:.1f} ms = {one / many:.2f}x (target >= 6)")
    for label in ("numpy", "numba"):
        if f"{label} default threads=1 one-core" not in w1:
            continue
        one, many = w1[f"{label} default threads=1 one-core"], w1[f"{label} default threads=all"]
        free = w1[f"{label} default threads=1 blas=free"]
        lines.append(f"W1 {label} scaling on {out['cores']} cores: one core {one * 1e3:.1f} ms / "
                     f"all {many * 1e3:.1f} ms = {one / many:.2f}x (target >= 6); one pool "
                     f"thread with BLAS free {free * 1e3:.1f} ms = {free / many:.2f}x")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="defaults only, no variants")
    ap.add_argument("--old", help="an earlier backends/numpy_.py to time beside this one")
    ap.add_argument("--no-plusplus", action="store_true", help="skip the k-means++ rows")
    ap.add_argument("--only", default=",".join(WORKLOADS),
                    help="comma-separated workloads to run (default: all)")
    ap.add_argument("--no-stages", action="store_true",
                    help="skip the stage breakdowns (numpy_stages.py) of " + ", ".join(STAGES))
    args = ap.parse_args()
    start_worker_pool()
    old = _Old(args.old) if args.old else None
    out = {"cores": len(os.sched_getaffinity(0)), "iters": args.iters, "workloads": {}}
    for name, (n, d, k) in WORKLOADS.items():
        if name not in args.only.split(","):
            continue
        X, init = data(n, d, k)
        out["workloads"][name] = lloyd_rows(name, X, init, args.iters, args.repeats,
                                            args.quick, old)
        print(name, json.dumps(out["workloads"][name]), flush=True)
        if name in STAGES and not args.no_stages:
            from numpy_stages import breakdown, describe
            out.setdefault("stages", {})[name] = rows = [
                breakdown(X, init, threads) for threads in (None, 1)]
            for row in rows:
                print(name, "stages", describe(row), flush=True)
    if not args.no_plusplus:
        tiny = os.environ.get("KMEANS_XP_PROBE_TINY")
        pp_n, pp_k = (500_000, 500) if not tiny else (5000, 20)
        out["kmeans_plusplus n=500000 k=500"] = plusplus_rows(pp_n, pp_k, 1)
        print(json.dumps(out["kmeans_plusplus n=500000 k=500"]), flush=True)
    out["summary"] = summary(out)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print("\n".join(out["summary"]), flush=True)


if __name__ == "__main__":
    main()
