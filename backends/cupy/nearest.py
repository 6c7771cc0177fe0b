"""Launchers of cupy-kernels' and cupy-chunked's kernels (cuda/nearest.cu, cuda/sums.cu,
cuda/row_argmin.cu) and of the centers' operands (cuda/centers.cu), shared with host streaming.

Numerics: the numpy backend's partition, bit for bit where numpy's own rounding is known. numpy
computes a point's distance to a center as the BLAS GEMM ``x . (-2 c)`` (OpenBLAS: one fused
multiply-add per feature, in feature order, from 0) plus ``||c||^2`` (``np.einsum``), and takes
the first minimum. The nearest-center kernels do exactly that, on operands pack_centers builds
on the device with ``||c||^2`` in np.einsum's summation order (`einsum_order`; where no known
order reproduces this numpy's einsum the operands are built by numpy on the host instead).
Ties go to the lower index. The squared distance returned is max(best + ||x||^2, 0).
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.backend import compact_labels_dtype

from . import common
from .common import BLOCK, NULL, ctype, cupy
from .einsum_order import einsum_order, norm_mode

#: largest d with a compile-time kernel
SMALL_D_MAX = 4
#: register widths of the nearest-center kernels for SMALL_D_MAX < d <= width
REGISTER_WIDTHS = (8, 16, 32, 64, 128)
#: bytes of registers a thread may spend on its point (128 float32 or 64 float64 features)
MAX_REGISTER_BYTES = 512
#: shared memory a cluster_sums_shared block may use (more needs an opt-in, done below)
SUMS_SHARED_MAX = 96 * 1024
ROW_ARGMIN_BLOCK = 256          # 8 warps, one row each
ROW_ARGMIN_MAX_GRID = 1 << 20   # the kernel strides over further rows
LABEL_STORE_CTYPE = {np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short",
                     np.dtype(np.int32): "int"}


def points_per_thread(d, itemsize):
    """Points each thread of nearest_small holds (registers: P * (d + 2) values)."""
    return 4 if itemsize == 4 else 2


def ops_stride(d, itemsize):
    """Row stride of the centers' operands: d + 1 rounded up to 16 bytes (as common.cuh)."""
    v = 16 // itemsize
    return -(-(d + 1) // v) * v


def nearest_kernel_name(d, dtype):
    """The instance that serves d features of `dtype`: nearest_small for d <= 4,
    nearest_tiled with the smallest register width that holds the point, else nearest_mem."""
    dt = np.dtype(dtype)
    t = ctype(dt)
    if d <= SMALL_D_MAX:
        return f"nearest_small<{t}, {d}, {points_per_thread(d, dt.itemsize)}>"
    for width in REGISTER_WIDTHS:
        if d <= width and width * dt.itemsize <= MAX_REGISTER_BYTES:
            return f"nearest_tiled<{t}, {width}>"
    return f"nearest_mem<{t}>"


def kernel_instances():
    """(file, instance) of every kernel these launchers can ask for (the compile check)."""
    out = []
    for dt in common.CTYPE:
        t = common.CTYPE[dt]
        out += [("nearest.cu", name) for name in
                sorted({nearest_kernel_name(d, dt) for d in range(1, 300)})]
        out += [("sums.cu", f"cluster_sums_shared<{t}>"), ("sums.cu", f"cluster_sums_global<{t}>"),
                ("row_argmin.cu", f"row_argmin_shifted<{t}>"),
                ("centers.cu", f"pack_centers<{t}>")]
    return out


# -- the centers' operands ----------------------------------------------------------------------
def pack_centers(C, layout, ops, cnorm, *, S=0, kpad=0):
    """Write the operands of centers C (k, d), contiguous, in the nearest kernels' layout:
    0: ops rows (-2c, ||c||^2, 0 padding) of stride S; 1: -2C^T (d, kpad) and cnorm;
    2: cnorm alone. ||c||^2 in np.einsum's order (see the module's note)."""
    k, d = C.shape
    mode = norm_mode(str(C.dtype))
    fn = common.raw_kernel("centers.cu", f"pack_centers<{ctype(C.dtype)}>")
    common.launch(fn, -(-k // BLOCK),
                  (C, np.int32(k), np.int32(d), np.int32(layout), np.int32(S), np.int32(kpad),
                   np.int32(mode), NULL if ops is None else ops, NULL if cnorm is None else cnorm,
                   np.int64(0), np.int32(0)))


def center_operands(centers, dtype):
    """Rows of (-2 c_0, ..., -2 c_{d-1}, ||c||^2, 0 padding) of stride `ops_stride` in
    `dtype`, on the device; built by numpy on the host when einsum's order is unknown."""
    cp = cupy()
    dtype = np.dtype(dtype)
    k, d = centers.shape
    S = ops_stride(d, dtype.itemsize)
    if einsum_order() is None:
        return cp.asarray(_host_operands(centers, dtype, S))
    C = cp.ascontiguousarray(cp.asarray(centers, dtype=dtype))
    ops = cp.empty((k, S), dtype=dtype)
    pack_centers(C, 0, ops, None, S=S)
    return ops


def center_norms(centers, dtype):
    """||c||^2 per center as the numpy backend computes it, on the device."""
    cp = cupy()
    dtype = np.dtype(dtype)
    if einsum_order() is None:
        c = np.ascontiguousarray(_to_host(centers), dtype=dtype)
        return cp.asarray(np.einsum("ij,ij->i", c, c))
    C = cp.ascontiguousarray(cp.asarray(centers, dtype=dtype))
    cnorm = cp.empty(C.shape[0], dtype=dtype)
    pack_centers(C, 2, None, cnorm)
    return cnorm


def _host_operands(centers, dtype, S):
    c = np.ascontiguousarray(_to_host(centers), dtype=dtype)
    k, d = c.shape
    ops = np.zeros((k, S), dtype=dtype)
    np.multiply(c, -2, out=ops[:, :d])
    np.einsum("ij,ij->i", c, c, out=ops[:, d])
    return ops


def _to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


# -- launches -----------------------------------------------------------------------------------
def nearest_center(X, ops, k, labels, min_sq):
    """labels[i] (int32), min_sq[i] = argmin_j / min_j of ||c_j||^2 - 2 x_i.c_j (+ ||x_i||^2,
    clamped at 0) with `ops` = center_operands(C); X C-contiguous."""
    n, d = X.shape
    if n == 0:
        return
    name = nearest_kernel_name(d, X.dtype)
    fn = common.raw_kernel("nearest.cu", name)
    if name.startswith("nearest_small"):
        per_block = BLOCK * points_per_thread(d, X.dtype.itemsize)
        args = (X, ops, np.int64(n), np.int32(k), labels, min_sq)
    else:
        per_block = BLOCK
        args = (X, ops, np.int64(n), np.int32(k), np.int32(d), labels, min_sq)
    common.launch(fn, common.grid(n, per_block), args)


def cluster_sums(X, labels, sample_weight, sums, weights):
    """sums[l] += w * x and weights[l] += w for every point (float64, zeroed or holding
    earlier chunks' sums; labels int32; weights None: unit): shared-memory privatised when
    k * (d + 1) doubles fit, else global atomics."""
    n, d = X.shape
    k = weights.shape[0]
    if n == 0:
        return
    w = NULL if sample_weight is None else sample_weight
    smem = k * (d + 1) * 8
    fn = common.raw_kernel("sums.cu", sums_kernel_name(k, d, X.dtype))
    if smem > SUMS_SHARED_MAX:
        common.launch(fn, common.grid(n, BLOCK, 8),
                      (X, labels, w, np.int64(n), np.int32(d), sums, weights))
        return
    # a block's flush costs k * (d + 1) atomics: a few blocks per SM, each over many points
    blocks_per_sm = 2 if smem > 32 * 1024 else 4
    common.launch(fn, common.grid(n, BLOCK * 8, blocks_per_sm),
                  (X, labels, w, np.int64(n), np.int32(d), np.int32(k), sums, weights),
                  shared_mem=smem)


def sums_kernel_name(k, d, dtype):
    """cluster_sums' kernel: privatised in shared memory when k * (d + 1) doubles fit."""
    where = "global" if k * (d + 1) * 8 > SUMS_SHARED_MAX else "shared"
    return f"cluster_sums_{where}<{ctype(dtype)}>"


def assignment_kernels(k, d, dtype, assign):
    """(file, instance) of a chunk's assignment (`assign`: cupy-kernels' nearest kernel, or
    cupy-chunked's GEMM epilogue), the centers' packing where it runs on the device, and the
    cluster sums: what `CupyBackendBase.fit_kernels` adds for these backends."""
    out = [assign, ("sums.cu", sums_kernel_name(k, d, dtype))]
    if einsum_order() is not None:
        out.append(("centers.cu", f"pack_centers<{ctype(dtype)}>"))
    return out


def row_argmin_shifted(dist, c_norm, col0, first, run_min, labels):
    """Merge argmin_j (dist[r, j] + c_norm[j]) + col0 into labels / run_min, row by row."""
    rows, width = dist.shape
    grid = max(1, min(-(-rows // (ROW_ARGMIN_BLOCK // 32)), ROW_ARGMIN_MAX_GRID))
    fn = common.raw_kernel("row_argmin.cu", f"row_argmin_shifted<{ctype(dist.dtype)}>")
    common.launch(fn, grid, (dist, c_norm, np.int64(rows), np.int32(width), np.int32(col0),
                             np.int32(bool(first)), run_min, labels), block=ROW_ARGMIN_BLOCK)


def label_store_dtype(k):
    """The smallest unsigned (or int32) dtype that holds labels 0..k-1 (the contract's
    `compact_labels_dtype`)."""
    return compact_labels_dtype(k)
