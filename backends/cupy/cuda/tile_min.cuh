// The tensor-core kernels' running first minimum (fused_tf32.cu, fused_mma.cu): each thread
// owns one cell of rbest/ridx (row stride RS) for each of its 2 MT rows, min over the column
// blocks it has seen; finish_rows (common.cuh) then merges a row's cells.
#ifndef KMEANS_XP_TILE_MIN_CUH
#define KMEANS_XP_TILE_MIN_CUH
#include "common.cuh"

// The thread's cells before the first column block: +inf, index 0.
template <int MT, int RS>
__device__ __forceinline__ void tile_first_min_reset(int rbase, int g, int cell, float* rbest,
                                                     int* ridx) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int at = (rbase + mt * 16 + g + 8 * h) * RS + cell;
            rbest[at] = pos_inf<float>();
            ridx[at] = 0;
        }
}

// The tensor-core kernels' epilogue of a column block (mma C fragments c0..c3 at (g, 2t),
// (g, 2t+1), (g+8, 2t), (g+8, 2t+1)): dist = fl(acc + ||c||^2), the running first minimum of
// the thread's 2 MT rows in its cell of rbest/ridx (row stride RS), columns ascending from
// cbase (block's first column + 2t) in NT tiles of 8; ZERO clears acc.
template <int MT, int NT, int RS, bool ZERO>
__device__ __forceinline__ void tile_first_min(float (&acc)[MT][NT][4],
                                               const float* __restrict__ cnorm, int cbase,
                                               int rbase, int g, int cell, float* rbest,
                                               int* ridx) {
    float2 cn[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        cn[nt] = *reinterpret_cast<const float2*>(cnorm + cbase + nt * 8);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int at = (rbase + mt * 16 + g + 8 * h) * RS + cell;
            float bst = rbest[at];
            int bi = ridx[at];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float dist = __fadd_rn(acc[mt][nt][2 * h + e], e ? cn[nt].y : cn[nt].x);
                    if (dist < bst) { bst = dist; bi = cbase + nt * 8 + e; }
                    if (ZERO) acc[mt][nt][2 * h + e] = 0.0f;
                }
            rbest[at] = bst;
            ridx[at] = bi;
        }
}

#endif  // KMEANS_XP_TILE_MIN_CUH
