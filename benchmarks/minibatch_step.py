"""Time of one MiniBatchKMeans step: ours on a backend (a CuPy X on the GPU backends) against
scikit-learn's on the host, for the same X, init, batch size and random_state.

A step is what `fit` repeats: draw a batch (sklearn's weighted draw), assign it, move the
centers, maybe reassign some, read the batch inertia. Ours is timed as a fit of 2 passes over
X minus a fit of 1 pass, divided by the steps of one pass (n // batch), so what a fit does
once (validation, init, the weights' cumulative, final labels: off) drops out; each fit runs
`--repeats` times after a warm-up fit (kernels compiled, pools grown), the median is kept, and
`fit`'s own `timings_["steps"]` per step is printed beside it.

scikit-learn's step draws its batch with `RandomState.choice(n, batch, p=weights)`, which
builds the weights' cumulative again at every step: O(n) a step, seconds at n=20M, so two
whole fits would take hours. Its steps are timed inside one fit instead: the time from one
entry into its `_mini_batch_step` to the next is one whole step (the draw, the step, the loop),
and the median over `--sklearn-steps` steps is kept (the fit is stopped after them).

    python benchmarks/minibatch_step.py                         # n=20M, d=3, k=1000, b=65536
    python benchmarks/minibatch_step.py --backend cupy-kernels --repeats 5
    python benchmarks/minibatch_step.py --n 20000 --k 20 --batch 1024 --backend numpy  # CPU

The issue's target (issue 37): ours at least 20x scikit-learn's per step at the default size.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from results_file import add_arguments, record_if_asked


def _fit_seconds(make, X, passes, repeats, sync):
    """Median wall seconds of `make(passes).fit(X)` over `repeats` runs, and the last model."""
    times, model = [], None
    for _ in range(repeats):
        model = make(passes)
        sync()
        t0 = time.perf_counter()
        model.fit(X)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), model


def per_step(make, X, steps_per_pass, repeats, sync, warm=True):
    """(seconds per step by the two-fit difference, the 2-pass model); warm: a first fit
    untimed (kernels compiled, pools filled: the GPU's; host code has none to pay)."""
    if warm:
        make(1).fit(X)
        sync()
    t1, _ = _fit_seconds(make, X, 1, repeats, sync)
    t2, model = _fit_seconds(make, X, 2, repeats, sync)
    return (t2 - t1) / steps_per_pass, model


class _Enough(Exception):
    """Stops a scikit-learn fit once its steps are timed."""


def sklearn_step_seconds(model, X, steps):
    """Median seconds of one step of `model.fit(X)` (a scikit-learn MiniBatchKMeans): the time
    between consecutive entries into its `_mini_batch_step`, over `steps` steps."""
    from sklearn.cluster import _kmeans
    inner, stamps = _kmeans._mini_batch_step, []

    def timed(*args, **kwargs):
        stamps.append(time.perf_counter())
        if len(stamps) > steps:
            raise _Enough
        return inner(*args, **kwargs)

    _kmeans._mini_batch_step = timed
    try:
        model.fit(X)
    except _Enough:
        pass
    finally:
        _kmeans._mini_batch_step = inner
    if len(stamps) < 2:
        raise RuntimeError(f"scikit-learn's fit took {len(stamps)} step(s); give a larger "
                           f"--n or a smaller --batch to time its steps")
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000_000)
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--backend", default="cupy-fused")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sklearn-steps", type=int, default=8,
                   help="scikit-learn steps timed inside its fit (their median is kept)")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    add_arguments(p)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    t0 = time.perf_counter()

    from kmeans_xp import MiniBatchKMeans, get_backend
    from kmeans_xp.tools.data import seed_data

    X = seed_data(args.n, args.d, dtype=np.dtype(args.dtype), random_state=args.seed)
    init = X[np.random.default_rng(args.seed).choice(args.n, args.k, replace=False)]
    steps_per_pass = args.n // args.batch
    common = dict(n_clusters=args.k, init=init, n_init=1, batch_size=args.batch, tol=0.0,
                  max_no_improvement=None, compute_labels=False, random_state=args.seed)

    gpu = get_backend(args.backend).device == "gpu"
    if gpu:
        import cupy as cp
        Xb = cp.asarray(X)

        def sync():
            cp.cuda.get_current_stream().synchronize()
    else:
        Xb = X

        def sync():
            pass

    def ours(passes):
        return MiniBatchKMeans(max_iter=passes, backend=args.backend, **common)

    print(f"n={args.n:,} d={args.d} k={args.k} batch={args.batch} {args.dtype}: "
          f"{steps_per_pass} steps a pass")
    mine, model = per_step(ours, Xb, steps_per_pass, args.repeats, sync)
    own = model.timings_["steps"] / model.n_steps_
    print(f"kmeans_xp {args.backend}: {1e3 * mine:.3f} ms per step "
          f"(fit's own steps timer: {1e3 * own:.3f} ms)")
    lines = [f"| kmeans_xp {args.backend} | {1e3 * mine:.3f} | {1e3 * own:.3f} |"]
    if args.no_sklearn:
        return _record(args, argv, t0, lines)
    from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans

    sk = sklearn_step_seconds(SkMiniBatchKMeans(max_iter=1, **common), X, args.sklearn_steps)
    print(f"scikit-learn (host): {1e3 * sk:.3f} ms per step (median of {args.sklearn_steps} "
          f"steps inside its fit)")
    print(f"ratio: {sk / mine:.1f}x scikit-learn per step (target 20x)")
    lines += [f"| scikit-learn (host) | {1e3 * sk:.3f} | - |", "",
              f"kmeans_xp {args.backend}: {sk / mine:.1f}x scikit-learn per step."]
    return _record(args, argv, t0, lines)


def _record(args, argv, t0, lines):
    """The figures as the results file's `minibatch` section (with --results)."""
    if args.results is not None:
        head = [f"## minibatch: n={args.n:,} d={args.d} k={args.k} batch {args.batch}, "
                f"{args.dtype}", "",
                "ms per step. Ours: a 2-pass fit minus a 1-pass fit over the steps of a "
                "pass (median of repeats), on device X for a GPU backend. scikit-learn's: "
                "entry to entry of its steps inside one fit (median; its weighted draw is "
                "O(n) a step, so whole fits at this n take hours).", "",
                "| row | ms per step | fit's own steps timer |", "| --- | ---: | ---: |"]
        record_if_asked(args, [head + lines], script="benchmarks/minibatch_step.py", argv=argv,
                        wall_s=time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
