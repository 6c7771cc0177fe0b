// cupy-fused: per-cluster weighted sums and weights in 64-bit fixed point (two words per
// value, scaled per feature by a power of two, fixed_point_scales in stats.cu), so that
// atomics in any order give bit-identical sums; then finalize_sums turns them into float64.
// Labels int32; W null: unit weights.
#include "common.cuh"

// Shared-memory privatisation (k*(d+1) pairs of words per block), one point per thread,
// warp aggregation when a warp's points share a cluster; one flush per block.
template <typename T>
__global__ void __launch_bounds__(BLOCK)
accumulate_shared(const T* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
                  int n, int d, int k, u64* __restrict__ acc, const double* __restrict__ scale,
                  double two_l, const bool* __restrict__ skip) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
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
        const T w = valid ? weight_at(W, i) : (T)0;
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
                  double two_l, const bool* __restrict__ skip) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    const i64 total = (i64)n * (d + 1);
    for (i64 e = (i64)blockIdx.x * BLOCK + threadIdx.x; e < total; e += (i64)gridDim.x * BLOCK) {
        const i64 i = e / (d + 1);
        const int j = (int)(e - i * (d + 1));
        const T w = weight_at(W, i);
        if (w == (T)0) continue;
        const double v = j < d ? (double)X[i * d + j] * (double)w : (double)w;
        i64 hi, lo;
        to_fixed(v, scale[j], two_l, hi, lo);
        add_pair(acc + ((i64)labels[i] * (d + 1) + j) * 2, hi, lo);
    }
}

// Fixed point -> float64 sums (k, d) and weights (k), zeroing the accumulator for the next
// pass. Block 0 also writes the pass's statistics: stats[0] = the fixed-order sum of the
// assignment's per-block inertia partials (when n_partials > 0), stats[1] = the labels
// changed (*counter, then reset to 0; or changed_if_none when it is >= 0: no old labels).
__global__ void __launch_bounds__(BLOCK)
finalize_sums(u64* __restrict__ acc, int k, int d, const double* __restrict__ inv_scale,
              double inv_two_l, double* __restrict__ sums, double* __restrict__ weights,
              const double* __restrict__ block_inertia, int n_partials,
              u64* __restrict__ counter, double changed_if_none, double* __restrict__ stats) {
    __shared__ double red[WARPS];
    const i64 total = (i64)k * (d + 1);
    for (i64 e = (i64)blockIdx.x * BLOCK + threadIdx.x; e < total; e += (i64)gridDim.x * BLOCK) {
        const i64 c = e / (d + 1);
        const int j = (int)(e - c * (d + 1));
        const i64 hi = (i64)acc[2 * e], lo = (i64)acc[2 * e + 1];
        acc[2 * e] = 0ull;
        acc[2 * e + 1] = 0ull;
        const double v = (__ll2double_rn(hi) + __ll2double_rn(lo) * inv_two_l) * inv_scale[j];
        if (j < d) sums[c * d + j] = v;
        else weights[c] = v;
    }
    if (blockIdx.x == 0 && n_partials > 0) {
        const double tot = block_sum_partials(block_inertia, n_partials, red);
        if (threadIdx.x == 0) {
            stats[0] = tot;
            stats[1] = changed_if_none >= 0.0 ? changed_if_none : (double)*counter;
            *counter = 0ull;
        }
    }
}
