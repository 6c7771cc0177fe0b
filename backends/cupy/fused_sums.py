"""cupy-fused's update step on a workspace (`workspace.Workspace`; kernels in cuda/fused_sums.cu
and cuda/stats.cu): the fixed-point scales of X, the per-cluster sums in the plan's mode
(in shared memory, counting-sorted by cluster and summed in registers, or by global
atomics), and finalize_sums (float64 sums and weights, the inertia and the changed labels).
A batch's workspace runs them once for all its problems (`fused_batch`)."""
from __future__ import annotations

import numpy as np

from . import common
from . import fused_plan as fp
from .common import BLOCK, NULL, device_ptr, launch

_i32 = np.int32


def absmax_bits(X, out):
    """out (d uint64, zeroed) = X's per-feature max |x| as float64 bits (non-negative
    doubles order like their bits, so the max of bits is the bits of the max); for a
    C-contiguous batch X (B, n, d), out (B * d) holds each problem's, from one launch."""
    cp = common.cupy()
    B, n, d = X.shape if X.ndim == 3 else (1, *X.shape)
    dev = fp.device_facts(cp.cuda.Device().id)
    grid = max(fp.cdiv(d, BLOCK), min(fp.cdiv(n * d, BLOCK), max(1, dev.sms * 8 // B)))
    launch(fp.kernel(f"column_absmax<{common.xtypes(X.dtype)}>"), (grid, B),
           (X, np.int64(n * d), _i32(d), out, np.int64(n * d)))


def scales(ws, scratch, bits=None):
    """(scale, 1 / scale): fixed-point scales (max|x| per feature and the total weight), on
    the device, made once per workspace; `bits`, X's `absmax_bits` where the caller has them
    (a batch's run: the max of its problems')."""
    if ws.scales is None:
        cp = common.cupy()
        n, d = ws.n, ws.d
        if bits is None:
            bits = cp.zeros(d, dtype=cp.uint64)
            absmax_bits(ws.X, bits)
        w_total = NULL
        if ws.w is not None:
            from .reductions import weighted_total
            w_total = cp.empty(1, dtype=cp.float64)
            weighted_total(ws.w, None, w_total, scratch)
        scale = cp.empty(d + 1, dtype=cp.float64)
        inv = cp.empty(d + 1, dtype=cp.float64)
        launch(fp.kernel("fixed_point_scales"), 1,
               (bits, w_total, np.float64(n), _i32(d), scale, inv), block=32)
        ws.scales = (scale, inv)
    return ws.scales


def accumulate(ws, labels, scratch, *, skip=None):
    """The rows' weighted sums and weights into ws.acc (fixed point), in the plan's mode."""
    p = ws.plan
    scale = scales(ws, scratch)[0]
    t = ws.xtypes   # (X's: half X reads as xhalf / xbf16)
    w = NULL if ws.w is None else ws.w
    skip = NULL if skip is None else skip
    if p.acc_mode == "shared":
        launch(fp.kernel(f"accumulate_shared<{t}>"), p.acc_grid,
               (ws.X, w, labels, _i32(ws.n), _i32(ws.d), _i32(ws.k), ws.acc, scale,
                np.float64(ws.two_l), skip), shared_mem=p.acc_smem)
    elif p.acc_mode == "sorted":
        sort_rows(ws, labels, skip)
        vec = fp.sorted_vector(ws.x_name, ws.d) if device_ptr(ws.X) % 16 == 0 else 1
        launch(fp.kernel(fp.sorted_kernel_name(ws.x_name, vec)), p.acc_grid,
               (ws.X, w, ws.sort_order, ws.sort_starts, _i32(ws.n), _i32(ws.d), _i32(ws.k),
                _i32(p.acc_rows), ws.acc, scale, np.float64(ws.two_l), skip))
    else:
        launch(fp.kernel(f"accumulate_global<{t}>"), p.acc_grid,
               (ws.X, w, labels, _i32(ws.n), _i32(ws.d), ws.acc, scale,
                np.float64(ws.two_l), skip))


def sort_rows(ws, labels, skip=NULL):
    """ws.sort_order: the rows counting-sorted by label, cluster c's from sort_starts[c].
    Up to fp.SORT_HIST_K clusters each block counts its rows in shared memory first."""
    n, rows = _i32(ws.n), common.grid(ws.n, BLOCK, 8)
    k_hist = ws.k if ws.k <= fp.SORT_HIST_K else 0
    if k_hist:   # (blocks of at least two rows a cluster: the flush is per cluster)
        rows = max(1, min(rows, ws.n // (2 * ws.k)))
    smem = 4 * k_hist
    launch(fp.kernel("sort_count"), rows, (labels, n, ws.sort_counts, skip, _i32(k_hist)),
           shared_mem=smem)
    launch(fp.kernel("sort_offsets"), 1,
           (ws.sort_counts, _i32(ws.k), ws.sort_starts, ws.sort_cursor, skip))
    launch(fp.kernel("sort_place"), rows, (labels, n, ws.sort_cursor, ws.sort_order, skip,
                                           _i32(k_hist)), shared_mem=smem)


def finalize(ws, out, scratch, *, stats=False, changed_if_none=-1.0):
    """Fixed point -> float64 sums and weights into `out` (k*(d+1) values, then with stats
    the inertia and the changed labels: of each problem of a batch, in turn)."""
    k, d = ws.k, ws.d
    launch(ws.fn_finalize, ws.finalize_grid,
           (ws.acc, _i32(k), _i32(d), scales(ws, scratch)[1], np.float64(1.0 / ws.two_l), out,
            out[k * d:], ws.partials, _i32(ws.n_partials if stats else 0), ws.counter,
            np.float64(changed_if_none), out[k * (d + 1):] if stats else NULL,
            _i32(ws.problems)))
