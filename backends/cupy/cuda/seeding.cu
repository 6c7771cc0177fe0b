// k-means++'s three steps per center (kmeans_xp.algorithms.init.Seeding) on the device, so the k-1
// greedy steps need nothing from the host (kmeans_xp_backends.cupy.seeding launches them):
//   seeding_draw: the candidates, drawn with probability w * D(x)^2 (numpy's searchsorted
//     on the cumulative sum, from per-segment totals: no scan of all n);
//   seeding_potentials<T>: each candidate's potential sum w * min(D(x)^2, ||x - p||^2), one
//     fixed-order reduction, and the best candidate (the first of the least) chosen;
//   seeding_update<T>: D(x)^2 = min(D(x)^2, ||x - p_chosen||^2), w * D(x)^2 and its segments'
//     totals for the next draw.
// X is read centered (x - mean, rounded in T, as the centered copy holds it; mean null: X as
// it is). Distances are direct differences summed feature by feature from 0 in T (the xp
// steps' rounding for d <= 4). Weights are float64 (null: unit weights). X is read as XT
// (default T; xhalf/xbf16: half X, each value widened exactly by xval before centering).
#include "common.cuh"

// candidates per center at most (2 + int(ln k) for k up to 1.2e6); the host checks it
constexpr int SEED_MAX_TRIALS = 16;

template <typename T, typename XT>
__device__ __forceinline__ T centered_at(const XT* __restrict__ X, const T* __restrict__ mean,
                                         i64 row, int d, int j) {
    const T x = xval<T>(X + row * d + j);
    return mean ? sub_rn(x, mean[j]) : x;
}

// The prefix sums the draws search are made in tiles of SEED_TILE values: each thread adds its
// SEED_PER_THREAD consecutive values in order, one thread adds the threads' totals in order.
// Every addition extends a running sum, so the prefix never decreases (values are >= 0) and
// a zero value is never the first to pass a bound.
constexpr int SEED_PER_THREAD = 8;
constexpr int SEED_TILE = BLOCK * SEED_PER_THREAD;

// The first i < m with prefix(a, i) > v (m if none), and in *before the prefix up to i - 1
// (the total when none); the whole block calls it, the result is valid in every thread.
__device__ i64 first_prefix_above(const double* __restrict__ a, i64 m, double v,
                                  double* before) {
    __shared__ double off[BLOCK + 1];
    __shared__ u64 redc[WARPS];
    __shared__ double at_start;
    __shared__ i64 found;
    double running = 0.0;
    for (i64 t0 = 0; t0 < m; t0 += SEED_TILE) {
        const i64 mine = t0 + (i64)threadIdx.x * SEED_PER_THREAD;
        double p[SEED_PER_THREAD];
        double acc = 0.0;
#pragma unroll
        for (int e = 0; e < SEED_PER_THREAD; ++e) {
            acc += mine + e < m ? a[mine + e] : 0.0;
            p[e] = acc;
        }
        off[threadIdx.x + 1] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            off[0] = running;
            for (int t = 1; t <= BLOCK; ++t) off[t] = off[t - 1] + off[t];
        }
        __syncthreads();
        const double base = off[threadIdx.x];
        unsigned below = 0;
#pragma unroll
        for (int e = 0; e < SEED_PER_THREAD; ++e)
            below += mine + e < m && base + p[e] <= v;
        const u64 count = block_count(below, redc);  // valid in thread 0
        if (threadIdx.x == 0) found = (i64)count;
        __syncthreads();
        const i64 idx = t0 + found;
        const i64 tile_end = t0 + SEED_TILE < m ? t0 + SEED_TILE : m;
        if (idx < tile_end) {  // the prefix passes v inside this tile, at idx
            if (idx == t0 && threadIdx.x == 0) at_start = off[0];
            const i64 prev = idx - 1 - mine;  // idx - 1 among this thread's values
            if (idx > t0 && prev >= 0 && prev < SEED_PER_THREAD) {
#pragma unroll
                for (int e = 0; e < SEED_PER_THREAD; ++e)
                    if (e == prev) at_start = base + p[e];
            }
            __syncthreads();
            *before = at_start;
            return idx;
        }
        running = off[BLOCK];
        __syncthreads();  // off is rewritten by the next tile
    }
    *before = running;
    return m;
}

// cand[t] = a row drawn with probability values[i] / total (one block per trial): the first
// row whose prefix sum passes u[t] * total, searched over the segments' totals (seg_total, of
// segments of `seg` rows, from seeding_update) and then inside one segment. numpy's
// searchsorted(cumsum(values), u * total, side="right") up to the sums' rounding; where the
// segment's own sum falls short of its total by rounding, its last positive row. Where no
// potential is left (total not > 0), by_weight[t].
__global__ void __launch_bounds__(BLOCK)
seeding_draw(const double* __restrict__ values, i64 n, i64 seg,
             const double* __restrict__ seg_total, i64 segments, const double* __restrict__ u,
             const i64* __restrict__ by_weight, i64* __restrict__ cand) {
    const int t = blockIdx.x;
    double total, before;
    first_prefix_above(seg_total, segments, pos_inf<double>(), &total);
    if (!(total > 0.0)) {
        if (threadIdx.x == 0) cand[t] = by_weight[t];
        return;
    }
    const double v = u[t] * total;
    i64 s = first_prefix_above(seg_total, segments, v, &before);
    const bool past_end = s == segments;  // u * total rounded up to the total
    if (past_end)
        for (s = segments - 1; s > 0 && !(seg_total[s] > 0.0); --s) {}
    const i64 start = s * seg;
    const i64 len = start + seg < n ? seg : n - start;
    double unused;
    i64 i = past_end ? len : first_prefix_above(values + start, len, v - before, &unused);
    if (i == len)
        for (i = len - 1; i > 0 && !(values[start + i] > 0.0); --i) {}
    if (threadIdx.x == 0) cand[t] = start + i;
}

// The potential of each candidate (fixed order: per thread, per block, then the last block
// over the blocks), then chosen[0] = cand[best] and *best = the first candidate of least
// potential. Dynamic shared memory: trials * d values of T (the centered candidates).
template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
seeding_potentials(const XT* __restrict__ X, const T* __restrict__ mean,
                   const T* __restrict__ closest, const double* __restrict__ w, i64 n, int d,
                   const i64* __restrict__ cand, int trials, double* __restrict__ partials,
                   unsigned* __restrict__ done, i64* __restrict__ chosen,
                   int* __restrict__ best) {
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
    T* P = reinterpret_cast<T*>(smem);
    __shared__ double red[WARPS];
    __shared__ double pots[SEED_MAX_TRIALS];
    for (int e = threadIdx.x; e < trials * d; e += BLOCK)
        P[e] = centered_at<T, XT>(X, mean, cand[e / d], d, e % d);
    __syncthreads();
    double acc[SEED_MAX_TRIALS];
#pragma unroll
    for (int t = 0; t < SEED_MAX_TRIALS; ++t) acc[t] = 0.0;
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK) {
        T s[SEED_MAX_TRIALS];
#pragma unroll
        for (int t = 0; t < SEED_MAX_TRIALS; ++t) s[t] = (T)0;
        for (int j = 0; j < d; ++j) {
            const T x = centered_at<T, XT>(X, mean, i, d, j);
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
// closest[i] = ||x_i - p||^2), values[i] = w * closest[i] in float64 (what the next draw
// searches), and seg_total[b] = the sum of block b's segment of `seg` rows of values (fixed
// order). Dynamic shared memory: d values of T.
template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
seeding_update(const XT* __restrict__ X, const T* __restrict__ mean, const double* __restrict__ w,
               i64 n, int d, i64 seg, const i64* __restrict__ chosen, int first,
               T* __restrict__ closest, double* __restrict__ values,
               double* __restrict__ seg_total) {
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
    T* p = reinterpret_cast<T*>(smem);
    __shared__ double red[WARPS];
    const i64 row = chosen[0];
    for (int j = threadIdx.x; j < d; j += BLOCK) p[j] = centered_at<T, XT>(X, mean, row, d, j);
    __syncthreads();
    const i64 start = (i64)blockIdx.x * seg;
    const i64 end = start + seg < n ? start + seg : n;
    double sum = 0.0;
    for (i64 i = start + threadIdx.x; i < end; i += BLOCK) {
        T s = (T)0;
        for (int j = 0; j < d; ++j) {
            const T df = sub_rn(centered_at<T, XT>(X, mean, i, d, j), p[j]);
            s = add_rn(s, mul_rn(df, df));
        }
        const T c = first ? s : (s < closest[i] ? s : closest[i]);
        closest[i] = c;
        const double v = w ? (double)c * w[i] : (double)c;
        values[i] = v;
        sum += v;
    }
    const double tot = block_sum(sum, red);
    if (threadIdx.x == 0) seg_total[blockIdx.x] = tot;
}
