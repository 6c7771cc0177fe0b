"""The `kmeans-xp` command (also `python -m kmeans_xp`).

`kmeans-xp run` fits the seed's workload (n=2M points in 3-D, k=200) on the best backend
present and prints time, inertia and memory.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


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


def build_parser():
    parser = argparse.ArgumentParser(prog="kmeans-xp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    _add_run(sub)
    p = sub.add_parser("backends", help="list backends and whether they are installed")
    p.set_defaults(func=cmd_backends)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["run", *(argv or [])])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
