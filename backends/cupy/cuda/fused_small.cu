// cupy-fused, d <= 16: distance + argmin with d known at compile time, P points per thread
// (common.cuh's tiled skeleton, G centers to a group), the centers' operands (layout 0)
// through shared memory in tiles of tc; with FUSE the per-cluster sums are privatised in
// shared memory (fixed point) in the same pass and flushed once per block. Per block: the
// inertia partial of the assignment and the labels changed against labels_old (when given)
// added to *counter.
#include "common.cuh"

template <typename T, int D, int P, bool FUSE, int G>
__global__ void __launch_bounds__(BLOCK)
assign_small(const T* __restrict__ X, const T* __restrict__ W, const T* __restrict__ ops,
             int n, int k, int tc, const int* __restrict__ labels_old, int* __restrict__ labels,
             T* __restrict__ min_sq, double* __restrict__ block_inertia,
             u64* __restrict__ counter, const bool* __restrict__ skip, u64* __restrict__ acc,
             const double* __restrict__ scale, double two_l) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    constexpr int S = ops_stride<T>(D);
    // [center tile: tc * S T][FUSE: k*(D+1) pairs of words][FUSE: D+1 scales]
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
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
            const i64 i = base + p * BLOCK + threadIdx.x;
            valid[p] = i < n;
#pragma unroll
            for (int j = 0; j < D; ++j) x[p][j] = valid[p] ? X[i * D + j] : (T)0;
            w[p] = valid[p] ? weight_at(W, i) : (T)0;
        }
        T best[P];
        int bidx[P];
        nearest_in_tiles<T, D, P, G>(x, ops, k, tc, resident, tile, best, bidx);

#pragma unroll
        for (int p = 0; p < P; ++p) {
            if (!valid[p]) continue;
            store_point<T>(base + p * BLOCK + threadIdx.x, bidx[p], best[p],
                           sq_norm_seq<T, D>(x[p]), w[p], labels_old, labels, min_sq, changed,
                           inertia);
        }
        if (FUSE) {
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const bool same = warp_same_label(bidx[p], valid[p]);
                const bool active = valid[p] && w[p] != (T)0;
                u64* dst = sacc + (size_t)bidx[p] * (D + 1) * 2;
#pragma unroll
                for (int j = 0; j <= D; ++j) {
                    // numpy: bincount(weights=float64(x) * float64(w)): exact in double
                    const double v = j < D ? (double)x[p][j] * (double)w[p] : (double)w[p];
                    i64 hi, lo;
                    to_fixed(v, sscale[j], two_l, hi, lo);
                    warp_add_pair(dst + 2 * j, hi, lo, same, active);
                }
            }
        }
    }

    store_block_totals(inertia, changed, red, redc, block_inertia, counter);
    if (FUSE) {
        __syncthreads();
        for (int e = threadIdx.x; e < acc_words; e += BLOCK)
            if (sacc[e]) atomicAdd(acc + e, sacc[e]);
    }
}
