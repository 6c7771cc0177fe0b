// The number formats of the CuPy backends' operands, included by common.cuh: TF32 and the
// half formats' rounding (the tensor-core kernels' operands) and fp16 or bf16 storage of X
// (a kernel template reading X through `xval`). Integer arithmetic only: no cuda_fp16.h under
// NVRTC, and the CPU emulator of the tests runs these as they are.
#ifndef KMEANS_XP_FORMATS_CUH
#define KMEANS_XP_FORMATS_CUH

// x rounded to TF32 (10 fraction bits) to nearest, ties away from zero: what PTX's
// cvt.rna.tf32.f32 gives a finite x, in two integer operations that every GPU (and the CPU
// emulator of the tests) has, so the centers' operands (pack_centers) and the points' (the
// tensor-core kernels) round alike. The low 13 bits come back zero.
__device__ __forceinline__ float tf32_rna(float x) {
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}

// The 16 bits of finite x rounded to nearest even in fp16 (FMT 1) or bf16 (FMT 2): what a
// half-precision tensor core reads (the host's rounding, kmeans_xp.contract.precision.round_to,
// gives the same values). Integer arithmetic only: no cuda_fp16.h under NVRTC, and the CPU
// emulator runs it as is. fp16: past 65504 (half-way 65520 up) the result is inf, below
// 2^-14 a subnormal.
template <int FMT>
__device__ __forceinline__ unsigned half_bits(float x) {
    const unsigned u = __float_as_uint(x), ax = u & 0x7fffffffu;
    if constexpr (FMT == 2) {
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    } else {
        const unsigned sign = (u >> 16) & 0x8000u;
        if (ax >= 0x477ff000u) return sign | 0x7c00u;
        if (ax < 0x38800000u) {  // subnormal: units of 2^-24, to nearest even
            const unsigned m = ax ? (ax & 0x7fffffu) | 0x800000u : 0u;
            const int shift = 126 - (int)(ax >> 23);  // 14..; m * 2^(e - 150) / 2^-24
            if (shift > 24) return sign;
            const unsigned q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
            return sign | (q + (rem > half || (rem == half && (q & 1u))));
        }
        const unsigned r = ax - 0x38000000u;  // exponent 127 -> 15 bias
        return sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    }
}

// X stored in fp16 (precision="fp16": the fit's centered data, or the user's float16 X): the
// IEEE binary16 bits of CuPy's float16, a distinct type so that a kernel template takes
// `const xhalf* X` beside float arithmetic (no cuda_fp16.h under NVRTC). Its value as a float
// is exact (every fp16 is a float), so a kernel reading xhalf X gives what it gives on float
// X holding the same values.
struct xhalf { unsigned short bits; };

__device__ __forceinline__ float fp16_value(unsigned h) {
    // branch free (a branch per value made the loads of an unrolled loop go out one by
    // one): normal and inf/NaN by moving the exponent and fraction, subnormals m * 2^-24
    const unsigned sign = (h & 0x8000u) << 16, em = h & 0x7fffu, m = h & 1023u;
    const unsigned wide = ((em << 13) + (112u << 23)) | (em >= 0x7c00u ? 0x7f800000u : 0u);
    const float sub = (float)m * 5.9604644775390625e-8f;
    return __uint_as_float(sign | (em < 0x400u ? __float_as_uint(sub) : wide));
}

// X stored in bf16 (precision="bf16": the fit's centered data, or the user's bfloat16 X):
// the upper 16 bits of a float, so its value is those bits shifted back (exact).
struct xbf16 { unsigned short bits; };

__device__ __forceinline__ float bf16_value(unsigned h) { return __uint_as_float(h << 16); }

// The half storage types: the format each stores (FMT of the tensor-core kernels: 1 fp16,
// 2 bf16; 0 for float and double) and the float value of its 16 bits, so that a kernel
// written once for "X in a half format" serves both.
template <typename XT> struct HalfFormat { static constexpr int value = 0; };
template <> struct HalfFormat<xhalf> { static constexpr int value = 1; };
template <> struct HalfFormat<xbf16> { static constexpr int value = 2; };

template <typename XT> __device__ __forceinline__ float half_value(unsigned h);
template <> __device__ __forceinline__ float half_value<xhalf>(unsigned h) {
    return fp16_value(h);
}
template <> __device__ __forceinline__ float half_value<xbf16>(unsigned h) {
    return bf16_value(h);
}

// X's value at p as the kernel's arithmetic type T (float or double): the identity for
// float and double X, the exact widening for the half storage types
template <typename T> __device__ __forceinline__ T xval(const T* p) { return *p; }
template <typename T> __device__ __forceinline__ T xval(const xhalf* p) {
    return (T)fp16_value(p->bits);
}
template <typename T> __device__ __forceinline__ T xval(const xbf16* p) {
    return (T)bf16_value(p->bits);
}

// two floats as one word of halves, lo in the low 16 bits (the K order of the operands)
template <int FMT>
__device__ __forceinline__ unsigned half2_bits(float lo, float hi) {
    return half_bits<FMT>(lo) | (half_bits<FMT>(hi) << 16);
}

#endif  // KMEANS_XP_FORMATS_CUH
