// cupy-fused, d > 16: the GEMM-like assignment kernel with the argmin in its epilogue
// (common.cuh's finish_rows: label, distance, inertia partial, changed labels).
#include "common.cuh"

// ---------------------------------------------------------------------------------------------
// (a) any d: register-blocked SIMT GEMM tile (BM points x BN centers, BK features per step,
//     TM x TN outputs per thread) with the argmin in its epilogue. Accumulators start at 0 and
//     take the features in order, so each distance has the small-d kernel's (and OpenBLAS's)
//     exact rounding. Centers come as -2 C^T (d, kpad) and ||c||^2 (kpad), padded with
//     ||c||^2 = inf so that padding columns never win.
//     Shared tiles are double-buffered: the next K step's global loads are in flight (in
//     registers) while the current one is multiplied, one barrier per K step. With VEC (d a
//     multiple of the 16-byte vector and X 16-byte aligned) every global load is 16 bytes;
//     the shared-memory operand loads are 16 bytes always. The running (best, index) per row
//     and column group lives in shared memory (each cell owned by one thread), which keeps
//     the 8x8 accumulators, operands and prefetch within 128 registers without spilling.
// ---------------------------------------------------------------------------------------------
template <typename T, int TM, int TN, bool VEC>
__global__ void __launch_bounds__(256, 2)  // two blocks per SM: at most 128 registers
assign_gemm(const T* __restrict__ X, const T* __restrict__ W, const T* __restrict__ m2ct,
            const T* __restrict__ cnorm, int n_rows, int d, int kpad,
            const int* __restrict__ labels_old, int* __restrict__ labels, T* __restrict__ min_sq,
            double* __restrict__ block_inertia, u64* __restrict__ counter,
            const bool* __restrict__ skip, i64 ops_b) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    to_problem(ops_b, kpad, m2ct, cnorm);  // (a batch: problem blockIdx.y's centers,
    const i64 n = problem_end(n_rows);       // its rows up to here; common.cuh)
    constexpr int BM = 16 * TM, BN = 16 * TN, BK = 8, HM = TM / 2, HN = TN / 2;
    constexpr int V = 16 / sizeof(T);              // values per 16-byte vector
    constexpr int APAD = V;                        // As rows stay 16-byte aligned
    constexpr int A_VECS = BM * BK / V / 256;      // 16-byte pieces per thread per A tile
    constexpr int B_VECS = BK * BN / V / 256;      // ... per B tile
    constexpr int A_KV = BK / V, B_CV = BN / V;    // pieces per A row / per B row
    // row stride of the running-best cells: HM * RS = 16 (mod 32), so the two rows groups of
    // a warp (ty, ty + 1) fall in different bank halves
    constexpr int RS = HM == 4 ? 20 : 24;
    static_assert(A_VECS >= 1 && B_VECS >= 1 && BM * BK == A_VECS * V * 256 &&
                  BK * BN == B_VECS * V * 256, "tile shape");
    __shared__ __align__(16) T As[2][BK][BM + APAD];
    __shared__ __align__(16) T Bs[2][BK][BN];
    __shared__ T rbest[BM * RS];
    __shared__ int ridx[BM * RS];
    __shared__ double red[8];
    __shared__ u64 redc[8];

    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const i64 row0 = problem_row0(n_rows) + (i64)blockIdx.x * BM;

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = i < HM ? ty * HM + i : BM / 2 + ty * HM + (i - HM);
        rbest[r * RS + tx] = pos_inf<T>();
        ridx[r * RS + tx] = 0;
    }

    T ra[A_VECS][V], rb[B_VECS][V];  // the next K step's tiles, in flight
    auto load_tiles = [&](int k0, int col0) {
#pragma unroll
        for (int q = 0; q < A_VECS; ++q) {
            const int e = tid + q * 256, m = e / A_KV, kv = e % A_KV;
            const i64 gx = row0 + m;
            const int gk = k0 + kv * V;
            const int cnt = gx < n ? max(0, min(V, d - gk)) : 0;
            ldg_vec<T, VEC>(X + (gx < n ? gx : 0) * d + (cnt > 0 ? gk : 0), cnt, ra[q]);
        }
#pragma unroll
        for (int q = 0; q < B_VECS; ++q) {
            const int e = tid + q * 256, kk = e / B_CV, cv = e % B_CV;
            const int gk = k0 + kk;
            ldg_vec<T, true>(m2ct + (i64)(gk < d ? gk : 0) * kpad + col0 + cv * V,
                             gk < d ? V : 0, rb[q]);
        }
    };
    auto store_tiles = [&](int buf) {
#pragma unroll
        for (int q = 0; q < A_VECS; ++q) {
            const int e = tid + q * 256, m = e / A_KV, kv = e % A_KV;
#pragma unroll
            for (int v = 0; v < V; ++v) As[buf][kv * V + v][m] = ra[q][v];
        }
#pragma unroll
        for (int q = 0; q < B_VECS; ++q) {
            const int e = tid + q * 256, kk = e / B_CV, cv = e % B_CV;
            sts_vec<T>(&Bs[buf][kk][cv * V], rb[q]);
        }
    };

    const int nk = (d + BK - 1) / BK;
    for (int col0 = 0; col0 < kpad; col0 += BN) {
        T acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = (T)0;

        load_tiles(0, col0);
        store_tiles(0);
        __syncthreads();
        for (int kt = 0; kt < nk; ++kt) {
            const int buf = kt & 1;
            const bool more = kt + 1 < nk;
            if (more) load_tiles((kt + 1) * BK, col0);
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                T a[TM], b[TN];
                lds_vec<T, HM>(&As[buf][kk][ty * HM], a);
                lds_vec<T, HM>(&As[buf][kk][BM / 2 + ty * HM], a + HM);
                lds_vec<T, HN>(&Bs[buf][kk][tx * HN], b);
                lds_vec<T, HN>(&Bs[buf][kk][BN / 2 + tx * HN], b + HN);
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fma_rn(a[i], b[j], acc[i][j]);
            }
            if (more) store_tiles(buf ^ 1);
            __syncthreads();
        }
        // epilogue: + ||c||^2, running first-minimum over this thread's columns (ascending)
        T cn[TN];
        lds_vec<T, HN>(cnorm + col0 + tx * HN, cn);
        lds_vec<T, HN>(cnorm + col0 + BN / 2 + tx * HN, cn + HN);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int r = i < HM ? ty * HM + i : BM / 2 + ty * HM + (i - HM);
            T b = rbest[r * RS + tx];
            int bi = ridx[r * RS + tx];
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int col = col0 + (j < HN ? tx * HN + j : BN / 2 + tx * HN + (j - HN));
                const T dist = add_rn(acc[i][j], cn[j]);
                if (dist < b) { b = dist; bi = col; }
            }
            rbest[r * RS + tx] = b;
            ridx[r * RS + tx] = bi;
        }
    }

    // the 16 threads sharing a row hold disjoint column sets
    __syncthreads();
    finish_rows<T, BM, RS>(rbest, ridx, row0, n, d, X, W, labels_old, labels, min_sq, red,
                           redc, block_inertia, counter);
}
