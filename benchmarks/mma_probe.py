"""Device probe of cupy-fused's tensor-core kernels (issue 13): one assignment pass, float32.

    python benchmarks/mma_probe.py OUT.json [--reps 7]

Cases: W5 (n=1M, d=128, k=4096), large-k (n=2M, d=128, k=16384) and d=64 (n=1M, k=4096).
Variants: tf32 v1 (tf32_kernel="fused-v1", cuda/fused_tf32.cu), tf32 v2 ("fused",
cuda/fused_mma.cu), tf32 wgmma (cuda/fused_wgmma.cu), 3xTF32
(gemm_kernel="3xtf32": the wgmma kernel on the H200, "-v2" the mma.sync one), the SIMT
exact kernel
(assign_gemm), cuBLAS TF32 GEMM + our argmin (tf32_kernel="cublas"), and torch TF32
(allow_tf32, chunked ||c||^2 - 2 X C^T + argmin; skipped without torch) and torch FP32 (the
same with allow_tf32 off). Each is timed by CUDA
events around the assignment alone (`_assign_pass`: labels, inertia partials, changed count;
centers packed once before), median of --reps after two warm-ups; W5 also times a whole
`lloyd_iter` (pack + pass + sums + finalize). Correctness on the first 4096 rows: tf32 labels
against the float64 exact argmin within TF32's rounding bound, 3xTF32 labels against the SIMT
kernel's (differences counted, and whether each is a near tie: kmeans_xp.testing.label_bounds). A
failing variant prints its error and the probe goes on. About a minute on an H200.
"""
from __future__ import annotations

import datetime
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {"W5": (1_000_000, 128, 4096), "large-k": (2_000_000, 128, 16384),
         "d64": (1_000_000, 64, 4096)}
VARIANTS = {
    "tf32-v1": {"precision": "tf32", "tf32_kernel": "fused-v1"},
    "tf32-v2": {"precision": "tf32", "tf32_kernel": "fused"},
    "tf32-wgmma": {"precision": "tf32", "tf32_kernel": "wgmma"},
    "3xtf32": {"gemm_kernel": "3xtf32"},
    "3xtf32-v2": {"gemm_kernel": "3xtf32", "tf32_kernel": "fused"},
    "simt": {"gemm_kernel": "simt"},
    "cublas-tf32": {"precision": "tf32", "tf32_kernel": "cublas"},
}
CHECK_ROWS = 4096


def timed(cp, fn, reps):
    """Median and all ms of fn() by CUDA events, after two warm-up calls."""
    fn()
    fn()
    cp.cuda.Device().synchronize()
    out = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(out)), out


def exact_reference(cp, Xs, C):
    """float64 squared distances of the check rows to every center (on the device)."""
    X64, C64 = Xs.astype(cp.float64), C.astype(cp.float64)
    D = (X64 * X64).sum(1)[:, None] - 2 * X64 @ C64.T + (C64 * C64).sum(1)[None]
    return cp.maximum(D, 0)


def tf32_violations(cp, Xs, C, lab, D):
    """Labels farther than TF32's rounding allows (kmeans_xp.testing.label_bounds.tf32_error), and the
    share equal to the exact argmin."""
    from kmeans_xp.testing.label_bounds import tf32_error
    Xh, Ch, lab, D = Xs.get(), C.get(), cp.asnumpy(lab), D.get()
    rows, best_i = np.arange(len(lab)), D.argmin(1)
    nx2, nc2 = (Xh.astype(np.float64) ** 2).sum(1), (Ch.astype(np.float64) ** 2).sum(1)
    bound = (tf32_error(Xh, Ch, lab) + tf32_error(Xh, Ch, best_i)
             + 1e-6 * (nx2 + nc2[lab]))
    excess = D[rows, lab] - D[rows, best_i]
    return int(np.count_nonzero(excess > bound)), float(np.mean(lab == best_i))


def run_variant(cp, name, opts, X, init, reps, with_iter):
    from kmeans_xp_backends.cupy import fused_plan as fp
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    be = CupyFusedBackend(**opts)
    ws = be._workspace(X, init.shape[0])
    be._pack(ws, init)
    labels = cp.empty(ws.n, dtype=cp.int32)
    ms, runs = timed(cp, lambda: be._assign_pass(ws, labels), reps)
    p = ws.plan
    row = {"variant": name, "options": opts, "path": p.path, "resident": p.resident,
           "assign_smem": p.assign_smem, "assign_grid": p.assign_grid, "assign_ms": ms,
           "runs_ms": runs}
    if p.path in ("mma", "mma3", "wgmma", "wgmma3"):
        try:
            fn = fp.kernel(fp.assign_kernel_name(p, "float32", ws.d, ws.d % 4 == 0))
            row["num_regs"] = int(fn.num_regs)
            row["blocks_per_sm"] = fp.blocks_per_sm(fn, p.assign_smem)
        except Exception as exc:  # attributes only
            row["attr_error"] = repr(exc)
    if with_iter:
        it = be.lloyd_iter(X, None, init, None)
        row["lloyd_iter_ms"], _ = timed(
            cp, lambda: be.lloyd_iter(X, None, init, it.labels), max(3, reps // 2))
    lab = labels[:CHECK_ROWS].copy()
    be.release_buffers()
    return row, lab


def run_torch(cp, X, init, reps, tf32=True):
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    Xt, Ct = torch.from_dlpack(X), torch.from_dlpack(init)
    n, k = Xt.shape[0], Ct.shape[0]
    cn = (Ct * Ct).sum(1)
    rows = max(1, min(n, (1 << 30) // (4 * k)))   # 1 GiB distance chunk
    out = torch.empty(n, dtype=torch.int64, device=Xt.device)

    def once():
        for r0 in range(0, n, rows):
            g = torch.addmm(cn, Xt[r0:r0 + rows], Ct.T, beta=1, alpha=-2)
            out[r0:r0 + rows] = g.argmin(1)

    once()
    torch.cuda.synchronize()
    runs = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        once()
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b))
    lab = cp.asarray(out[:CHECK_ROWS].to(torch.int32))
    torch.backends.cuda.matmul.allow_tf32 = False
    return {"variant": "torch-tf32" if tf32 else "torch-fp32", "torch": torch.__version__,
            "chunk_rows": rows,
            "assign_ms": float(np.median(runs)), "runs_ms": runs}, lab


def tf32_round(a):
    """a rounded to TF32 as the kernels round their operands (common.cuh tf32_rna)."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def same_operands(cp, case, name, a, b, Xs, init):
    """Labels of two TF32 kernels (the same rounded operands, another summation order):
    how many differ, and how many of those are not near ties of the rounded operands."""
    from kmeans_xp.testing.label_bounds import near_tie
    diff = cp.flatnonzero(a != b)
    Xr, Cr = tf32_round(Xs[diff].get()), tf32_round(init.get())
    ties = near_tie(Xr, Cr, a[diff].get(), b[diff].get(), np.float32)
    cmp = {"case": case, "variant": f"{name}-vs-tf32-v2", "differing": int(diff.size),
           "not_near_ties": int(diff.size - np.count_nonzero(ties))}
    print(f"{case:8s} {name} vs tf32-v2: {cmp['differing']} of {CHECK_ROWS} labels differ, "
          f"{cmp['not_near_ties']} not near ties")
    return cmp


def main(argv):
    import cupy as cp

    from benchmarks.probe_fused import make_data
    from kmeans_xp.testing.label_bounds import near_tie
    out_path = argv[1] if len(argv) > 1 and not argv[1].startswith("--") else "mma_probe.json"
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 7
    props = cp.cuda.runtime.getDeviceProperties(0)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    meta = {"gpu": gpu, "cupy": cp.__version__,
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "driver": cp.cuda.runtime.driverGetVersion(), "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "dtype": "float32", "reps": reps, "check_rows": CHECK_ROWS}
    print(f"{gpu}  cupy {cp.__version__}")
    rows, t_start = [], time.perf_counter()
    for case, (n, d, k) in CASES.items():
        X, init = make_data(cp, n, d, k)
        Xs = X[:CHECK_ROWS]
        D = exact_reference(cp, Xs, init)
        labs = {}
        variants = list(VARIANTS.items()) + [("torch-tf32", None), ("torch-fp32", None)]
        for name, opts in variants:
            t0 = time.perf_counter()
            try:
                if opts is None:
                    row, lab = run_torch(cp, X, init, reps, tf32=name == "torch-tf32")
                else:
                    row, lab = run_variant(cp, name, opts, X, init, reps, case == "W5")
                labs[name] = lab
                if name not in ("simt", "torch-fp32") and not name.startswith("3xtf32"):
                    row["tf32_bound_violations"], row["exact_agreement"] = tf32_violations(
                        cp, Xs, init, lab, D)
                else:
                    row["exact_agreement"] = float(cp.mean(lab == D.argmin(1)))
            except Exception as exc:
                print(f"{case:8s} {name:12s} FAILED: {exc!r}")
                traceback.print_exc(limit=3)
                row = {"variant": name, "options": opts, "error": repr(exc)}
            row.update(case=case, n=n, d=d, k=k, wall_s=time.perf_counter() - t0)
            if "assign_ms" in row:
                row["pairs_per_s"] = n * k / (row["assign_ms"] * 1e-3)
                row["tflops"] = 2.0 * n * k * d / (row["assign_ms"] * 1e-3) / 1e12
                extra = "".join(f" {key}={row[key]}" for key in
                                ("path", "resident", "num_regs", "blocks_per_sm",
                                 "tf32_bound_violations") if key in row)
                it = f" iter {row['lloyd_iter_ms']:.2f} ms" if "lloyd_iter_ms" in row else ""
                print(f"{case:8s} {name:12s} {row['assign_ms']:9.3f} ms  "
                      f"{row['pairs_per_s']:.3e} pairs/s  {row['tflops']:6.1f} TFLOP/s{it}  "
                      f"exact-agree {row.get('exact_agreement', float('nan')):.4f}{extra}")
            rows.append(row)
            cp.get_default_memory_pool().free_all_blocks()
        for name in [v for v in labs if v.startswith("3xtf32")] if "simt" in labs else []:
            # the exact paths against each other
            a, b = labs[name], labs["simt"]
            diff = cp.flatnonzero(a != b)
            ties = near_tie(Xs[diff].get(), init.get(), a[diff].get(), b[diff].get(),
                            np.float32)
            cmp = {"case": case, "variant": f"{name}-vs-simt", "differing": int(diff.size),
                   "not_near_ties": int(diff.size - np.count_nonzero(ties))}
            print(f"{case:8s} {name} vs simt: {cmp['differing']} of {CHECK_ROWS} labels "
                  f"differ, {cmp['not_near_ties']} not near ties")
            rows.append(cmp)
        for name in ("tf32-wgmma",):  # the same operands, another summation order
            if name in labs and "tf32-v2" in labs:
                rows.append(same_operands(cp, case, name, labs[name], labs["tf32-v2"], Xs,
                                          init))
        del X, init, Xs, D
        cp.get_default_memory_pool().free_all_blocks()
    meta["total_s"] = time.perf_counter() - t_start
    Path(out_path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {out_path} ({meta['total_s']:.0f} s)")


if __name__ == "__main__":
    main(sys.argv)
