"""CUDA kernels of the CuPy backends, each named after what it does.

Built on first use (CuPy is imported lazily) and memoized here; CuPy compiles each kernel
once per dtype and keeps the binary in its on-disk cache. None of them makes an n x k array.

Numerics: the numpy backend's partition, bit for bit where numpy's own rounding is known.
numpy computes a point's distance to a center as the BLAS GEMM ``x . (-2 c)`` (OpenBLAS: one
fused multiply-add per feature, in feature order, from 0) plus ``||c||^2`` (``np.einsum``),
and takes the first minimum. The nearest-center kernels do exactly that with explicit
``__fmaf_rn``/``__fadd_rn`` intrinsics (NVRTC can neither contract nor reassociate them), on
operands the host builds with numpy itself (`center_operands`: ``-2 c``, exact, and
``np.einsum("ij,ij->i", c, c)``, whose summation order depends on the CPU's SIMD path: for
float64 and d = 3 on an AVX-512 CPU it is (c0^2 + c2^2) + c1^2, not sequential; computing it
with numpy keeps it right on every CPU). Ties go to the lower index. The squared distance
returned is numpy's too: max(best + ||x||^2, 0).

Raw kernels (templates, one NVRTC module per instance, compiled on first use):

- `nearest_small<T, D, P>`: d = D <= 4 known at compile time, P points per thread held in
  registers, the centers' operands streamed through shared memory in tiles (loaded once per
  block when all k fit), read back as 16-byte broadcasts.
- `nearest_tiled<T, W>`: 4 < d <= W (W in REGISTER_WIDTHS), one point per thread in W
  registers (predicated past d), centers tiled through shared memory.
- `nearest_mem<T>`: wider d: the point read from memory (L1) for every center.
- `cluster_sums_shared<T>`: per-cluster float64 sums of w * x and w privatised in shared
  memory per block (a warp whose 32 points share a label adds once), flushed with one global
  atomicAdd per value and block; `cluster_sums` falls back on the global-atomic elementwise
  kernel when k * (d + 1) doubles do not fit in shared memory.
- `row_argmin_shifted<T>`: for cupy-chunked, one warp per row of a GEMM block of -2 x.c:
  adds ||c||^2 (one rounding, as numpy), takes the row's first minimum and merges it into a
  running minimum across center tiles.
- `update_label_store<S>`: for host streaming, counts labels that changed against a compact
  per-point store (uint8/uint16/int32) and writes the new ones.
Elementwise kernels `cluster_sums` (global atomics) and `labelled_sq_dist` (||x - c_l||^2 by
differences); reductions `weighted_sum`, `center_shift`, `count_changed` for the
device-resident loop.
"""
from __future__ import annotations

import functools

import numpy as np

from ._cupy_common import cupy

#: options every raw module is compiled with (no header is needed)
NVRTC_OPTIONS = ("--std=c++17",)
#: threads per block of the raw kernels (the source reads the same number)
BLOCK = 256
#: bytes of shared memory a nearest-center block uses for its tile of centers
TILE_BYTES = 32 * 1024
#: largest d with a compile-time kernel
SMALL_D_MAX = 4
#: register widths of the nearest-center kernels for SMALL_D_MAX < d <= width; one kernel
#: each, so a narrow one is not held to the register count (and occupancy) of a wide one
REGISTER_WIDTHS = (8, 16, 32, 64, 128)
#: bytes of registers a thread may spend on its point (128 float32 or 64 float64 features)
MAX_REGISTER_BYTES = 512
#: shared memory a cluster_sums_shared block may use (more needs an opt-in, done below)
SUMS_SHARED_MAX = 96 * 1024

RAW_SOURCE = r"""
typedef long long i64;
typedef unsigned long long u64;
#define FULL_MASK 0xffffffffu

constexpr int BLOCK = %(block)d;
constexpr int TILE_BYTES = %(tile_bytes)d;

// IEEE single-rounding operations, overloaded on float and double. Written as intrinsics, so
// that no a * b + c below is contracted and no sum reassociated: each rounds where numpy's
// BLAS and einsum round.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) {
    return __fma_rn(a, b, c);
}

template <typename T> __device__ __forceinline__ T positive_infinity();
template <> __device__ __forceinline__ float positive_infinity<float>() {
    return __int_as_float(0x7f800000);
}
template <> __device__ __forceinline__ double positive_infinity<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// values of T in one 16-byte vector
template <typename T> __host__ __device__ constexpr int vec_len() { return 16 / (int)sizeof(T); }

// Row stride of the centers' operands (-2 c_0 .. -2 c_{d-1}, ||c||^2, zero padding): d + 1
// rounded up to a 16-byte vector. center_operands() on the host uses the same stride.
template <typename T> __host__ __device__ constexpr int ops_stride(int d) {
    return (d + 1 + vec_len<T>() - 1) / vec_len<T>() * vec_len<T>();
}

// One 16-byte load of shared memory into V consecutive values.
template <typename T>
__device__ __forceinline__ void load_vec(const T* __restrict__ src, T* dst) {
    if constexpr (sizeof(T) == 4) {
        const float4 q = *reinterpret_cast<const float4*>(src);
        dst[0] = q.x; dst[1] = q.y; dst[2] = q.z; dst[3] = q.w;
    } else {
        const double2 q = *reinterpret_cast<const double2*>(src);
        dst[0] = q.x; dst[1] = q.y;
    }
}

// numpy's reported distance: the GEMM minimum plus ||x||^2 (a sequential sum of rounded
// squares), clamped at 0.
template <typename T>
__device__ __forceinline__ T with_point_norm(T best, T xnorm) {
    const T m = add_rn(best, xnorm);
    return m < T(0) ? T(0) : m;
}

// ---------------------------------------------------------------------------------------------
// nearest center, d = D known at compile time, P points per thread
// ---------------------------------------------------------------------------------------------
template <typename T, int D, int P>
__global__ void __launch_bounds__(BLOCK)
nearest_small(const T* __restrict__ X, const T* __restrict__ ops, i64 n, int k,
              i64* __restrict__ labels, T* __restrict__ min_sq) {
    constexpr int S = ops_stride<T>(D);
    constexpr int V = vec_len<T>();
    constexpr int TC = TILE_BYTES / (S * (int)sizeof(T));
    __shared__ __align__(16) T tile[TC * S];
    const bool resident = k <= TC;  // all centers fit: loaded once, no syncs in the loop
    if (resident) {
        for (int e = threadIdx.x; e < k * S; e += BLOCK) tile[e] = ops[e];
        __syncthreads();
    }
    const i64 step = (i64)gridDim.x * BLOCK * P;
    // base is the same in every thread of the block: all reach every __syncthreads
    for (i64 base = (i64)blockIdx.x * BLOCK * P; base < n; base += step) {
        T x[P][D];
        bool valid[P];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const i64 i = base + p * BLOCK + threadIdx.x;
            valid[p] = i < n;
#pragma unroll
            for (int j = 0; j < D; ++j) x[p][j] = valid[p] ? X[i * D + j] : T(0);
        }
        T best[P];
        int bidx[P];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            best[p] = positive_infinity<T>();
            bidx[p] = 0;
        }
        for (int c0 = 0; c0 < k; c0 += TC) {
            const int nc = min(TC, k - c0);
            if (!resident) {
                __syncthreads();
                for (int e = threadIdx.x; e < nc * S; e += BLOCK) tile[e] = ops[(i64)c0 * S + e];
                __syncthreads();
            }
#pragma unroll 2
            for (int c = 0; c < nc; ++c) {
                T op[S];
#pragma unroll
                for (int v = 0; v < S; v += V) load_vec<T>(tile + c * S + v, op + v);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    T acc = T(0);
#pragma unroll
                    for (int j = 0; j < D; ++j) acc = fma_rn(x[p][j], op[j], acc);
                    const T dist = add_rn(acc, op[D]);
                    if (dist < best[p]) {  // strict: the first of equal centers wins
                        best[p] = dist;
                        bidx[p] = c0 + c;
                    }
                }
            }
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            if (!valid[p]) continue;
            T xn = T(0);
#pragma unroll
            for (int j = 0; j < D; ++j) xn = add_rn(xn, mul_rn(x[p][j], x[p][j]));
            const i64 i = base + p * BLOCK + threadIdx.x;
            labels[i] = bidx[p];
            min_sq[i] = with_point_norm(best[p], xn);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// nearest center, 4 < d <= W: the point in W registers, centers tiled in shared memory
// ---------------------------------------------------------------------------------------------
template <typename T, int W>
__global__ void __launch_bounds__(BLOCK)
nearest_tiled(const T* __restrict__ X, const T* __restrict__ ops, i64 n, int k, int d,
              i64* __restrict__ labels, T* __restrict__ min_sq) {
    constexpr int V = vec_len<T>();
    __shared__ __align__(16) T tile[TILE_BYTES / sizeof(T)];
    const int S = ops_stride<T>(d);
    const int tc = (TILE_BYTES / (int)sizeof(T)) / S;
    const bool resident = k <= tc;
    if (resident) {
        for (int e = threadIdx.x; e < k * S; e += BLOCK) tile[e] = ops[e];
        __syncthreads();
    }
    const i64 step = (i64)gridDim.x * BLOCK;
    for (i64 base = (i64)blockIdx.x * BLOCK; base < n; base += step) {
        const i64 i = base + threadIdx.x;
        const bool valid = i < n;
        T x[W];
#pragma unroll
        for (int f = 0; f < W; ++f) x[f] = (valid && f < d) ? X[i * d + f] : T(0);
        T best = positive_infinity<T>();
        int bidx = 0;
        for (int c0 = 0; c0 < k; c0 += tc) {
            const int nc = min(tc, k - c0);
            if (!resident) {
                __syncthreads();
                for (int e = threadIdx.x; e < nc * S; e += BLOCK) tile[e] = ops[(i64)c0 * S + e];
                __syncthreads();
            }
            for (int c = 0; c < nc; ++c) {
                const T* op = tile + c * S;
                T acc = T(0);
#pragma unroll
                for (int v = 0; v < W; v += V) {
                    if (v < d) {
                        T o[V];
                        load_vec<T>(op + v, o);
#pragma unroll
                        for (int u = 0; u < V; ++u)
                            if (v + u < d) acc = fma_rn(x[v + u], o[u], acc);
                    }
                }
                const T dist = add_rn(acc, op[d]);
                if (dist < best) {
                    best = dist;
                    bidx = c0 + c;
                }
            }
        }
        if (valid) {
            T xn = T(0);
#pragma unroll
            for (int f = 0; f < W; ++f)
                if (f < d) xn = add_rn(xn, mul_rn(x[f], x[f]));
            labels[i] = bidx;
            min_sq[i] = with_point_norm(best, xn);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// nearest center, any d: the point read from memory for every center
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(BLOCK)
nearest_mem(const T* __restrict__ X, const T* __restrict__ ops, i64 n, int k, int d,
            i64* __restrict__ labels, T* __restrict__ min_sq) {
    const int S = ops_stride<T>(d);
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK) {
        const T* x = X + i * d;
        T best = positive_infinity<T>();
        int bidx = 0;
        for (int c = 0; c < k; ++c) {
            const T* op = ops + (i64)c * S;
            T acc = T(0);
            for (int f = 0; f < d; ++f) acc = fma_rn(__ldg(x + f), __ldg(op + f), acc);
            const T dist = add_rn(acc, __ldg(op + d));
            if (dist < best) {
                best = dist;
                bidx = c;
            }
        }
        T xn = T(0);
        for (int f = 0; f < d; ++f) xn = add_rn(xn, mul_rn(x[f], x[f]));
        labels[i] = bidx;
        min_sq[i] = with_point_norm(best, xn);
    }
}

// ---------------------------------------------------------------------------------------------
// per-cluster sums privatised in shared memory
// ---------------------------------------------------------------------------------------------
// acc[l * d + f] += w * x_f and acc[k * d + l] += w for each point; a warp whose 32 valid
// points share one label sums them by shuffles first and adds once (sorted input would
// otherwise serialise 32 atomics on one address). Then every non-zero value is added to the
// float64 outputs with one global atomicAdd per block.
template <typename T>
__global__ void __launch_bounds__(BLOCK)
cluster_sums_shared(const T* __restrict__ X, const i64* __restrict__ labels,
                    const T* __restrict__ w, i64 n, int d, int k, double* __restrict__ sums,
                    double* __restrict__ wsum) {
    extern __shared__ double acc[];
    const int words = k * (d + 1);
    for (int e = threadIdx.x; e < words; e += BLOCK) acc[e] = 0.0;
    __syncthreads();
    const i64 step = (i64)gridDim.x * BLOCK;
    for (i64 base = (i64)blockIdx.x * BLOCK; base < n; base += step) {
        const i64 i = base + threadIdx.x;
        const bool valid = i < n;
        const i64 lab = valid ? labels[i] : -1;
        const double wd = valid ? (double)w[i] : 0.0;
        const i64 first = __shfl_sync(FULL_MASK, lab, 0);
        const bool same = __all_sync(FULL_MASK, valid && lab == first);
        if (same) {
            for (int f = 0; f <= d; ++f) {
                double v = f < d ? wd * (double)X[i * d + f] : wd;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
                if ((threadIdx.x & 31) == 0 && v != 0.0)
                    atomicAdd(f < d ? acc + lab * d + f : acc + (i64)k * d + lab, v);
            }
        } else if (valid && wd != 0.0) {
            for (int f = 0; f < d; ++f) atomicAdd(acc + lab * d + f, wd * (double)X[i * d + f]);
            atomicAdd(acc + (i64)k * d + lab, wd);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < words; e += BLOCK) {
        const double v = acc[e];
        if (v != 0.0) atomicAdd(e < k * d ? sums + e : wsum + (e - k * d), v);
    }
}

// ---------------------------------------------------------------------------------------------
// cupy-chunked: argmin over a block of -2 x.c
// ---------------------------------------------------------------------------------------------
// One warp per row of a (rows, width) block: each lane scans columns lane, lane + 32, ...
// adding ||c||^2 (one rounding, as numpy's `dist += c_norm`) and keeps its first minimum;
// the warp then reduces by shuffles, preferring the lower column on ties. Lane 0 merges the
// row's minimum into the running minimum over center tiles (strictly smaller wins, so
// earlier tiles win ties).
template <typename T>
__global__ void row_argmin_shifted(const T* __restrict__ dist, const T* __restrict__ c_norm,
                                   i64 rows, int width, i64 col0, int first,
                                   T* __restrict__ run_min, i64* __restrict__ labels) {
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 n_warps = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 r = warp; r < rows; r += n_warps) {
        const T* row = dist + r * (i64)width;
        T best = positive_infinity<T>();
        int best_j = -1;
        if (lane < width) {
            best = add_rn(row[lane], c_norm[lane]);
            best_j = lane;
        }
        for (int j = lane + 32; j < width; j += 32) {
            const T v = add_rn(row[j], c_norm[j]);
            if (v < best) {
                best = v;
                best_j = j;
            }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            const T other = __shfl_down_sync(FULL_MASK, best, offset);
            const int other_j = __shfl_down_sync(FULL_MASK, best_j, offset);
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

// ---------------------------------------------------------------------------------------------
// host streaming: the per-point label store
// ---------------------------------------------------------------------------------------------
// changed += #(store[i] != labels[i]); store[i] = labels[i]. One atomicAdd per warp.
template <typename S>
__global__ void __launch_bounds__(BLOCK)
update_label_store(const i64* __restrict__ labels, S* __restrict__ store, i64 m,
                   u64* __restrict__ changed) {
    unsigned count = 0;
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < m; i += (i64)gridDim.x * BLOCK) {
        const S now = (S)labels[i];
        if (store[i] != now) {
            ++count;
            store[i] = now;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(FULL_MASK, count, o);
    if ((threadIdx.x & 31) == 0 && count) atomicAdd(changed, (u64)count);
}
""" % {"block": BLOCK, "tile_bytes": TILE_BYTES}

#: elementwise kernels: (in_params, out_params, operation, name)
ELEMENTWISE_PREAMBLE = r"""
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

ELEMENTWISE = {
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
    # host streaming's column statistics: sum of (x - s)^2 in float64 about a shift s
    "shifted_sq": (
        "T x, float64 s", "float64 q",
        "(static_cast<double>(x) - s) * (static_cast<double>(x) - s)", "a + b", "q = a", "0",
        "kmeans_shifted_squares"),
}

ROW_ARGMIN_BLOCK = 256          # 8 warps, one row each
ROW_ARGMIN_MAX_GRID = 1 << 20   # the kernel strides over further rows

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_STORE_CTYPE = {np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short",
                np.dtype(np.int32): "int"}


@functools.lru_cache(maxsize=None)
def elementwise(kind):
    in_params, out_params, operation, name = ELEMENTWISE[kind]
    return cupy().ElementwiseKernel(in_params, out_params, operation, name,
                                    preamble=ELEMENTWISE_PREAMBLE)


@functools.lru_cache(maxsize=None)
def reduction(kind):
    in_params, out_params, map_expr, reduce_expr, post_map, identity, name = REDUCTIONS[kind]
    return cupy().ReductionKernel(in_params, out_params, map_expr, reduce_expr, post_map,
                                  identity, name)


@functools.lru_cache(maxsize=None)
def raw_kernel(name_expression):
    """The compiled template instance `name_expression` (one module each, built on first use;
    a fit compiles only the few instances it launches)."""
    module = cupy().RawModule(code=RAW_SOURCE, options=NVRTC_OPTIONS,
                              name_expressions=[name_expression])
    return module.get_function(name_expression)


@functools.lru_cache(maxsize=None)
def _multiprocessors():
    cp = cupy()
    rt = cp.cuda.runtime
    return int(rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount,
                                     cp.cuda.Device().id))


def _grid(work_items, per_block, blocks_per_sm=4):
    """Blocks for a grid-stride kernel: enough for the work, at most a few waves' worth."""
    return int(max(1, min(-(-work_items // per_block), _multiprocessors() * blocks_per_sm)))


# -- nearest center ---------------------------------------------------------------------------
def points_per_thread(d, itemsize):
    """Points each thread of nearest_small holds (registers: P * (d + 2) values)."""
    return 4 if itemsize == 4 else 2


def ops_stride(d, itemsize):
    """Row stride of the centers' operands: d + 1 rounded up to 16 bytes (as the source)."""
    v = 16 // itemsize
    return -(-(d + 1) // v) * v


def nearest_kernel_name(d, dtype):
    """The template instance that serves d features of `dtype`: nearest_small for d <= 4,
    nearest_tiled with the smallest register width that holds the point, else nearest_mem."""
    dt = np.dtype(dtype)
    t = _CTYPE[dt]
    if d <= SMALL_D_MAX:
        return f"nearest_small<{t}, {d}, {points_per_thread(d, dt.itemsize)}>"
    for width in REGISTER_WIDTHS:
        if d <= width and width * dt.itemsize <= MAX_REGISTER_BYTES:
            return f"nearest_tiled<{t}, {width}>"
    return f"nearest_mem<{t}>"


def center_operands(centers, dtype):
    """The centers' operands as the numpy backend computes them, on the host: rows of
    (-2 c_0, ..., -2 c_{d-1}, ||c||^2, 0 padding), stride `ops_stride`, in `dtype`.
    ||c||^2 is np.einsum's, the numpy backend's own call (its SIMD order is the CPU's)."""
    c = np.ascontiguousarray(to_host(centers), dtype=dtype)
    k, d = c.shape
    ops = np.zeros((k, ops_stride(d, c.dtype.itemsize)), dtype=c.dtype)
    np.multiply(c, -2, out=ops[:, :d])
    np.einsum("ij,ij->i", c, c, out=ops[:, d])
    return ops


def center_norms(centers, dtype):
    """||c||^2 per center as the numpy backend computes it (np.einsum, on the host)."""
    c = np.ascontiguousarray(to_host(centers), dtype=dtype)
    return np.einsum("ij,ij->i", c, c)


def to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def nearest_center(X, ops, k, labels, min_sq):
    """labels[i], min_sq[i] = argmin_j / min_j of numpy's ||c_j||^2 - 2 x_i.c_j (+ ||x_i||^2,
    clamped at 0) with `ops` = center_operands(C) on the device; X C-contiguous."""
    n, d = X.shape
    if n == 0:
        return
    name = nearest_kernel_name(d, X.dtype)
    fn = raw_kernel(name)
    if name.startswith("nearest_small"):
        per_block = BLOCK * points_per_thread(d, X.dtype.itemsize)
        args = (X, ops, np.int64(n), np.int32(k), labels, min_sq)
    else:
        per_block = BLOCK
        args = (X, ops, np.int64(n), np.int32(k), np.int32(d), labels, min_sq)
    fn((_grid(n, per_block),), (BLOCK,), args)


# -- per-cluster sums -------------------------------------------------------------------------
_SMEM_OPTED = {}


def cluster_sums(X, labels, sample_weight, sums, weights):
    """sums[l] += w * x and weights[l] += w for every point (sums, weights float64, zeroed or
    holding earlier chunks' sums): shared-memory privatised when k * (d + 1) doubles fit."""
    n, d = X.shape
    k = weights.shape[0]
    if n == 0:
        return
    smem = k * (d + 1) * 8
    if smem > SUMS_SHARED_MAX:
        elementwise("cluster_sums")(X, labels, sample_weight, d, sums, weights)
        return
    fn = raw_kernel(f"cluster_sums_shared<{_CTYPE[X.dtype]}>")
    if smem > 48 * 1024 and _SMEM_OPTED.get(id(fn), 0) < smem:
        fn.max_dynamic_shared_size_bytes = int(smem)
        _SMEM_OPTED[id(fn)] = smem
    # a block's flush costs k * (d + 1) atomics: a few blocks per SM, each over many points
    blocks_per_sm = 2 if smem > 32 * 1024 else 4
    fn((_grid(n, BLOCK * 8, blocks_per_sm),), (BLOCK,),
       (X, labels, sample_weight, np.int64(n), np.int32(d), np.int32(k), sums, weights),
       shared_mem=int(smem))


def labelled_sq_dist(X, C, labels, out):
    """out[i] = ||X[i] - C[labels[i]]||^2 by differences (X, C C-contiguous, same dtype)."""
    elementwise("labelled_sq_dist")(X, cupy().ascontiguousarray(C), labels, X.shape[1], out)
    return out


def row_argmin_shifted(dist, c_norm, col0, first, run_min, labels):
    """Merge argmin_j (dist[r, j] + c_norm[j]) + col0 into labels / run_min, row by row."""
    rows, width = dist.shape
    grid = max(1, min(-(-rows // (ROW_ARGMIN_BLOCK // 32)), ROW_ARGMIN_MAX_GRID))
    raw_kernel(f"row_argmin_shifted<{_CTYPE[dist.dtype]}>")(
        (grid,), (ROW_ARGMIN_BLOCK,),
        (dist, c_norm, np.int64(rows), np.int32(width), np.int64(col0), np.int32(bool(first)),
         run_min, labels))


def label_store_dtype(k):
    """The smallest unsigned (or int32) dtype that holds labels 0..k-1."""
    if k <= 1 << 8:
        return np.dtype(np.uint8)
    if k <= 1 << 16:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def update_label_store(labels, store, changed):
    """changed += #(store != labels); store[:] = labels (labels int64, same length)."""
    m = labels.shape[0]
    if m == 0:
        return
    raw_kernel(f"update_label_store<{_STORE_CTYPE[store.dtype]}>")(
        (_grid(m, BLOCK * 8),), (BLOCK,), (labels, store, np.int64(m), changed))


def all_raw_kernel_names():
    """Every template instance the backends can launch (for the compile check)."""
    names = []
    for dt in _CTYPE:
        names += sorted({nearest_kernel_name(d, dt) for d in range(1, 300)})
        names += [f"cluster_sums_shared<{_CTYPE[dt]}>", f"row_argmin_shifted<{_CTYPE[dt]}>"]
    names += [f"update_label_store<{t}>" for t in _STORE_CTYPE.values()]
    return names


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
