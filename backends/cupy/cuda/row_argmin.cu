// cupy-chunked: argmin over a (rows, width) block of -2 x.c computed by cuBLAS. One warp per
// row: each lane scans columns lane, lane + 32, ... adding ||c||^2 (one rounding, as numpy's
// `dist += c_norm`) and keeps its first minimum; the warp reduces by shuffles, preferring the
// lower column on ties. Lane 0 merges the row's minimum into the running minimum over center
// tiles (strictly smaller wins, so earlier tiles win ties). Labels int32.
#include "common.cuh"

template <typename T>
__global__ void row_argmin_shifted(const T* __restrict__ dist, const T* __restrict__ c_norm,
                                   i64 rows, int width, int col0, int first,
                                   T* __restrict__ run_min, int* __restrict__ labels) {
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 n_warps = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 r = warp; r < rows; r += n_warps) {
        const T* row = dist + r * (i64)width;
        T best = pos_inf<T>();
        int best_j = -1;
        if (lane < width) {
            best = add_rn(row[lane], c_norm[lane]);
            best_j = lane;
        }
        for (int j = lane + 32; j < width; j += 32) {
            const T v = add_rn(row[j], c_norm[j]);
            if (v < best) {
                best = v;
                best_j = j;
            }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            const T other = __shfl_down_sync(FULL_MASK, best, offset);
            const int other_j = __shfl_down_sync(FULL_MASK, best_j, offset);
            if (other_j >= 0 && (best_j < 0 || other < best ||
                                 (other == best && other_j < best_j))) {
                best = other;
                best_j = other_j;
            }
        }
        if (lane == 0 && (first || best < run_min[r])) {
            run_min[r] = best;
            labels[r] = col0 + best_j;
        }
    }
}
