"""CUDA kernels of the CuPy backends, each named after what it does.

Built on first use (CuPy is imported lazily) and memoized here; CuPy compiles each kernel
once per dtype and keeps the binary in its on-disk cache. None of them makes an n x k array:

- `nearest_center`: one thread per point loops over all k centers (every feature; the point
  held in registers up to 128 float32 / 64 float64 features) and writes the label and the
  squared distance, by differences.
- `cluster_sums`: one thread per point adds w * x and w into float64 (k, d) / (k,) outputs
  with atomicAdd (native for double on sm_60+), so float32 centers stay right at n = 1e8.
- `labelled_sq_dist`: ||x - c_label||^2 by differences, for a given assignment.
- `row_argmin_shifted`: for cupy-chunked, one warp per row of a GEMM block of -2 x.c: adds
  ||c||^2, takes the row's minimum (first index on ties) and merges it into a running
  minimum across center tiles.
- reductions `weighted_sum`, `center_shift`, `count_changed` for the device-resident loop.
"""
from __future__ import annotations

import functools

import numpy as np

from ._cupy_common import cupy

#: device functions shared by the elementwise kernels
POINT_PREAMBLE = r"""
template <typename T>
__device__ __forceinline__ T sq_dist_any(const T* __restrict__ x, const T* __restrict__ c,
                                         int d) {
    T s = T(0);
    for (int f = 0; f < d; ++f) {
        const T t = x[f] - c[f];
        s += t * t;
    }
    return s;
}

// x held in registers; centers read in order (all threads of a warp read the same center,
// so each load is one broadcast).
template <typename T, int D>
__device__ __forceinline__ void nearest_fixed(const T* __restrict__ x,
                                              const T* __restrict__ C, int k,
                                              long long& best_j, T& best_d) {
    T xr[D];
#pragma unroll
    for (int f = 0; f < D; ++f) xr[f] = x[f];
    best_j = 0;
    best_d = T(0);
#pragma unroll
    for (int f = 0; f < D; ++f) {
        const T t = xr[f] - C[f];
        best_d += t * t;
    }
    for (int j = 1; j < k; ++j) {
        const T* c = C + (ptrdiff_t)j * D;
        T s = T(0);
#pragma unroll
        for (int f = 0; f < D; ++f) {
            const T t = xr[f] - c[f];
            s += t * t;
        }
        if (s < best_d) {  // strict: the first of equal centers wins, as numpy's argmin
            best_d = s;
            best_j = j;
        }
    }
}

template <typename T>
__device__ __forceinline__ void nearest_any(const T* __restrict__ x,
                                            const T* __restrict__ C, int k, int d,
                                            long long& best_j, T& best_d) {
    best_j = 0;
    best_d = sq_dist_any<T>(x, C, d);
    for (int j = 1; j < k; ++j) {
        const T s = sq_dist_any<T>(x, C + (ptrdiff_t)j * d, d);
        if (s < best_d) {
            best_d = s;
            best_j = j;
        }
    }
}

template <typename T>
__device__ __forceinline__ void nearest_center(const T* x, const T* C, int k, int d,
                                               long long& label, T& min_sq) {
    switch (d) {
        case 1: nearest_fixed<T, 1>(x, C, k, label, min_sq); break;
        case 2: nearest_fixed<T, 2>(x, C, k, label, min_sq); break;
        case 3: nearest_fixed<T, 3>(x, C, k, label, min_sq); break;
        case 4: nearest_fixed<T, 4>(x, C, k, label, min_sq); break;
        default: nearest_any<T>(x, C, k, d, label, min_sq);
    }
}

// d <= W features held in W registers (predicated past d): the point is read once instead
// of once per center, which is what makes a thread-per-point loop viable for wider data.
template <typename T, int W>
__device__ __forceinline__ T sq_dist_regs(const T (&xr)[W], const T* __restrict__ c, int d) {
    T s = T(0);
#pragma unroll
    for (int f = 0; f < W; ++f) {
        if (f < d) {
            const T t = xr[f] - c[f];
            s += t * t;
        }
    }
    return s;
}

template <typename T, int W>
__device__ __forceinline__ void nearest_regs(const T* __restrict__ x,
                                             const T* __restrict__ C, int k, int d,
                                             long long& best_j, T& best_d) {
    T xr[W];
#pragma unroll
    for (int f = 0; f < W; ++f) xr[f] = f < d ? x[f] : T(0);
    best_j = 0;
    best_d = sq_dist_regs<T, W>(xr, C, d);
    for (int j = 1; j < k; ++j) {
        const T s = sq_dist_regs<T, W>(xr, C + (ptrdiff_t)j * d, d);
        if (s < best_d) {
            best_d = s;
            best_j = j;
        }
    }
}

template <typename T>
__device__ __forceinline__ void add_to_cluster(const T* __restrict__ x, long long label,
                                               T w, int d, double* sums, double* wsum) {
    if (w == T(0)) return;  // a zero weight adds nothing: skip its atomics
    const double wd = static_cast<double>(w);
    double* s = sums + label * d;
    for (int f = 0; f < d; ++f) atomicAdd(s + f, wd * static_cast<double>(x[f]));
    atomicAdd(wsum + label, wd);
}
"""

ROW_ARGMIN_SOURCE = r"""
template <typename T> __device__ __forceinline__ T positive_infinity();
template <> __device__ __forceinline__ float positive_infinity<float>() {
    return __int_as_float(0x7f800000);
}
template <> __device__ __forceinline__ double positive_infinity<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// One warp per row of a (rows, width) block holding -2 x.c: each lane scans columns
// lane, lane + 32, ... adding ||c||^2 and keeps its first minimum; the warp then reduces by
// shuffles, preferring the lower column on ties. Lane 0 merges the row's minimum into the
// running minimum over center tiles (strictly smaller wins, so earlier tiles win ties).
template <typename T>
__device__ __forceinline__ void row_argmin_shifted(
        const T* __restrict__ dist, const T* __restrict__ c_norm, long long rows, int width,
        long long col0, int first, T* __restrict__ run_min, long long* __restrict__ labels) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = warp; r < rows; r += n_warps) {
        const T* row = dist + r * (long long)width;
        T best = positive_infinity<T>();
        int best_j = -1;
        if (lane < width) {
            best = row[lane] + c_norm[lane];
            best_j = lane;
        }
        for (int j = lane + 32; j < width; j += 32) {
            const T v = row[j] + c_norm[j];
            if (v < best) {
                best = v;
                best_j = j;
            }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            const T other = __shfl_down_sync(0xffffffffu, best, offset);
            const int other_j = __shfl_down_sync(0xffffffffu, best_j, offset);
            if (other_j >= 0 && (best_j < 0 || other < best ||
                                 (other == best && other_j < best_j))) {
                best = other;
                best_j = other_j;
            }
        }
        if (lane == 0 && (first || best < run_min[r])) {
            run_min[r] = best;
            labels[r] = col0 + best_j;
        }
    }
}

extern "C" __global__ void kmeans_row_argmin_f32(
        const float* dist, const float* c_norm, long long rows, int width, long long col0,
        int first, float* run_min, long long* labels) {
    row_argmin_shifted<float>(dist, c_norm, rows, width, col0, first, run_min, labels);
}

extern "C" __global__ void kmeans_row_argmin_f64(
        const double* dist, const double* c_norm, long long rows, int width, long long col0,
        int first, double* run_min, long long* labels) {
    row_argmin_shifted<double>(dist, c_norm, rows, width, col0, first, run_min, labels);
}
"""

#: register widths of the nearest-center kernels for 4 < d <= width; one kernel each, so a
#: narrow one is not held to the register count (and occupancy) of a wide one
REGISTER_WIDTHS = (8, 16, 32, 64, 128)
#: bytes of registers a thread may spend on its point (128 float32 or 64 float64 features)
MAX_REGISTER_BYTES = 512

_NEAREST_PARAMS = ("raw T X, raw T C, int32 k, int32 d", "int64 label, T min_sq")

#: (in_params, out_params, operation, name) of each elementwise kernel
ELEMENTWISE = {
    "nearest_center": (
        *_NEAREST_PARAMS,
        "nearest_center<T>(&X[i * d], &C[0], k, d, label, min_sq)",
        "kmeans_nearest_center"),
    **{f"nearest_center_r{w}": (
        *_NEAREST_PARAMS,
        f"nearest_regs<T, {w}>(&X[i * d], &C[0], k, d, label, min_sq)",
        f"kmeans_nearest_center_r{w}") for w in REGISTER_WIDTHS},
    "cluster_sums": (
        "raw T X, int64 label, T w, int32 d", "raw float64 sums, raw float64 wsum",
        "add_to_cluster<T>(&X[i * d], label, w, d, &sums[0], &wsum[0])",
        "kmeans_cluster_sums"),
    "labelled_sq_dist": (
        "raw T X, raw T C, int64 label, int32 d", "T dist",
        "dist = sq_dist_any<T>(&X[i * d], &C[label * d], d)",
        "kmeans_labelled_sq_dist"),
}

#: (in_params, out_params, map, reduce, post_map, identity, name) of each reduction
REDUCTIONS = {
    "weighted_sum": (
        "T v, T w", "float64 total",
        "static_cast<double>(v) * static_cast<double>(w)", "a + b", "total = a", "0",
        "kmeans_weighted_sum"),
    "center_shift": (
        "T c_new, T c_old", "float64 shift",
        "(static_cast<double>(c_new) - static_cast<double>(c_old)) * "
        "(static_cast<double>(c_new) - static_cast<double>(c_old))",
        "a + b", "shift = a", "0", "kmeans_center_shift"),
    "count_changed": (
        "int64 lab_new, int64 lab_old", "int64 changed",
        "lab_new != lab_old ? 1 : 0", "a + b", "changed = a", "0",
        "kmeans_count_changed_labels"),
}

ROW_ARGMIN_BLOCK = 256          # 8 warps, one row each
ROW_ARGMIN_MAX_GRID = 1 << 20   # the kernel strides over further rows


@functools.lru_cache(maxsize=None)
def elementwise(kind):
    in_params, out_params, operation, name = ELEMENTWISE[kind]
    return cupy().ElementwiseKernel(in_params, out_params, operation, name,
                                    preamble=POINT_PREAMBLE)


@functools.lru_cache(maxsize=None)
def reduction(kind):
    in_params, out_params, map_expr, reduce_expr, post_map, identity, name = REDUCTIONS[kind]
    return cupy().ReductionKernel(in_params, out_params, map_expr, reduce_expr, post_map,
                                  identity, name)


@functools.lru_cache(maxsize=None)
def _row_argmin_module():
    return cupy().RawModule(code=ROW_ARGMIN_SOURCE)


def _row_argmin_function(dtype):
    suffix = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}[np.dtype(dtype)]
    return _row_argmin_module().get_function(f"kmeans_row_argmin_{suffix}")


# -- calls ------------------------------------------------------------------------------------
def nearest_kernel_kind(d, itemsize):
    """Which nearest-center kernel serves d features: fixed widths for d <= 4, the smallest
    register width that holds the point, else the loop reading the point from memory."""
    if d > 4:
        for width in REGISTER_WIDTHS:
            if d <= width and width * itemsize <= MAX_REGISTER_BYTES:
                return f"nearest_center_r{width}"
    return "nearest_center"


def nearest_center(X, C, labels, min_sq):
    """labels[i], min_sq[i] = argmin_j / min_j ||X[i] - C[j]||^2 (all C-contiguous, same dtype)."""
    kind = nearest_kernel_kind(X.shape[1], X.dtype.itemsize)
    elementwise(kind)(X, C, C.shape[0], X.shape[1], labels, min_sq)


def cluster_sums(X, labels, sample_weight, sums, weights):
    """sums[l] += w * x and weights[l] += w for every point (sums, weights zeroed float64)."""
    elementwise("cluster_sums")(X, labels, sample_weight, X.shape[1], sums, weights)


def labelled_sq_dist(X, C, labels, out):
    """out[i] = ||X[i] - C[labels[i]]||^2 by differences (X, C C-contiguous, same dtype)."""
    elementwise("labelled_sq_dist")(X, cupy().ascontiguousarray(C), labels, X.shape[1], out)
    return out


def row_argmin_shifted(dist, c_norm, col0, first, run_min, labels):
    """Merge argmin_j (dist[r, j] + c_norm[j]) + col0 into labels / run_min, row by row."""
    rows, width = dist.shape
    grid = max(1, min(-(-rows // (ROW_ARGMIN_BLOCK // 32)), ROW_ARGMIN_MAX_GRID))
    _row_argmin_function(dist.dtype)(
        (grid,), (ROW_ARGMIN_BLOCK,),
        (dist, c_norm, np.int64(rows), np.int32(width), np.int64(col0), np.int32(bool(first)),
         run_min, labels))


#: a full reduction is split into this many parts reduced side by side (CuPy's generic
#: reduction gives a whole-array reduction to a single block, which idles the other SMs)
REDUCE_PARTS = 1024
#: below this many elements per part one block is fast enough
REDUCE_MIN_PART = 4096


def full_reduce(kernel, *arrays):
    """kernel reduced over all elements of the same-shaped, C-contiguous arrays, as a 0-d
    array: REDUCE_PARTS rows reduced in parallel, then their partial results and the tail."""
    n = arrays[0].size
    m = n // REDUCE_PARTS
    if m < REDUCE_MIN_PART:
        return kernel(*arrays)
    flat = [a.reshape(-1) for a in arrays]
    head = [f[: m * REDUCE_PARTS].reshape(REDUCE_PARTS, m) for f in flat]
    total = kernel(*head, axis=1).sum()
    if m * REDUCE_PARTS < n:
        total = total + kernel(*[f[m * REDUCE_PARTS:] for f in flat])
    return total


class DeviceReductions:
    """The reductions the device-resident Lloyd loop (`_device_loop`) asks for."""

    @staticmethod
    def weighted_sum(v, w):
        return full_reduce(reduction("weighted_sum"), v, w)

    @staticmethod
    def center_shift(a, b):
        return full_reduce(reduction("center_shift"), a, b)

    @staticmethod
    def count_changed(a, b):
        return full_reduce(reduction("count_changed"), a, b)

    @staticmethod
    def labelled_sq_dist(X, C, labels, out):
        return labelled_sq_dist(X, C, labels, out)

    @staticmethod
    def fetch(scalars):
        cp = cupy()
        stacked = cp.stack([cp.asarray(s, dtype=cp.float64) for s in scalars])
        return [float(v) for v in cp.asnumpy(stacked)]
