// cupy-fused on the tensor cores, v2 (float32, compute capability >= 8.0): the distance GEMM by
// mma.sync m16n8k8 TF32 with the argmin in its epilogue, for precision="tf32" (one product
// per term: NOT bit-exact FP32) and for the exact option gemm_kernel="3xtf32" (split
// precision: x = x_big + x_small, both TF32, and x.c = small.big + big.small + big.big, the
// small terms first; the lost small.small term and the split's remainder are ~2^-22 of a
// product, below FP32's own accumulation error, so labels agree with the SIMT kernel's up to
// near ties). The v1 kernel (fused_tf32.cu) stays for comparison (tf32_kernel="fused-v1").
//
// What v2 changes, and why (v1: 10.5 ms for W5, n=1M d=128 k=4096, on an H200):
//  - The block's X rows stay in shared memory for the whole pass (RESIDENT, when BM rows of d
//    fit beside the centers' stages), read from global memory and rounded to TF32 once: v1
//    reloaded and reconverted its X tile for every one of the kpad/128 column blocks, which
//    doubled the L2 traffic. Otherwise (large d) X's K slices stream with the centers'.
//  - BM = 256 points per block: every block streams all the centers once, so the L2 traffic
//    of the centers is n/BM * k*d*4 bytes (8 GB for W5 at BM=256, 16 GB at v1's 128).
//  - Centers' operands come from pack_centers already rounded (layout 3: tf32(-2c) rows of
//    (kpad, dk); layout 4: the big part, then the small part): no conversion in the loop.
//  - Centers' tiles go global -> shared by cp.async (no staging registers) through a 3-stage
//    pipeline over the flattened (column block, K step) sequence, so the next column
//    block's first tiles are in flight while this one's epilogue runs.
//  - Warp tile 64 x 64 (8 warps as 4 x 2; 128 accumulators per thread, one block per SM):
//    4 ldmatrix.x4 of A + 4 of B per 32 mma, i.e. 128 bytes of shared memory per mma
//    instead of v1's 192 (64 x 32 tiles), and one instruction per four fragment words.
// Fragment layouts (PTX ISA, m16n8k8 .tf32; g = lane/4, t = lane%4), as v1: A a0 (g,t),
// a1 (g+8,t), a2 (g,t+4), a3 (g+8,t+4); B b0 (k=t,n=g), b1 (k=t+4,n=g); C c0 (g,2t),
// c1 (g,2t+1), c2 (g+8,2t), c3 (g+8,2t+1). ldmatrix.x4 (b16) hands lane L word L%4 of row L/4
// of each 8-row x 16-byte matrix, i.e. (g, t): with matrices (rows 0-7, k 0-3), (rows 8-15,
// k 0-3), (rows 0-7, k 4-7), (rows 8-15, k 4-7) that is a0..a3; B is stored as rows of n
// (k contiguous, like A), so matrices (n 0-7, k 0-3), (n 0-7, k 4-7), (n 8-15, k 0-3),
// (n 8-15, k 4-7) are b0, b1 of two 8-column tiles. Row strides = 4 (mod 8) words keep every
// ldmatrix phase (8 rows x 16 bytes) on 32 distinct banks.
// Epilogue as every GEMM-like kernel: dist = fl(acc + ||c||^2), first minimum per cell in
// ascending columns, padding columns (||c||^2 = inf) never win, then finish_rows.
#include "common.cuh"
#include "cp_async.cuh"
#include "tile_min.cuh"

// -- PTX (the CPU emulator of the tests defines these itself: KMEANS_MMA_EMULATED) -----------
// Tensor cores, ldmatrix's TF32 use and cp.async need sm_80; the host never launches these
// kernels below that, and the guards keep the module compiling for older GPUs.
#ifndef KMEANS_MMA_EMULATED
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define KMEANS_MMA_PTX 1
#else
#define KMEANS_MMA_PTX 0
#endif

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
#if KMEANS_MMA_PTX
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
#else
    r[0] = r[1] = r[2] = r[3] = addr;
    __trap();
#endif
}

__device__ __forceinline__ void mma_tf32_16x8x8(float (&c)[4], const unsigned (&a)[4],
                                                unsigned b0, unsigned b1) {
#if KMEANS_MMA_PTX
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

#endif  // KMEANS_MMA_EMULATED

// -- the kernel ------------------------------------------------------------------------------
// Block tile BM x BN, K in steps of BK (32; 16 for 3xTF32, whose stages hold two B parts).
constexpr int MMA_BM = 256, MMA_BN = 128, MMA_STAGES = 3;

// One K step of 8 for the warp's 64 x 64 tile: A fragments from shared (rounded there already
// when A_ROUNDED, else rounded, and for SPLIT split, here), B from the stage (big, then at
// + b_part bytes the small part).
template <int SPLIT, bool A_ROUNDED>
__device__ __forceinline__ void mma_k8(float (&acc)[4][8][4], unsigned a_addr, int a_stride,
                                       unsigned b_addr, int b_stride, int b_part) {
    unsigned a[4][4], as[4][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
        ldsm_x4(a[mt], a_addr + mt * 16 * a_stride * 4);
        if constexpr (!A_ROUNDED) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float x = __uint_as_float(a[mt][i]);
                const float big = tf32_rna(x);
                a[mt][i] = __float_as_uint(big);
                // x - big is exact (big is x with its low bits cleared, rounded)
                if constexpr (SPLIT) as[mt][i] = __float_as_uint(tf32_rna(__fsub_rn(x, big)));
            }
        }
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {  // two 8-column tiles per ldmatrix.x4 of B
        unsigned b[4];
        ldsm_x4(b, b_addr + np * 16 * b_stride * 4);
        if constexpr (SPLIT) {
            unsigned bs[4];
            ldsm_x4(bs, b_addr + b_part + np * 16 * b_stride * 4);
            // the small terms first, across 8 independent accumulators before each reuse
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                mma_tf32_16x8x8(acc[mt][2 * np], as[mt], b[0], b[1]);
                mma_tf32_16x8x8(acc[mt][2 * np + 1], as[mt], b[2], b[3]);
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                mma_tf32_16x8x8(acc[mt][2 * np], a[mt], bs[0], bs[1]);
                mma_tf32_16x8x8(acc[mt][2 * np + 1], a[mt], bs[2], bs[3]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
            mma_tf32_16x8x8(acc[mt][2 * np], a[mt], b[0], b[1]);
            mma_tf32_16x8x8(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
    }
}

// Operands: X (n, d) FP32; ops = layout 3/4 of pack_centers: rows of dk = roundup(d, 8) words
// per center (kpad rows, zero padding), TF32(-2c) [, then kpad more rows of the small part];
// cnorm (kpad) ||c||^2 in FP32, inf on padding. Dynamic shared memory (bytes; the host's
// fused_plan.mma_smem): 4 * (STAGES * NB * BN * SB + (RESIDENT ? BM * (dk + 4)
// : STAGES * BM * SB) + 2 * BM * 8).
template <int SPLIT, bool RESIDENT, bool VEC>
__global__ void __launch_bounds__(256, 1)  // one block per SM: up to 255 registers
assign_mma(const float* __restrict__ X, const float* __restrict__ W,
           const float* __restrict__ ops, const float* __restrict__ cnorm, int n_rows, int d,
           int kpad, const int* __restrict__ labels_old, int* __restrict__ labels,
           float* __restrict__ min_sq, double* __restrict__ block_inertia,
           u64* __restrict__ counter, const bool* __restrict__ skip, i64 ops_b) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    to_problem(ops_b, kpad, ops, cnorm);  // (a batch: problem blockIdx.y's centers,
    const i64 n = problem_end(n_rows);       // its rows up to here; common.cuh)
    constexpr int BM = MMA_BM, BN = MMA_BN, ST = MMA_STAGES, BK = SPLIT ? 16 : 32;
    constexpr int SB = BK + 4;                 // stage row stride (words), 4 (mod 8)
    constexpr int NB = SPLIT ? 2 : 1;          // parts of the centers' operand
    constexpr int B_WORDS = NB * BN * SB;      // one stage of B
    constexpr int A_WORDS = BM * SB;           // one stage of A (streamed X)
    constexpr int BQ = BK / 4;                 // 16-byte pieces per stage row
    const int dk = (d + 7) & ~7;               // K padded to the mma's 8 (zeros)
    const int SA = RESIDENT ? dk + 4 : SB;     // A row stride (words), 4 (mod 8)
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
    float* const sm = reinterpret_cast<float*>(smem);
    float* const xs = sm + ST * B_WORDS;       // resident X rows, or the A stages
    float* const rbest = xs + (RESIDENT ? BM * SA : ST * A_WORDS);
    int* const ridx = reinterpret_cast<int*>(rbest + BM * 8);
    __shared__ double red[8];
    __shared__ u64 redc[8];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;  // warp tile: rows wm*64.., columns wn*64..
    const i64 row0 = problem_row0(n_rows) + (i64)blockIdx.x * BM;
    const unsigned s_b = smem_u32(smem), s_a = s_b + ST * B_WORDS * 4;

    // running best per (row, column group wn*4 + t): 8 cells a row, each owned by one thread
    tile_first_min_reset<4, 8>(wm * 64, g, wn * 4 + t, rbest, ridx);

    if constexpr (RESIDENT) {
        // the block's rows once, zero beyond n and d; TF32 now (tf32), or FP32 kept for the
        // split, which needs x itself (done per fragment: registers are cheaper than space)
        const int q4 = dk >> 2;
        for (int e = tid; e < BM * q4; e += 256) {
            const int m = e / q4, gk = (e - m * q4) * 4;
            const i64 gx = row0 + m;
            const int cnt = gx < n ? max(0, min(4, d - gk)) : 0;
            float v[4];
            ldg_vec<float, VEC>(X + (gx < n ? gx : 0) * d + (cnt > 0 ? gk : 0), cnt, v);
            float4 q;
            q.x = SPLIT ? v[0] : tf32_rna(v[0]); q.y = SPLIT ? v[1] : tf32_rna(v[1]);
            q.z = SPLIT ? v[2] : tf32_rna(v[2]); q.w = SPLIT ? v[3] : tf32_rna(v[3]);
            *reinterpret_cast<float4*>(xs + m * SA + gk) = q;
        }
    }

    const int nk = (dk + BK - 1) / BK, total = (kpad / BN) * nk;
    // tile `it` of the flattened (column block, K step) sequence into stage it % ST
    auto issue = [&](int it) {
        const int st = it % ST, cb = it / nk, k0 = (it - cb * nk) * BK;
#pragma unroll
        for (int q = 0; q < BN * BQ / 256; ++q) {
            const int e = tid + q * 256, r = e / BQ, gk = k0 + (e % BQ) * 4;
            const bool ok = gk < dk;
            const float* src = ops + (i64)(cb * BN + r) * dk + (ok ? gk : 0);
            const unsigned dst = s_b + (st * B_WORDS + r * SB + (e % BQ) * 4) * 4;
            cp_async16(dst, src, ok);
            if constexpr (SPLIT) cp_async16(dst + BN * SB * 4, src + (i64)kpad * dk, ok);
        }
        if constexpr (!RESIDENT) {
            if constexpr (VEC) {
#pragma unroll
                for (int q = 0; q < BM * BQ / 256; ++q) {
                    const int e = tid + q * 256, m = e / BQ, gk = k0 + (e % BQ) * 4;
                    const bool ok = row0 + m < n && gk < d;
                    cp_async16(s_a + (st * A_WORDS + m * SA + (e % BQ) * 4) * 4,
                               X + (ok ? (row0 + m) * d + gk : 0), ok);
                }
            } else {
#pragma unroll 4
                for (int q = 0; q < BM * BK / 256; ++q) {
                    const int e = tid + q * 256, m = e / BK, gk = k0 + e % BK;
                    const bool ok = row0 + m < n && gk < d;
                    cp_async4(s_a + (st * A_WORDS + m * SA + e % BK) * 4,
                              X + (ok ? (row0 + m) * d + gk : 0), ok);
                }
            }
        }
    };

    float acc[4][8][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (s < total) issue(s);
        cp_async_commit();  // empty groups too: one group per tile slot keeps the count
    }
    // this lane's ldmatrix row address within the warp's tile (see the header comment)
    const int lr = lane & 7, lq = lane >> 3;
    const unsigned a_lane = ((wm * 64 + lr + 8 * (lq & 1)) * SA + 4 * (lq >> 1)) * 4;
    const unsigned b_lane = ((wn * 64 + 8 * (lq >> 1) + lr) * SB + 4 * (lq & 1)) * 4;

    for (int it = 0; it < total; ++it) {
        cp_async_wait<ST - 2>();  // tile it has landed (for this thread) ...
        __syncthreads();          // ... for all; and stage (it - 1) % ST is free again
        if (it + ST - 1 < total) issue(it + ST - 1);
        cp_async_commit();
        const int st = it % ST, cb = it / nk, kt = it - cb * nk;
        const unsigned a_addr = RESIDENT ? s_a + kt * BK * 4 + a_lane
                                         : s_a + st * A_WORDS * 4 + a_lane;
        const unsigned b_addr = s_b + st * B_WORDS * 4 + b_lane;
        const int kend = dk - kt * BK;  // a multiple of 8
#pragma unroll
        for (int kb = 0; kb < BK; kb += 8)
            if (kb < kend)
                mma_k8<SPLIT, RESIDENT && !SPLIT>(acc, a_addr + kb * 4, SA, b_addr + kb * 4, SB,
                                                  BN * SB * 4);
        if (kt != nk - 1) continue;

        // epilogue of column block cb: + ||c||^2, running first minimum (ascending columns)
        tile_first_min<4, 8, 8, true>(acc, cnorm, cb * BN + wn * 64 + 2 * t, wm * 64, g,
                                      wn * 4 + t, rbest, ridx);
    }

    // the 8 column groups of a row hold disjoint column sets
    __syncthreads();
    finish_rows<float, BM, 8, 8>(rbest, ridx, row0, n, d, X, W, labels_old, labels, min_sq,
                                 red, redc, block_inertia, counter);
}
