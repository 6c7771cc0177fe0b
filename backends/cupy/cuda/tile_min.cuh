// The tensor-core kernels' running first minimum (fused_tf32.cu, fused_mma.cu, and per row,
// row_first_min, fused_wgmma.cu): each thread owns one cell of rbest/ridx (row stride RS) for
// each of its 2 MT rows, min over the column blocks it has seen; finish_rows (common.cuh)
// then merges a row's cells.
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

// ||c||^2 of the columns a thread's C fragments hold: cbase + 8 nt, + 1 (cbase = the column
// block's first column + 2t).
template <int NT>
__device__ __forceinline__ void fragment_norms(const float* __restrict__ cnorm, int cbase,
                                               float2 (&cn)[NT]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        cn[nt] = *reinterpret_cast<const float2*>(cnorm + cbase + nt * 8);
}

// One row's running first minimum over a column block (mma C fragments c0..c3 at (g, 2t),
// (g, 2t+1), (g+8, 2t), (g+8, 2t+1); h = 0 the row g, 1 the row g + 8): dist = fl(acc +
// ||c||^2), columns ascending from cbase in NT tiles of 8.
template <int NT>
__device__ __forceinline__ void row_first_min(const float (&acc)[NT][4], const float2 (&cn)[NT],
                                              int h, int cbase, float& bst, int& bi) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float dist = __fadd_rn(acc[nt][2 * h + e], e ? cn[nt].y : cn[nt].x);
            if (dist < bst) { bst = dist; bi = cbase + nt * 8 + e; }
        }
}

// The mma.sync kernels' epilogue of a column block: row_first_min of the thread's 2 MT rows
// (the MT row tiles 16 rows apart), kept in its cell of rbest/ridx (row stride RS); ZERO
// clears acc.
template <int MT, int NT, int RS, bool ZERO>
__device__ __forceinline__ void tile_first_min(float (&acc)[MT][NT][4],
                                               const float* __restrict__ cnorm, int cbase,
                                               int rbase, int g, int cell, float* rbest,
                                               int* ridx) {
    float2 cn[NT];
    fragment_norms<NT>(cnorm, cbase, cn);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int at = (rbase + mt * 16 + g + 8 * h) * RS + cell;
            float bst = rbest[at];
            int bi = ridx[at];
            row_first_min<NT>(acc[mt], cn, h, cbase, bst, bi);
            rbest[at] = bst;
            ridx[at] = bi;
        }
    if (ZERO) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    }
}

#endif  // KMEANS_XP_TILE_MIN_CUH
