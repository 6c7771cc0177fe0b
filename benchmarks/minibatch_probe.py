"""MiniBatchKMeans's targets (issue 16): the same steps as scikit-learn's MiniBatchKMeans on the
CPU (not slower), on the GPU (>= 20x sklearn at n=20M, d=3, k=1000, batch_size=65536), and
partial_fit over a 12 GB memmap in bounded memory.

Every row fits from the same explicit init with max_no_improvement=None and tol=0, so each
runs exactly max_iter * n // batch_size steps (the same batches from the same seed), with
compute_labels=False (the steps alone; the labels pass is timed apart for ours). GPU rows
are skipped without CuPy and a GPU; each is run once small first (kernel compiles).

    python benchmarks/minibatch_probe.py --out minibatch.json [--n 2e7 --k 1000 ...]
    python benchmarks/minibatch_probe.py --out small.json --n 2e5 --memmap-gb 0.05  # CPU
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import tracemalloc

import numpy as np

GPU_BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")


def data(n, d, k, seed=0):
    """k blobs in d features on different scales, float32, generated in chunks."""
    rng = np.random.default_rng(seed)
    centers = (rng.uniform(-10, 10, size=(k, d)) * (1 + np.arange(d) * 0.7)).astype(np.float32)
    X = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 1 << 22):
        e = min(s + (1 << 22), n)
        X[s:e] = centers[rng.integers(0, k, e - s)]
        X[s:e] += rng.standard_normal((e - s, d), dtype=np.float32)
    return X


def rss_anon():
    """Anonymous resident bytes of this process (file-backed memmap pages excluded)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def params(args, init):
    return dict(n_clusters=init.shape[0], init=init, batch_size=args.batch_size,
                max_iter=args.max_iter, max_no_improvement=None, tol=0.0, random_state=0,
                compute_labels=False, n_init=1)


def sklearn_row(X, init, args):
    from sklearn.cluster import MiniBatchKMeans as Sk
    from threadpoolctl import threadpool_info
    t0 = time.perf_counter()
    km = Sk(**params(args, init)).fit(X)
    wall = time.perf_counter() - t0
    return {"impl": "sklearn", "fit_s": wall, "n_steps": int(km.n_steps_),
            "per_step_ms": 1e3 * wall / km.n_steps_, "inertia_ewa": float(km.inertia_),
            "threads": [i.get("num_threads") for i in threadpool_info()],
            "centers_head": km.cluster_centers_[:2].tolist()}, km


def ours_row(X, init, args, backend, ref=None, labels=False):
    from kmeans_xp import MiniBatchKMeans
    from kmeans_xp.contract.namespaces import to_numpy
    km = MiniBatchKMeans(backend=backend, **params(args, init))
    t0 = time.perf_counter()
    km.fit(X)
    wall = time.perf_counter() - t0
    row = {"impl": "kmeans_xp", "backend": km.backend_, "input": type(X).__module__,
           "fit_s": wall, "n_steps": int(km.n_steps_), "per_step_ms": 1e3 * wall / km.n_steps_,
           "timings": {k: float(v) for k, v in km.timings_.items()},
           "inertia_ewa": float(km.inertia_),
           "memory_report": {k: int(v) for k, v in km.memory_report_.items()}}
    if ref is not None:
        c = np.asarray(to_numpy(km.cluster_centers_), dtype=np.float64)
        row["speedup_vs_sklearn"] = ref["fit_s"] / wall
        row["max_center_diff_vs_sklearn"] = float(np.max(np.abs(c - ref["_centers"])))
        row["same_steps_as_sklearn"] = row["n_steps"] == ref["n_steps"]
    if labels:
        t0 = time.perf_counter()
        km.set_params(compute_labels=True)
        lab = km.predict(X)
        to_numpy(lab[:1])
        row["labels_pass_s"] = time.perf_counter() - t0
    return row


def memmap_row(args, backend):
    """partial_fit over a memmap of args.memmap_gb GB (written first, in chunks), batch by
    batch: peak traced allocations and anonymous RSS against the file's size."""
    from kmeans_xp import MiniBatchKMeans
    d = 3
    n = int(args.memmap_gb * 1e9) // (4 * d)
    folder = args.memmap_dir or tempfile.gettempdir()
    path = os.path.join(folder, "kmeans_xp_minibatch_probe.npy")
    t0 = time.perf_counter()
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    step = 1 << 24
    for s in range(0, n, step):
        X[s:s + step] = data(min(step, n - s), d, 50, seed=s)
    X.flush()
    del X
    write_s = time.perf_counter() - t0
    X = np.load(path, mmap_mode="r")
    rows = args.memmap_batch
    km = MiniBatchKMeans(args.memmap_k, batch_size=rows, random_state=0, compute_labels=False,
                         backend=backend)
    rss0 = rss_anon()
    rss_peak = rss0
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        for s in range(0, n, rows):
            km.partial_fit(X[s:s + rows])
            r = rss_anon()
            if r is not None and s % (64 * rows) == 0:
                rss_peak = max(rss_peak, r)
        fit_s = time.perf_counter() - t0
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        del X
        os.remove(path)
    return {"backend": km.backend_, "file_bytes": n * d * 4, "n": n, "batch_rows": rows,
            "k": args.memmap_k, "write_s": write_s, "partial_fit_s": fit_s,
            "n_steps": int(km.n_steps_), "rows_per_s": n / fit_s,
            "peak_traced_bytes": int(traced), "batch_bytes": rows * d * 4,
            "rss_anon_growth_bytes": None if rss0 is None else int(rss_peak - rss0)}


def gpu():
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=float, default=2e7)
    ap.add_argument("--d", type=int, default=3)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--max-iter", type=int, default=1, help="steps = max_iter * n // batch")
    ap.add_argument("--memmap-gb", type=float, default=12.0, help="0: no memmap row")
    ap.add_argument("--memmap-dir", default=None)
    ap.add_argument("--memmap-k", type=int, default=100)
    ap.add_argument("--memmap-batch", type=int, default=1 << 20)
    ap.add_argument("--skip-sklearn", action="store_true")
    args = ap.parse_args(argv)
    n = int(args.n)
    out = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "args": vars(args), "rows": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)

    X = data(n, args.d, args.k)
    init = X[np.random.default_rng(1).choice(n, args.k, replace=False)].copy()
    ref = None
    if not args.skip_sklearn:
        ref, sk = sklearn_row(X, init, args)
        out["rows"].append(ref)
        ref = {**ref, "_centers": sk.cluster_centers_.astype(np.float64)}
        save()
    out["rows"].append(ours_row(X, init, args, "numpy", ref, labels=True))
    save()
    cp = gpu()
    if cp is not None:
        out["machine"]["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        small = argparse.Namespace(**{**vars(args), "max_iter": 1})
        Xd = cp.asarray(X)
        for name in GPU_BACKENDS:
            for Xin, label in ((Xd, "device X"), (X, "host X")):
                try:
                    ours_row(Xin[:200_000], init, small, name)  # compiles, allocations
                    cp.cuda.Device().synchronize()
                    row = ours_row(Xin, init, args, name, ref, labels=label == "device X")
                    cp.cuda.Device().synchronize()
                except Exception as exc:  # noqa: BLE001 - a row that fails says why
                    row = {"backend": name, "error": f"{type(exc).__name__}: {exc}"}
                row["x_placement"] = label
                out["rows"].append(row)
                save()
        del Xd
    del X
    if args.memmap_gb > 0:
        out["memmap"] = [memmap_row(args, "numpy")]
        save()
        if cp is not None:
            out["memmap"].append(memmap_row(args, "cupy-kernels"))
            save()
    for row in out["rows"]:
        print({k: row.get(k) for k in ("impl", "backend", "x_placement", "fit_s", "n_steps",
                                      "per_step_ms", "speedup_vs_sklearn", "error")})
    for row in out.get("memmap", []):
        print(row)


if __name__ == "__main__":
    main()
