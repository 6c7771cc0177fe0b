// Hopper's wgmma (sm_90a) in PTX, as cuda/fused_wgmma.cu uses it: the shared-memory matrix
// descriptor of a 128B-swizzled K-major tile, fence / commit / wait, the proxy fence that
// makes generic-proxy writes to shared memory visible to wgmma, and m64n64 products with
// both operands in shared memory (TF32, fp16, bf16) or A in registers (TF32, fp16, bf16),
// FP32 accumulation. On any other target they trap (the host never launches the kernel
// there); the CPU emulator of the tests defines all but the descriptor itself
// (KMEANS_WGMMA_EMULATED).
#ifndef KMEANS_XP_WGMMA_CUH
#define KMEANS_XP_WGMMA_CUH
#include "common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KMEANS_WGMMA 1
#else
#define KMEANS_WGMMA 0  // (any other target: the kernel traps; the host never launches it)
#endif

// shared-memory matrix descriptor of a 128B-swizzled K-major tile starting at saddr
__device__ __forceinline__ u64 wg_desc(unsigned saddr) {
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

#ifndef KMEANS_WGMMA_EMULATED
__device__ __forceinline__ void wg_fence() {
#if KMEANS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if KMEANS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wg_wait() {
#if KMEANS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// generic-proxy writes to shared memory (stores, cp.async) made visible to wgmma's reads
__device__ __forceinline__ void fence_async_shared() {
#if KMEANS_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// keeps the compiler from moving accumulator reads or writes across an asynchronous wgmma
template <int NT>
__device__ __forceinline__ void wg_pin(float (&d)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// the 32 FP32 accumulators of an m64n64 product (d[8][4]): their operands in the PTX text
// and as asm outputs, shared by both forms below
#define KMEANS_WGMMA_D_REGS                                                                  \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KMEANS_WGMMA_D                                                                       \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),               \
    "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),               \
    "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),               \
    "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),               \
    "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),               \
    "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),               \
    "+f"(d[7][2]), "+f"(d[7][3])

#define KMEANS_WGMMA_SS(SHAPE_TYPES, TAIL)                                                   \
    asm volatile(                                                                            \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                          \
        "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {"                                     \
        KMEANS_WGMMA_D_REGS "}, "                                                            \
        "%32, %33, p, 1, 1" TAIL ";\n}\n"                                                    \
        : KMEANS_WGMMA_D                                                                     \
        : "l"(da), "l"(db), "r"(scale_d))

// D (64 x 64) += A (64 x K, shared, descriptor da) * B (64 x K, shared, db)^T, one 32-byte K
// step: k8 of TF32 (FMT 0), k16 of fp16 (1) or bf16 (2), FP32 accumulation, both operands
// K-major (the half formats' transpose flags 0); scale_d = 0 starts from zero instead of D
template <int FMT>
__device__ __forceinline__ void wgmma_64(float (&d)[8][4], u64 da, u64 db, int scale_d) {
#if KMEANS_WGMMA
    if constexpr (FMT == 0) {
        KMEANS_WGMMA_SS("m64n64k8.f32.tf32.tf32", "");
    } else if constexpr (FMT == 1) {
        KMEANS_WGMMA_SS("m64n64k16.f32.f16.f16", ", 0, 0");
    } else {
        KMEANS_WGMMA_SS("m64n64k16.f32.bf16.bf16", ", 0, 0");
    }
#else
    __trap();
#endif
}

// D (64 x 64) += A (registers) * B (64 x K, shared, db)^T, one 32-byte K step. A is the
// mma.sync A fragment of warp q's rows 16q..16q+15: TF32 (FMT 0, k8) a0 (g, t), a1 (g + 8,
// t), a2 (g, t + 4), a3 (g + 8, t + 4); a half format (1 fp16, 2 bf16, k16, the m16n8k16
// fragment) a[0] (g, 2t..2t+1), a[1] (g + 8, 2t..), a[2] (g, 2t + 8..), a[3] (g + 8,
// 2t + 8..), the lower k in the low half (the half formats' B transpose flag 0)
#define KMEANS_WGMMA_RS(SHAPE_TYPES, TAIL)                                                   \
    asm volatile(                                                                            \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                          \
        "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {"                                     \
        KMEANS_WGMMA_D_REGS "}, "                                                            \
        "{%32, %33, %34, %35}, %36, p, 1, 1" TAIL ";\n}\n"                                     \
        : KMEANS_WGMMA_D                                                                     \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))

template <int FMT = 0>
__device__ __forceinline__ void wgmma_64_rs(float (&d)[8][4], const unsigned (&a)[4], u64 db,
                                            int scale_d) {
#if KMEANS_WGMMA
    if constexpr (FMT == 0) {
        KMEANS_WGMMA_RS("m64n64k8.f32.tf32.tf32", "");
    } else if constexpr (FMT == 1) {
        KMEANS_WGMMA_RS("m64n64k16.f32.f16.f16", ", 0");
    } else {
        KMEANS_WGMMA_RS("m64n64k16.f32.bf16.bf16", ", 0");
    }
#else
    __trap();
#endif
}
#endif  // KMEANS_WGMMA_EMULATED
#endif  // KMEANS_XP_WGMMA_CUH
