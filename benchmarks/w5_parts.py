"""Where one W5 Lloyd iteration's device time goes on cupy-fused (issue 13's tf32 target is
per iteration): CUDA-event times of pack_centers, the assignment pass, the sums (fixed-point
accumulate), finalize, and the driver's center update (`kmeans_xp.algorithms.lloyd._update`: means,
shift, the small array it reads), at n=1M, d=128, k=4096, float32; median of 9 after two
warm-ups, for the tf32 default and the exact default. Then the sums both ways where k*(d+1)
does not fit in shared memory (`sums_ways`): accumulate_global's atomics per element against
the counting sort + accumulate_sorted, at W5, large-k and d=32 (the plan sorts where d > 16),
their words checked equal.

    python benchmarks/w5_parts.py OUT.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parts(cp, opts, X, init):
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    from benchmarks.mma_probe import timed
    from kmeans_xp.algorithms.lloyd import _update
    be = CupyFusedBackend(**opts)
    ws = be._workspace(X, init.shape[0])
    labels = cp.empty(ws.n, dtype=cp.int32)
    out = cp.empty(ws.k * (ws.d + 1) + 2, dtype=cp.float64)
    row = {"options": opts, "path": ws.plan.path, "acc_mode": ws.plan.acc_mode}
    parts_ms = {"pack": lambda: be._pack(ws, init),
                "assign": lambda: be._assign_pass(ws, labels),
                "accumulate": lambda: be._accumulate(ws, labels),
                "finalize": lambda: be._finalize(ws, out, stats=True),
                "lloyd_iter": lambda: be.lloyd_iter(X, None, init, labels)}
    for name, fn in parts_ms.items():
        row[f"{name}_ms"] = timed(cp, fn, 9)[0]
    it = be.lloyd_iter(X, None, init, labels)
    c64 = init.astype(cp.float64)
    zero = cp.zeros((), dtype=cp.float64)
    row["update_ms"] = timed(cp, lambda: _update(be, X, None, init, c64, it, xp=cp, cxp=cp,
                                                 relocate=False, spherical=False,
                                                 zero=zero), 9)[0]
    be.release_buffers()
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in row.items()))
    return row


def sums_ways(cp, n, d, k):
    """ms of one pass's sums by global atomics and by cluster order (CUDA events, median of 9),
    on the labels of one assignment from k sampled centers; the accumulators must agree."""
    from kmeans_xp_backends.cupy import fused_plan as fp
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    from benchmarks.mma_probe import timed
    from benchmarks.probe_fused import make_data
    X, init = make_data(cp, n, d, k)
    be = CupyFusedBackend()
    ws = be._workspace(X, k)
    labels = cp.empty(n, dtype=cp.int32)
    be._pack(ws, init)
    be._assign_pass(ws, labels)
    row, words = {"n": n, "d": d, "k": k, "acc_mode": ws.plan.acc_mode}, {}
    dev = fp.device_facts(cp.cuda.Device().id)
    for mode, grid in (("global", fp.global_acc_grid(n, d, dev)),
                       ("sorted", ws.plan.acc_grid)):
        ws.plan = ws.plan._replace(acc_mode=mode, acc_grid=grid)
        ws.acc.fill(0)
        be._accumulate(ws, labels)
        words[mode] = ws.acc.copy()
        row[f"{mode}_ms"] = timed(cp, lambda: be._accumulate(ws, labels), 9)[0]
    row["same_words"] = bool((words["global"] == words["sorted"]).all())
    row["sort_only_ms"] = timed(cp, lambda: be._sort_rows(ws, labels), 9)[0]
    base = ws.plan.acc_rows
    for rows in (base // 2, base * 2, base * 4):   # positions per block of accumulate_sorted
        ws.plan = ws.plan._replace(acc_rows=rows, acc_grid=-(-n // rows))
        row[f"sorted_rows{rows}_ms"] = timed(cp, lambda: be._accumulate(ws, labels), 9)[0]
    be.release_buffers()
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in row.items()))
    return row


def main(argv):
    import cupy as cp

    from benchmarks.probe_fused import make_data
    X, init = make_data(cp, 1_000_000, 128, 4096)
    rows = [parts(cp, opts, X, init) for opts in ({"precision": "tf32"}, {})]
    del X, init
    sums = [sums_ways(cp, *shape) for shape in ((1_000_000, 128, 4096),
                                                 (2_000_000, 128, 16384),
                                                 (2_000_000, 32, 4096))]
    out = argv[1] if len(argv) > 1 else "w5_parts.json"
    Path(out).write_text(json.dumps({"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"]
                                     .decode(), "rows": rows, "sums": sums}, indent=1))


if __name__ == "__main__":
    main(sys.argv)
