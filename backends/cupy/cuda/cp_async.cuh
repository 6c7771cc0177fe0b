// cp.async (global -> shared without registers, sm_80+) and the shared-window address it
// takes: the tensor-core kernels' copies (fused_mma.cu, fused_wgmma.cu). Below sm_80 the PTX is
// guarded out (the host never launches those kernels there); the CPU emulator of the tests
// defines these itself (KMEANS_MMA_EMULATED).
#ifndef KMEANS_XP_CP_ASYNC_CUH
#define KMEANS_XP_CP_ASYNC_CUH
#include "common.cuh"

#ifndef KMEANS_MMA_EMULATED
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define KMEANS_CP_ASYNC 1
#else
#define KMEANS_CP_ASYNC 0
#endif

// the 32-bit shared-window address of a shared pointer (what ldmatrix and cp.async take)
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm("{ .reg .u64 u; cvta.to.shared.u64 u, %1; cvt.u32.u64 %0, u; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 (or 4) bytes global -> shared without registers; !valid writes zeros (src-size 0)
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
#if KMEANS_CP_ASYNC
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid) {
#if KMEANS_CP_ASYNC
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if KMEANS_CP_ASYNC
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// wait until at most N of this thread's committed groups are pending
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if KMEANS_CP_ASYNC
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}
#endif  // KMEANS_MMA_EMULATED
#endif  // KMEANS_XP_CP_ASYNC_CUH
