// ||x_i - c_{label_i}||^2 by direct differences, rounded exactly as numpy's
// `np.sum((x - c) ** 2, axis=1)` (the difference and the square in T, then numpy's pairwise
// summation in T: 8 accumulators for 8 <= n <= 128, halving above). Labels int32; W null:
// unit weights. Every CuPy backend uses these for what the driver computes by differences:
//   direct_inertia<T>: sum of w * distance (the final inertia and score), fixed order.
//   labelled_sq_dist<T>: the distances themselves (cupy-chunked's min_sq_dist).
//   relocation_keys<T>: the distance, or -1 for zero-weight points (never relocated): the
//     keys `farthest` ranks when a cluster is empty.
// X is read as XT (default T; xhalf/xbf16: half X, each value widened exactly by xval), the
// centers and the arithmetic stay in T.
#include "common.cuh"

template <typename T, typename XT>
__device__ __forceinline__ T sq_diff(const XT* __restrict__ x, const T* __restrict__ c, int j) {
    const T df = sub_rn(xval<T>(x + j), c[j]);
    return mul_rn(df, df);
}

template <typename T, typename XT = T>
__device__ T pairwise_sq_dist(const XT* __restrict__ x, const T* __restrict__ c, int n) {
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

// The same sum computed by a group of 8 consecutive lanes (lane8 = lane % 8), so that a warp
// reads four rows at a time in 32-byte pieces: lane l keeps numpy's accumulator r[l]; the
// combination ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) is three xor-shuffles (addition commutes,
// so every lane ends with the same bits); the tail and n < 8 are summed by every lane alike.
template <typename T, typename XT = T>
__device__ T pairwise_sq_dist_g8(const XT* __restrict__ x, const T* __restrict__ c, int n,
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

// Every row's distance handed to emit(i, dist). For d >= 16 eight lanes share a row, below one
// thread per row. Every lane of a warp runs the same iterations (the shuffles need the whole
// warp); past-the-end rows compute on row n-1 and emit nothing.
template <typename T, typename XT, typename Emit>
__device__ __forceinline__ void for_each_direct_sq_dist(const XT* __restrict__ X,
                                                        const int* __restrict__ labels,
                                                        const T* __restrict__ C, i64 n, int d,
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
        const i64 r = valid ? i : n - 1;
        const XT* x = X + r * d;
        const T* c = C + (i64)labels[r] * d;
        const T dist = group ? pairwise_sq_dist_g8<T, XT>(x, c, d, lane8)
                             : pairwise_sq_dist<T, XT>(x, c, d);
        if (valid && (!group || lane8 == 0)) emit(i, dist);
    }
}

template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
direct_inertia(const XT* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
               const T* __restrict__ C, i64 n, int d, double* __restrict__ partials,
               double* __restrict__ out, unsigned* __restrict__ done) {
    __shared__ double red[WARPS];
    double s = 0.0;
    for_each_direct_sq_dist<T, XT>(X, labels, C, n, d, [&](i64 i, T dist) {
        s += (double)dist * (double)weight_at(W, i);
    });
    const double tot = block_sum(s, red);
    if (threadIdx.x == 0) partials[blockIdx.x] = tot;
    if (last_block_done(done)) {
        const double all = block_sum_partials(partials, gridDim.x, red);
        if (threadIdx.x == 0) *out = all;
    }
}

template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
labelled_sq_dist(const XT* __restrict__ X, const int* __restrict__ labels,
                 const T* __restrict__ C, i64 n, int d, T* __restrict__ out) {
    for_each_direct_sq_dist<T, XT>(X, labels, C, n, d, [&](i64 i, T dist) { out[i] = dist; });
}

template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
relocation_keys(const XT* __restrict__ X, const T* __restrict__ W, const int* __restrict__ labels,
                const T* __restrict__ C, i64 n, int d, T* __restrict__ keys) {
    for_each_direct_sq_dist<T, XT>(X, labels, C, n, d, [&](i64 i, T dist) {
        keys[i] = weight_at(W, i) > (T)0 ? dist : (T)-1;
    });
}
