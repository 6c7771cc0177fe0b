// cupy-fused on Hopper's asynchronous tensor cores: wgmma (sm_90a only; NVRTC compiles this
// file for it: the nvrtc-arch line below, read by common.arch_target), the TF32 distance GEMM
// with the argmin in its epilogue, for precision="tf32" on a compute capability 9.0 GPU
// (tf32_kernel="auto" picks it there; the mma.sync kernel of fused_mma.cu everywhere else), and
// in split precision (SPLIT, 3xTF32) for the exact float32 path on such a GPU. Same operands,
// epilogue and results contract as fused_mma.cu's TF32 kernel: dist = fl(x.tf32(-2c) +
// ||c||^2) with x rounded to TF32 (rna), the first minimum per row in ascending columns, then
// finish_rows.
//
// Why another kernel: mma.sync keeps a warp's 64 x 64 tile's 128 accumulators in registers
// (one block of 8 warps per SM), and each warp waits for its own mma results: 43% of the tensor
// pipe on the H200 at W5 (ncu). wgmma runs asynchronously for a whole warpgroup (128 threads)
// from shared memory, so each warpgroup issues column block cb's products and, while they
// run, does column block cb - 1's argmin from a second set of accumulators (ping-pong). A
// column block's products are one commit group, and no product is in flight across a branch
// or the loop's back edge: where one was (a wait behind `if (cb > 0)`, a break in the K loop),
// ptxas waited for each group in turn, and the argmin ran with the tensor cores idle.
//
// Block: 2 warpgroups; warpgroup w owns rows w*64*MT.. (MT m64 tiles), every column block of
// BN centers. TF32: X's BM = 128 MT rows stay in shared memory for the whole pass (rounded
// once); MT = 2, BN = 64 (half the centers' L2 traffic of BM = 128; measured faster than
// MT = 1, BN = 128, and than X in registers with BN = 128: 5.27 against 4.86 ms at W5).
// 3xTF32: each thread's A fragments of X's two parts stay in registers (wgmma takes A from
// there; 128 registers at d = 128); MT = 1, BN = 64: shared memory holds only the centers'
// two parts, and a product reads half the shared bytes it would with A in shared memory (X's
// parts there left room for 32 centers a block: 18.2 ms at W5 against 10.8 this way).
// The centers stream through WG_STAGES stages of BN rows x all of K (cp.async), loaded two
// column blocks ahead. Each thread keeps its rows' running minimum in registers; the stages
// take them for finish_rows at the end.
// Shared layout (wgmma's K-major, 128-byte swizzle): K in atoms of 32 words; an atom holds
// 128-byte rows (32 words of one row of X or one center); 16-byte chunk c of row r sits at
// word r*32 + 4*(c ^ (r & 7)). Descriptor: leading byte offset 16, stride byte offset 1024
// (8 rows), swizzle 128B; a k8 step moves the start address 32 bytes; atoms 1024-byte aligned.
// Half formats (FMT 1 fp16, 2 bf16: precision="fp16"/"bf16"): the same bytes, the same tiles
// and descriptors. An atom's 128-byte row holds 64 halves, a 32-byte K step is a k16 wgmma
// (.f32.f16.f16 / .f32.bf16.bf16, FP32 accumulation); X's float32 rows are rounded to the
// format (round to nearest even) as they enter shared memory; the centers' operand is
// fmt(-c) (layout 5/6 of pack_centers, rows of roundup(d, 16) halves) and cnorm ||c||^2 / 2,
// so the kernel ranks dist / 2 = x.(-c) + ||c||^2 / 2 (-2c could overflow fp16 where c does
// not; halving is exact), and the row's minimum is doubled back for finish_rows.
// Accumulators (m64nN .f32, PTX ISA): warp q of the warpgroup, lane (g = lane/4, t = lane%4):
// d[j][0..3] = (16q + g, 8j + 2t), (16q + g, 8j + 2t + 1), (16q + g + 8, 8j + 2t),
// (16q + g + 8, 8j + 2t + 1): the mma.sync C fragment per 8 columns, so row_first_min applies.
// nvrtc-arch: sm_90a
#include "common.cuh"
#include "cp_async.cuh"
#include "tile_min.cuh"
#include "wgmma.cuh"

constexpr int WG_STAGES = 3;  // centers' stages: a column block loads two blocks ahead

// SPLIT: 3xTF32 (gemm_kernel "auto"/"3xtf32", FP32-accurate, as fused_mma.cu's split): X and
// the centers in two TF32 parts each (x = big + small; layout 4 of pack_centers), and
// x.c = small.big + big.small + big.big per k8 step, the small terms first; X's parts in
// registers. Dynamic shared memory (bytes; the host's fused_plan.wgmma_smem): 1024
// (alignment) + 4 * NAT * 32 * (SPLIT ? 2 * WG_STAGES * BN : AREG ? WG_STAGES * BN :
// BM + WG_STAGES * BN). NAT = ceil(roundup(d, 8) / 32) atoms of K, a template parameter so
// that every copy and descriptor offset are a constant (d <= 32 NAT). FMT (0 TF32, 1 fp16,
// 2 bf16; not with SPLIT): the format of the operands in shared memory; a half format's atom
// holds 64 values of K (d <= 64 NAT), its K padded to 16 and `ops` holds 16-bit values
// (layouts 5 and 6). AREG (a half format, half_kernel="registers"): each thread's A
// fragments of its MT row tiles in registers for the whole pass, as SPLIT's, and shared
// memory for the centers alone (A in shared memory, the products read it beside B's rows).
// XT: X's storage, float, xhalf or xbf16 (X in the half format FMT computes at: the fit's
// data stored in it); a half 16-byte chunk of X is the shared tile's chunk as it is, so
// X's rows go to shared memory by cp.async (16-byte rows) with nothing to round.
template <int SPLIT, int MT, int BN, int NAT, bool VEC, int FMT = 0, bool AREG = false,
          typename XT = float>
__global__ void __launch_bounds__(256, 1)
assign_wgmma(const XT* __restrict__ X, const float* __restrict__ W,
             const float* __restrict__ ops, const float* __restrict__ cnorm, int n_rows, int d,
             int kpad, const int* __restrict__ labels_old, int* __restrict__ labels,
             float* __restrict__ min_sq, double* __restrict__ block_inertia,
             u64* __restrict__ counter, const bool* __restrict__ skip, i64 ops_b) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    to_problem(ops_b, kpad, ops, cnorm);  // (a batch: problem blockIdx.y's centers,
    const i64 n = problem_end(n_rows);       // its rows up to here; common.cuh)
    constexpr int BM = 128 * MT, NT = BN / 8, RS = 4, NB = SPLIT ? 2 : 1;
    static_assert(BN == 64 && (!SPLIT || MT == 1), "the tiles of fused_plan.wgmma_tile");
    static_assert(FMT == 0 || !SPLIT, "the split is of TF32 only");
    static_assert(!AREG || FMT != 0, "X's half fragments in registers: a half format only");
    constexpr bool XH = sizeof(XT) == 2;   // X in a half format
    static_assert(!XH || FMT == HalfFormat<XT>::value, "half X computes at its own format");
    constexpr bool XSMEM = !SPLIT && !AREG;  // X's rows in shared memory (A by descriptor)
    constexpr int EB = FMT ? 2 : 4;        // bytes of an operand value in shared memory
    constexpr int EC = 16 / EB;            // values in a 16-byte chunk
    constexpr int EA = 8 * EC;             // values of K in an atom's 128-byte row
    KMEANS_DYNAMIC_SMEM(unsigned char, smem_raw);
    __shared__ double red[8];
    __shared__ u64 redc[8];
    const unsigned raw = smem_u32(smem_raw);
    float* const xs = reinterpret_cast<float*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    const int dk = FMT ? (d + 15) & ~15 : (d + 7) & ~7;  // K padded to the step's 8 / 16
    constexpr int nat = NAT;                    // atoms of 32 words
    float* const bs = xs + (XSMEM ? nat * BM * 32 : 0);  // WG_STAGES stages of NB nat BN 32

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // (the warpgroup from a shuffle: the compiler then keeps its descriptors in uniform
    // registers, one add per wgmma instead of a vector-to-uniform move per operand)
    const int wgi = __shfl_sync(FULL_MASK, tid >> 7, 0), q = warp & 3, g = lane >> 2, t = lane & 3;
    const int rbase = wgi * 64 * MT + 16 * q;  // this thread's first row (+ g, + 8, + 64 mt)
    const i64 row0 = problem_row0(n_rows) + (i64)blockIdx.x * BM;
    const int ncb = kpad / BN;

    // Copies in 16-byte chunks: thread tid takes chunk c = tid % 8 of rows r0 = tid / 8,
    // r0 + 32, ... of every atom; those rows share r & 7, so one swizzled offset serves all
    const int c8 = tid & 7, r0 = tid >> 3;
    const int sw = r0 * 32 + ((c8 ^ (r0 & 7)) << 2);  // word offset in an atom, row r0

    // centers' column block cb -> its stage (all of K; zeros past dk)
    auto issue = [&](int cb) {
        const unsigned st = smem_u32(bs + (cb % WG_STAGES) * NB * nat * BN * 32 + sw);
        const unsigned char* src = reinterpret_cast<const unsigned char*>(ops) +
                                   ((i64)(cb * BN + r0) * dk + c8 * EC) * EB;
#pragma unroll
        for (int part = 0; part < NB; ++part)  // the big part, then (SPLIT) the small one
#pragma unroll
            for (int a = 0; a < nat; ++a) {
                const bool ok = a * EA + c8 * EC < dk;
#pragma unroll
                for (int i = 0; i < BN / 32; ++i)
                    cp_async16(st + ((part * nat + a) * BN * 32 + i * 32 * 32) * 4,
                               ok ? src + ((i64)part * kpad * dk + i * 32 * dk + a * EA) * EB
                                  : (const void*)ops,
                               ok);
            }
    };
    // TF32 (or fp16 X) with 16-byte rows: X's raw rows by cp.async, all in flight, a group
    // of their own
    // (fp16 X up to two atoms, d <= 128: at three and four ptxas spilled)
    constexpr bool XASYNC = !SPLIT && !AREG && (XH ? NAT <= 2 : FMT == 0) && VEC && BM == 256;
    if constexpr (XASYNC) {
#pragma unroll
        for (int a = 0; a < nat; ++a) {
            const int k = a * EA + c8 * EC;
#pragma unroll
            for (int i = 0; i < BM / 32; ++i) {
                const i64 gx = row0 + r0 + 32 * i;
                const bool ok = gx < n && k < d;
                cp_async16(smem_u32(xs + a * BM * 32 + i * 32 * 32 + sw),
                           ok ? (const void*)(X + gx * d + k) : (const void*)X, ok);
            }
        }
        cp_async_commit();
    }
    // one commit group per column block slot, empty ones too (the wait counts groups)
    issue(0);
    cp_async_commit();
    if (ncb > 1) issue(1);
    cp_async_commit();

    // SPLIT: the thread's A fragments of every k8 step, both parts, in registers for the
    // whole pass (zeros past n and d)
    unsigned xb[SPLIT ? 4 * NAT : 1][4], xl[SPLIT ? 4 * NAT : 1][4];
    if constexpr (SPLIT) {
        const i64 ra = row0 + wgi * 64 + 16 * q + g, rb = ra + 8;
        const XT* const pa = X + (ra < n ? ra : 0) * d;
        const XT* const pb = X + (rb < n ? rb : 0) * d;
#pragma unroll
        for (int s = 0; s < 4 * NAT; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // a0..a3: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
                const int k = 8 * s + t + 4 * (e >> 1);
                const bool ok = k < d && ((e & 1) ? rb < n : ra < n);
                const float v = ok ? xval<float>(((e & 1) ? pb : pa) + k) : 0.0f;
                const float big = tf32_rna(v);
                xb[s][e] = __float_as_uint(big);
                xl[s][e] = __float_as_uint(tf32_rna(__fsub_rn(v, big)));
            }
    }
    // AREG: the thread's A fragments of every k16 step of its MT row tiles, rounded to the
    // format (nearest even, as the shared tile's), in registers for the whole pass (zeros
    // past n and d): no X in shared memory, whose reads the products would share with B's
    unsigned xh[AREG ? MT : 1][AREG ? 4 * NAT : 1][4];
    if constexpr (AREG) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const i64 ra = row0 + wgi * 64 * MT + mt * 64 + 16 * q + g, rb = ra + 8;
            const XT* const pa = X + (ra < n ? ra : 0) * d;
            const XT* const pb = X + (rb < n ? rb : 0) * d;
#pragma unroll
            for (int s = 0; s < 4 * NAT; ++s)
#pragma unroll
                for (int e = 0; e < 4; ++e) {  // rows g (+ 8 for odd e), k 2t (+ 8 from e = 2)
                    const int k = 16 * s + 2 * t + 8 * (e >> 1);
                    const bool row_ok = (e & 1) ? rb < n : ra < n;
                    const XT* const p = ((e & 1) ? pb : pa) + k;
                    // (half X: its value rounds back to its own bits)
                    const float lo = row_ok && k < d ? xval<float>(p) : 0.0f;
                    const float hi = row_ok && k + 1 < d ? xval<float>(p + 1) : 0.0f;
                    xh[mt][s][e] = half2_bits<FMT>(lo, hi);
                }
        }
    }
    float xn_own = -1.0f;  // XASYNC: ||x||^2 of row tid, in feature order (finish_rows')
    if constexpr (XASYNC) {
        cp_async_wait<2>();  // X's group (the centers' two may still be in flight)
        __syncthreads();
        // row tid's chunks in feature order: its norm from the raw values, then (TF32) the
        // values rounded in place; fp16 X's chunks are the operands already
        // (a quarter-warp's 8 rows hit 8 different 16-byte chunks: no bank conflict)
        float s = 0.0f;
#pragma unroll
        for (int a = 0; a < nat; ++a)
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                float4* const p = reinterpret_cast<float4*>(xs + a * BM * 32 + tid * 32 +
                                                            ((c ^ (tid & 7)) << 2));
                float4 v = *p;
                if constexpr (XH) {
                    const unsigned w[4] = {__float_as_uint(v.x), __float_as_uint(v.y),
                                           __float_as_uint(v.z), __float_as_uint(v.w)};
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const float lo = half_value<XT>(w[u] & 0xffffu),
                                    hi = half_value<XT>(w[u] >> 16);
                        s = __fadd_rn(s, __fmul_rn(lo, lo));
                        s = __fadd_rn(s, __fmul_rn(hi, hi));
                    }
                } else {
                    s = __fadd_rn(s, __fmul_rn(v.x, v.x)); s = __fadd_rn(s, __fmul_rn(v.y, v.y));
                    s = __fadd_rn(s, __fmul_rn(v.z, v.z)); s = __fadd_rn(s, __fmul_rn(v.w, v.w));
                    v.x = tf32_rna(v.x); v.y = tf32_rna(v.y); v.z = tf32_rna(v.z);
                    v.w = tf32_rna(v.w);
                    *p = v;
                }
            }
        xn_own = s;
    }
    // TF32: the block's rows in shared memory once, TF32 (rna), zeros past n and d; a half
    // format: rounded to it (nearest even), a 16-byte chunk of 8 values from two float loads
#pragma unroll
    for (int a = 0; a < (XSMEM && !XASYNC ? nat : 0); ++a) {
        const int k = a * EA + c8 * EC;
#pragma unroll 4
        for (int i = 0; i < BM / 32; ++i) {
            const i64 gx = row0 + r0 + 32 * i;
            const XT* const xr = X + (gx < n ? gx : 0) * d;
            uint4 f;
            if constexpr (XH) {   // half X: its 8 values' bits, zeros past n and d
                const int cnt = gx < n ? max(0, min(8, d - k)) : 0;
                if constexpr (VEC) {   // (cnt 0 or 8: d a multiple of 8)
                    f.x = f.y = f.z = f.w = 0u;
                    if (cnt) f = __ldg(reinterpret_cast<const uint4*>(xr + k));
                } else {
                    unsigned h[8];
#pragma unroll
                    for (int u = 0; u < 8; ++u) h[u] = u < cnt ? xr[k + u].bits : 0u;
                    f.x = h[0] | (h[1] << 16); f.y = h[2] | (h[3] << 16);
                    f.z = h[4] | (h[5] << 16); f.w = h[6] | (h[7] << 16);
                }
                *reinterpret_cast<uint4*>(xs + a * BM * 32 + i * 32 * 32 + sw) = f;
                continue;
            }
            float v[2][4];
#pragma unroll
            for (int h = 0; h < EC / 4; ++h) {
                const int cnt = gx < n ? max(0, min(4, d - k - 4 * h)) : 0;
                ldg_vec<float, VEC>(reinterpret_cast<const float*>(xr) + (cnt > 0 ? k + 4 * h : 0),
                                    cnt, v[h]);
            }
            if constexpr (FMT == 0) {
                f.x = __float_as_uint(tf32_rna(v[0][0])); f.y = __float_as_uint(tf32_rna(v[0][1]));
                f.z = __float_as_uint(tf32_rna(v[0][2])); f.w = __float_as_uint(tf32_rna(v[0][3]));
            } else {
                f.x = half2_bits<FMT>(v[0][0], v[0][1]); f.y = half2_bits<FMT>(v[0][2], v[0][3]);
                f.z = half2_bits<FMT>(v[1][0], v[1][1]); f.w = half2_bits<FMT>(v[1][2], v[1][3]);
            }
            *reinterpret_cast<uint4*>(xs + a * BM * 32 + i * 32 * 32 + sw) = f;
        }
    }

    float acc[2][MT][NT][4];
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[s][mt][j][e] = 0.0f;
    // the running first minimum of the thread's 2 MT rows (its quarter of their columns)
    float best[MT][2];
    int bidx[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) { best[mt][h] = pos_inf<float>(); bidx[mt][h] = 0; }

    // + ||c||^2 and the running first minimum over column block cb (ascending columns)
    auto epilogue = [&](float (&done)[MT][NT][4], int cb) {
        float2 cn[NT];
        fragment_norms<NT>(cnorm, cb * BN + 2 * t, cn);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                row_first_min<NT>(done[mt], cn, h, cb * BN + 2 * t, best[mt][h], bidx[mt][h]);
    };

    // descriptors of the warpgroup's first A tile and of stage 0; a k8 step, an atom, a
    // stage or a row tile adds its byte offset / 16 to the address field (bits 0-13)
    const u64 da0 = wg_desc(smem_u32(xs) + wgi * 64 * MT * 128);
    const u64 db0 = wg_desc(smem_u32(bs));

    // column block cb's products into `cur` (asynchronous; one commit group)
    // column block cb's stage has landed for everyone, and every warpgroup is done with
    // column block cb - 1 (it waited for its products before this barrier), so cb + 2's
    // centers may load into cb - 1's stage
    auto stage_ready = [&](int cb) {
        cp_async_wait<1>();     // this thread's part of column block cb has landed ...
        fence_async_shared();   // ... is visible to the tensor cores ...
        __syncthreads();        // ... and so is everyone's
        if (cb + 2 < ncb) issue(cb + 2);
        cp_async_commit();
    };
    auto products = [&](float (&cur)[MT][NT][4], int cb) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) wg_pin(cur[mt]);
        wg_fence();
        const u64 dbs = db0 + (u64)((cb % WG_STAGES) * NB * nat * BN * 8);
#pragma unroll
        for (int a = 0; a < nat; ++a) {
            const u64 da = da0 + (u64)(a * BM * 8), db = dbs + (u64)(a * BN * 8);
#pragma unroll
            for (int j = 0; j < 4; ++j) {     // the k8 steps of the atom, 32 bytes apart
                // (every step of every atom, past roundup(d, 8) too: those products are
                // of zeros, and a branch here splits the commit group, which makes ptxas
                // wait for each part)
                const u64 dbj = db + (u64)(j * 2);
                if constexpr (SPLIT) {  // small.big, big.small, big.big (centers' parts nat
                    const int s = a * 4 + j;      // atoms apart), A from the registers
                    wgmma_64_rs(cur[0], xl[s], dbj, s > 0);
                    wgmma_64_rs(cur[0], xb[s], dbj + (u64)(nat * BN * 8), 1);
                    wgmma_64_rs(cur[0], xb[s], dbj, 1);
                } else if constexpr (AREG) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        wgmma_64_rs<FMT>(cur[mt], xh[mt][a * 4 + j], dbj, a + j > 0);
                } else {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        wgmma_64<FMT>(cur[mt], da + (u64)(mt * 64 * 8 + j * 2), dbj,
                                      a + j > 0);
                }
            }
        }
        wg_commit();  // (cur is not touched again before a wait retires these products)
    };
    // column block cb > 0: its centers' stage is ready and cb + 2's load is under way, its
    // products run into `cur` (asynchronous) while this warpgroup does column block cb - 1's
    // argmin from `prev`; then it waits for them. No product is in flight across a branch or
    // the loop's back edge (ptxas serialises every wgmma of the function where a non-wgmma
    // instruction might touch an accumulator in flight: a wait behind a branch, or the loop
    // carrying a set in flight, did)
    auto step = [&](float (&cur)[MT][NT][4], float (&prev)[MT][NT][4], int cb) {
        stage_ready(cb);
        products(cur, cb);
        epilogue(prev, cb - 1);
        wg_wait<0>();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) wg_pin(cur[mt]);
    };

    stage_ready(0);
    products(acc[0], 0);
    wg_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) wg_pin(acc[0][mt]);
    int cb = 1;
    for (; cb + 1 < ncb; cb += 2) {
        step(acc[1], acc[0], cb);
        step(acc[0], acc[1], cb + 1);
    }
    if (cb < ncb) {
        step(acc[1], acc[0], cb);
        epilogue(acc[1], cb);
    } else {
        epilogue(acc[0], cb - 1);
    }

    // every warpgroup is past its last wgmma: the stages hold the cells for finish_rows
    __syncthreads();
    float* const rbest = bs;
    int* const ridx = reinterpret_cast<int*>(bs + BM * RS);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int at = (rbase + mt * 64 + g + 8 * h) * RS + t;
            rbest[at] = FMT ? 2.0f * best[mt][h] : best[mt][h];  // (half: dist / 2 ranked)
            ridx[at] = bidx[mt][h];
        }
    __syncthreads();
    finish_rows<float, BM, RS, RS>(rbest, ridx, row0, n, d, X, W, labels_old, labels, min_sq,
                                   red, redc, block_inertia, counter, xn_own);
}
