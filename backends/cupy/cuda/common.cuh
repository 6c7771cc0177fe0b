// Shared helpers of every CUDA source of the CuPy backends (kmeans_xp_backends.cupy).
//
// The host reads each .cu file and inlines the headers it includes (kmeans_xp_backends.cupy
// .compile), so CuPy's kernel cache key covers this header too; nvcc compiles the same files
// with -I pointing here (tests/test_cuda_compile.py). NVRTC needs no system header.
//
// Numerics: every rounding is explicit (add_rn, mul_rn, fma_rn: NVRTC and nvcc may neither
// contract nor reassociate intrinsics), so distances round where numpy's BLAS and einsum
// round and the GPU gives the numpy backend's partition from the same centers. Reductions
// across blocks are fixed-order trees over per-block partials; per-cluster sums are either
// float64 atomics (cupy-kernels, cupy-chunked) or 64-bit fixed point (cupy-fused, exact and
// order-independent). A weight array may be null: unit weights.
#ifndef KMEANS_XP_COMMON_CUH
#define KMEANS_XP_COMMON_CUH

#define FULL_MASK 0xffffffffu

typedef long long i64;
typedef unsigned long long u64;

// threads of the point-parallel kernels; the host reads the same number (common.BLOCK)
constexpr int BLOCK = 256;
constexpr int WARPS = BLOCK / 32;

// A kernel's dynamic shared memory (the CPU emulator of the tests defines its own).
#ifndef KMEANS_DYNAMIC_SMEM
#define KMEANS_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]
#endif

// ---------------------------------------------------------------------------------------------
// IEEE single-rounding operations, overloaded on float and double
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ __forceinline__ float to_t(double v, float) { return __double2float_rn(v); }
__device__ __forceinline__ double to_t(double v, double) { return v; }

template <typename T> __device__ __forceinline__ T pos_inf();
template <> __device__ __forceinline__ float pos_inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double pos_inf<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

#include "formats.cuh"

// Weight of point i; W null means unit weights.
template <typename T>
__device__ __forceinline__ T weight_at(const T* __restrict__ W, i64 i) {
    return W ? W[i] : (T)1;
}

// ---------------------------------------------------------------------------------------------
// 16-byte vectors
// ---------------------------------------------------------------------------------------------
// values of T in one 16-byte vector
template <typename T> __host__ __device__ constexpr int vec_len() { return 16 / (int)sizeof(T); }

// Row stride of the centers' operands (-2 c_0 .. -2 c_{d-1}, ||c||^2, zero padding): d + 1
// rounded up to a 16-byte vector (the host's ops_stride is the same formula).
template <typename T> __host__ __device__ constexpr int ops_stride(int d) {
    return (d + 1 + vec_len<T>() - 1) / vec_len<T>() * vec_len<T>();
}

// N consecutive values from src (16-byte aligned) into dst, in 16-byte loads.
template <typename T, int N>
__device__ __forceinline__ void lds_vec(const T* __restrict__ src, T* dst) {
    if constexpr (sizeof(T) == 4) {
        static_assert(N % 4 == 0, "float operands come in float4");
#pragma unroll
        for (int v = 0; v < N / 4; ++v) {
            const float4 q = reinterpret_cast<const float4*>(src)[v];
            dst[4 * v] = q.x; dst[4 * v + 1] = q.y; dst[4 * v + 2] = q.z; dst[4 * v + 3] = q.w;
        }
    } else {
        static_assert(N % 2 == 0, "double operands come in double2");
#pragma unroll
        for (int v = 0; v < N / 2; ++v) {
            const double2 q = reinterpret_cast<const double2*>(src)[v];
            dst[2 * v] = q.x; dst[2 * v + 1] = q.y;
        }
    }
}

// One 16-byte store of V values (dst 16-byte aligned).
template <typename T>
__device__ __forceinline__ void sts_vec(T* dst, const T (&src)[16 / sizeof(T)]) {
    if constexpr (sizeof(T) == 4) {
        float4 q;
        q.x = src[0]; q.y = src[1]; q.z = src[2]; q.w = src[3];
        *reinterpret_cast<float4*>(dst) = q;
    } else {
        double2 q;
        q.x = src[0]; q.y = src[1];
        *reinterpret_cast<double2*>(dst) = q;
    }
}

// V consecutive values from p (16-byte aligned when VEC) into out; `count` of them are valid
// (the rest read as 0). With VEC, count is 0 or V.
template <typename T, bool VEC>
__device__ __forceinline__ void ldg_vec(const T* __restrict__ p, int count,
                                        T (&out)[16 / sizeof(T)]) {
    constexpr int V = 16 / sizeof(T);
    if constexpr (VEC) {
        if (count > 0) {
            lds_vec<T, V>(p, out);  // the same 16-byte load, from global memory
        } else {
#pragma unroll
            for (int v = 0; v < V; ++v) out[v] = (T)0;
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = v < count ? p[v] : (T)0;
    }
}

// ---------------------------------------------------------------------------------------------
// the tiled nearest-center skeleton (small d known at compile time)
// ---------------------------------------------------------------------------------------------
// P points per thread, D features each in registers, against k centers whose operands (rows
// of S = ops_stride(D) values: -2c, ||c||^2, padding) stream through the shared `tile` in
// tiles of tc centers (loaded once by the caller when all k fit: `resident`). Per point the
// first minimum of fma-chain(x_j * -2c_j, j = 0..D-1, from 0) + ||c||^2: the rounding
// OpenBLAS's GEMM gives numpy's `X @ (-2 C).T + ||c||^2`; ties go to the lower index.
// Every thread of the block must call it (it synchronises when the centers are tiled).
//
// G > 1 (a compare and two selects per pair are three ALU-pipe instructions, the bound at
// d <= 16): per pair only the group's minimum (FMNMX), per group a compare and two selects,
// then per point the first center of its best group whose distance, recomputed with the same
// intrinsics, equals the minimum: the sequential rule's label (the best group is the first
// holding the minimum). G = 1 is the per-center loop itself.
constexpr int NEAREST_GROUP = 8;

template <typename T, int D>
__device__ __forceinline__ T center_distance(const T (&x)[D], const T (&op)[ops_stride<T>(D)]) {
    T acc = (T)0;
#pragma unroll
    for (int j = 0; j < D; ++j) acc = fma_rn(x[j], op[j], acc);
    return add_rn(acc, op[D]);
}

__device__ __forceinline__ float min_of(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double min_of(double a, double b) { return fmin(a, b); }

template <typename T, int D, int P, int G = NEAREST_GROUP>
__device__ __forceinline__ void nearest_in_tiles(const T (&x)[P][D], const T* __restrict__ ops,
                                                 int k, int tc, bool resident, T* tile,
                                                 T (&best)[P], int (&bidx)[P]) {
    constexpr int S = ops_stride<T>(D);
    // a whole group unrolled while the points' and one center's registers stay small; wider
    // rows (float64, larger d) would spill with every center of the group loaded ahead
    constexpr int GROUP_UNROLL = P * D * (int)sizeof(T) <= 64 ? G : 2;
#pragma unroll
    for (int p = 0; p < P; ++p) {
        best[p] = pos_inf<T>();
        bidx[p] = 0;  // with G > 1: the best group's first center until the search below
    }
    for (int c0 = 0; c0 < k; c0 += tc) {
        const int nc = min(tc, k - c0);
        if (!resident) {
            __syncthreads();
            for (int e = threadIdx.x; e < nc * S; e += BLOCK) tile[e] = ops[(i64)c0 * S + e];
            __syncthreads();
        }
        if constexpr (G == 1) {
#pragma unroll 2
            for (int c = 0; c < nc; ++c) {
                T op[S];
                lds_vec<T, S>(tile + c * S, op);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    const T dist = center_distance<T, D>(x[p], op);
                    if (dist < best[p]) {  // strict: the first of equal centers wins
                        best[p] = dist;
                        bidx[p] = c0 + c;
                    }
                }
            }
        } else {
            for (int g0 = 0; g0 < nc; g0 += G) {
                T m[P];
#pragma unroll
                for (int p = 0; p < P; ++p) m[p] = pos_inf<T>();
                if (g0 + G <= nc) {
#pragma unroll GROUP_UNROLL
                    for (int c = 0; c < G; ++c) {
                        T op[S];
                        lds_vec<T, S>(tile + (g0 + c) * S, op);
#pragma unroll
                        for (int p = 0; p < P; ++p)
                            m[p] = min_of(m[p], center_distance<T, D>(x[p], op));
                    }
                } else {
                    for (int c = 0; c < nc - g0; ++c) {
                        T op[S];
                        lds_vec<T, S>(tile + (g0 + c) * S, op);
#pragma unroll
                        for (int p = 0; p < P; ++p)
                            m[p] = min_of(m[p], center_distance<T, D>(x[p], op));
                    }
                }
#pragma unroll
                for (int p = 0; p < P; ++p)
                    if (m[p] < best[p]) {
                        best[p] = m[p];
                        bidx[p] = c0 + g0;
                    }
            }
        }
    }
    if constexpr (G > 1) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            // no minimum below +inf (every distance inf or NaN): center 0, as the sequential
            // rule; else the first center of the group with the minimum's bits
            const T b = best[p];
            const int g = bidx[p];
            int c = 0;
            T dist = b;
            if (b < pos_inf<T>()) {
                const T* row = resident ? tile + g * S : ops + (i64)g * S;
                do {  // == also for -0 and +0, as the sequential strict <
                    T op[S];
                    lds_vec<T, S>(row + c * S, op);
                    dist = center_distance<T, D>(x[p], op);
                } while (dist != b && ++c < G && g + c < k);
            }
            const bool hit = b < pos_inf<T>() && dist == b;  // always, given the same operations
            bidx[p] = hit ? g + c : (b < pos_inf<T>() ? g : 0);
            best[p] = hit ? dist : b;
        }
    }
}

// ||x||^2 as a sequential sum of rounded squares (the kernels' own, for the reported distance)
template <typename T, int D>
__device__ __forceinline__ T sq_norm_seq(const T (&x)[D]) {
    T s = (T)0;
#pragma unroll
    for (int j = 0; j < D; ++j) s = add_rn(s, mul_rn(x[j], x[j]));
    return s;
}

// numpy's reported distance: the GEMM minimum plus ||x||^2, clamped at 0.
template <typename T>
__device__ __forceinline__ T with_point_norm(T best, T xnorm) {
    const T m = add_rn(best, xnorm);
    return m < (T)0 ? (T)0 : m;
}

// ---------------------------------------------------------------------------------------------
// fixed-order block reductions
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ double block_sum(double v, double* red /* WARPS doubles, shared */) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += red[w];
    __syncthreads();
    return total;  // valid in thread 0
}

__device__ __forceinline__ u64 block_count(unsigned v, u64* red /* WARPS words, shared */) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    u64 total = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += red[w];
    __syncthreads();
    return total;
}

// Sum of partials[0..count) in a fixed order by one block; result in thread 0.
__device__ __forceinline__ double block_sum_partials(const double* partials, int count,
                                                     double* red) {
    double v = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) v += __ldcg(partials + i);
    return block_sum(v, red);
}

// True in every thread of the block that finishes last among the grid's blocks (the classic
// threadfence reduction). `done` is reset for the next launch by that block.
__device__ __forceinline__ bool last_block_done(unsigned* done) {
    __shared__ bool am_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) am_last = (atomicAdd(done, 1u) == gridDim.x - 1);
    __syncthreads();
    if (am_last && threadIdx.x == 0) *done = 0u;
    return am_last;
}

// ---------------------------------------------------------------------------------------------
// fixed point (cupy-fused's deterministic per-cluster sums)
// ---------------------------------------------------------------------------------------------
// v * scale = hi + f, |f| <= 1/2, lo = round(f * 2^L). scale and 2^L are powers of two, so
// every step but the final rounding of lo is exact; two words keep about 90 bits.
__device__ __forceinline__ void to_fixed(double v, double scale, double two_l, i64& hi, i64& lo) {
    const double s = v * scale;
    hi = __double2ll_rn(s);
    const double f = s - __ll2double_rn(hi);
    lo = __double2ll_rn(f * two_l);
}

__device__ __forceinline__ void add_pair(u64* dst, i64 hi, i64 lo) {
    if (hi) atomicAdd(dst, (u64)hi);
    if (lo) atomicAdd(dst + 1, (u64)lo);
}

// Add (hi, lo) of every lane to dst (a pair of words). When the whole warp adds to the same
// cluster (few clusters, sorted data) the warp sums first and one lane adds: no contention.
// `same` must be warp-uniform; integer sums make both paths give the same bits.
__device__ __forceinline__ void warp_add_pair(u64* dst, i64 hi, i64 lo, bool same, bool active) {
    if (same) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            hi += __shfl_xor_sync(FULL_MASK, hi, o);
            lo += __shfl_xor_sync(FULL_MASK, lo, o);
        }
        if ((threadIdx.x & 31) == 0) add_pair(dst, hi, lo);
    } else if (active) {
        add_pair(dst, hi, lo);
    }
}

// The whole warp (all 32 lanes valid) has one label.
__device__ __forceinline__ bool warp_same_label(int label, bool valid) {
    const int first = __shfl_sync(FULL_MASK, label, 0);
    return __all_sync(FULL_MASK, valid && label == first);
}

// ---------------------------------------------------------------------------------------------
// the per-point epilogue of cupy-fused's assignment kernels
// ---------------------------------------------------------------------------------------------
// Label, min_sq = max(best + ||x||^2, 0) (when min_sq is given), the labels-changed count
// against labels_old (when given) and the inertia term w * min_sq.
template <typename T>
__device__ __forceinline__ void store_point(i64 i, int label, T best, T xnorm, T w,
                                            const int* __restrict__ labels_old,
                                            int* __restrict__ labels, T* __restrict__ min_sq,
                                            unsigned& changed, double& inertia) {
    const T m = with_point_norm(best, xnorm);
    if (labels_old) changed += (labels_old[i] != label);
    labels[i] = label;
    if (min_sq) min_sq[i] = m;
    inertia += (double)m * (double)w;
}

// A block's totals: its inertia partial, and its changed labels added to *counter.
__device__ __forceinline__ void store_block_totals(double inertia, unsigned changed,
                                                   double* red, u64* redc,
                                                   double* __restrict__ block_inertia,
                                                   u64* __restrict__ counter) {
    const double tot = block_sum(inertia, red);
    const u64 ch = block_count(changed, redc);
    if (threadIdx.x == 0) {   // (a batch: problem blockIdx.y's partials and counter)
        block_inertia[(i64)blockIdx.y * gridDim.x + blockIdx.x] = tot;
        if (ch) atomicAdd(counter + blockIdx.y, ch);
    }
}

// A batch of gridDim.y problems in one launch (cupy-fused's batch_lloyd_iter): problem p =
// blockIdx.y owns rows p * n .. p * n + n - 1 of X, W, labels_old, labels and min_sq (a
// kernel indexes them by global row, bounded by problem_end), its own centers' operands
// (ops_b values of ops apart) and ||c||^2 (kpad apart), and its own per-block partials and
// changed counter (store_block_totals). A single problem (gridDim.y = 1) is problem 0. Only
// the operands' pointers move: the row pointers stay kernel parameters, not registers.
template <typename T, typename O>
__device__ __forceinline__ void to_problem(i64 ops_b, int kpad, const O* __restrict__& ops,
                                           const T* __restrict__& cnorm) {
    ops += (i64)blockIdx.y * ops_b;
    cnorm += (i64)blockIdx.y * kpad;
}

// (problem blockIdx.y's first row, one past its last row)
__device__ __forceinline__ i64 problem_row0(int n) { return (i64)blockIdx.y * n; }
__device__ __forceinline__ i64 problem_end(int n) { return (i64)blockIdx.y * n + n; }

// The epilogue of the GEMM-like assignment kernels (SIMT and TF32): per row of the block, the
// lexicographic (dist, index) minimum over its NC candidate cells (disjoint column sets), then
// the point's label, distance, inertia and changed count, and the block's totals. ||x||^2 is
// summed in feature order (products rounded, no FMA), from X in 16-byte loads where rows allow,
// eight at a time (one thread per row: scalar loads left each thread waiting on memory once
// per 16 features); xn_own >= 0 is that sum for row threadIdx.x, made by the caller. Rows
// are global (a batch's problems one after another): n is one past the problem's last.
// XT: X's storage (T, or xhalf / xbf16: half X, its values widened exactly).
template <typename T, int BM, int RS, int NC = 16, typename XT = T>
__device__ __forceinline__ void finish_rows(const T* rbest, const int* ridx, i64 row0, i64 n,
                                            int d, const XT* __restrict__ X,
                                            const T* __restrict__ W,
                                            const int* __restrict__ labels_old,
                                            int* __restrict__ labels, T* __restrict__ min_sq,
                                            double* red, u64* redc,
                                            double* __restrict__ block_inertia,
                                            u64* __restrict__ counter, T xn_own = (T)-1) {
    double inertia = 0.0;
    unsigned changed = 0;
    for (int r = threadIdx.x; r < BM; r += 256) {
        const i64 gx = row0 + r;
        if (gx >= n) continue;
        T b = rbest[r * RS];
        int bi = ridx[r * RS];
        for (int t = 1; t < NC; ++t) {
            const T v = rbest[r * RS + t];
            const int vi = ridx[r * RS + t];
            if (v < b || (v == b && vi < bi)) { b = v; bi = vi; }
        }
        T xn = (T)0;
        const XT* const xr = X + gx * d;
        int j = (xn_own >= (T)0 && r == (int)threadIdx.x) ? d : 0;  // (the caller's sum)
        if (j) xn = xn_own;
        if constexpr (sizeof(XT) == 2) {   // half X: 16 values in two 16-byte loads
            if ((d & 7) == 0 && (reinterpret_cast<unsigned long long>(X) & 15) == 0) {
                const uint4* const xv = reinterpret_cast<const uint4*>(xr);
                for (; j + 16 <= d; j += 16) {
                    const uint4 a = __ldg(xv + j / 8), b = __ldg(xv + j / 8 + 1);
                    const unsigned w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                    for (int u = 0; u < 8; ++u) {
                        const T lo = (T)half_value<XT>(w[u] & 0xffffu),
                                hi = (T)half_value<XT>(w[u] >> 16);
                        xn = add_rn(xn, mul_rn(lo, lo));
                        xn = add_rn(xn, mul_rn(hi, hi));
                    }
                }
            }
        } else if constexpr (sizeof(T) == 4) {
            if ((d & 3) == 0 && (reinterpret_cast<unsigned long long>(X) & 15) == 0) {
                const float4* const xv4 = reinterpret_cast<const float4*>(xr);
                for (; j + 32 <= d; j += 32) {
                    float4 v[8];
#pragma unroll
                    for (int u = 0; u < 8; ++u) v[u] = __ldg(xv4 + j / 4 + u);
#pragma unroll
                    for (int u = 0; u < 8; ++u) {
                        xn = add_rn(xn, mul_rn(v[u].x, v[u].x));
                        xn = add_rn(xn, mul_rn(v[u].y, v[u].y));
                        xn = add_rn(xn, mul_rn(v[u].z, v[u].z));
                        xn = add_rn(xn, mul_rn(v[u].w, v[u].w));
                    }
                }
            }
        }
        for (; j < d; ++j) {
            const T xv = xval<T>(xr + j);
            xn = add_rn(xn, mul_rn(xv, xv));
        }
        store_point<T>(gx, bi, b, xn, weight_at(W, gx), labels_old, labels, min_sq, changed,
                       inertia);
    }
    store_block_totals(inertia, changed, red, redc, block_inertia, counter);
}

#endif  // KMEANS_XP_COMMON_CUH
