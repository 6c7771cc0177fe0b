"""Whole fits to convergence with and without the driver's triangle-inequality bounds
(`kmeans_xp.contract.bounds`), against scikit-learn's lloyd and elkan, all from the same
initial centers (k-means++ computed once), on the same threads.

    python benchmarks/bounds_fit.py                    # n=100k d=128 k=256, max_iter=100, tol=1e-4
    python benchmarks/bounds_fit.py --threads 16 --repeats 3 --json out.json
    python benchmarks/bounds_fit.py --grid             # the table's sweep (docs/bounds.md)

Rows: each CPU backend's driver without bounds ("lloyd") and with each method forced
("hamerly", "elkan", "yinyang"), `KMeans` with algorithm "lloyd" and "elkan" (as the table
chooses), and scikit-learn's lloyd and elkan. Each row gives the median whole-fit seconds
(the Lloyd run alone for the driver rows; the whole `fit` for the estimator rows, init
excluded since the init is given), n_iter, the share of the rows' distances computed over
the run (driver rows: a bounded run's recomputed rows, paused iterations counted whole;
the figure to estimate what bounds would save on another machine, a GPU included), and
whether labels and n_iter equal the plain run's (the driver's for driver rows and scikit-learn; KMeans lloyd's for KMeans elkan).
On data as ambiguous as the default (two wide Gaussians cut into k clusters) two correct
runs can part at a near tie: scikit-learn's elkan and lloyd do too.

`--grid` times lloyd and each method at d x k points (`--grid-d`, `--grid-k`) and prints
each method's time over lloyd's: the figures `bound_path`'s table (BOUNDS_MIN_KD,
ELKAN_MAX_K, ELKAN_MIN_D, FUSED_PASS_ENGINES) is set from, on the machine's cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def size(text):
    text = str(text).strip().lower()
    mult = {"k": 10**3, "m": 10**6}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def problem(n, d, k, seed=0, data="seed"):
    """float32 data ("seed": the comparison's default data; "blobs": k separated blobs,
    which converge in a few iterations) and one k-means++ init (the benchmark's shared
    workload code)."""
    from kmeans_xp.tools.bench.workload import Workload, make_data, shared_init
    w = Workload(n=n, d=d, k=k, data=data, init="k-means++", seed=seed)
    X = make_data(w)
    return X, shared_init(X, w)


def timed(fn, repeats):
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times), times


def driver_run(backend, X, init, method, max_iter, tol):
    """The driver's run on centered X (as a fit hands it), bounds `method` or None."""
    from kmeans_xp.algorithms.lloyd import kmeans_single_lloyd
    mean = X.mean(axis=0)
    Xc = X - mean
    C = (init - mean).astype(X.dtype)
    tol_abs = tol * float(np.mean(np.var(X, axis=0)))  # scikit-learn's _tolerance
    xp = backend.placement.namespace(Xc)
    return lambda: kmeans_single_lloyd(backend, Xc, None, C, xp=xp, max_iter=max_iter,
                                       tol=tol_abs, bounds=method)


def counting(backend):
    """The backend with its `assign_bounded` counting the share of rows each call
    recomputed (a list, filled as the run goes): what bounds save, on any machine."""
    shares = []
    bounded = backend.assign_bounded

    def assign_bounded(X, centers, bounds, **kw):
        out = bounded(X, centers, bounds, **kw)
        shares.append(bounds.recomputed / max(bounds.n, 1))
        return out

    backend.assign_bounded = assign_bounded
    return shares


def backends(names, threads):
    from kmeans_xp.contract.registry import get_backend
    out = {}
    for name in names:
        try:
            out[name] = get_backend(name)(n_threads=threads)
        except Exception as exc:  # noqa: BLE001 - a row says why it is missing
            print(f"# {name}: not run ({exc})", file=sys.stderr)
    return out


def fit_rows(args):
    from kmeans_xp import KMeans
    from kmeans_xp.contract.bounds import METHODS
    X, init = problem(args.n, args.d, args.k, args.seed, args.data)
    rows = []
    for name, be in backends(args.backends, args.threads).items():
        base = None
        shares = counting(be)
        for method in (None, *METHODS):
            run = driver_run(be, X, init, method, args.max_iter, args.tol)
            run()  # compile and warm
            shares.clear()
            res, med, times = timed(run, args.repeats)
            labels = np.asarray(res.labels)
            base = base or (res, labels)
            # rows recomputed over the run, of n per iteration (a paused iteration: all n)
            share = ((sum(shares) + res.n_iter * args.repeats - len(shares))
                     / (res.n_iter * args.repeats) if method else 1.0)
            rows.append(dict(row=f"kmeans_xp {name} {method or 'lloyd'}", seconds=med,
                             times=times, n_iter=res.n_iter, inertia=res.inertia,
                             recomputed=share,
                             same_labels=bool(np.array_equal(labels, base[1])),
                             same_n_iter=res.n_iter == base[0].n_iter))
        # the estimator centers X its own way (float64 mean): its rounding, and so its run
        # on ambiguous data, may differ from the driver rows'; elkan is compared with lloyd
        est = None
        for algorithm in ("lloyd", "elkan"):
            km = lambda: KMeans(args.k, init=init, n_init=1,  # noqa: E731
                                max_iter=args.max_iter, tol=args.tol, algorithm=algorithm,
                                backend=name,
                                backend_options={"n_threads": args.threads}).fit(X)
            km()
            fit, med, times = timed(km, args.repeats)
            est = est or fit
            rows.append(dict(row=f"KMeans(algorithm={algorithm!r}, backend={name!r}) "
                                 f"[{fit._bounds_path[0] or 'lloyd'}]", seconds=med,
                             times=times, n_iter=fit.n_iter_, inertia=fit.inertia_,
                             same_labels=bool(np.array_equal(fit.labels_, est.labels_)),
                             same_n_iter=fit.n_iter_ == est.n_iter_))
    try:
        from sklearn.cluster import KMeans as SkKMeans
    except ImportError:
        print("# scikit-learn: not installed", file=sys.stderr)
        return rows
    for algorithm in ("lloyd", "elkan"):
        sk = lambda: SkKMeans(args.k, init=init, n_init=1, max_iter=args.max_iter,  # noqa: E731
                              tol=args.tol, algorithm=algorithm).fit(X)
        sk()
        fit, med, times = timed(sk, args.repeats)
        same = base is not None
        rows.append(dict(row=f"scikit-learn {algorithm}", seconds=med, times=times,
                         n_iter=fit.n_iter_, inertia=fit.inertia_,
                         same_labels=same and bool(np.array_equal(fit.labels_, base[1])),
                         same_n_iter=same and fit.n_iter_ == base[0].n_iter))
    return rows


def grid_rows(args):
    from kmeans_xp.contract.bounds import METHODS
    rows = []
    for d in args.grid_d:
        for k in args.grid_k:
            X, init = problem(args.n, d, k, args.seed, args.data)
            for name, be in backends(args.backends, args.threads).items():
                lloyd = None
                for method in (None, *METHODS):
                    run = driver_run(be, X, init, method, args.max_iter, args.tol)
                    run()
                    res, med, _ = timed(run, args.repeats)
                    lloyd = lloyd or med
                    rows.append(dict(row=f"{name} d={d} k={k} {method or 'lloyd'}",
                                     seconds=med, n_iter=res.n_iter,
                                     over_lloyd=med / lloyd))
                    print(line(rows[-1]), flush=True)   # (a long grid shows as it goes)
    return rows


def line(r):
    """A row as the table prints it."""
    extra = (f"  {r['over_lloyd']:.2f}x lloyd" if "over_lloyd" in r else
             f"  labels==lloyd {r['same_labels']}  n_iter==lloyd {r['same_n_iter']}")
    if "recomputed" in r:
        extra += f"  rows computed {r['recomputed']:.0%}"
    return f"{r['row']:<58} {r['seconds']:9.3f} s  n_iter {r['n_iter']:4d}{extra}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=size, default=100_000)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--max-iter", type=int, default=100)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=None,
                   help="threads for every row (threadpoolctl and n_threads); default: all")
    p.add_argument("--backends", type=lambda s: s.split(","), default=["numpy", "numba"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", choices=["seed", "blobs"], default="seed")
    p.add_argument("--grid", action="store_true", help="the table's sweep over d and k")
    p.add_argument("--grid-d", type=lambda s: [int(v) for v in s.split(",")],
                   default=[4, 8, 32, 128])
    p.add_argument("--grid-k", type=lambda s: [int(v) for v in s.split(",")],
                   default=[8, 32, 64, 256, 1024])
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    from threadpoolctl import threadpool_limits
    with threadpool_limits(args.threads):
        rows = grid_rows(args) if args.grid else fit_rows(args)
    what = (f"n={args.n} d={args.d} k={args.k}" if not args.grid else f"n={args.n} grid") + \
        f", data={args.data}" + \
        f", max_iter={args.max_iter}, tol={args.tol}, threads={args.threads or 'all'}"
    print(f"# {what}")
    for r in rows:
        print(line(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": what, "rows": rows}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
