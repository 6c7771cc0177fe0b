// cupy-kernels, cupy-chunked and host streaming: per-cluster float64 sums of w * x and of w
// (added to sums/wsum, which hold zeros or earlier chunks' sums). Labels int32; W null: unit.
//   cluster_sums_shared<T>: privatised in shared memory per block (a warp whose 32 points
//     share a label sums them by shuffles and adds once), flushed with one global atomicAdd
//     per value and block; needs k * (d + 1) doubles of dynamic shared memory.
//   cluster_sums_global<T>: one thread per point, global atomics (k * (d + 1) too large).
#include "common.cuh"

template <typename T>
__global__ void __launch_bounds__(BLOCK)
cluster_sums_shared(const T* __restrict__ X, const int* __restrict__ labels,
                    const T* __restrict__ W, i64 n, int d, int k, double* __restrict__ sums,
                    double* __restrict__ wsum) {
    KMEANS_DYNAMIC_SMEM(double, acc);
    const int words = k * (d + 1);
    for (int e = threadIdx.x; e < words; e += BLOCK) acc[e] = 0.0;
    __syncthreads();
    const i64 step = (i64)gridDim.x * BLOCK;
    for (i64 base = (i64)blockIdx.x * BLOCK; base < n; base += step) {
        const i64 i = base + threadIdx.x;
        const bool valid = i < n;
        const int lab = valid ? labels[i] : -1;
        const double wd = valid ? (double)weight_at(W, i) : 0.0;
        const int first = __shfl_sync(FULL_MASK, lab, 0);
        const bool same = __all_sync(FULL_MASK, valid && lab == first);
        if (same) {
            for (int f = 0; f <= d; ++f) {
                double v = f < d ? wd * (double)X[i * d + f] : wd;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
                if ((threadIdx.x & 31) == 0 && v != 0.0)
                    atomicAdd(f < d ? acc + (i64)lab * d + f : acc + (i64)k * d + lab, v);
            }
        } else if (valid && wd != 0.0) {
            for (int f = 0; f < d; ++f) atomicAdd(acc + (i64)lab * d + f, wd * (double)X[i * d + f]);
            atomicAdd(acc + (i64)k * d + lab, wd);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < words; e += BLOCK) {
        const double v = acc[e];
        if (v != 0.0) atomicAdd(e < k * d ? sums + e : wsum + (e - k * d), v);
    }
}

template <typename T>
__global__ void __launch_bounds__(BLOCK)
cluster_sums_global(const T* __restrict__ X, const int* __restrict__ labels,
                    const T* __restrict__ W, i64 n, int d, double* __restrict__ sums,
                    double* __restrict__ wsum) {
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK) {
        const double wd = (double)weight_at(W, i);
        if (wd == 0.0) continue;  // a zero weight adds nothing: skip its atomics
        const i64 lab = labels[i];
        for (int f = 0; f < d; ++f) atomicAdd(sums + lab * d + f, wd * (double)X[i * d + f]);
        atomicAdd(wsum + lab, wd);
    }
}
