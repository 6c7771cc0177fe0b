"""The `kmeans-xp` command (also `python -m kmeans_xp`).

    kmeans-xp compare        same fit on several rows: time, memory, agreement, speed-up over
                             the fastest CPU row (the default command)
    kmeans-xp sweep          the same protocol over a range of n, k or d: scaling curves
    kmeans-xp plot           the PNGs again from a saved compare/sweep JSON
    kmeans-xp plot-clusters  the seed's picture of points and centers, readable for large k
    kmeans-xp run            one fit of the seed's workload on the best backend
    kmeans-xp backends       which backends are installed

With no arguments it runs `compare` with defaults scaled to the machine: the seed's n=2M, d=3,
k=500 with a CUDA GPU, n=200k, k=100 without one; on the default rows (every installed
backend but the slow generic ones, plus scikit-learn, faiss-cpu and torch where installed),
saving JSON and charts under kmeans_xp_results/<time>/. Sizes take 200k, 2M, 1e6, and are
checked against the host's free memory before anything is allocated. --json puts the
machine-readable result on stdout and everything else on stderr; progress goes to stderr (a
bar at a terminal, a line per fit elsewhere; --no-progress: none).

Exit status: 0 done, 1 failed (a backend or file unusable, every row failed), 2 usage error.
Errors are one line; KMEANS_XP_TRACEBACK=1 shows the traceback instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from kmeans_xp import __version__
from kmeans_xp.tools.arguments import (
    Failure,
    Parser,
    UsageError,
    check_backend,
    check_memory,
    count,
    data_option,
    json_flag,
    memory_option,
    parse_size,
    progress_flag,
    size_list,
)

#: defaults when a GPU is present: the seed's workload; CPU rows timed once (seconds each)
GPU_DEFAULTS = dict(n=2_000_000, d=3, k=500, cpu_repeats=1)
#: defaults on a CPU-only machine: seconds per row
CPU_DEFAULTS = dict(n=200_000, d=3, k=100)


def show(args, *text):
    """Text for people (a table, a headline): on stderr when stdout carries --json."""
    print(*text, file=sys.stderr if getattr(args, "json", False) else sys.stdout, flush=True)


def say(args, *text):
    """A header: as `show`, but not with --quiet."""
    if not getattr(args, "quiet", False):
        show(args, *text)


def _check_memory(args, *sizes, **where):
    """`check_memory`, and a line saying so where the host's memory is unknown."""
    if check_memory(args, *sizes, **where) is None:
        say(args, "host memory unknown here (pip install psutil): the sizes asked for are "
                  "not checked against it")


# -- run and backends -----------------------------------------------------------------------


def _add_run(sub):
    p = sub.add_parser("run", help="fit the seed's workload once and report time, inertia, "
                                   "memory")
    p.add_argument("--n", type=parse_size, default=2_000_000, help="points (default 2M)")
    p.add_argument("--d", type=parse_size, default=3, help="dimension (default 3)")
    p.add_argument("--k", type=parse_size, default=200, help="clusters (default 200)")
    p.add_argument("--iters", type=parse_size, default=10, help="max Lloyd iterations (10)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="the data's dtype, which the fit computes in (float32)")
    p.add_argument("--backend", default="auto",
                   help="backend name (see `kmeans-xp backends`) or 'auto'")
    p.add_argument("--max-memory", type=memory_option, default="auto",
                   help="working-memory bound of the fit, e.g. 2GB (auto: a share of what "
                        "is free)")
    p.add_argument("--seed", type=count, default=0, help="random seed for data and init (0)")
    p.add_argument("--verbose", action="store_true",
                   help="a line per iteration on stdout, and a progress bar on stderr")
    progress_flag(p)
    json_flag(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args):
    from kmeans_xp import KMeans, available_backends
    from kmeans_xp.algorithms.progress import progress_bars
    from kmeans_xp.contract.memory import format_bytes
    from kmeans_xp.tools.data import seed_data
    if args.k > args.n:
        raise UsageError(f"--k {args.k} is more than the {args.n} points of --n")
    check_backend(args.backend)
    _check_memory(args, "run", args.n, args.d, args.k, args.dtype, backend=args.backend)
    X = seed_data(args.n, args.d, dtype=np.dtype(args.dtype), random_state=args.seed)
    say(args, f"data: seed workload, n={args.n:,}, d={args.d}, k={args.k}, {args.dtype}")
    say(args, "backends available: " + ", ".join(available_backends()))
    km = KMeans(args.k, init="random", n_init=1, max_iter=args.iters, tol=0,
                random_state=args.seed, backend=args.backend, max_memory=args.max_memory,
                verbose=int(args.verbose))
    with progress_bars(not args.no_progress):
        km.fit(X)
    t = km.timings_
    show(args, f"backend: {km.backend_} ({km.backend_reason_})\n"
                f"time: total {t['total']:.3f} s, transfer {t['transfer']:.3f} s, init "
                f"{t['init']:.3f} s, Lloyd {t['lloyd']:.3f} s for {km.n_iter_} iterations "
                f"({1e3 * t['per_iteration']:.1f} ms/iteration)\ninertia: {km.inertia_:.6g}")
    if km.memory_report_:
        show(args, "memory: " + ", ".join(f"{k} {format_bytes(v)}"
                                           for k, v in km.memory_report_.items()))
    if args.json:
        _print_json({"kind": "run", "version": __version__, "n": args.n, "d": args.d,
                     "k": args.k, "dtype": args.dtype, "backend": km.backend_,
                     "backend_reason": km.backend_reason_, "n_iter": int(km.n_iter_),
                     "inertia": float(km.inertia_), "timings_s": dict(t),
                     "memory_report_bytes": dict(km.memory_report_ or {})})
    return 0


def cmd_backends(args):
    from kmeans_xp import list_backends
    infos = list_backends()
    if args.json:
        _print_json({name: {"available": i.available, "reason": i.reason, "gpu": i.gpu,
                            "install": i.install, "provider": i.provider}
                     for name, i in infos.items()})
        return 0
    for name, info in infos.items():
        state = "available" if info.available else f"unavailable: {info.reason}"
        hint = f" ({info.install})" if info.install and not info.available else ""
        print(f"{name:14s} {state}{hint}  [{info.provider}]")
    return 0


def _print_json(obj):
    print(json.dumps(obj, indent=1, default=str), flush=True)


# -- compare and sweep ----------------------------------------------------------------------


def _add_protocol_args(p):
    from kmeans_xp.tools.bench.workload import SHARED_INITS, WORKLOADS
    g = p.add_argument_group("workload (defaults scale to the machine)")
    g.add_argument("--workload", choices=sorted(WORKLOADS),
                   help="a named workload: " + "; ".join(
                       f"{k} n={v['n']:,} d={v['d']} k={v['k']}" for k, v in WORKLOADS.items()))
    g.add_argument("--n", type=parse_size, help="points (GPU: 2M; CPU only: 200k)")
    g.add_argument("--d", type=parse_size, help="features (default 3)")
    g.add_argument("--k", type=parse_size, help="clusters (GPU: 500; CPU only: 100)")
    g.add_argument("--iters", type=parse_size, default=10, help="Lloyd iterations, tol=0 (10)")
    g.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="the data's dtype, which every row computes in (faiss: float32)")
    g.add_argument("--data", type=data_option, default="seed",
                   help="'seed' (the seed's two Gaussians), 'blobs', or PATH.npy")
    g.add_argument("--init", default="random", choices=SHARED_INITS,
                   help="how the ONE shared init is computed (random, as the seed)")
    g.add_argument("--seed", type=count, default=0, help="random seed for data and init")
    g = p.add_argument_group("protocol")
    g.add_argument("--backends", default=None,
                   help="rows: 'default' (installed backends but the generic array-api and "
                        "dask, plus scikit-learn, faiss-cpu, torch where installed), 'all', "
                        "or names: numpy,cupy-fused,sklearn,faiss,torch, NAME@namespace "
                        "(array-api@cupy); 'default,array-api' adds to the default")
    g.add_argument("--max-memory", type=memory_option, default="auto",
                   help="working-memory bound for every backend (e.g. 2GB); for the seed "
                        "reference, the memory it may use (a smaller card)")
    g.add_argument("--repeats", type=parse_size, default=3,
                   help="timed fits per row: their median, min and max; a warning when they "
                        "spread beyond 1.5x (3)")
    g.add_argument("--cpu-repeats", type=parse_size, default=None,
                   help="timed fits for CPU rows (default: --repeats; 1 with a GPU): "
                        "seconds-long CPU fits need fewer repeats than millisecond GPU ones")
    g.add_argument("--warmup-iters", type=count, default=2,
                   help="iterations of the untimed warm-up fit, whose one-time cost (JIT "
                        "compile) is reported apart (2; 0: none)")
    g.add_argument("--include-seed", action="store_true",
                   help="add the seed's original broadcasting algorithm (float64) as a row")
    g.add_argument("--seed-device", default="auto", choices=["auto", "gpu", "cpu", "both"],
                   help="where the seed reference runs (auto: the GPU if there is one)")
    g.add_argument("--include-torch", action="store_true",
                   help="add the torch chunked-GEMM baseline (same as naming 'torch')")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path,
                   help="directory for the JSON result and PNG charts (default: "
                        "kmeans_xp_results/<time>/)")
    g.add_argument("--no-save", action="store_true", help="write no files")
    g.add_argument("--name", help="file name stem inside the directory (default: the command)")
    g.add_argument("--quiet", action="store_true",
                   help="no progress and no header; the table and headline still print")
    progress_flag(g)
    json_flag(g)


def _workload(args):
    """The Workload and the row selection, checked before anything runs."""
    from kmeans_xp.tools import bench
    defaults = GPU_DEFAULTS if bench.cupy_gpu() else CPU_DEFAULTS
    named = bench.WORKLOADS.get(args.workload, {})
    size = {key: getattr(args, key) or named.get(key) or defaults[key] for key in ("n", "d", "k")}
    if args.data not in ("seed", "blobs") and not (args.n or named):
        size["n"] = 0  # a file: all its rows unless --n says fewer (d comes from the file)
    w = bench.Workload(**size, iters=args.iters, dtype=args.dtype, data=args.data,
                       init=args.init, seed=args.seed, repeats=args.repeats,
                       cpu_repeats=args.cpu_repeats or defaults.get("cpu_repeats"),
                       warmup_iters=args.warmup_iters, max_memory=args.max_memory)
    try:
        n, _ = bench.data_shape(w)
    except (OSError, ValueError) as exc:
        raise Failure(str(exc)) from None
    if w.k > n:
        raise UsageError(f"--k {w.k} is more than the {n:,} points of the data; ask for at "
                         f"most {n:,} clusters")
    chosen = bench.select(args.backends, include_torch=args.include_torch)
    bench.check_specs(chosen.specs)  # ValueError: a usage error
    largest = {key: getattr(w, key) for key in ("n", "d", "k")}
    largest["n"] = n
    if getattr(args, "vary", None):  # a sweep: its largest value
        largest[args.vary] = max(args.values)
    _check_memory(args, args.command, **largest, dtype=w.dtype, data=w.data)
    return w, chosen


def _finish(args, result, plots):
    """The text, the results folder (said at the end), the JSON on stdout with --json."""
    from kmeans_xp.tools.bench import output
    show(args, output.report_text(result, header=not args.quiet))
    if not args.no_save:
        folder = output.results_dir(args.out)
        written, skipped = output.save_result(result, folder, args.name or args.command, plots)
        if skipped:
            print(f"kmeans-xp: charts skipped: {skipped}", file=sys.stderr)
        show(args, f"results: {folder}{os.sep} ({', '.join(written)})")
    if args.json:
        print(output.to_json(result), end="", flush=True)
    if not any(r["status"] == "ok" for r in result["rows"]):
        print("kmeans-xp: error: no row ran (the table says why)", file=sys.stderr)
        return 1
    return 0


def _header(args, command, w, chosen, vary=None, values=()):
    """The command, the workload (a swept size as its values) and the rows."""
    rows = ", ".join(chosen.specs) + (", seed-reference" if args.include_seed else "")
    size = {"n": f"{w.n:,}" if w.n else "all", "d": str(w.d), "k": str(w.k)}
    if vary:
        size[vary] = ",".join(f"{v:,}" for v in values)
    say(args, f"kmeans-xp {__version__} {command}: "
               + " ".join(f"{key}={v}" for key, v in size.items())
               + f" iters={w.iters} {w.dtype}; rows: {rows}")


def _progress(args):
    return not (args.quiet or args.no_progress)


def cmd_compare(args):
    from kmeans_xp.tools import bench, plot
    w, chosen = _workload(args)
    _header(args, "compare", w, chosen)
    result = bench.compare(args.backends, w, include_seed=args.include_seed,
                           seed_device=args.seed_device, include_torch=args.include_torch,
                           progress=_progress(args))
    return _finish(args, result, plot.charts_for("compare"))


def cmd_sweep(args):
    from kmeans_xp.tools import bench, plot
    w, chosen = _workload(args)
    _header(args, f"sweep over {args.vary}", w, chosen, args.vary, args.values)
    result = bench.sweep(args.vary, args.values, args.backends, w,
                         include_seed=args.include_seed, seed_device=args.seed_device,
                         include_torch=args.include_torch, progress=_progress(args))
    return _finish(args, result, plot.charts_for("sweep"))


def _add_compare(sub):
    p = sub.add_parser("compare", help="the same fit on several rows: time per iteration, "
                                       "pairs/s, memory, agreement, speed-up")
    _add_protocol_args(p)
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("sweep", help="the compare protocol over a range of n, k or d")
    p.add_argument("--vary", required=True, choices=["n", "k", "d"],
                   help="the size that takes each of --values (the others stay as given)")
    p.add_argument("--values", required=True, type=size_list,
                   help="comma-separated values, e.g. 100k,1M,10M")
    _add_protocol_args(p)
    p.set_defaults(func=cmd_sweep)


def cmd_plot(args):
    """PNGs again from a saved compare/sweep JSON (e.g. a result brought back from a GPU host)."""
    from kmeans_xp.tools.plot import redraw
    print("wrote " + ", ".join(redraw(args.result, args.out)))
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
    p.add_argument("--n", type=parse_size, default=200_000, help="points (200k)")
    p.add_argument("--d", type=parse_size, default=3, help="features (3)")
    p.add_argument("--k", type=parse_size, default=200, help="clusters (200)")
    p.add_argument("--iters", type=parse_size, default=20, help="max Lloyd iterations (20)")
    p.add_argument("--data", type=data_option, default="seed", help="'seed', 'blobs' or PATH.npy")
    p.add_argument("--backend", default="auto",
                   help="backend name (see `kmeans-xp backends`) or 'auto'")
    p.add_argument("--max-memory", type=memory_option, default="auto",
                   help="working-memory bound of the fit, e.g. 2GB (auto)")
    p.add_argument("--seed", type=count, default=0,
                   help="random seed for data, init and the drawn subsample (0)")
    p.add_argument("--max-points", type=parse_size, default=60_000,
                   help="points drawn (a uniform subsample; default 60k)")
    p.add_argument("--features", default="0,1", help="the two features on the axes (0,1)")
    p.add_argument("--out", type=Path, default=Path("clusters.png"), help="PNG to write")
    p.add_argument("--save", type=Path, help="also save the drawn result as .npz")
    p.set_defaults(func=cmd_plot_clusters)


def _fresh_fit(args):
    from kmeans_xp import KMeans
    from kmeans_xp.contract.namespaces import to_numpy
    from kmeans_xp.tools.bench import Workload, data_shape, make_data
    check_backend(args.backend)
    w = Workload(n=args.n, d=args.d, k=args.k, data=args.data, seed=args.seed)
    try:
        n, d = data_shape(w)
    except (OSError, ValueError) as exc:
        raise Failure(str(exc)) from None
    _check_memory(args, "plot-clusters", n, d, args.k, w.dtype, data=args.data,
                  backend=args.backend)
    X = make_data(w)
    km = KMeans(args.k, n_init=1, max_iter=args.iters, random_state=args.seed,
                backend=args.backend, max_memory=args.max_memory).fit(X)
    print(f"fit: {km.backend_}, n={len(X):,} k={args.k}, {km.n_iter_} iterations, "
          f"inertia {km.inertia_:.6g}")
    return X, to_numpy(km.labels_), to_numpy(km.cluster_centers_)


def cmd_plot_clusters(args):
    from kmeans_xp.tools.plot import (
        PlotUnavailable,
        load_clusters,
        parse_features,
        plot_clusters,
        require_matplotlib,
    )
    try:  # before the fit: a picture that cannot be drawn is not worth a fit
        require_matplotlib()
    except PlotUnavailable as exc:
        raise Failure(str(exc)) from None
    X, labels, centers = load_clusters(args.source) if args.source else _fresh_fit(args)
    features = parse_features(args.features, X.shape[1])  # ValueError: a usage error
    if args.save:
        keep = np.random.default_rng(args.seed).permutation(len(X))[: args.max_points]
        np.savez_compressed(args.save, X=X[keep], labels=labels[keep], centers=centers)
    try:
        path = plot_clusters(X, labels, centers, args.out, max_points=args.max_points,
                             features=features, random_state=args.seed)
    except PlotUnavailable as exc:
        raise Failure(str(exc)) from None
    print(f"wrote {path}")
    return 0


# -- entry point ----------------------------------------------------------------------------


def build_parser():
    parser = Parser(prog="kmeans-xp", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_compare(sub)
    _add_plot(sub)
    _add_plot_clusters(sub)
    _add_run(sub)
    p = sub.add_parser("backends", help="list backends and whether they are installed")
    json_flag(p)
    p.set_defaults(func=cmd_backends)
    return parser


def _exit_status(exc) -> int | None:
    """2 for usage errors, 1 for failures, None for what is a bug (shown as a traceback)."""
    from kmeans_xp.contract.memory import KMeansMemoryError
    from kmeans_xp.contract.registry import BackendNotAvailableError
    from kmeans_xp.tools.plot import PlotUnavailable
    from kmeans_xp.tools.preflight import TooLarge
    if isinstance(exc, (UsageError, TooLarge)):
        return 2
    if isinstance(exc, (Failure, BackendNotAvailableError, KMeansMemoryError, OSError,
                        PlotUnavailable, MemoryError)):  # (a MemoryError the check missed)
        return 1
    if isinstance(exc, ValueError):  # kmeans_xp's checks of what the arguments asked for
        return 2
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["compare", *argv]  # no command: compare (with defaults scaled to the machine)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # usage errors: one line, status 2
    except SystemExit as exc:  # also --help and --version (status 0)
        return exc.code
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("kmeans-xp: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        status = _exit_status(exc)
        if status is None or os.environ.get("KMEANS_XP_TRACEBACK"):
            raise
        print(f"kmeans-xp: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
