"""Where one W5 Lloyd iteration's device time goes on cupy-fused (issue 13's tf32 target is
per iteration): CUDA-event times of pack_centers, the assignment pass, the sums (fixed-point
accumulate), finalize, and the driver's center update (`kmeans_xp.lloyd._update`: means,
shift, the small array it reads), at n=1M, d=128, k=4096, float32; median of 9 after two
warm-ups, for the tf32 default and the exact default.

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
    from kmeans_xp.lloyd import _update
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


def main(argv):
    import cupy as cp

    from benchmarks.probe_fused import make_data
    X, init = make_data(cp, 1_000_000, 128, 4096)
    rows = [parts(cp, opts, X, init) for opts in ({"precision": "tf32"}, {})]
    out = argv[1] if len(argv) > 1 else "w5_parts.json"
    Path(out).write_text(json.dumps({"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"]
                                     .decode(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv)
