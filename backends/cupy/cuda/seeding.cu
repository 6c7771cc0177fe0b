// k-means++'s three steps per center (kmeans_xp.init.Seeding) on the device, so the k-1
// greedy steps need nothing from the host (kmeans_xp_backends.cupy.seeding launches them):
//   seeding_draw: the candidates, drawn from the scan of w * D(x)^2 as numpy's searchsorted;
//   seeding_potentials<T>: each candidate's potential sum w * min(D(x)^2, ||x - p||^2), one
//     fixed-order reduction, and the best candidate (the first of the least) chosen;
//   seeding_update<T>: D(x)^2 = min(D(x)^2, ||x - p_chosen||^2) and w * D(x)^2 for the scan.
// X is read centered (x - mean, rounded in T, as the centered copy holds it; mean null: X as
// it is). Distances are direct differences summed feature by feature from 0 in T (the xp
// steps' rounding for d <= 4). Weights are float64 (null: unit weights).
#include "common.cuh"

// candidates per center at most (2 + int(ln k) for k up to 1.2e6); the host checks it
constexpr int SEED_MAX_TRIALS = 16;

template <typename T>
__device__ __forceinline__ T centered_at(const T* __restrict__ X, const T* __restrict__ mean,
                                         i64 row, int d, int j) {
    const T x = X[row * d + j];
    return mean ? sub_rn(x, mean[j]) : x;
}

// cand[t] = the first i with cum[i] > u[t] * cum[n-1] (numpy's searchsorted, side="right"),
// at most n - 1; where no potential is left (cum[n-1] is not > 0), by_weight[t].
__global__ void seeding_draw(const double* __restrict__ cum, i64 n,
                             const double* __restrict__ u, const i64* __restrict__ by_weight,
                             int trials, i64* __restrict__ cand) {
    const int t = threadIdx.x;
    if (t >= trials) return;
    const double total = cum[n - 1];
    if (!(total > 0.0)) {
        cand[t] = by_weight[t];
        return;
    }
    const double v = u[t] * total;
    i64 lo = 0, hi = n;
    while (lo < hi) {
        const i64 mid = lo + (hi - lo) / 2;
        if (cum[mid] > v) hi = mid; else lo = mid + 1;
    }
    cand[t] = lo < n - 1 ? lo : n - 1;
}

// The potential of each candidate (fixed order: per thread, per block, then the last block
// over the blocks), then chosen[0] = cand[best] and *best = the first candidate of least
// potential. Dynamic shared memory: trials * d values of T (the centered candidates).
template <typename T>
__global__ void __launch_bounds__(BLOCK)
seeding_potentials(const T* __restrict__ X, const T* __restrict__ mean,
                   const T* __restrict__ closest, const double* __restrict__ w, i64 n, int d,
                   const i64* __restrict__ cand, int trials, double* __restrict__ partials,
                   unsigned* __restrict__ done, i64* __restrict__ chosen,
                   int* __restrict__ best) {
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
    T* P = reinterpret_cast<T*>(smem);
    __shared__ double red[WARPS];
    __shared__ double pots[SEED_MAX_TRIALS];
    for (int e = threadIdx.x; e < trials * d; e += BLOCK)
        P[e] = centered_at(X, mean, cand[e / d], d, e % d);
    __syncthreads();
    double acc[SEED_MAX_TRIALS];
#pragma unroll
    for (int t = 0; t < SEED_MAX_TRIALS; ++t) acc[t] = 0.0;
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK) {
        T s[SEED_MAX_TRIALS];
#pragma unroll
        for (int t = 0; t < SEED_MAX_TRIALS; ++t) s[t] = (T)0;
        for (int j = 0; j < d; ++j) {
            const T x = centered_at(X, mean, i, d, j);
#pragma unroll
            for (int t = 0; t < SEED_MAX_TRIALS; ++t) {
                if (t < trials) {
                    const T df = sub_rn(x, P[t * d + j]);
                    s[t] = add_rn(s[t], mul_rn(df, df));
                }
            }
        }
        const T c = closest[i];
        const double wi = w ? w[i] : 1.0;
#pragma unroll
        for (int t = 0; t < SEED_MAX_TRIALS; ++t) {
            if (t < trials) {
                const double m = (double)(s[t] < c ? s[t] : c);
                acc[t] += w ? m * wi : m;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < SEED_MAX_TRIALS; ++t) {  // unrolled: acc stays in registers
        if (t < trials) {
            const double tot = block_sum(acc[t], red);
            if (threadIdx.x == 0) partials[(i64)blockIdx.x * trials + t] = tot;
        }
    }
    if (!last_block_done(done)) return;
    if (threadIdx.x < trials) {
        double p = 0.0;
        for (unsigned b = 0; b < gridDim.x; ++b) p += __ldcg(partials + (i64)b * trials + threadIdx.x);
        pots[threadIdx.x] = p;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int b = 0;
        for (int t = 1; t < trials; ++t)
            if (pots[t] < pots[b]) b = t;
        *best = b;
        chosen[0] = cand[b];
    }
}

// closest[i] = min(closest[i], ||x_i - p||^2) with p the centered row chosen[0] of X (first:
// closest[i] = ||x_i - p||^2), and values[i] = w * closest[i] in float64 (the next scan's
// input). Dynamic shared memory: d values of T.
template <typename T>
__global__ void __launch_bounds__(BLOCK)
seeding_update(const T* __restrict__ X, const T* __restrict__ mean, const double* __restrict__ w,
               i64 n, int d, const i64* __restrict__ chosen, int first,
               T* __restrict__ closest, double* __restrict__ values) {
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
    T* p = reinterpret_cast<T*>(smem);
    const i64 row = chosen[0];
    for (int j = threadIdx.x; j < d; j += BLOCK) p[j] = centered_at(X, mean, row, d, j);
    __syncthreads();
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK) {
        T s = (T)0;
        for (int j = 0; j < d; ++j) {
            const T df = sub_rn(centered_at(X, mean, i, d, j), p[j]);
            s = add_rn(s, mul_rn(df, df));
        }
        const T c = first ? s : (s < closest[i] ? s : closest[i]);
        closest[i] = c;
        values[i] = w ? (double)c * w[i] : (double)c;
    }
}
