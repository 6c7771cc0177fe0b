// cupy-kernels: nearest center of every point, no n x k array. The centers' operands (rows of
// -2c, ||c||^2 and padding, see centers.cu) come from pack_centers; labels are int32.
//   nearest_small<T, D, P>: d = D <= 4 at compile time, P points per thread in registers,
//     the operands through shared memory (loaded once per block when all k fit).
//   nearest_tiled<T, W>: 4 < d <= W, one point per thread in W registers (predicated past
//     d), operands tiled through shared memory.
//   nearest_mem<T>: wider d, the point read from memory (L1) for every center.
#include "common.cuh"

constexpr int NEAREST_TILE_BYTES = 32 * 1024;

template <typename T, int D, int P>
__global__ void __launch_bounds__(BLOCK)
nearest_small(const T* __restrict__ X, const T* __restrict__ ops, i64 n, int k,
              int* __restrict__ labels, T* __restrict__ min_sq) {
    constexpr int S = ops_stride<T>(D);
    constexpr int TC = NEAREST_TILE_BYTES / (S * (int)sizeof(T));
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
            for (int j = 0; j < D; ++j) x[p][j] = valid[p] ? X[i * D + j] : (T)0;
        }
        T best[P];
        int bidx[P];
        nearest_in_tiles<T, D, P>(x, ops, k, TC, resident, tile, best, bidx);
#pragma unroll
        for (int p = 0; p < P; ++p) {
            if (!valid[p]) continue;
            const i64 i = base + p * BLOCK + threadIdx.x;
            labels[i] = bidx[p];
            min_sq[i] = with_point_norm(best[p], sq_norm_seq<T, D>(x[p]));
        }
    }
}

template <typename T, int W>
__global__ void __launch_bounds__(BLOCK)
nearest_tiled(const T* __restrict__ X, const T* __restrict__ ops, i64 n, int k, int d,
              int* __restrict__ labels, T* __restrict__ min_sq) {
    constexpr int V = vec_len<T>();
    __shared__ __align__(16) T tile[NEAREST_TILE_BYTES / sizeof(T)];
    const int S = ops_stride<T>(d);
    const int tc = (NEAREST_TILE_BYTES / (int)sizeof(T)) / S;
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
        for (int f = 0; f < W; ++f) x[f] = (valid && f < d) ? X[i * d + f] : (T)0;
        T best = pos_inf<T>();
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
                T acc = (T)0;
#pragma unroll
                for (int v = 0; v < W; v += V) {
                    if (v < d) {
                        T o[V];
                        lds_vec<T, V>(op + v, o);
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
            T xn = (T)0;
#pragma unroll
            for (int f = 0; f < W; ++f)
                if (f < d) xn = add_rn(xn, mul_rn(x[f], x[f]));
            labels[i] = bidx;
            min_sq[i] = with_point_norm(best, xn);
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(BLOCK)
nearest_mem(const T* __restrict__ X, const T* __restrict__ ops, i64 n, int k, int d,
            int* __restrict__ labels, T* __restrict__ min_sq) {
    const int S = ops_stride<T>(d);
    for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK) {
        const T* x = X + i * d;
        T best = pos_inf<T>();
        int bidx = 0;
        for (int c = 0; c < k; ++c) {
            const T* op = ops + (i64)c * S;
            T acc = (T)0;
            for (int f = 0; f < d; ++f) acc = fma_rn(__ldg(x + f), __ldg(op + f), acc);
            const T dist = add_rn(acc, __ldg(op + d));
            if (dist < best) {
                best = dist;
                bidx = c;
            }
        }
        T xn = (T)0;
        for (int f = 0; f < d; ++f) xn = add_rn(xn, mul_rn(x[f], x[f]));
        labels[i] = bidx;
        min_sq[i] = with_point_norm(best, xn);
    }
}
