// The centers' operands of the nearest-center kernels, computed on the device (no host round
// trip of the centers): -2c (exact) and ||c||^2 summed in the order np.einsum("ij,ij->i", C, C)
// uses, so that the expansion ||c||^2 - 2 x.c rounds as the numpy backend's and near-ties break
// alike. Layouts: 0: ops (k, S) rows [-2c_0 .. -2c_{d-1}, ||c||^2, 0...] (small d, cupy-kernels);
// 1: -2C^T (d, kpad) in ops and ||c||^2 in cnorm (the GEMM-like kernels); 2: ||c||^2 alone in
// cnorm (cupy-chunked, whose GEMM takes C itself); 3: the tensor-core kernels' (fused_mma.cu,
// float only): rows of S = roundup(d, 8) words per center, tf32(-2c) (kpad rows, the padding
// zero), ||c||^2 in cnorm; 4: as 3, then kpad more rows of the small part tf32(-2c - big) of
// the 3xTF32 split; 5 / 6: the half-precision wgmma kernel's (fused_wgmma.cu FMT 1 / 2, float
// only): rows of S = roundup(d, 16) fp16 / bf16 values of -c (nearest even) in ops' words,
// kpad rows, and ||c||^2 / 2 in cnorm (the kernel ranks dist / 2: -2c could overflow fp16).
// Rounded here once, so the kernels' inner loops convert nothing.
#include "common.cuh"

// norm_mode (detected on the host from numpy itself, kmeans_xp_backends.cupy.einsum_order):
//   0: plain sequential sum (numpy without SIMD);
//   else lanes = mode & 0xff (vector width / itemsize), fused = bit 8 (npyv_muladd is an FMA),
//   horizontal sum = bits 9-10: 0 adjacent pairs ((a0+a1)+(a2+a3))..., 1 halves folded
//   (a_l + a_{l+w/2}) down to one, 2 halves folded down to a 16-byte vector, then pairs.
// The vector loop: per group of 4 vectors acc = a0*a0 + (a1*a1 + (a2*a2 + (a3*a3 + acc)))
// lane-wise, then the rest one (zero-padded) vector at a time, then the horizontal sum.
template <typename T>
__device__ __forceinline__ T norm_muladd(T v, T acc, bool fused) {
    return fused ? fma_rn(v, v, acc) : add_rn(mul_rn(v, v), acc);
}

template <typename T>
__device__ T einsum_sq_norm(const T* __restrict__ c, int d, int mode) {
    if (mode == 0) {
        T s = (T)0;
        for (int j = 0; j < d; ++j) s = add_rn(s, mul_rn(c[j], c[j]));
        return s;
    }
    const int L = mode & 0xff;
    const bool fused = (mode >> 8) & 1;
    const int hmode = (mode >> 9) & 3;
    T acc[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) acc[l] = (T)0;
    int p = 0, cnt = d;
    for (; cnt >= 4 * L; cnt -= 4 * L, p += 4 * L) {
        for (int l = 0; l < L; ++l) {
            T t = norm_muladd(c[p + 3 * L + l], acc[l], fused);
            t = norm_muladd(c[p + 2 * L + l], t, fused);
            t = norm_muladd(c[p + L + l], t, fused);
            acc[l] = norm_muladd(c[p + l], t, fused);
        }
    }
    for (; cnt > 0; cnt -= L, p += L) {
        for (int l = 0; l < L; ++l) {
            const T v = l < cnt ? c[p + l] : (T)0;
            acc[l] = norm_muladd(v, acc[l], fused);
        }
    }
    const int vec16 = 16 / (int)sizeof(T);  // lanes of a 16-byte vector
    for (int w = L; w > 1; w >>= 1) {
        const bool fold = hmode == 1 || (hmode == 2 && w > vec16);
        for (int l = 0; l < w / 2; ++l)
            acc[l] = fold ? add_rn(acc[l], acc[l + w / 2]) : add_rn(acc[2 * l], acc[2 * l + 1]);
    }
    return add_rn((T)0, acc[0]);
}

template <typename T>
__global__ void __launch_bounds__(BLOCK)
pack_centers(const T* __restrict__ C, int k, int d, int layout, int S, int kpad, int norm_mode,
             T* __restrict__ ops, T* __restrict__ cnorm, i64 ops_b, int cnorm_b) {
    // (a batch: problem blockIdx.y's k centers, into its operands ops_b and cnorm_b apart)
    C += (i64)blockIdx.y * k * d;
    ops += (i64)blockIdx.y * ops_b;
    if (cnorm != nullptr) cnorm += (i64)blockIdx.y * cnorm_b;
    for (int c = blockIdx.x * BLOCK + threadIdx.x; c < k; c += gridDim.x * BLOCK) {
        const T* row = C + (i64)c * d;
        const T cn = einsum_sq_norm<T>(row, d, norm_mode);
        if (layout == 0) {
            for (int j = 0; j < d; ++j) ops[(i64)c * S + j] = mul_rn((T)-2, row[j]);
            ops[(i64)c * S + d] = cn;
            for (int j = d + 1; j < S; ++j) ops[(i64)c * S + j] = (T)0;
        } else if (layout >= 5) {
            if constexpr (sizeof(T) == 4) {
                unsigned short* const h = reinterpret_cast<unsigned short*>(ops) + (i64)c * S;
                for (int j = 0; j < d; ++j)
                    h[j] = (unsigned short)(layout == 5 ? half_bits<1>(-row[j])
                                                        : half_bits<2>(-row[j]));
            }
            cnorm[c] = mul_rn((T)0.5, cn);
        } else if (layout >= 3) {
            if constexpr (sizeof(T) == 4) {  // (the host asks for it with float only)
                for (int j = 0; j < d; ++j) {
                    const T v = mul_rn((T)-2, row[j]);
                    const T big = tf32_rna(v);
                    ops[(i64)c * S + j] = big;
                    if (layout == 4) ops[((i64)kpad + c) * S + j] = tf32_rna(sub_rn(v, big));
                }
            }
            cnorm[c] = cn;
        } else {
            if (layout == 1)
                for (int j = 0; j < d; ++j) ops[(i64)j * kpad + c] = mul_rn((T)-2, row[j]);
            cnorm[c] = cn;
        }
    }
}
