"""cupy-fused's workspace: the buffers of one problem (X's shape, k, weights given or not),
kept across the backend's calls and across the batches of a mini-batch fit."""
from __future__ import annotations

import numpy as np

from . import fused_plan as fp
from .common import BLOCK, compute_dtype, xtypes
from .einsum_order import norm_mode

CTYPE = {"float32": "float", "float64": "double"}
_i32 = np.int32


class Workspace:
    """The buffers of one (X, k, weights) problem, kept across calls (the driver calls with
    the same X every iteration): the plan, the centers' operands, the fixed-point
    accumulator (finalize_sums leaves it zeroed), per-block partials, the changed-labels
    counter (finalize_sums resets it) and the fixed-point scales (computed on the device on
    first use). All used in stream order.

    Or of a batch of `problems` problems of one shape (`fused_batch`): X holds the rows of
    all of them, one problem after another (`rows` each), k clusters each; every problem has
    its own operands, partials (plan.n_partials each) and counter, while the sums, the sort
    and the scales (the max of its problems') are of the whole batch, whose problems'
    clusters follow one another (self.k = problems * k of them)."""

    def __init__(self, cp, plan, X, w, k, dev, problems=1):
        n, d = X.shape
        self.X, self.w, self.k, self.n, self.d = X, w, k * problems, n, d
        self.problems, self.rows = problems, n // problems
        # T, dtype_name: what the kernels compute in (the centers' operands, min_sq); X's own
        # dtype (x_name) differs for half X, read in its format (`common.xtypes`)
        self.plan, self.T = plan, compute_dtype(X.dtype)
        self.dtype_name, self.x_name, self.xtypes = str(self.T), str(X.dtype), xtypes(X.dtype)
        self.acc = cp.zeros(self.k * (d + 1) * 2, dtype=cp.uint64)
        n_ops, n_cnorm = fp.operand_sizes(plan.layout, k, d, plan.S, plan.kpad)
        self.ops_b, self.cnorm_b = n_ops, n_cnorm   # (a problem's)
        self.ops = cp.zeros(n_ops * problems, dtype=self.T)  # the padding stays zero
        # ||c||^2 of the padding columns is inf: they never win
        self.cnorm = cp.full(n_cnorm * problems, 0 if plan.layout == 0 else np.inf,
                             dtype=self.T)
        self.n_partials = plan.n_partials   # grows if an OOM halves the tf32 chunk
        self.chunk_rows = plan.chunk_rows
        self.partials = cp.zeros(max(plan.n_partials, 1) * problems, dtype=cp.float64)
        self.counter = cp.zeros(problems, dtype=cp.uint64)
        self.gbuf = None
        if plan.acc_mode == "sorted":   # counts (sort_offsets zeroes them), starts, cursor, rows
            kt = self.k
            self.sort_counts = cp.zeros(kt, dtype=cp.int32)
            self.sort_starts, self.sort_cursor = cp.empty(kt + 1, cp.int32), cp.empty(kt, cp.int32)
            self.sort_order = cp.empty(n, dtype=cp.int32)
        self.scales = None  # (scale, inv_scale) device arrays of d + 1 values
        # host centers' way in and the statistics' way out (HostCenters, made on first use)
        self.host = None
        self.two_l = fp.fixed_point_lo(n)
        t = CTYPE[self.dtype_name]
        # what every call launches with, looked up once (an iteration's host time is small)
        self.fn_pack = fp.kernel(f"pack_centers<{t}>")
        self.pack_grid = (fp.cdiv(k, BLOCK), problems)
        self.pack_args = (_i32(k), _i32(d), _i32(plan.layout), _i32(plan.S), _i32(plan.kpad),
                          np.int32(norm_mode(self.dtype_name)), self.ops, self.cnorm,
                          np.int64(n_ops), _i32(n_cnorm))
        self.fn_finalize = fp.kernel("finalize_sums")
        self.finalize_grid = max(problems, min(fp.cdiv(self.k * (d + 1), BLOCK), dev.sms * 8))
        if plan.path == "small":
            names = fp.small_kernel_names(self.dtype_name, d, plan.P, plan.G)
            self.fn_fused, self.fn_assign = fp.kernel(names[0]), fp.kernel(names[1])

    def fits(self, X, k, w):
        """Whether this workspace serves another X of the same shape, dtype and k (weights
        given or not alike): every buffer is left as a new one would be between calls (the
        accumulator and counter zeroed by finalize_sums, the operands' padding untouched)."""
        return (X.shape == (self.n, self.d) and str(X.dtype) == self.x_name and k == self.k and
                (w is None) == (self.w is None))

    def rebind(self, X, w, w_in):
        """Serve X (and its weights): only the fixed-point scales depend on X's values."""
        self.X, self.w, self.w_in, self.scales = X, w, w_in, None
