"""Where one fit's time goes: its stages (`timings_`), its memory per stage
(`memory_report_`), and optionally a cProfile table, for any backend, from host or device X.

    python benchmarks/profile_fit.py --backend cupy-fused --workload W1 --device-x
    python benchmarks/profile_fit.py --backend numpy --n 200k --k 100 --cprofile 25
    python benchmarks/profile_fit.py --backend cupy-fused --first-use
    python benchmarks/profile_fit.py --backend cupy-fused --workload F2 --device-x --cprofile 40

A warm-up fit runs first (kernels compile there); the profiled fits run after it, and the
median of each stage over `--repeats` fits is printed. `--first-use` times instead a fresh
process's first fit against its second (import, kernel compilation, pools started). Only
the public API is used, so the same script profiles any version of the code.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import time

import numpy as np

#: workload shapes; the comparison's named ones (kmeans_xp.tools.bench.WORKLOADS) and small
WORKLOADS = {"W1": (2_000_000, 3, 200), "W3": (20_000_000, 3, 1000),
             "W5": (1_000_000, 128, 4096), "F1": (8_000_000, 128, 1024),
             "F2": (65_536, 128, 1024), "small": (200_000, 3, 100)}
#: workloads that are batches of problems: how many (--problems sets it for any shape)
PROBLEMS = {"F2": 32}


def size(text):
    """200k, 2M, 1e6, 200000 -> int."""
    text = str(text).strip().lower()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def data(n, d, k, seed=0, problems=0):
    """X (float32, asymmetric features) and k initial rows of it, the same for any backend;
    with `problems`, a (problems, n, d) batch and (problems, k, d) initial centers: the
    comparison's own (`benchmarks/run.py`'s F2) where this version of the code has it, so
    the profile is of the fit that is timed."""
    if problems:
        try:
            from kmeans_xp.tools.bench.batched import BatchWorkload, batch_data
        except ImportError:
            pass
        else:
            return batch_data(BatchWorkload(batch=problems, n=n, d=d, k=k, seed=seed))
        pairs = [data(n, d, k, seed + b) for b in range(problems)]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(k, d)) * (1.0 + 0.5 * np.arange(d))
    X = (centers[rng.integers(0, k, size=n)] + rng.normal(size=(n, d))).astype(np.float32)
    return X, X[rng.choice(n, k, replace=False)].copy()


def sync(X):
    mod = type(X).__module__.split(".")[0]
    if mod == "cupy":
        import cupy
        cupy.cuda.Device().synchronize()


def one_fit(X, init, args):
    from kmeans_xp import KMeans
    sync(X)
    t0 = time.perf_counter()
    km = KMeans(init.shape[-2], init=init, n_init=1, max_iter=args.iters, tol=0,
                backend=args.backend, max_memory=args.max_memory,
                precision=args.precision).fit(X)
    sync(X)
    wall = time.perf_counter() - t0
    return wall, km


def stages(args):
    n, d, k = (WORKLOADS[args.workload] if args.workload else (args.n, args.d, args.k))
    problems = args.problems if args.problems is not None else PROBLEMS.get(args.workload, 0)
    X, init = data(n, d, k, args.seed, problems)
    if args.device_x:
        import cupy
        X = cupy.asarray(X)
    print(f"{args.backend}: {f'{problems} problems of ' if problems else ''}"
          f"n={n:,} d={d} k={k}, {args.iters} iterations (tol=0), "
          f"X on the {'device' if args.device_x else 'host'}", flush=True)
    one_fit(X, init, args)  # warm-up
    walls, timings, km = [], [], None
    for _ in range(args.repeats):
        wall, km = one_fit(X, init, args)
        walls.append(wall)
        timings.append(km.timings_)
    keys = list(dict.fromkeys(k_ for t in timings for k_ in t))
    med = {k_: statistics.median(t[k_] for t in timings if k_ in t) for k_ in keys}
    out = {"backend": km.backend_, "problems": problems, "n": n, "d": d, "k": k,
           "n_iter": int(np.max(km.n_iter_)),
           "wall_s": statistics.median(walls), "stages_s": med,
           "memory_report": {k_: int(v) for k_, v in km.memory_report_.items()}}
    print(f"whole fit {out['wall_s'] * 1e3:.1f} ms (median of {args.repeats}), "
          f"{out['n_iter']} iterations, backend {out['backend']}")
    for k_, v in med.items():
        print(f"  {k_:<14} {v * 1e3:10.3f} ms")
    for k_, v in out["memory_report"].items():
        print(f"  memory {k_:<14} {v / 2**20:10.2f} MiB")
    if args.cprofile:
        pr = cProfile.Profile()
        pr.enable()
        one_fit(X, init, args)
        pr.disable()
        for order in ("cumulative", "tottime"):  # where the time is spent, then by whom
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats(order).print_stats(args.cprofile)
            print(s.getvalue())
    return out


FIRST_USE = """
import json, sys, time, numpy as np
t0 = time.perf_counter()
from kmeans_xp import KMeans
backend, n, d, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
X = np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)
t_import = time.perf_counter() - t0
def fit():
    t = time.perf_counter()
    km = KMeans(k, init="random", n_init=1, max_iter=5, random_state=0, backend=backend).fit(X)
    float(km.inertia_)
    return time.perf_counter() - t
first = fit()
second = fit()
print(json.dumps({"import_s": t_import, "first_fit_s": first, "second_fit_s": second}))
"""


def first_use(args):
    """A fresh process's first fit against its second."""
    n, d, k = (WORKLOADS[args.workload] if args.workload else (args.n, args.d, args.k))
    r = subprocess.run([sys.executable, "-c", FIRST_USE, args.backend, str(n), str(d), str(k)],
                       capture_output=True, text=True, timeout=600, check=False)
    if r.returncode:
        raise SystemExit(f"the first-use process failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{args.backend} n={n:,} d={d} k={k}: import {out['import_s']:.2f} s, first fit "
          f"{out['first_fit_s']:.3f} s, second {out['second_fit_s']:.3f} s, first use costs "
          f"{out['first_fit_s'] - out['second_fit_s']:.3f} s")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--workload", choices=sorted(WORKLOADS))
    ap.add_argument("--n", type=size, default=200_000)
    ap.add_argument("--d", type=int, default=3)
    ap.add_argument("--k", type=size, default=100)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--problems", type=int, default=None,
                    help="fit a batch of this many problems of the shape (F2: 32)")
    ap.add_argument("--precision", default="exact")
    ap.add_argument("--max-memory", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device-x", action="store_true", help="X as a CuPy array")
    ap.add_argument("--cprofile", type=int, default=0, metavar="TOP",
                    help="also profile one fit: the TOP functions by cumulative, then own time")
    ap.add_argument("--first-use", action="store_true",
                    help="a fresh process's first fit against its second")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    out = first_use(args) if args.first_use else stages(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
