"""Where the numpy backend's Lloyd iteration spends its time, stage by stage, on T threads:
each per-block kernel of backends/numpy_blocks.py, and each NumPy function it calls through
``np.`` (matmul, take, copyto, dot, argsort, add.reduceat, ...), timed on the thread that runs
it and summed over threads, per iteration; beside the iteration's wall time. On one thread
the sum is the iteration; on T threads, a stage whose thread-time grows past its one-thread
time is what contends (the GIL, memory bandwidth, BLAS), and T x wall minus all stages is
the time threads wait (for the GIL, or for the last block); "calls" counts the NumPy
functions called, each of which takes the GIL at least once. Array methods (``D.argmin``,
``keys.searchsorted``, ``cols *= ws``) are not NumPy functions: they stay in their kernel's
"rest". The wrappers add about a microsecond of Python per call.

    python benchmarks/numpy_stages.py d128 [--threads 1] [--iters 5] [--set NAME=VALUE ...]
        [--clock cpu]

(--threads 1 also holds BLAS to one thread: one core. --clock cpu: each thread's CPU time
instead of wall time, steadier on a machine shared with other work, blind to waits.)
`breakdown` is what cpu_probe.py calls.
"""
from __future__ import annotations

import argparse
import contextlib
import threading
import time

import numpy as np

#: the kernels timed as a whole (their NumPy calls are also timed one by one)
KERNELS = ("block_rows", "assign_block", "block_weights", "sorted_sums", "bincount_sums")


class _Sink:
    """Seconds per name, one dict per thread (no lost updates between threads)."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self._local = threading.local()
        self._all = []
        self._lock = threading.Lock()

    def add(self, name, dt):
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = {}
            with self._lock:
                self._all.append(d)
        d[name] = d.get(name, 0.0) + dt
        if name not in KERNELS:
            d[None] = d.get(None, 0) + 1    # NumPy calls

    def clear(self):
        for d in self._all:
            d.clear()

    def totals(self):
        out = {}
        for d in self._all:
            for k, v in list(d.items()):
                out[k] = out.get(k, 0.0) + v
        return out


class _Timed:
    """A callable timed into the sink under `name`; its callable attributes too (a ufunc's
    ``reduceat``)."""

    __slots__ = ("_obj", "_name", "_sink")

    def __init__(self, obj, name, sink):
        self._obj, self._name, self._sink = obj, name, sink

    def __call__(self, *args, **kwargs):
        clock = self._sink.clock
        t0 = clock()
        try:
            return self._obj(*args, **kwargs)
        finally:
            self._sink.add(self._name, clock() - t0)

    def __getattr__(self, attr):
        v = getattr(self._obj, attr)
        return _Timed(v, f"{self._name}.{attr}", self._sink) if callable(v) else v


class _TimedNumpy:
    """Stands for the numpy module in a kernel module: its functions (not its types) timed."""

    def __init__(self, prefix, sink):
        self._prefix, self._sink = prefix, sink

    def __getattr__(self, name):
        v = getattr(np, name)
        if callable(v) and not isinstance(v, type):
            return _Timed(v, self._prefix + name, self._sink)
        return v


@contextlib.contextmanager
def _instrumented(sink):
    import kmeans_xp_backends.numpy.backend as nb
    import kmeans_xp_backends.numpy.blocks as blocks
    saved = [(blocks, "np", blocks.np), (nb, "np", nb.np)]
    saved += [(blocks, k, getattr(blocks, k)) for k in KERNELS if hasattr(blocks, k)]
    try:
        blocks.np = _TimedNumpy("np.", sink)
        nb.np = _TimedNumpy("pass: np.", sink)   # the pass itself (chunk GEMMs, labels)
        for k in KERNELS:
            if hasattr(blocks, k):
                setattr(blocks, k, _Timed(getattr(blocks, k), k, sink))
        yield
    finally:
        for mod, name, v in saved:
            setattr(mod, name, v)


def _patched(attrs):
    import kmeans_xp_backends.numpy.backend as nb

    @contextlib.contextmanager
    def ctx():
        saved = {a: getattr(nb, a) for a in attrs}
        try:
            for a, v in attrs.items():
                setattr(nb, a, v)
            yield
        finally:
            for a, v in saved.items():
                setattr(nb, a, v)
    return ctx()


def breakdown(X, centers, threads=None, iters=5, attrs=None, clock="wall"):
    """{"threads", "wall_ms", "clock", "stages": {name: thread-ms}} per lloyd_iter (from
    the same centers each time) on `threads` pool threads (None: all cores); threads=1 holds
    BLAS to one thread as well. clock "cpu": stages in each thread's CPU time."""
    import kmeans_xp_backends.numpy.backend as nb
    from threadpoolctl import threadpool_limits
    sink = _Sink(time.thread_time if clock == "cpu" else time.perf_counter)
    one_core = threadpool_limits(1) if threads == 1 else contextlib.nullcontext()
    with one_core, _patched(attrs or {}):
        # (the threads' stages: worker processes would run them out of this sink's sight)
        be = nb.NumpyBackend(n_threads=threads, processes=False)
        with _instrumented(sink):
            labels = be.lloyd_iter(X, None, centers, None).labels   # warm-up: buffers, pool
            sink.clear()
            t0 = time.perf_counter()
            for _ in range(iters):
                labels = be.lloyd_iter(X, None, centers, labels).labels
            wall = (time.perf_counter() - t0) / iters
        be.finish()
    totals = sink.totals()
    calls = totals.pop(None, 0) / iters
    stages = {k: v / iters * 1e3 for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    return {"threads": be.threads, "wall_ms": wall * 1e3, "clock": clock,
            "calls_per_iter": calls, "stages": stages}


def describe(row):
    """One line: wall, then the kernels with their NumPy calls, then what is left."""
    st, t, wall = row["stages"], row["threads"], row["wall_ms"]
    parts, in_kernels = [], 0.0
    for k in KERNELS:
        if k not in st:
            continue
        in_kernels += st[k]
        parts.append(f"{k} {st[k]:.1f}")
    calls = ", ".join(f"{k} {v:.1f}" for k, v in st.items() if k not in KERNELS and v >= 0.05)
    what = "thread CPU ms/iter" if row.get("clock") == "cpu" else "thread-ms/iter"
    return (f"threads={t}: wall {wall:.1f} ms/iter, {row.get('calls_per_iter', 0):.0f} "
            f"calls/iter, {what}: " + ", ".join(parts)
            + f"; waiting or outside the kernels {t * wall - in_kernels:.1f}"
            + f" [NumPy calls: {calls}]")


def main():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from cpu_probe import WORKLOADS, data
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a numpy_ module constant for this run (an int)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args()
    attrs = {a.split("=")[0]: int(a.split("=")[1]) for a in args.set}
    X, init = data(*WORKLOADS[args.workload])
    print(args.workload, attrs or "", describe(breakdown(X, init, args.threads, args.iters,
                                                         attrs, args.clock)))


if __name__ == "__main__":
    main()
