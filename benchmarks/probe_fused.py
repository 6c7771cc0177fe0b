"""Timing probe for `cupy-fused`: ms per Lloyd iteration on the issue's workloads (float32).

    python benchmarks/probe_fused.py OUT.json [--quick] [--only=W1,W3] [--defaults]

W1 n=2M d=3 k=200, W2 n=2M d=3 k=500, W3 n=20M d=3 k=1000, W5 n=1M d=128 k=4096, each for a
few backend options (fused or split passes; fp32, tf32 through cuBLAS, tf32 fused). One
"iteration" is what the driver (`kmeans_xp.algorithms.lloyd`) does per iteration on this backend: its
`lloyd_iter` (pack_centers, the assignment pass + fused or separate sums, finalize), the
driver's center update and its one fetch of the statistics (relocation when a cluster is
empty). Warm-up first (NVRTC compile, pool growth), the device synchronised before each clock
read, median of several repeats. Also times one lloyd_iter and one assignment on the device
(CUDA events) and a lloyd_iter's host time, the extras a fit adds (the farthest points, only
when a cluster is empty, and the final direct inertia), and a whole `KMeans.fit` per
iteration, and checks the labels of a subsample against the numpy backend.
"""
from __future__ import annotations

import datetime
import json
import platform
import sys
import time

import numpy as np

WORKLOADS = {
    "W1": (2_000_000, 3, 200),
    "W2": (2_000_000, 3, 500),
    "W3": (20_000_000, 3, 1000),
    "W5": (1_000_000, 128, 4096),
}
_SMALL = [{}, {"center_group": 1}, {"center_group": 8}, {"center_group": 32},
          {"points_per_thread": 8}, {"fuse": False}, {"fuse": False, "points_per_thread": 8}]
VARIANTS = {
    "W1": _SMALL,
    "W2": _SMALL,
    "W3": _SMALL,
    "W5": [{}, {"gemm_kernel": "3xtf32"}, {"precision": "tf32"},
           {"precision": "tf32", "tf32_kernel": "fused"},
           {"precision": "tf32", "tf32_kernel": "fused-v1"},
           {"precision": "tf32", "tf32_kernel": "cublas"}],
}
TARGET_MS = {"W1": 0.5, "W2": 0.6, "W3": 8.0, "W5": 30.0, "W5-tf32": 12.0}


def make_data(cp, n, d, k, seed=0):
    """Asymmetric blobs on the device (features on different scales and offsets), centred."""
    rs = cp.random.RandomState(seed)
    scales = 1.0 + cp.arange(d, dtype=cp.float32) * 0.7
    blobs = (rs.uniform(-10, 10, (k, d)).astype(cp.float32) * scales
             + cp.arange(d, dtype=cp.float32) * 3)
    X = blobs[rs.randint(0, k, n)]
    X += rs.standard_normal((n, d), dtype=cp.float32) * scales * 0.8
    X -= X.mean(axis=0)
    init = X[cp.asarray(np.random.default_rng(seed).choice(n, k, replace=False))].copy()
    return X, init


def time_iterations(cp, be, X, w, init, iters, repeats):
    """ms per iteration through the driver (`kmeans_xp.algorithms.lloyd.kmeans_single_lloyd`: lloyd_iter,
    the center update, the one fetch, relocation when a cluster is empty) as the difference of
    runs of 2 and 2 + iters iterations (tol=0), so the final pass and inertia cancel out; and,
    by CUDA events, one lloyd_iter and one assignment on the device, a lloyd_iter's host time,
    and what a fit adds: the farthest points (only when a cluster is empty) and the final
    inertia by direct differences."""
    from array_api_compat import array_namespace

    from kmeans_xp.algorithms.lloyd import kmeans_single_lloyd
    xp = array_namespace(X)

    relocations = []  # the relocations (farthest calls) of the last run, by empty clusters

    def counting_farthest(*args, **kwargs):
        relocations.append(int(args[4]))
        return type(be).farthest(be, *args, **kwargs)

    be.farthest = counting_farthest

    def run(m):
        relocations.clear()
        be.placement.synchronize()
        t0 = time.perf_counter()
        kmeans_single_lloyd(be, X, w, init, xp=xp, max_iter=m, tol=0.0)
        be.placement.synchronize()
        return time.perf_counter() - t0

    run(2)  # warm-up: NVRTC, pool growth
    runs = [(run(2 + iters) - run(2)) * 1e3 / iters for _ in range(repeats)]
    run(2 + iters)
    relocated = list(relocations)  # a run of 2 + iters iterations: empty clusters per relocation
    del be.farthest
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def device_ms(fn, count=5):
        fn()
        start.record()
        for _ in range(count):
            fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / count

    it = be.lloyd_iter(X, w, init, None, xp=xp)
    iter_ms = device_ms(lambda: be.lloyd_iter(X, w, init, it.labels, xp=xp))
    assign_ms = device_ms(lambda: be.assign(X, init, xp=xp))
    be.placement.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        be.lloyd_iter(X, w, init, it.labels, xp=xp)
    host_ms = (time.perf_counter() - t0) * 1e3 / 20
    extras = {"farthest_ms": device_ms(lambda: be.farthest(X, w, init, it.labels, 8, xp=xp), 3),
              "final_inertia_ms": device_ms(lambda: be.inertia(X, w, init, it.labels, xp=xp), 3),
              "lloyd_iter_host_ms": host_ms, "relocations": relocated}
    return float(np.median(runs)), runs, float(iter_ms), float(assign_ms), be._ws.plan, extras


def check_labels(cp, be, X, init, rows):
    """Share of a subsample's labels equal to the numpy backend's (ties may differ)."""
    from kmeans_xp_backends.numpy.backend import NumpyBackend
    Xs = X[:rows]
    got = be.assign(Xs, init).labels.get()
    ref = NumpyBackend().assign(Xs.get(), init.get()).labels
    return float(np.mean(got == ref))


def main(argv):
    import cupy as cp
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    from kmeans_xp import KMeans

    out_path = argv[1] if len(argv) > 1 else "probe_fused.json"
    quick = "--quick" in argv
    only = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--only=")),
                list(WORKLOADS))
    props = cp.cuda.runtime.getDeviceProperties(0)
    meta = {
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "cupy": cp.__version__, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "driver": cp.cuda.runtime.driverGetVersion(), "numpy": np.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dtype": "float32",
    }
    print(f"{meta['gpu']}  cupy {meta['cupy']}  CUDA runtime {meta['cuda_runtime']}")
    results = []
    for wl, (n, d, k) in WORKLOADS.items():
        if wl not in only:
            continue
        if quick:
            n = n // 10
        X, init = make_data(cp, n, d, k)
        w = None  # unit weights: no array at all
        iters = 20 if n * k * d < 5e10 else 5
        variants = VARIANTS[wl] if "--defaults" not in argv else (
            [{}, {"precision": "tf32"}] if d > 16 else [{}])
        for opts in variants:
            be = CupyFusedBackend(**opts)
            ms, runs, iter_ms, assign_ms, plan, extras = time_iterations(
                cp, be, X, w, init, iters, repeats=5)
            km = KMeans(k, init=init.get(), n_init=1, max_iter=10, tol=0.0,
                        backend=be.name, backend_options=opts).fit(X)
            be.placement.synchronize()
            fit_ms = km.timings_["lloyd"] * 1e3 / km.n_iter_
            agree = check_labels(cp, be, X, init, 100_000 if d <= 16 else 10_000)
            name = wl + ("-tf32" if opts.get("precision") == "tf32" else "")
            row = {
                "workload": wl, "n": n, "d": d, "k": k, "options": opts,
                "path": plan.path, "fused": plan.fuse, "sums": plan.acc_mode,
                "points_per_thread": plan.P, "center_group": plan.G,
                "assign_grid": plan.assign_grid,
                "ms_per_iteration": ms, "runs_ms": runs, "lloyd_iter_device_ms": iter_ms,
                "assign_only_ms": assign_ms, "driver_share_ms": ms - iter_ms,
                "pairs_per_s": n * k / (ms * 1e-3),
                "fit_ms_per_iteration": fit_ms, "fit_n_iter": km.n_iter_,
                **extras,
                "label_agreement_with_numpy": agree,
                "target_ms": None if quick else TARGET_MS.get(name),
            }
            results.append(row)
            print(f"{name:8s} {str(opts):28s} {plan.path:5s} fused={plan.fuse!s:5s} "
                  f"sums={plan.acc_mode:6s} {ms:8.3f} ms/iter (lloyd_iter {iter_ms:7.3f}, "
                  f"assign {assign_ms:7.3f}) "
                  f"{row['pairs_per_s']:.3g} pairs/s  fit {fit_ms:7.3f} ms/iter  "
                  f"agree {agree:.5f}  target {row['target_ms']}  "
                  f"relocations {len(extras['relocations'])} in {2 + iters}")
            print(f"{'':8s} fit: {km.n_iter_} iterations, lloyd_iter host "
                  f"{extras['lloyd_iter_host_ms']:.3f} ms; farthest {extras['farthest_ms']:.3f} ms "
                  f"(only when a cluster is empty), final inertia "
                  f"{extras['final_inertia_ms']:.3f} ms")
        del X, init, w
        cp.get_default_memory_pool().free_all_blocks()
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main(sys.argv)
