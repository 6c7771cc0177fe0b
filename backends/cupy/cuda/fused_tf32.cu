// cupy-fused, precision="tf32" (float32 only, compute capability >= 8.0; NOT bit-exact FP32):
// the fused tensor-core assignment kernel, and the argmin over rows of a distance chunk that
// cuBLAS computed in TF32 (tf32_kernel="cublas").
#include "common.cuh"
#include "tile_min.cuh"

// ---------------------------------------------------------------------------------------------
// (a) tf32 option, fused: the distance GEMM on the tensor cores (mma.sync m16n8k8, TF32 inputs
//     rounded by tf32_rna (common.cuh), FP32 accumulation) with the argmin in its epilogue, so
//     the n x k distances never leave the SM. Block tile BM = 128 points x BN = 128 centers,
//     8 warps as 2 (points) x 4 (centers), each warp 64 x 32 = 4 x 4 mma tiles; K in steps of
//     16 through double-buffered shared tiles (the next step's global loads in flight in
//     registers). Operands: X (n, d) and -2C^T (d, kpad) as for assign_gemm, ||c||^2 added in
//     FP32 in the epilogue. Fragment layouts (PTX ISA, mma.m16n8k8 .tf32), g = lane / 4,
//     t = lane % 4: A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B b0 (k=t, n=g),
//     b1 (k=t+4, n=g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1). Shared
//     strides (20 and 136 words) make every fragment load conflict-free. Not bit-exact FP32.
// ---------------------------------------------------------------------------------------------
// x's TF32 bits as mma.sync takes them (common.cuh's rounding, as the v2 kernel's)
__device__ __forceinline__ unsigned to_tf32(float x) { return __float_as_uint(tf32_rna(x)); }

// (TF32 tensor cores exist from sm_80 on; the host never launches this kernel below that, and
// the guards keep the module compiling for older GPUs, where the other kernels still run.)
__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();
#endif
}

template <bool VEC>
__global__ void __launch_bounds__(256, 2)
assign_tf32(const float* __restrict__ X, const float* __restrict__ W,
            const float* __restrict__ m2ct, const float* __restrict__ cnorm, int n_rows, int d,
            int kpad, const int* __restrict__ labels_old, int* __restrict__ labels,
            float* __restrict__ min_sq, double* __restrict__ block_inertia,
            u64* __restrict__ counter, const bool* __restrict__ skip, i64 ops_b) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    to_problem(ops_b, kpad, m2ct, cnorm);  // (a batch: problem blockIdx.y's centers,
    const i64 n = problem_end(n_rows);       // its rows up to here; common.cuh)
    constexpr int BM = 128, BN = 128, BK = 16;
    constexpr int SA = BK + 4;     // As row stride (words): g * 20 + t hits 32 banks
    constexpr int SB = BN + 8;     // Bs row stride (words): t * 136 + g hits 32 banks
    constexpr int RS = 20;         // running-best row stride, g * 20 + (wn * 4 + t) likewise
    // 58368 bytes of dynamic shared memory (TF32_MMA_SMEM on the host; over the 48 KB a
    // static allocation may take): As[2][BM][SA], Bs[2][BK][SB], rbest[BM*RS], ridx[BM*RS]
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
    auto As = reinterpret_cast<unsigned (*)[BM][SA]>(smem);
    auto Bs = reinterpret_cast<unsigned (*)[BK][SB]>(smem + 2 * BM * SA * 4);
    float* rbest = reinterpret_cast<float*>(smem + (2 * BM * SA + 2 * BK * SB) * 4);
    int* ridx = reinterpret_cast<int*>(rbest + BM * RS);
    __shared__ double red[8];
    __shared__ u64 redc[8];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm*64.., columns wn*32..
    const i64 row0 = problem_row0(n_rows) + (i64)blockIdx.x * BM;

    // running best per (row, column group wn*4 + t); each cell belongs to one thread
    tile_first_min_reset<4, RS>(wm * 64, g, wn * 4 + t, rbest, ridx);

    float ra[2][4], rb[2][4];  // the next K step's tiles, in flight
    auto load_tiles = [&](int k0, int col0) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, m = e >> 2, kq = e & 3;   // A: 128 rows x 4 float4
            const i64 gx = row0 + m;
            const int gk = k0 + kq * 4;
            const int cnt = gx < n ? max(0, min(4, d - gk)) : 0;
            ldg_vec<float, VEC>(X + (gx < n ? gx : 0) * d + (cnt > 0 ? gk : 0), cnt, ra[q]);
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, kk = e >> 5, cq = e & 31;  // B: 16 rows x 32 float4
            const int gk = k0 + kk;
            ldg_vec<float, true>(m2ct + (i64)(gk < d ? gk : 0) * kpad + col0 + cq * 4,
                                 gk < d ? 4 : 0, rb[q]);
        }
    };
    auto store_tiles = [&](int buf) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, m = e >> 2, kq = e & 3;
            uint4 v;
            v.x = to_tf32(ra[q][0]); v.y = to_tf32(ra[q][1]);
            v.z = to_tf32(ra[q][2]); v.w = to_tf32(ra[q][3]);
            *reinterpret_cast<uint4*>(&As[buf][m][kq * 4]) = v;
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int e = tid + q * 256, kk = e >> 5, cq = e & 31;
            uint4 v;
            v.x = to_tf32(rb[q][0]); v.y = to_tf32(rb[q][1]);
            v.z = to_tf32(rb[q][2]); v.w = to_tf32(rb[q][3]);
            *reinterpret_cast<uint4*>(&Bs[buf][kk][cq * 4]) = v;
        }
    };

    const int nk = (d + BK - 1) / BK;
    for (int col0 = 0; col0 < kpad; col0 += BN) {
        float acc[4][4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

        load_tiles(0, col0);
        store_tiles(0);
        __syncthreads();
        for (int kt = 0; kt < nk; ++kt) {
            const int buf = kt & 1;
            const bool more = kt + 1 < nk;
            if (more) load_tiles((kt + 1) * BK, col0);
#pragma unroll
            for (int kb = 0; kb < BK; kb += 8) {
                unsigned a[4][4], b[4][2];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
                    const int r = wm * 64 + mt * 16 + g;
                    a[mt][0] = As[buf][r][kb + t];
                    a[mt][1] = As[buf][r + 8][kb + t];
                    a[mt][2] = As[buf][r][kb + t + 4];
                    a[mt][3] = As[buf][r + 8][kb + t + 4];
                }
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const int c = wn * 32 + nt * 8 + g;
                    b[nt][0] = Bs[buf][kb + t][c];
                    b[nt][1] = Bs[buf][kb + t + 4][c];
                }
#pragma unroll
                for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) mma_tf32(acc[mt][nt], a[mt], b[nt]);
            }
            if (more) store_tiles(buf ^ 1);
            __syncthreads();
        }
        // epilogue: + ||c||^2, running first-minimum over this thread's 8 columns (ascending)
        tile_first_min<4, 4, RS, false>(acc, cnorm, col0 + wn * 32 + 2 * t, wm * 64, g,
                                        wn * 4 + t, rbest, ridx);
    }

    // the 16 column groups of a row hold disjoint column sets
    __syncthreads();
    finish_rows<float, BM, RS>(rbest, ridx, row0, n, d, X, W, labels_old, labels, min_sq,
                               red, redc, block_inertia, counter);
}

// ---------------------------------------------------------------------------------------------
// (a) tf32 option: argmin over rows of G = X_chunk @ (-2 C^T) computed by cuBLAS (TF32 tensor
//     cores), one warp per row reading G once in 16-byte pieces (kpad is a multiple of 128,
//     so rows are aligned and the padding columns, ||c||^2 = inf, never win). Not bit-exact
//     FP32: G's products are rounded to TF32.
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(BLOCK)
argmin_rows(const T* __restrict__ G, const T* __restrict__ cnorm, int rows, int kpad, int k,
            i64 row0, const T* __restrict__ X, int d, const T* __restrict__ W,
            const int* __restrict__ labels_old, int* __restrict__ labels,
            T* __restrict__ min_sq, double* __restrict__ block_inertia,
            u64* __restrict__ counter, const bool* __restrict__ skip) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    constexpr int V = 16 / sizeof(T);
    __shared__ double red[WARPS];
    __shared__ u64 redc[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double inertia = 0.0;
    unsigned changed = 0;
    for (int r = blockIdx.x * WARPS + warp; r < rows; r += gridDim.x * WARPS) {
        const T* g = G + (i64)r * kpad;
        T b = pos_inf<T>();
        int bi = 0x7fffffff;
        for (int c0 = lane * V; c0 < k; c0 += 32 * V) {
            T gv[V], cv[V];
            lds_vec<T, V>(g + c0, gv);
            lds_vec<T, V>(cnorm + c0, cv);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const T dist = add_rn(gv[v], cv[v]);
                if (dist < b) { b = dist; bi = c0 + v; }
            }
        }
        const i64 gx = row0 + r;
        T xn = (T)0;
        for (int j = lane; j < d; j += 32) {
            T xv = X[gx * d + j];
            xn = add_rn(xn, mul_rn(xv, xv));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            T ob = __shfl_xor_sync(FULL_MASK, b, o);
            int oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (ob < b || (ob == b && oi < bi)) { b = ob; bi = oi; }
            xn = add_rn(xn, __shfl_xor_sync(FULL_MASK, xn, o));
        }
        if (bi == 0x7fffffff) bi = 0;  // only when every distance is NaN
        if (lane == 0)
            store_point<T>(gx, bi, b, xn, weight_at(W, gx), labels_old, labels, min_sq,
                           changed, inertia);
    }
    store_block_totals(inertia, changed, red, redc, block_inertia, counter);
}
