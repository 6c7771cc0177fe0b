// Per-pass statistics shared by the CuPy backends, each a deterministic fixed-order reduction
// (per-block partials, then the last block sums them) written into a float64 slot `out`:
//   weighted_total<T>: sum of float64(v) * float64(w) (w null: unit weights), the inertia of
//     an assignment from its distances (cupy-kernels, cupy-chunked, streaming).
//   count_changed: #(a != b) (b null: all n), the labels changed between two iterations.
//   store_labels<S>: host streaming: a chunk's int32 labels into the per-point label array of
//     the compact type S, counting those that differ from the previous iteration's.
//   column_absmax<T> + fixed_point_scales: cupy-fused's fixed-point scales, on the device.
//   column_moments<T>: host streaming's one-pass column sums and squares about a shift.
//   count_labels: points per cluster (integer atomics: exact in any order).
// column_absmax and column_moments read X as XT (default T; xhalf/xbf16: half X, widened
// exactly by xval), their arithmetic still in T and float64.
#include "common.cuh"

template <typename T>
__global__ void __launch_bounds__(BLOCK)
weighted_total(const T* __restrict__ v, const T* __restrict__ w, i64 n,
               double* __restrict__ partials, double* __restrict__ out,
               unsigned* __restrict__ done) {
    __shared__ double red[WARPS];
    double s = 0.0;
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK)
        s += (double)v[i] * (w ? (double)w[i] : 1.0);
    const double tot = block_sum(s, red);
    if (threadIdx.x == 0) partials[blockIdx.x] = tot;
    if (last_block_done(done)) {
        const double all = block_sum_partials(partials, gridDim.x, red);
        if (threadIdx.x == 0) *out = all;
    }
}

__global__ void __launch_bounds__(BLOCK)
count_changed(const int* __restrict__ a, const int* __restrict__ b, i64 n,
              double* __restrict__ partials, double* __restrict__ out,
              unsigned* __restrict__ done) {
    __shared__ double red[WARPS];
    __shared__ u64 redc[WARPS];
    unsigned c = 0;
    if (b)
        for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK)
            c += a[i] != b[i];
    const u64 tot = block_count(c, redc);
    if (threadIdx.x == 0) partials[blockIdx.x] = (double)tot;  // exact below 2^53
    if (last_block_done(done)) {
        const double all = block_sum_partials(partials, gridDim.x, red);
        if (threadIdx.x == 0) *out = b ? all : (double)n;
    }
}

template <typename S>
__global__ void __launch_bounds__(BLOCK)
store_labels(const int* __restrict__ labels, const S* __restrict__ old, S* __restrict__ out,
             i64 m, u64* __restrict__ changed) {
    __shared__ u64 redc[WARPS];
    unsigned count = 0;
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < m; i += (i64)gridDim.x * BLOCK) {
        const S now = (S)labels[i];
        if (old) count += old[i] != now;
        out[i] = now;
    }
    const u64 tot = block_count(count, redc);
    if (threadIdx.x == 0 && tot) atomicAdd(changed, tot);
}

// max |x_j| per feature as float64 bits (non-negative doubles order like their bits). The
// stride over the flattened X is a multiple of d, so each thread keeps one feature. A batch
// of problems along the grid's y: problem y's `total` values start problem_stride values
// after problem y - 1's, and its d maxima d words after y - 1's.
template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
column_absmax(const XT* __restrict__ X, i64 total, int d, u64* __restrict__ out,
              i64 problem_stride) {
    X += (i64)blockIdx.y * problem_stride;
    out += (i64)blockIdx.y * d;
    const i64 tid = (i64)blockIdx.x * BLOCK + threadIdx.x;
    const i64 threads = (i64)gridDim.x * BLOCK;
    const i64 stride = threads / d * d;  // the host launches at least d threads
    if (tid >= stride) return;
    double m = 0.0;
    for (i64 e = tid; e < total; e += stride) {
        const double v = fabs((double)xval<T>(X + e));
        if (v > m) m = v;
    }
    if (m > 0.0) atomicMax(out + tid % d, (u64)__double_as_longlong(m));
}

// Power-of-two scale per feature (and for the weights, last) such that every cluster's
// fixed-point hi word stays below 2^62: bound = max|x_j| * total weight (the weight itself for
// the last), scale = 2^(61 - e) with bound < 2^e, clamped to 2^+-1000; 1 where bound is 0 or
// not finite. w_total null: the total weight is w_default (n, for unit weights). One block.
__global__ void fixed_point_scales(const u64* __restrict__ absmax_bits,
                                   const double* __restrict__ w_total, double w_default, int d,
                                   double* __restrict__ scale, double* __restrict__ inv_scale) {
    const double wt = w_total ? *w_total : w_default;
    for (int j = threadIdx.x; j <= d; j += blockDim.x) {
        const double b = j < d ? __longlong_as_double((i64)absmax_bits[j]) * wt : wt;
        double s = 1.0;
        if (b > 0.0 && b <= 1.7976931348623157e308) {
            int e;
            frexp(b, &e);
            s = ldexp(1.0, max(-1000, min(1000, 61 - e)));
        }
        scale[j] = s;
        inv_scale[j] = 1.0 / s;
    }
}

// Per thread (one feature each: the stride over the flattened chunk is a multiple of d) the
// float64 sum of its values, and with `shift` the sum of (x - shift_j)^2; written per thread
// (the host adds the partials in a fixed order). A batch of problems along the grid's y:
// problem y's `total` values start problem_stride values after problem y - 1's, its shift
// d values and its partials `stride` values after y - 1's.
template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
column_moments(const XT* __restrict__ X, i64 total, int d, const double* __restrict__ shift,
               double* __restrict__ part_sum, double* __restrict__ part_sq,
               i64 problem_stride) {
    const i64 tid = (i64)blockIdx.x * BLOCK + threadIdx.x;
    const i64 stride = (i64)gridDim.x * BLOCK / d * d;
    if (tid >= stride) return;
    X += (i64)blockIdx.y * problem_stride;
    if (shift) shift += (i64)blockIdx.y * d;
    part_sum += (i64)blockIdx.y * stride;
    part_sq += (i64)blockIdx.y * stride;
    const double s = shift ? shift[tid % d] : 0.0;
    double a = 0.0, q = 0.0;
    i64 e = tid;
    // eight loads in flight per thread before the adds (in the same order as one at a
    // time): 2 blocks per SM wait on their loads (F1's statistics, 4 GB: mean, variance
    // and centering, took 12.0 ms on an H100 with one load in flight, 8.2 with four)
    for (; e + 7 * stride < total; e += 8 * stride) {
        double v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = (double)xval<T>(X + e + u * stride);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            a += v[u];
            q += (v[u] - s) * (v[u] - s);
        }
    }
    for (; e < total; e += stride) {
        const double v = (double)xval<T>(X + e);
        a += v;
        q += (v - s) * (v - s);
    }
    part_sum[tid] = a;
    part_sq[tid] = q;
}

__global__ void __launch_bounds__(BLOCK)
count_labels(const int* __restrict__ labels, i64 n, u64* __restrict__ counts) {
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK)
        atomicAdd(counts + labels[i], 1ull);
}
