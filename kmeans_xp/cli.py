"""The `kmeans-xp` command (also `python -m kmeans_xp`).

    kmeans-xp compare        same fit on every backend: time, memory, agreement (the default)
    kmeans-xp sweep          the same protocol over a range of n or k: scaling curves
    kmeans-xp plot           the PNGs again from a saved compare/sweep JSON
    kmeans-xp plot-clusters  the seed's picture of points and centers, readable for large k
    kmeans-xp run            one fit of the seed's workload on the best backend
    kmeans-xp backends       which backends are installed

With no arguments it runs `compare` with defaults scaled to the machine: the seed's n=2M, d=3,
k=500 on every backend when a CUDA GPU is present, a workload that takes seconds on the CPU
backends otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

#: defaults when a GPU is present: the seed's workload, every backend
GPU_DEFAULTS = dict(n=2_000_000, d=3, k=500, backends="all")
#: defaults on a CPU-only machine: seconds on numpy and array-api
CPU_DEFAULTS = dict(n=200_000, d=3, k=100, backends="numpy,array-api")


def _add_run(sub):
    p = sub.add_parser("run", help="fit the seed's workload once and report time, inertia, "
                                   "memory")
    p.add_argument("--n", type=int, default=2_000_000, help="number of points (default 2M)")
    p.add_argument("--d", type=int, default=3, help="dimension (default 3)")
    p.add_argument("--k", type=int, default=200, help="clusters (default 200)")
    p.add_argument("--iters", type=int, default=10, help="max Lloyd iterations (default 10)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--backend", default="auto", help="backend name or 'auto'")
    p.add_argument("--max-memory", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_run)


def cmd_run(args):
    from . import KMeans, list_backends
    from .data import seed_data
    from .memory import format_bytes

    X = seed_data(args.n, args.d, dtype=np.dtype(args.dtype), random_state=args.seed)
    print(f"data: seed workload, n={args.n:,}, d={args.d}, k={args.k}, {args.dtype}")
    print("backends available: " + ", ".join(
        n for n, i in list_backends().items() if i.available))
    km = KMeans(args.k, init="random", n_init=1, max_iter=args.iters, tol=0,
                random_state=args.seed, backend=args.backend, max_memory=args.max_memory)
    km.fit(X)
    t = km.timings_
    print(f"backend: {km.backend_} ({km.backend_reason_})")
    print(f"time: total {t['total']:.3f} s, transfer {t['transfer']:.3f} s, init "
          f"{t['init']:.3f} s, Lloyd {t['lloyd']:.3f} s for {km.n_iter_} iterations "
          f"({1e3 * t['per_iteration']:.1f} ms/iteration)")
    print(f"inertia: {km.inertia_:.6g}")
    if km.memory_report_:
        print("memory: " + ", ".join(f"{k} {format_bytes(v)}"
                                     for k, v in km.memory_report_.items()))
    return 0


def cmd_backends(args):
    from . import list_backends
    for name, info in list_backends().items():
        state = "available" if info.available else f"unavailable: {info.reason}"
        hint = f" ({info.install})" if info.install and not info.available else ""
        print(f"{name:14s} {state}{hint}  [{info.provider}]")
    return 0


# -- compare and sweep ----------------------------------------------------------------------


def _int(text):
    """'2000000', '2_000_000', '2e6', '2M' or '200k' -> int."""
    t = str(text).strip().lower().replace("_", "")
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(t[-1:], 1)
    if scale > 1:
        t = t[:-1]
    try:
        return int(round(float(t) * scale))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count (e.g. 2000000, 2e6, 2M)") from None


def _add_protocol_args(p):
    from .bench import WORKLOADS
    g = p.add_argument_group("workload (defaults scale to the machine)")
    g.add_argument("--workload", choices=sorted(WORKLOADS),
                   help="a named workload: " + "; ".join(
                       f"{k} n={v['n']:,} d={v['d']} k={v['k']}" for k, v in WORKLOADS.items()))
    g.add_argument("--n", type=_int, help="points (GPU: 2M; CPU only: 200k)")
    g.add_argument("--d", type=_int, help="features (default 3)")
    g.add_argument("--k", type=_int, help="clusters (GPU: 500; CPU only: 100)")
    g.add_argument("--iters", type=_int, default=10, help="Lloyd iterations, tol=0 (10)")
    g.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    g.add_argument("--data", default="seed",
                   help="'seed' (the seed's two Gaussians), 'blobs', or PATH.npy")
    g.add_argument("--init", default="random", choices=["random", "k-means++"],
                   help="how the ONE shared init is computed (random, as the seed)")
    g.add_argument("--seed", type=int, default=0, help="random seed for data and init")
    g = p.add_argument_group("protocol")
    g.add_argument("--backends", default=None,
                   help="comma-separated backend names, NAME@namespace (e.g. array-api@cupy), "
                        "or 'all' (GPU: all; CPU only: numpy,array-api)")
    g.add_argument("--max-memory", default="auto",
                   help="working-memory bound for every backend (e.g. 2GB); for the seed "
                        "reference, the memory it may use (a smaller card)")
    g.add_argument("--repeats", type=_int, default=3, help="timed fits per row; median (3)")
    g.add_argument("--cpu-repeats", type=_int, default=None,
                   help="timed fits for CPU rows (default: --repeats); seconds-long CPU "
                        "iterations need fewer repeats than millisecond GPU ones")
    g.add_argument("--warmup-iters", type=_int, default=2,
                   help="iterations of the untimed warm-up fit (2)")
    g.add_argument("--include-seed", action="store_true",
                   help="add the seed's original broadcasting algorithm (float64) as a row")
    g.add_argument("--seed-device", default="auto", choices=["auto", "gpu", "cpu", "both"],
                   help="where the seed reference runs (auto: the GPU if there is one)")
    g.add_argument("--include-torch", action="store_true",
                   help="add a torch chunked-GEMM + argmin baseline as a row")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, help="directory for the JSON result and PNG plots")
    g.add_argument("--name", help="file name stem inside --out (default: the command)")
    g.add_argument("--quiet", action="store_true",
                   help="no progress bars and no header; the table still prints")


def _workload(args):
    from .bench import WORKLOADS, Workload, cupy_gpu
    defaults = GPU_DEFAULTS if cupy_gpu() else CPU_DEFAULTS
    named = WORKLOADS.get(args.workload, {})
    size = {key: getattr(args, key) or named.get(key) or defaults[key] for key in ("n", "d", "k")}
    if args.data not in ("seed", "blobs") and not (args.n or named):
        size["n"] = 0  # a file: all its rows unless --n says fewer (d comes from the file)
    w = Workload(**size, iters=args.iters, dtype=args.dtype, data=args.data, init=args.init,
                 seed=args.seed, repeats=args.repeats, cpu_repeats=args.cpu_repeats,
                 warmup_iters=args.warmup_iters, max_memory=args.max_memory)
    return w, args.backends or defaults["backends"]


def _say(args, *text):
    if not args.quiet:
        print(*text, flush=True)


def _write(args, result, plots):
    """JSON and PNGs into --out; plots skipped with a message when matplotlib is missing."""
    if args.out is None:
        _say(args, "(give --out DIR to save the JSON result and the plots)")
        return
    from .plot import PlotUnavailable
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.name or args.command
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    written = [str(path)]
    try:
        for suffix, fn in plots:
            written.append(fn(result, args.out / f"{stem}-{suffix}.png"))
    except PlotUnavailable as exc:
        print(f"plots skipped: {exc}", file=sys.stderr)
    _say(args, "wrote " + ", ".join(written))


def cmd_compare(args):
    from . import bench, plot
    w, backends = _workload(args)
    _say(args, f"compare: n={w.n:,} d={w.d} k={w.k} iters={w.iters} {w.dtype}, "
               f"backends {backends}")
    result = bench.compare(backends, w, include_seed=args.include_seed,
                           seed_device=args.seed_device, include_torch=args.include_torch,
                           progress=not args.quiet)
    _say(args, bench.describe(result))
    print(bench.format_table(result))
    _write(args, result, [("time", plot.plot_time), ("memory", plot.plot_memory)])
    return 0 if any(r["status"] == "ok" for r in result["rows"]) else 1


def cmd_sweep(args):
    from . import bench, plot
    w, backends = _workload(args)
    _say(args, f"sweep over {args.vary}: {args.values}")
    result = bench.sweep(args.vary, args.values, backends, w,
                         include_seed=args.include_seed, seed_device=args.seed_device,
                         include_torch=args.include_torch, progress=not args.quiet)
    print(bench.format_table(result))
    _write(args, result, [("scaling", plot.plot_sweep)])
    return 0 if any(r["status"] == "ok" for r in result["rows"]) else 1


def _add_compare(sub):
    p = sub.add_parser("compare", help="the same fit on several backends: time per iteration, "
                                       "pairs/s, memory, agreement, speed-up")
    _add_protocol_args(p)
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("sweep", help="the compare protocol over a range of n or k")
    p.add_argument("--vary", required=True, choices=["n", "k", "d"])
    p.add_argument("--values", required=True,
                   type=lambda s: [_int(v) for v in s.split(",") if v.strip()],
                   help="comma-separated values, e.g. 100k,1M,10M")
    _add_protocol_args(p)
    p.set_defaults(func=cmd_sweep)


def cmd_plot(args):
    """PNGs again from a saved compare/sweep JSON (e.g. a result brought back from a GPU host)."""
    from . import plot
    result = json.loads(args.result.read_text())
    kind = result.get("kind")
    plots = {"compare": [("time", plot.plot_time), ("memory", plot.plot_memory)],
             "sweep": [("scaling", plot.plot_sweep)]}.get(kind)
    if plots is None:
        raise SystemExit(f"{args.result}: not a kmeans-xp compare or sweep result (kind={kind!r})")
    out = args.out or args.result.parent
    out.mkdir(parents=True, exist_ok=True)
    try:
        written = [fn(result, out / f"{args.result.stem}-{suffix}.png") for suffix, fn in plots]
    except plot.PlotUnavailable as exc:
        print(f"plot: {exc}", file=sys.stderr)
        return 1
    print("wrote " + ", ".join(written))
    return 0


def _add_plot(sub):
    p = sub.add_parser("plot", help="draw the PNGs of a saved compare or sweep JSON result")
    p.add_argument("result", type=Path, help="a JSON file written by compare or sweep")
    p.add_argument("--out", type=Path, help="directory for the PNGs (default: beside it)")
    p.set_defaults(func=cmd_plot)


# -- plot-clusters --------------------------------------------------------------------------


def _add_plot_clusters(sub):
    p = sub.add_parser("plot-clusters", help="scatter of points colored by cluster with the "
                                             "centers marked (from a fit or a saved .npz)")
    p.add_argument("--from", dest="source", type=Path,
                   help="a saved result .npz with X, labels, centers (no fit is run)")
    p.add_argument("--n", type=_int, default=200_000)
    p.add_argument("--d", type=_int, default=3)
    p.add_argument("--k", type=_int, default=200)
    p.add_argument("--iters", type=_int, default=20)
    p.add_argument("--data", default="seed", help="'seed', 'blobs' or PATH.npy")
    p.add_argument("--backend", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-points", type=_int, default=60_000,
                   help="points drawn (a uniform subsample; default 60k)")
    p.add_argument("--features", default="0,1", help="the two features on the axes (0,1)")
    p.add_argument("--out", type=Path, default=Path("clusters.png"), help="PNG to write")
    p.add_argument("--save", type=Path, help="also save the drawn result as .npz")
    p.set_defaults(func=cmd_plot_clusters)


def _fresh_fit(args):
    from . import KMeans
    from .bench import Workload, make_data
    from .namespaces import to_numpy
    X = make_data(Workload(n=args.n, d=args.d, k=args.k, data=args.data, seed=args.seed))
    km = KMeans(args.k, n_init=1, max_iter=args.iters, random_state=args.seed,
                backend=args.backend).fit(X)
    print(f"fit: {km.backend_}, n={len(X):,} k={args.k}, {km.n_iter_} iterations, "
          f"inertia {km.inertia_:.6g}")
    return X, to_numpy(km.labels_), to_numpy(km.cluster_centers_)


def _load_npz(path):
    with np.load(path) as f:
        missing = {"X", "labels", "centers"} - set(f.files)
        if missing:
            raise SystemExit(f"{path}: missing arrays {sorted(missing)} (need X, labels, "
                             f"centers; found {f.files})")
        return f["X"], f["labels"], f["centers"]


def cmd_plot_clusters(args):
    from .plot import PlotUnavailable, plot_clusters
    X, labels, centers = _load_npz(args.source) if args.source else _fresh_fit(args)
    features = tuple(int(v) for v in args.features.split(","))
    if len(features) != 2 or (X.shape[1] > 1 and max(features) >= X.shape[1]):
        raise SystemExit(f"--features needs two indices below d={X.shape[1]}")
    if args.save:
        keep = np.random.default_rng(args.seed).permutation(len(X))[: args.max_points]
        np.savez_compressed(args.save, X=X[keep], labels=labels[keep], centers=centers)
    try:
        path = plot_clusters(X, labels, centers, args.out, max_points=args.max_points,
                             features=features, random_state=args.seed)
    except PlotUnavailable as exc:
        print(f"plot-clusters: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


# -- entry point ----------------------------------------------------------------------------


def build_parser():
    parser = argparse.ArgumentParser(prog="kmeans-xp", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="command")
    _add_compare(sub)
    _add_plot(sub)
    _add_plot_clusters(sub)
    _add_run(sub)
    p = sub.add_parser("backends", help="list backends and whether they are installed")
    p.set_defaults(func=cmd_backends)
    return parser


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["compare", *argv]  # no command: compare (with defaults scaled to the machine)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
