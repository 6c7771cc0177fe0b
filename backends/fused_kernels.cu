// CUDA kernels of the `cupy-fused` backend (kmeans_xp_backends.cupy_fused).
//
// Compiled at run time by NVRTC through cupy.RawModule, one module per (dtype, small d), with
// the template instances named through `name_expressions`; tests/test_cuda_compile.py compiles
// the same instances with nvcc. No headers: NVRTC has none by default.
//
// Numerics, chosen so the GPU gives the numpy backend's partition from the same centers:
//  * distance = fma-chain(x_j * (-2 c_j), j = 0..d-1, from 0) + ||c||^2, the exact rounding
//    OpenBLAS's sgemm/dgemm kernels produce for numpy's `X @ (-2 C).T + ||c||^2`;
//    ||c||^2 and ||x||^2 are sequential non-fused sums (what np.einsum does for d <= 3);
//    argmin keeps the first minimum, as numpy does.
//  * per-cluster sums use 64-bit fixed point (a hi word and a lo word per value, scaled per
//    feature by a power of two chosen from max|x| and the total weight so nothing overflows).
//    Integer addition is associative, so atomics in any order give bit-identical sums run to
//    run, in shared and in global memory alike, and the two words keep about 90 bits: the sum
//    is as exact as a float64 sum of float64 terms (better than numpy's sequential one).
//  * every other reduction (inertia, center shift) is a fixed-order tree over per-block
//    partials: deterministic for a fixed grid.
// The host compiles with --fmad=false so that no a*b+c written below is contracted: every
// rounding happens where numpy rounds.

#define FULL_MASK 0xffffffffu

typedef long long i64;
typedef unsigned long long u64;

// threads of the point-parallel kernels; the host code reads the same number
constexpr int BLOCK = 256;
constexpr int WARPS = BLOCK / 32;

// ---------------------------------------------------------------------------------------------
// IEEE single-rounding helpers, overloaded on float and double
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

// Row stride of the packed small-d center operands: d + 1 values (-2c, ||c||^2) rounded up to
// one 16-byte vector, so a center is read from shared memory in (d + 1) / 4 loads.
template <typename T, int D> __host__ __device__ constexpr int ops_stride() {
    return ((D + 1) * (int)sizeof(T) + 15) / 16 * 16 / (int)sizeof(T);
}

// ---------------------------------------------------------------------------------------------
// numpy's arithmetic, reproduced where the driver's result depends on it
// ---------------------------------------------------------------------------------------------

// ||x - c||^2 exactly as numpy's `np.sum((x - c) ** 2, axis=1)` rounds it: the difference and
// the square in T, then numpy's pairwise summation (8 accumulators for 8 <= n <= 128, halving
// above) in T. Used for relocation (farthest points) and the final inertia.
template <typename T>
__device__ T sq_diff(const T* __restrict__ x, const T* __restrict__ c, int j) {
    T df = sub_rn(x[j], c[j]);
    return mul_rn(df, df);
}

template <typename T>
__device__ T pairwise_sq_dist(const T* __restrict__ x, const T* __restrict__ c, int n) {
    if (n < 8) {
        T res = (T)0;
        for (int i = 0; i < n; ++i) res = add_rn(res, sq_diff(x, c, i));
        return res;
    }
    if (n <= 128) {
        T r[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) r[j] = sq_diff(x, c, j);
        int i = 8;
        for (; i < n - (n % 8); i += 8) {
#pragma unroll
            for (int j = 0; j < 8; ++j) r[j] = add_rn(r[j], sq_diff(x, c, i + j));
        }
        T res = add_rn(add_rn(add_rn(r[0], r[1]), add_rn(r[2], r[3])),
                       add_rn(add_rn(r[4], r[5]), add_rn(r[6], r[7])));
        for (; i < n; ++i) res = add_rn(res, sq_diff(x, c, i));
        return res;
    }
    int n2 = n / 2;
    n2 -= n2 % 8;
    return add_rn(pairwise_sq_dist(x, c, n2), pairwise_sq_dist(x + n2, c + n2, n - n2));
}

// The same sum computed by a group of 8 consecutive lanes of a warp (lane8 = lane % 8), so that
// a warp reads four rows at a time in 32-byte pieces instead of 32 rows element by element.
// Lane l keeps numpy's accumulator r[l]; the combination ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))
// is three xor-shuffles (addition commutes, so every lane ends with the same bits); the tail
// and the n < 8 case are summed by every lane alike. All 8 lanes return the value.
template <typename T>
__device__ T pairwise_sq_dist_g8(const T* __restrict__ x, const T* __restrict__ c, int n,
                                 int lane8) {
    if (n < 8) {
        T res = (T)0;
        for (int i = 0; i < n; ++i) res = add_rn(res, sq_diff(x, c, i));
        return res;
    }
    if (n <= 128) {
        const int body = n - (n % 8);
        T r = sq_diff(x, c, lane8);
        for (int i = 8; i < body; i += 8) r = add_rn(r, sq_diff(x, c, i + lane8));
        r = add_rn(r, __shfl_xor_sync(FULL_MASK, r, 1));
        r = add_rn(r, __shfl_xor_sync(FULL_MASK, r, 2));
        r = add_rn(r, __shfl_xor_sync(FULL_MASK, r, 4));
        for (int i = body; i < n; ++i) r = add_rn(r, sq_diff(x, c, i));
        return r;
    }
    int n2 = n / 2;
    n2 -= n2 % 8;
    return add_rn(pairwise_sq_dist_g8(x, c, n2, lane8),
                  pairwise_sq_dist_g8(x + n2, c + n2, n - n2, lane8));
}

// ||c||^2 in the order np.einsum("ij,ij->i", C, C) sums it (numpy's SIMD
// sum_of_products_contig_contig_outstride0_two), so that the GEMM expansion
// ||c||^2 - 2 x.c rounds exactly as the numpy backend's and near-ties break alike.
// mode (detected on the host from numpy itself, see cupy_fused._einsum_norm_mode):
//   0: plain sequential sum (numpy without SIMD);
//   else lanes = mode & 0xff (vector width / itemsize), fused = bit 8 (npyv_muladd is an FMA),
//   horizontal sum = bits 9-10: 0 adjacent pairs ((a0+a1)+(a2+a3))..., 1 halves folded
//   (a_l + a_{l+w/2}) down to one, 2 halves folded down to a 16-byte vector, then pairs.
// The vector loop: per group of 4 vectors acc = a0*a0 + (a1*a1 + (a2*a2 + (a3*a3 + acc)))
// lane-wise, then the rest one (zero-padded) vector at a time, then the horizontal sum.
template <typename T>
__device__ __forceinline__ T norm_muladd(T v, T acc, bool fused) {
    return fused ? fma_rn(v, v, acc) : add_rn(mul_rn(v, v), acc);
}

template <typename T>
__device__ T einsum_sq_norm(const T* __restrict__ c, int d, int mode) {
    if (mode == 0) {
        T s = (T)0;
        for (int j = 0; j < d; ++j) s = add_rn(s, mul_rn(c[j], c[j]));
        return s;
    }
    const int L = mode & 0xff;
    const bool fused = (mode >> 8) & 1;
    const int hmode = (mode >> 9) & 3;
    T acc[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) acc[l] = (T)0;
    int p = 0, cnt = d;
    for (; cnt >= 4 * L; cnt -= 4 * L, p += 4 * L) {
        for (int l = 0; l < L; ++l) {
            T t = norm_muladd(c[p + 3 * L + l], acc[l], fused);
            t = norm_muladd(c[p + 2 * L + l], t, fused);
            t = norm_muladd(c[p + L + l], t, fused);
            acc[l] = norm_muladd(c[p + l], t, fused);
        }
    }
    for (; cnt > 0; cnt -= L, p += L) {
        for (int l = 0; l < L; ++l) {
            const T v = l < cnt ? c[p + l] : (T)0;
            acc[l] = norm_muladd(v, acc[l], fused);
        }
    }
    const int vec16 = 16 / (int)sizeof(T);  // lanes of a 16-byte vector
    for (int w = L; w > 1; w >>= 1) {
        const bool fold = hmode == 1 || (hmode == 2 && w > vec16);
        for (int l = 0; l < w / 2; ++l)
            acc[l] = fold ? add_rn(acc[l], acc[l + w / 2]) : add_rn(acc[2 * l], acc[2 * l + 1]);
    }
    return add_rn((T)0, acc[0]);
}

// ---------------------------------------------------------------------------------------------
// fixed-point accumulation (deterministic per-cluster sums)
// ---------------------------------------------------------------------------------------------

// v * scale = hi + f, |f| <= 1/2, lo = round(f * 2^L). scale and 2^L are powers of two, so
// every step but the final rounding of lo is exact.
__device__ __forceinline__ void to_fixed(double v, double scale, double two_l, i64& hi, i64& lo) {
    double s = v * scale;
    hi = __double2ll_rn(s);
    double f = s - __ll2double_rn(hi);
    lo = __double2ll_rn(f * two_l);
}

__device__ __forceinline__ void add_pair(u64* dst, i64 hi, i64 lo) {
    if (hi) atomicAdd(dst, (u64)hi);
    if (lo) atomicAdd(dst + 1, (u64)lo);
}

// Add (hi, lo) of every lane to dst (a pair of words). When the whole warp adds to the same
// cluster (few clusters, or sorted data) the warp sums first and one lane adds: no contention.
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
    int first = __shfl_sync(FULL_MASK, label, 0);
    return __all_sync(FULL_MASK, valid && label == first);
}

// ---------------------------------------------------------------------------------------------
// fixed-order block reductions
// ---------------------------------------------------------------------------------------------
__device__ double block_sum(double v, double* red /* WARPS doubles of shared memory */) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += red[w];
    __syncthreads();
    return total;  // valid in thread 0
}

__device__ u64 block_count(unsigned v, u64* red /* WARPS words */) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    u64 total = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += red[w];
    __syncthreads();
    return total;
}

// Sum of partials[0..count) in a fixed order by one block; result in thread 0.
__device__ double block_sum_partials(const double* partials, int count, double* red) {
    double v = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) v += __ldcg(partials + i);
    return block_sum(v, red);
}

// True in every thread of the block that finishes last among the grid's blocks (the classic
// threadfence reduction). `done` is reset for the next launch by that block.
__device__ bool last_block_done(unsigned* done) {
    __shared__ bool am_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) am_last = (atomicAdd(done, 1u) == gridDim.x - 1);
    __syncthreads();
    if (am_last && threadIdx.x == 0) *done = 0u;
    return am_last;
}

// Per point after its argmin: label, min_sq = max(best + ||x||^2, 0) as numpy's assign does,
// the labels-changed count and the inertia term.
template <typename T>
__device__ __forceinline__ void store_point(i64 i, int label, T best, T xnorm, T w, int* labels,
                                            T* min_sq, int want_min, int count_changed,
                                            unsigned& changed, double& inertia) {
    T m = add_rn(best, xnorm);
    if (m < (T)0) m = (T)0;
    if (count_changed) changed += (labels[i] != label);
    labels[i] = label;
    if (want_min) min_sq[i] = m;
    inertia += (double)m * (double)w;
}

// ---------------------------------------------------------------------------------------------
// (a) small d: distance + argmin with d known at compile time, P points per thread, centers
//     streamed through shared memory in tiles of `tc`; with FUSE the per-cluster sums are
//     privatised in shared memory (fixed point) in the same pass and flushed once per block.
// ---------------------------------------------------------------------------------------------
template <typename T, int S>
__device__ __forceinline__ void load_center(const T* __restrict__ src, T (&op)[S]) {
    if constexpr (sizeof(T) == 4 && S % 4 == 0) {
#pragma unroll
        for (int v = 0; v < S / 4; ++v) {
            float4 q = reinterpret_cast<const float4*>(src)[v];
            op[4 * v] = q.x; op[4 * v + 1] = q.y; op[4 * v + 2] = q.z; op[4 * v + 3] = q.w;
        }
    } else if constexpr (sizeof(T) == 8 && S % 2 == 0) {
#pragma unroll
        for (int v = 0; v < S / 2; ++v) {
            double2 q = reinterpret_cast<const double2*>(src)[v];
            op[2 * v] = q.x; op[2 * v + 1] = q.y;
        }
    } else {
#pragma unroll
        for (int j = 0; j < S; ++j) op[j] = src[j];
    }
}

template <typename T, int D, int P, bool FUSE>
__global__ void __launch_bounds__(BLOCK)
assign_small(const T* __restrict__ X, const T* __restrict__ W, const T* __restrict__ ops,
             int n, int k, int tc, int* __restrict__ labels, T* __restrict__ min_sq,
             int want_min, int count_changed, double* __restrict__ block_inertia,
             u64* __restrict__ counters, u64* __restrict__ acc,
             const double* __restrict__ scale, double two_l) {
    constexpr int S = ops_stride<T, D>();
    extern __shared__ __align__(16) unsigned char smem[];
    // [center tile: tc * S T][FUSE: k*(D+1) pairs of words][FUSE: D+1 scales]
    T* tile = reinterpret_cast<T*>(smem);
    u64* sacc = reinterpret_cast<u64*>(smem + (size_t)tc * S * sizeof(T));
    const int acc_words = FUSE ? k * (D + 1) * 2 : 0;
    double* sscale = reinterpret_cast<double*>(sacc + acc_words);
    __shared__ double red[WARPS];
    __shared__ u64 redc[WARPS];

    if (FUSE) {
        for (int e = threadIdx.x; e < acc_words; e += BLOCK) sacc[e] = 0ull;
        for (int j = threadIdx.x; j <= D; j += BLOCK) sscale[j] = scale[j];
    }
    const bool resident = k <= tc;  // all centers fit: load once, no syncs in the loop
    if (resident)
        for (int e = threadIdx.x; e < k * S; e += BLOCK) tile[e] = ops[e];
    __syncthreads();

    double inertia = 0.0;
    unsigned changed = 0;
    const i64 step = (i64)gridDim.x * BLOCK * P;
    for (i64 base = (i64)blockIdx.x * BLOCK * P; base < n; base += step) {
        T x[P][D], w[P];
        bool valid[P];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            i64 i = base + p * BLOCK + threadIdx.x;
            valid[p] = i < n;
#pragma unroll
            for (int j = 0; j < D; ++j) x[p][j] = valid[p] ? X[i * D + j] : (T)0;
            w[p] = valid[p] ? W[i] : (T)0;
        }
        T best[P];
        int bidx[P];
#pragma unroll
        for (int p = 0; p < P; ++p) { best[p] = pos_inf<T>(); bidx[p] = 0; }

        for (int c0 = 0; c0 < k; c0 += tc) {
            const int nc = min(tc, k - c0);
            if (!resident) {
                __syncthreads();
                for (int e = threadIdx.x; e < nc * S; e += BLOCK) tile[e] = ops[(i64)c0 * S + e];
                __syncthreads();
            }
#pragma unroll 2
            for (int c = 0; c < nc; ++c) {
                T op[S];
                load_center<T, S>(tile + c * S, op);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    T a = mul_rn(x[p][0], op[0]);
#pragma unroll
                    for (int j = 1; j < D; ++j) a = fma_rn(x[p][j], op[j], a);
                    T dist = add_rn(a, op[D]);
                    if (dist < best[p]) { best[p] = dist; bidx[p] = c0 + c; }
                }
            }
        }

#pragma unroll
        for (int p = 0; p < P; ++p) {
            if (!valid[p]) continue;
            T xn = (T)0;
#pragma unroll
            for (int j = 0; j < D; ++j) xn = add_rn(xn, mul_rn(x[p][j], x[p][j]));
            store_point<T>(base + p * BLOCK + threadIdx.x, bidx[p], best[p], xn, w[p], labels,
                           min_sq, want_min, count_changed, changed, inertia);
        }
        if (FUSE) {
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const bool same = warp_same_label(bidx[p], valid[p]);
                const bool active = valid[p] && w[p] != (T)0;
                u64* dst = sacc + (size_t)bidx[p] * (D + 1) * 2;
#pragma unroll
                for (int j = 0; j <= D; ++j) {
                    // numpy: bincount(weights=float64(x) * float64(w)): the product is exact in double
                    double v = j < D ? (double)x[p][j] * (double)w[p] : (double)w[p];
                    i64 hi, lo;
                    to_fixed(v, sscale[j], two_l, hi, lo);
                    warp_add_pair(dst + 2 * j, hi, lo, same, active);
                }
            }
        }
    }

    double tot = block_sum(inertia, red);
    u64 ch = block_count(changed, redc);
    if (threadIdx.x == 0) {
        block_inertia[blockIdx.x] = tot;
        if (count_changed && ch) atomicAdd(counters, ch);
    }
    if (FUSE) {
        __syncthreads();
        for (int e = threadIdx.x; e < acc_words; e += BLOCK)
            if (sacc[e]) atomicAdd(acc + e, sacc[e]);
    }
}

// The epilogue of the GEMM-like assignment kernels (SIMT and TF32): per row of the block, the
// lexicographic (dist, index) minimum over its 16 candidate cells (disjoint column sets), then
// the point's label, distance, inertia and changed count, and the block's totals.
template <typename T, int BM, int RS>
__device__ __forceinline__ void finish_rows(const T* rbest, const int* ridx, i64 row0, int n,
                                            int d, const T* __restrict__ X,
                                            const T* __restrict__ W, int* __restrict__ labels,
                                            T* __restrict__ min_sq, int want_min,
                                            int count_changed, double* red, u64* redc,
                                            double* __restrict__ block_inertia,
                                            u64* __restrict__ counters) {
    const int tid = threadIdx.x;
    double inertia = 0.0;
    unsigned changed = 0;
    for (int r = tid; r < BM; r += 256) {
        const i64 gx = row0 + r;
        if (gx >= n) continue;
        T b = rbest[r * RS];
        int bi = ridx[r * RS];
        for (int t = 1; t < 16; ++t) {
            const T v = rbest[r * RS + t];
            const int vi = ridx[r * RS + t];
            if (v < b || (v == b && vi < bi)) { b = v; bi = vi; }
        }
        T xn = (T)0;
        for (int j = 0; j < d; ++j) {
            const T xv = X[gx * d + j];
            xn = add_rn(xn, mul_rn(xv, xv));
        }
        store_point<T>(gx, bi, b, xn, W[gx], labels, min_sq, want_min, count_changed, changed,
                       inertia);
    }
    double tot = block_sum(inertia, red);
    u64 ch = block_count(changed, redc);
    if (tid == 0) {
        block_inertia[blockIdx.x] = tot;
        if (count_changed && ch) atomicAdd(counters, ch);
    }
}

// ---------------------------------------------------------------------------------------------
// (a) any d: register-blocked SIMT GEMM tile (BM points x BN centers, BK features per step,
//     TM x TN outputs per thread) with the argmin in its epilogue. Accumulators start at 0 and
//     take the features in order, so each distance has the small-d kernel's (and OpenBLAS's)
//     exact rounding. Centers come as -2 C^T (d, kpad) and ||c||^2 (kpad), padded with
//     ||c||^2 = inf so that padding columns never win.
//     Shared tiles are double-buffered: the next K step's global loads are in flight (in
//     registers) while the current one is multiplied, one barrier per K step. With VEC (d a
//     multiple of the 16-byte vector and X 16-byte aligned) every global load is 16 bytes;
//     the shared-memory operand loads are 16 bytes always. The running (best, index) per row
//     and column group lives in shared memory (each cell owned by one thread), which keeps
//     the 8x8 accumulators, operands and prefetch within 128 registers without spilling.
// ---------------------------------------------------------------------------------------------
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
            lds_vec<T, V>(p, out);  // same 16-byte load, from global memory
        } else {
#pragma unroll
            for (int v = 0; v < V; ++v) out[v] = (T)0;
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = v < count ? p[v] : (T)0;
    }
}

template <typename T, int TM, int TN, bool VEC>
__global__ void __launch_bounds__(256, 2)  // two blocks per SM: at most 128 registers
assign_gemm(const T* __restrict__ X, const T* __restrict__ W, const T* __restrict__ m2ct,
            const T* __restrict__ cnorm, int n, int d, int kpad, int* __restrict__ labels,
            T* __restrict__ min_sq, int want_min, int count_changed,
            double* __restrict__ block_inertia, u64* __restrict__ counters) {
    constexpr int BM = 16 * TM, BN = 16 * TN, BK = 8, HM = TM / 2, HN = TN / 2;
    constexpr int V = 16 / sizeof(T);              // values per 16-byte vector
    constexpr int APAD = V;                        // As rows stay 16-byte aligned
    constexpr int A_VECS = BM * BK / V / 256;      // 16-byte pieces per thread per A tile
    constexpr int B_VECS = BK * BN / V / 256;      // ... per B tile
    constexpr int A_KV = BK / V, B_CV = BN / V;    // pieces per A row / per B row
    // row stride of the running-best cells: HM * RS = 16 (mod 32), so the two rows groups of
    // a warp (ty, ty + 1) fall in different bank halves
    constexpr int RS = HM == 4 ? 20 : 24;
    static_assert(A_VECS >= 1 && B_VECS >= 1 && BM * BK == A_VECS * V * 256 &&
                  BK * BN == B_VECS * V * 256, "tile shape");
    __shared__ __align__(16) T As[2][BK][BM + APAD];
    __shared__ __align__(16) T Bs[2][BK][BN];
    __shared__ T rbest[BM * RS];
    __shared__ int ridx[BM * RS];
    __shared__ double red[8];
    __shared__ u64 redc[8];

    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const i64 row0 = (i64)blockIdx.x * BM;

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = i < HM ? ty * HM + i : BM / 2 + ty * HM + (i - HM);
        rbest[r * RS + tx] = pos_inf<T>();
        ridx[r * RS + tx] = 0;
    }

    T ra[A_VECS][V], rb[B_VECS][V];  // the next K step's tiles, in flight
    auto load_tiles = [&](int k0, int col0) {
#pragma unroll
        for (int q = 0; q < A_VECS; ++q) {
            const int e = tid + q * 256, m = e / A_KV, kv = e % A_KV;
            const i64 gx = row0 + m;
            const int gk = k0 + kv * V;
            const int cnt = gx < n ? max(0, min(V, d - gk)) : 0;
            ldg_vec<T, VEC>(X + (gx < n ? gx : 0) * d + (cnt > 0 ? gk : 0), cnt, ra[q]);
        }
#pragma unroll
        for (int q = 0; q < B_VECS; ++q) {
            const int e = tid + q * 256, kk = e / B_CV, cv = e % B_CV;
            const int gk = k0 + kk;
            ldg_vec<T, true>(m2ct + (i64)(gk < d ? gk : 0) * kpad + col0 + cv * V,
                             gk < d ? V : 0, rb[q]);
        }
    };
    auto store_tiles = [&](int buf) {
#pragma unroll
        for (int q = 0; q < A_VECS; ++q) {
            const int e = tid + q * 256, m = e / A_KV, kv = e % A_KV;
#pragma unroll
            for (int v = 0; v < V; ++v) As[buf][kv * V + v][m] = ra[q][v];
        }
#pragma unroll
        for (int q = 0; q < B_VECS; ++q) {
            const int e = tid + q * 256, kk = e / B_CV, cv = e % B_CV;
            sts_vec<T>(&Bs[buf][kk][cv * V], rb[q]);
        }
    };

    const int nk = (d + BK - 1) / BK;
    for (int col0 = 0; col0 < kpad; col0 += BN) {
        T acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = (T)0;

        load_tiles(0, col0);
        store_tiles(0);
        __syncthreads();
        for (int kt = 0; kt < nk; ++kt) {
            const int buf = kt & 1;
            const bool more = kt + 1 < nk;
            if (more) load_tiles((kt + 1) * BK, col0);
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                T a[TM], b[TN];
                lds_vec<T, HM>(&As[buf][kk][ty * HM], a);
                lds_vec<T, HM>(&As[buf][kk][BM / 2 + ty * HM], a + HM);
                lds_vec<T, HN>(&Bs[buf][kk][tx * HN], b);
                lds_vec<T, HN>(&Bs[buf][kk][BN / 2 + tx * HN], b + HN);
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fma_rn(a[i], b[j], acc[i][j]);
            }
            if (more) store_tiles(buf ^ 1);
            __syncthreads();
        }
        // epilogue: + ||c||^2, running first-minimum over this thread's columns (ascending)
        T cn[TN];
        lds_vec<T, HN>(cnorm + col0 + tx * HN, cn);
        lds_vec<T, HN>(cnorm + col0 + BN / 2 + tx * HN, cn + HN);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int r = i < HM ? ty * HM + i : BM / 2 + ty * HM + (i - HM);
            T b = rbest[r * RS + tx];
            int bi = ridx[r * RS + tx];
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int col = col0 + (j < HN ? tx * HN + j : BN / 2 + tx * HN + (j - HN));
                const T dist = add_rn(acc[i][j], cn[j]);
                if (dist < b) { b = dist; bi = col; }
            }
            rbest[r * RS + tx] = b;
            ridx[r * RS + tx] = bi;
        }
    }

    // the 16 threads sharing a row hold disjoint column sets
    __syncthreads();
    finish_rows<T, BM, RS>(rbest, ridx, row0, n, d, X, W, labels, min_sq, want_min,
                            count_changed, red, redc, block_inertia, counters);
}

// ---------------------------------------------------------------------------------------------
// (a) tf32 option, fused: the distance GEMM on the tensor cores (mma.sync m16n8k8, TF32 inputs
//     rounded to nearest by cvt.rna, FP32 accumulation) with the argmin in its epilogue, so
//     the n x k distances never leave the SM. Block tile BM = 128 points x BN = 128 centers,
//     8 warps as 2 (points) x 4 (centers), each warp 64 x 32 = 4 x 4 mma tiles; K in steps of
//     16 through double-buffered shared tiles (the next step's global loads in flight in
//     registers). Operands: X (n, d) and -2C^T (d, kpad) as for assign_gemm, ||c||^2 added in
//     FP32 in the epilogue. Fragment layouts (PTX ISA, mma.m16n8k8 .tf32), g = lane / 4,
//     t = lane % 4: A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B b0 (k=t, n=g),
//     b1 (k=t+4, n=g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1). Shared
//     strides (20 and 136 words) make every fragment load conflict-free. Not bit-exact FP32.
// ---------------------------------------------------------------------------------------------
// (TF32 tensor cores exist from sm_80 on; the host never launches this kernel below that, and
// the guards keep the module compiling for older GPUs, where the other kernels still run.)
__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#else
    r = __float_as_uint(x);
#endif
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();
#endif
}

template <bool VEC>
__global__ void __launch_bounds__(256, 2)
assign_tf32(const float* __restrict__ X, const float* __restrict__ W,
            const float* __restrict__ m2ct, const float* __restrict__ cnorm, int n, int d,
            int kpad, int* __restrict__ labels, float* __restrict__ min_sq, int want_min,
            int count_changed, double* __restrict__ block_inertia,
            u64* __restrict__ counters) {
    constexpr int BM = 128, BN = 128, BK = 16;
    constexpr int SA = BK + 4;     // As row stride (words): g * 20 + t hits 32 banks
    constexpr int SB = BN + 8;     // Bs row stride (words): t * 136 + g hits 32 banks
    constexpr int RS = 20;         // running-best row stride, g * 20 + (wn * 4 + t) likewise
    // 58368 bytes of dynamic shared memory (TF32_MMA_SMEM on the host; over the 48 KB a
    // static allocation may take): As[2][BM][SA], Bs[2][BK][SB], rbest[BM*RS], ridx[BM*RS]
    extern __shared__ __align__(16) unsigned char smem[];
    auto As = reinterpret_cast<unsigned (*)[BM][SA]>(smem);
    auto Bs = reinterpret_cast<unsigned (*)[BK][SB]>(smem + 2 * BM * SA * 4);
    float* rbest = reinterpret_cast<float*>(smem + (2 * BM * SA + 2 * BK * SB) * 4);
    int* ridx = reinterpret_cast<int*>(rbest + BM * RS);
    __shared__ double red[8];
    __shared__ u64 redc[8];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm*64.., columns wn*32..
    const i64 row0 = (i64)blockIdx.x * BM;

    // running best per (row, column group wn*4 + t); each cell belongs to one thread
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wm * 64 + mt * 16 + g + 8 * h;
            rbest[r * RS + wn * 4 + t] = pos_inf<float>();
            ridx[r * RS + wn * 4 + t] = 0;
        }

    float ra[2][4], rb[2][4];  // the next K step's tiles, in flight
    auto load_tiles = [&](int k0, int col0) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, m = e >> 2, kq = e & 3;   // A: 128 rows x 4 float4
            const i64 gx = row0 + m;
            const int gk = k0 + kq * 4;
            const int cnt = gx < n ? max(0, min(4, d - gk)) : 0;
            ldg_vec<float, VEC>(X + (gx < n ? gx : 0) * d + (cnt > 0 ? gk : 0), cnt, ra[q]);
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, kk = e >> 5, cq = e & 31;  // B: 16 rows x 32 float4
            const int gk = k0 + kk;
            ldg_vec<float, true>(m2ct + (i64)(gk < d ? gk : 0) * kpad + col0 + cq * 4,
                                 gk < d ? 4 : 0, rb[q]);
        }
    };
    auto store_tiles = [&](int buf) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, m = e >> 2, kq = e & 3;
            uint4 v;
            v.x = to_tf32(ra[q][0]); v.y = to_tf32(ra[q][1]);
            v.z = to_tf32(ra[q][2]); v.w = to_tf32(ra[q][3]);
            *reinterpret_cast<uint4*>(&As[buf][m][kq * 4]) = v;
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, kk = e >> 5, cq = e & 31;
            uint4 v;
            v.x = to_tf32(rb[q][0]); v.y = to_tf32(rb[q][1]);
            v.z = to_tf32(rb[q][2]); v.w = to_tf32(rb[q][3]);
            *reinterpret_cast<uint4*>(&Bs[buf][kk][cq * 4]) = v;
        }
    };

    const int nk = (d + BK - 1) / BK;
    for (int col0 = 0; col0 < kpad; col0 += BN) {
        float acc[4][4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

        load_tiles(0, col0);
        store_tiles(0);
        __syncthreads();
        for (int kt = 0; kt < nk; ++kt) {
            const int buf = kt & 1;
            const bool more = kt + 1 < nk;
            if (more) load_tiles((kt + 1) * BK, col0);
#pragma unroll
            for (int kb = 0; kb < BK; kb += 8) {
                unsigned a[4][4], b[4][2];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
                    const int r = wm * 64 + mt * 16 + g;
                    a[mt][0] = As[buf][r][kb + t];
                    a[mt][1] = As[buf][r + 8][kb + t];
                    a[mt][2] = As[buf][r][kb + t + 4];
                    a[mt][3] = As[buf][r + 8][kb + t + 4];
                }
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const int c = wn * 32 + nt * 8 + g;
                    b[nt][0] = Bs[buf][kb + t][c];
                    b[nt][1] = Bs[buf][kb + t + 4][c];
                }
#pragma unroll
                for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) mma_tf32(acc[mt][nt], a[mt], b[nt]);
            }
            if (more) store_tiles(buf ^ 1);
            __syncthreads();
        }
        // epilogue: + ||c||^2, running first-minimum over this thread's 8 columns (ascending)
        float cn[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const float2 q = *reinterpret_cast<const float2*>(cnorm + col0 + wn * 32 + nt * 8 +
                                                              2 * t);
            cn[nt][0] = q.x;
            cn[nt][1] = q.y;
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * 64 + mt * 16 + g + 8 * h;
                float bst = rbest[r * RS + wn * 4 + t];
                int bi = ridx[r * RS + wn * 4 + t];
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float dist = __fadd_rn(acc[mt][nt][2 * h + e], cn[nt][e]);
                        if (dist < bst) { bst = dist; bi = col0 + wn * 32 + nt * 8 + 2 * t + e; }
                    }
                rbest[r * RS + wn * 4 + t] = bst;
                ridx[r * RS + wn * 4 + t] = bi;
            }
    }

    // the 16 column groups of a row hold disjoint column sets
    __syncthreads();
    finish_rows<float, BM, RS>(rbest, ridx, row0, n, d, X, W, labels, min_sq, want_min,
                            count_changed, red, redc, block_inertia, counters);
}

// ---------------------------------------------------------------------------------------------
// (a) tf32 option: argmin over rows of G = X_chunk @ (-2 C^T) computed by cuBLAS (TF32 tensor
//     cores), one warp per row reading G once in 16-byte pieces (kpad is a multiple of 128,
//     so rows are aligned and the padding columns, ||c||^2 = inf, never win). Not bit-exact
//     FP32: G's products are rounded to TF32.
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(BLOCK)
argmin_rows(const T* __restrict__ G, const T* __restrict__ cnorm, int rows, int kpad, int k,
            i64 row0, const T* __restrict__ X, int d, const T* __restrict__ W,
            int* __restrict__ labels, T* __restrict__ min_sq, int want_min, int count_changed,
            double* __restrict__ block_inertia, u64* __restrict__ counters) {
    constexpr int V = 16 / sizeof(T);
    __shared__ double red[WARPS];
    __shared__ u64 redc[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double inertia = 0.0;
    unsigned changed = 0;
    for (int r = blockIdx.x * WARPS + warp; r < rows; r += gridDim.x * WARPS) {
        const T* g = G + (i64)r * kpad;
        T b = pos_inf<T>();
        int bi = 0x7fffffff;
        for (int c0 = lane * V; c0 < k; c0 += 32 * V) {
            T gv[V], cv[V];
            lds_vec<T, V>(g + c0, gv);
            lds_vec<T, V>(cnorm + c0, cv);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const T dist = add_rn(gv[v], cv[v]);
                if (dist < b) { b = dist; bi = c0 + v; }
            }
        }
        const i64 gx = row0 + r;
        T xn = (T)0;
        for (int j = lane; j < d; j += 32) {
            T xv = X[gx * d + j];
            xn = add_rn(xn, mul_rn(xv, xv));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            T ob = __shfl_xor_sync(FULL_MASK, b, o);
            int oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (ob < b || (ob == b && oi < bi)) { b = ob; bi = oi; }
            xn = add_rn(xn, __shfl_xor_sync(FULL_MASK, xn, o));
        }
        if (bi == 0x7fffffff) bi = 0;  // only when every distance is NaN
        if (lane == 0)
            store_point<T>(gx, bi, b, xn, W[gx], labels, min_sq, want_min, count_changed,
                           changed, inertia);
    }
    double tot = block_sum(inertia, red);
    u64 ch = block_count(changed, redc);
    if (threadIdx.x == 0) {
        block_inertia[blockIdx.x] = tot;
        if (count_changed && ch) atomicAdd(counters, ch);
    }
}

// ---------------------------------------------------------------------------------------------
// (b) per-cluster weighted sums and weights, fixed point, no (k, n) anything
// ---------------------------------------------------------------------------------------------

// Shared-memory privatisation (k*(d+1) pairs of words per block), one point per thread,
// warp aggregation when a warp's points share a cluster; one flush per block.
template <typename T>
__global__ void __launch_bounds__(BLOCK)
accumulate_shared(const T* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
                  int n, int d, int k, u64* __restrict__ acc, const double* __restrict__ scale,
                  double two_l) {
    extern __shared__ __align__(16) unsigned char smem[];
    u64* sacc = reinterpret_cast<u64*>(smem);
    const int words = k * (d + 1) * 2;
    double* sscale = reinterpret_cast<double*>(sacc + words);
    for (int e = threadIdx.x; e < words; e += BLOCK) sacc[e] = 0ull;
    for (int j = threadIdx.x; j <= d; j += BLOCK) sscale[j] = scale[j];
    __syncthreads();
    for (i64 base = (i64)blockIdx.x * BLOCK; base < n; base += (i64)gridDim.x * BLOCK) {
        const i64 i = base + threadIdx.x;
        const bool valid = i < n;
        const int lab = valid ? labels[i] : -1;
        const T w = valid ? W[i] : (T)0;
        const bool same = warp_same_label(lab, valid);
        const bool active = valid && w != (T)0;
        u64* dst = sacc + (size_t)(lab < 0 ? 0 : lab) * (d + 1) * 2;
        for (int j = 0; j <= d; ++j) {
            double v = 0.0;
            if (valid) v = j < d ? (double)X[i * d + j] * (double)w : (double)w;
            i64 hi, lo;
            to_fixed(v, sscale[j], two_l, hi, lo);
            warp_add_pair(dst + 2 * j, hi, lo, same, active);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < words; e += BLOCK)
        if (sacc[e]) atomicAdd(acc + e, sacc[e]);
}

// Global atomics, one thread per (point, feature-or-weight) element, coalesced over X. Used
// when k*(d+1) does not fit in shared memory; still bit-reproducible (integer atomics).
template <typename T>
__global__ void __launch_bounds__(BLOCK)
accumulate_global(const T* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
                  int n, int d, u64* __restrict__ acc, const double* __restrict__ scale,
                  double two_l) {
    const i64 total = (i64)n * (d + 1);
    for (i64 e = (i64)blockIdx.x * BLOCK + threadIdx.x; e < total; e += (i64)gridDim.x * BLOCK) {
        const i64 i = e / (d + 1);
        const int j = (int)(e - i * (d + 1));
        const T w = W[i];
        if (w == (T)0) continue;
        const double v = j < d ? (double)X[i * d + j] * (double)w : (double)w;
        i64 hi, lo;
        to_fixed(v, scale[j], two_l, hi, lo);
        add_pair(acc + ((i64)labels[i] * (d + 1) + j) * 2, hi, lo);
    }
}

// Fixed point -> float64 sums (k, d) and weights (k); zeroes the accumulator for the next
// pass; counts empty clusters into counters[1]; block 0 sums the assignment's per-block
// inertia partials (fixed order) into stats[2].
__global__ void __launch_bounds__(BLOCK)
finalize_sums(u64* __restrict__ acc, int k, int d, const double* __restrict__ inv_scale,
              double inv_two_l, double* __restrict__ sums, double* __restrict__ weights,
              const double* __restrict__ block_inertia, int n_partials,
              double* __restrict__ stats) {
    __shared__ double red[WARPS];
    u64* counters = reinterpret_cast<u64*>(stats);
    const i64 total = (i64)k * (d + 1);
    for (i64 e = (i64)blockIdx.x * BLOCK + threadIdx.x; e < total; e += (i64)gridDim.x * BLOCK) {
        const i64 c = e / (d + 1);
        const int j = (int)(e - c * (d + 1));
        const i64 hi = (i64)acc[2 * e], lo = (i64)acc[2 * e + 1];
        acc[2 * e] = 0ull;
        acc[2 * e + 1] = 0ull;
        const double v = (__ll2double_rn(hi) + __ll2double_rn(lo) * inv_two_l) * inv_scale[j];
        if (j < d) {
            sums[c * d + j] = v;
        } else {
            weights[c] = v;
            if (v == 0.0) atomicAdd(counters + 1, 1ull);
        }
    }
    if (blockIdx.x == 0 && n_partials > 0) {
        double tot = block_sum_partials(block_inertia, n_partials, red);
        if (threadIdx.x == 0) stats[2] = tot;
    }
}

// ---------------------------------------------------------------------------------------------
// (c) center update, packing of the distance operands, center shift
// ---------------------------------------------------------------------------------------------

// Writes -2c and ||c||^2 of center c in the layout the assignment kernel reads:
// layout 0: ops (k, S) rows [-2c_0 .. -2c_{d-1}, ||c||^2, 0...]; layout 1: -2C^T (d, kpad) in
// ops and ||c||^2 in cnorm. ||c||^2 is summed in numpy's einsum order (norm_mode).
template <typename T>
__device__ void pack_center(const T* __restrict__ c_row, int c, int d, int layout, int S,
                            int kpad, int norm_mode, T* __restrict__ ops, T* __restrict__ cnorm) {
    for (int j = 0; j < d; ++j) {
        const T m2 = mul_rn((T)-2, c_row[j]);
        if (layout == 0) ops[(i64)c * S + j] = m2;
        else ops[(i64)j * kpad + c] = m2;
    }
    const T cn = einsum_sq_norm<T>(c_row, d, norm_mode);
    if (layout == 0) {
        ops[(i64)c * S + d] = cn;
        for (int j = d + 1; j < S; ++j) ops[(i64)c * S + j] = (T)0;
    } else {
        cnorm[c] = cn;
    }
}

template <typename T>
__global__ void __launch_bounds__(BLOCK)
pack_centers(const T* __restrict__ C, int k, int d, int layout, int S, int kpad, int norm_mode,
             T* __restrict__ ops, T* __restrict__ cnorm) {
    for (int c = blockIdx.x * BLOCK + threadIdx.x; c < k; c += gridDim.x * BLOCK)
        pack_center<T>(C + (i64)c * d, c, d, layout, S, kpad, norm_mode, ops, cnorm);
}

// The driver's new_centers (weighted mean in float64 rounded to T, or the old center when the
// cluster has no weight), the squared shift sum((new - old)^2) with the difference and the
// square in T and the sum in float64 (fixed order), the packed operands for the next pass;
// the last block writes the shift to stats[3] and clears the counters stats[0:2].
template <typename T>
__global__ void __launch_bounds__(BLOCK)
update_centers(const double* __restrict__ sums, const double* __restrict__ weights,
               const T* __restrict__ c_old, T* __restrict__ c_new, int k, int d, int layout,
               int S, int kpad, int norm_mode, T* __restrict__ ops, T* __restrict__ cnorm,
               double* __restrict__ shift_partials, double* __restrict__ stats,
               unsigned* __restrict__ done) {
    __shared__ double red[WARPS];
    double shift = 0.0;
    const int c = blockIdx.x * BLOCK + threadIdx.x;
    if (c < k) {
        const double w = weights[c];
        for (int j = 0; j < d; ++j) {
            const i64 e = (i64)c * d + j;
            const T old = c_old[e];
            const T v = w > 0.0 ? to_t(sums[e] / w, (T)0) : old;
            c_new[e] = v;
            const T df = sub_rn(v, old);
            shift += (double)mul_rn(df, df);
        }
        pack_center<T>(c_new + (i64)c * d, c, d, layout, S, kpad, norm_mode, ops, cnorm);
    }
    double tot = block_sum(shift, red);
    if (threadIdx.x == 0) shift_partials[blockIdx.x] = tot;
    if (last_block_done(done)) {
        double all = block_sum_partials(shift_partials, gridDim.x, red);
        if (threadIdx.x == 0) {
            stats[3] = all;
            u64* counters = reinterpret_cast<u64*>(stats);
            counters[0] = 0ull;
            counters[1] = 0ull;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// empty clusters: the driver's relocation, on the device
// ---------------------------------------------------------------------------------------------

// Ids of the clusters with zero weight, ascending (one block).
__global__ void __launch_bounds__(1024)
list_empty_clusters(const double* __restrict__ weights, int k, int* __restrict__ empty_ids) {
    __shared__ int counts[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int base = 0;
    for (int c0 = 0; c0 < k; c0 += 1024) {
        const int c = c0 + threadIdx.x;
        const bool e = c < k && weights[c] == 0.0;
        const unsigned bal = __ballot_sync(FULL_MASK, e);
        if (lane == 0) counts[warp] = __popc(bal);
        __syncthreads();
        int off = 0, total = 0;
        for (int w = 0; w < 32; ++w) {
            if (w < warp) off += counts[w];
            total += counts[w];
        }
        if (e) empty_ids[base + off + __popc(bal & ((1u << lane) - 1u))] = c;
        base += total;
        __syncthreads();
    }
}

// ||x_i - c_{label_i}||^2 by direct differences in numpy's pairwise order, for every row,
// handed to `emit(i, dist)` for valid rows. For d >= 16 eight lanes share a row (reads in
// 32-byte pieces, four rows per warp access); below, one thread per row. Every lane of a warp
// runs the same iterations (the shuffles need the whole warp); past-the-end rows compute on
// row n-1 and emit nothing.
template <typename T, typename Emit>
__device__ __forceinline__ void for_each_direct_sq_dist(const T* __restrict__ X,
                                                        const int* __restrict__ labels,
                                                        const T* __restrict__ C, int n, int d,
                                                        Emit emit) {
    const bool group = d >= 16;
    const int G = group ? 8 : 1;
    const int lane = threadIdx.x & 31, lane8 = lane & 7;
    const i64 rows_per_warp = 32 / G;
    const i64 warp_id = ((i64)blockIdx.x * BLOCK + threadIdx.x) >> 5;
    const i64 warps = ((i64)gridDim.x * BLOCK) >> 5;
    for (i64 base = warp_id * rows_per_warp; base < n; base += warps * rows_per_warp) {
        const i64 i = base + lane / G;
        const bool valid = i < n;
        const i64 r = valid ? i : (i64)n - 1;
        const T* x = X + r * d;
        const T* c = C + (i64)labels[r] * d;
        const T dist = group ? pairwise_sq_dist_g8<T>(x, c, d, lane8) : pairwise_sq_dist<T>(x, c, d);
        if (valid && (!group || lane8 == 0)) emit(i, dist);
    }
}

// The driver's relocation keys, one pass over X: the distance of each point to its own center,
// or -1 for zero-weight points (never taken). Kept in X's dtype (numpy's keys are float64
// copies of these values, so the order is the same).
template <typename T>
__global__ void __launch_bounds__(BLOCK)
relocation_keys(const T* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
                const T* __restrict__ c_old, int n, int d, T* __restrict__ keys) {
    for_each_direct_sq_dist<T>(X, labels, c_old, n, d, [&](i64 i, T dist) {
        keys[i] = W[i] > (T)0 ? dist : (T)-1;
    });
}

// One relocation step p: find the point that comes next in the driver's order (key descending,
// index ascending) after pick p-1, then move it as relocate_empty does: sums[old] -= x*w;
// sums[new] = x*w; weights likewise, in float64 and in the driver's order. The last block
// combines the per-block candidates. Reads only the n keys, not X.
template <typename T>
__global__ void __launch_bounds__(BLOCK)
relocate_farthest(const T* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
                  const T* __restrict__ keys, int n, int d, int p,
                  const int* __restrict__ empty_ids, double* __restrict__ far_dist,
                  i64* __restrict__ far_idx, double* __restrict__ sums,
                  double* __restrict__ weights, double* __restrict__ part_d,
                  i64* __restrict__ part_i, unsigned* __restrict__ done) {
    __shared__ double sd[BLOCK];
    __shared__ i64 si[BLOCK];
    const double prev_d = p > 0 ? far_dist[p - 1] : pos_inf<double>();
    const i64 prev_i = p > 0 ? far_idx[p - 1] : -1;
    double bd = -pos_inf<double>();
    i64 bi = -1;
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK) {
        const double key = (double)keys[i];
        const bool after = key < prev_d || (key == prev_d && i > prev_i);
        if (after && (bi < 0 || key > bd)) { bd = key; bi = i; }  // i ascends: ties keep first
    }
    sd[threadIdx.x] = bd;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const double od = sd[threadIdx.x + s];
            const i64 oi = si[threadIdx.x + s];
            if (oi >= 0 && (si[threadIdx.x] < 0 || od > sd[threadIdx.x] ||
                            (od == sd[threadIdx.x] && oi < si[threadIdx.x]))) {
                sd[threadIdx.x] = od;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part_d[blockIdx.x] = sd[0];
        part_i[blockIdx.x] = si[0];
    }
    if (!last_block_done(done)) return;
    if (threadIdx.x == 0) {
        double gd = -pos_inf<double>();
        i64 gi = -1;
        for (int b = 0; b < (int)gridDim.x; ++b) {
            const double od = __ldcg(part_d + b);
            const i64 oi = __ldcg(part_i + b);
            if (oi >= 0 && (gi < 0 || od > gd || (od == gd && oi < gi))) { gd = od; gi = oi; }
        }
        far_dist[p] = gd;
        far_idx[p] = gi;
        si[0] = gi;
    }
    __syncthreads();
    const i64 idx = si[0];
    if (idx < 0) return;  // fewer candidates than empty clusters: cannot happen after validation
    const int old_id = labels[idx], new_id = empty_ids[p];
    const double wt = (double)W[idx];
    for (int j = threadIdx.x; j < d; j += BLOCK) {
        const double xw = (double)X[idx * d + j] * wt;
        sums[(i64)old_id * d + j] -= xw;
        sums[(i64)new_id * d + j] = xw;
    }
    if (threadIdx.x == 0) {
        weights[old_id] -= wt;
        weights[new_id] = wt;
    }
}

// ---------------------------------------------------------------------------------------------
// final inertia and the fixed-point scales
// ---------------------------------------------------------------------------------------------

// sum_i w_i * ||x_i - c_label||^2 with the driver's direct differences; stats[slot] gets it.
template <typename T>
__global__ void __launch_bounds__(BLOCK)
direct_inertia(const T* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
               const T* __restrict__ C, int n, int d, double* __restrict__ partials,
               double* __restrict__ stats, int slot, unsigned* __restrict__ done) {
    __shared__ double red[WARPS];
    double s = 0.0;
    for_each_direct_sq_dist<T>(X, labels, C, n, d, [&](i64 i, T dist) {
        s += (double)dist * (double)W[i];
    });
    double tot = block_sum(s, red);
    if (threadIdx.x == 0) partials[blockIdx.x] = tot;
    if (last_block_done(done)) {
        double all = block_sum_partials(partials, gridDim.x, red);
        if (threadIdx.x == 0) stats[slot] = all;
    }
}

// max |x_j| per feature as float64 bits (non-negative doubles order like their bits). The
// stride over the flattened X is a multiple of d, so each thread keeps one feature.
template <typename T>
__global__ void __launch_bounds__(BLOCK)
column_absmax(const T* __restrict__ X, i64 total, int d, u64* __restrict__ out) {
    const i64 tid = (i64)blockIdx.x * BLOCK + threadIdx.x;
    const i64 threads = (i64)gridDim.x * BLOCK;
    const i64 stride = threads / d * d;  // the host launches at least d threads
    if (tid >= stride) return;
    double m = 0.0;
    for (i64 e = tid; e < total; e += stride) {
        const double v = fabs((double)X[e]);
        if (v > m) m = v;
    }
    if (m > 0.0) atomicMax(out + tid % d, (u64)__double_as_longlong(m));
}
