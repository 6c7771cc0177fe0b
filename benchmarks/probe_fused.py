"""Timing probe for `cupy-fused`: ms per Lloyd iteration on the issue's workloads (float32).

    python benchmarks/probe_fused.py OUT.json [--quick]

W1 n=2M d=3 k=200, W2 n=2M d=3 k=500, W3 n=20M d=3 k=1000, W5 n=1M d=128 k=4096, each for a
few backend options (fused or split passes; fp32, tf32 through cuBLAS, tf32 fused). One
"iteration" is exactly what `kmeans_single` does per iteration: assignment (+ fused or
separate sums), fixed-point finalize, the one device-to-host copy of the statistics, the
center update. Warm-up first (NVRTC compile, pool growth), the device synchronised before
each clock read, median of several repeats. Also times the assignment pass alone (CUDA
events), the once-per-fit and per-relocation extras a whole fit adds (the relocation-key
pass over X, the final direct inertia), and a whole `kmeans_single` (with how many
assignment passes it ran and how many empty clusters it relocated), and checks the labels
of a subsample against the numpy backend.
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
VARIANTS = {
    "W1": [{}, {"fuse": False}, {"points_per_thread": 8}],
    "W2": [{}, {"fuse": False}],
    "W3": [{}, {"fuse": False}],
    "W5": [{}, {"precision": "tf32", "tf32_kernel": "cublas"}, {"precision": "tf32"}],
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
    st, X, w = be._prepare(X, w, init.shape[0])
    centers = be._pack(st, init).copy()
    spare = cp.empty_like(centers)
    st.scales()
    state = {"c": centers, "s": spare}

    def iteration():
        be._assign_pass(st, count_changed=True, accumulate=True)
        be._finalize(st)
        st.stats.get()  # the one transfer per iteration
        be._update(st, state["c"], state["s"])
        state["c"], state["s"] = state["s"], state["c"]

    for _ in range(3):
        iteration()
    be.synchronize()
    runs = []
    for _ in range(repeats):
        be.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            iteration()
        be.synchronize()
        runs.append((time.perf_counter() - t0) * 1e3 / iters)
    # assignment pass alone (no sums), device time by events
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        be._assign_pass(st)
    stop.record()
    stop.synchronize()
    assign_ms = cp.cuda.get_elapsed_time(start, stop) / iters
    # what a fit adds: one relocation-key pass over X per iteration that has empty clusters
    # (m = 0: the keys only), and the final inertia by direct differences once per fit
    extras = {}
    for name, fn in (("relocation_keys_ms", lambda: be._relocate(st, state["c"], 0)),
                     ("final_inertia_ms", lambda: be._direct_inertia(st, state["c"]))):
        fn()
        start.record()
        for _ in range(3):
            fn()
        stop.record()
        stop.synchronize()
        extras[name] = cp.cuda.get_elapsed_time(start, stop) / 3
    return float(np.median(runs)), runs, float(assign_ms), st.plan, extras


def check_labels(cp, be, X, init, rows):
    """Share of a subsample's labels equal to the numpy backend's (ties may differ)."""
    from kmeans_xp_backends.numpy_ import NumpyBackend
    Xs = X[:rows]
    got = be.assign(Xs, init).labels.get()
    ref = NumpyBackend().assign(Xs.get(), init.get()).labels
    return float(np.mean(got == ref))


def main(argv):
    import cupy as cp
    from kmeans_xp_backends.cupy_fused import CupyFusedBackend

    out_path = argv[1] if len(argv) > 1 else "probe_fused.json"
    quick = "--quick" in argv
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
        if quick:
            n = n // 10
        X, init = make_data(cp, n, d, k)
        w = cp.ones(n, dtype=cp.float32)
        iters = 20 if n * k * d < 5e10 else 5
        for opts in VARIANTS[wl]:
            be = CupyFusedBackend(**opts)
            ms, runs, assign_ms, plan, extras = time_iterations(cp, be, X, w, init, iters,
                                                                repeats=5)
            t0 = time.perf_counter()
            res = be.kmeans_single(X, w, init, max_iter=10, tol=-1.0)
            be.synchronize()
            fit_ms = (time.perf_counter() - t0) * 1e3 / res.n_iter
            loop = dict(getattr(be, "last_loop", {}))
            agree = check_labels(cp, be, X, init, 100_000 if d <= 16 else 10_000)
            name = wl + ("-tf32" if opts.get("precision") == "tf32" else "")
            row = {
                "workload": wl, "n": n, "d": d, "k": k, "options": opts,
                "path": plan.path, "fused": plan.fuse, "sums": plan.acc_mode,
                "points_per_thread": plan.P, "assign_grid": plan.assign_grid,
                "ms_per_iteration": ms, "runs_ms": runs, "assign_only_ms": assign_ms,
                "update_share_ms": ms - assign_ms,
                "pairs_per_s": n * k / (ms * 1e-3),
                "fit_ms_per_iteration": fit_ms, "fit_n_iter": res.n_iter,
                "fit_assignment_passes": loop.get("assignment_passes"),
                "fit_relocated_clusters": loop.get("relocated_clusters"),
                **extras,
                "label_agreement_with_numpy": agree,
                "target_ms": None if quick else TARGET_MS.get(name),
            }
            results.append(row)
            print(f"{name:8s} {str(opts):28s} {plan.path:5s} fused={plan.fuse!s:5s} "
                  f"sums={plan.acc_mode:6s} {ms:8.3f} ms/iter (assign {assign_ms:7.3f}) "
                  f"{row['pairs_per_s']:.3g} pairs/s  fit {fit_ms:7.3f} ms/iter  "
                  f"agree {agree:.5f}  target {row['target_ms']}")
            print(f"{'':8s} fit: {res.n_iter} iterations, {loop.get('assignment_passes')} "
                  f"passes, {loop.get('relocated_clusters')} clusters relocated; "
                  f"relocation keys {extras['relocation_keys_ms']:.3f} ms, final inertia "
                  f"{extras['final_inertia_ms']:.3f} ms")
        del X, init, w
        cp.get_default_memory_pool().free_all_blocks()
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main(sys.argv)
