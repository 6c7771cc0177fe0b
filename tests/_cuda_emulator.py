"""Runs the CuPy backends' CUDA kernels (kmeans_xp_backends/cupy/cuda/*.cu) on the CPU.

Each kernel instance is compiled as C++20 with a small SIMT emulation in front of its source
(headers inlined as for NVRTC): every CUDA thread of a block is a coroutine (ucontext) on one
OS thread, blocks run one after another; `__syncthreads` is a block barrier, warp shuffles and
votes exchange values through a per-warp slot array between two warp barriers (a thread that
waits yields to the next); `__shared__` arrays are static (one block runs at a time), the
dynamic one a per-launch buffer; atomics are plain read-modify-writes (one OS thread); the
rounding intrinsics are std::fma and plain IEEE operations compiled with -ffp-contract=off
(what the GPU does).

Launches are checked as CuPy cannot: every argument must have the exact size and kind of the
kernel's parameter (an np.int32 for an `int`, an np.int64 for a `long long`, an np.float64
for a `double`, an array or the null np.uint64(0) for a pointer; for a `const xhalf*`, fp16 X,
a float16 array, or its bits as uint16; for a `const xbf16*`, bf16 X, ml_dtypes' bfloat16
array or its bits as uint16), so a launch that passes here passes its bytes right
on the GPU too.

So the kernels' logic (indexing, tiles, grid-stride loops, warp reductions, tie rules, last-block
reductions) and their arithmetic are checked bit for bit against NumPy without a GPU. Launch
configuration, occupancy and speed are not. Needs g++ (C++20) and <ucontext.h>; callers skip
without it. The v1 TF32 tensor-core file (fused_tf32.cu, inline PTX) is not emulated; the v2
one (fused_mma.cu) and the wgmma one (fused_wgmma.cu) are: their PTX sits behind
KMEANS_MMA_EMULATED and KMEANS_WGMMA_EMULATED, defined here by the ISA.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

import numpy as np
from kmeans_xp_backends.cupy import common

HEADER = r"""
#include <algorithm>
#include <cmath>
#include <math.h>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>
#include <setjmp.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define KMEANS_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(emu_dynamic_smem)

struct emu_dim { unsigned x = 0, y = 0; };
static emu_dim threadIdx, blockIdx, blockDim, gridDim;
static unsigned char* emu_dynamic_smem = nullptr;

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };

template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }

// A thread starts on its own stack through makecontext/swapcontext once; after that the
// switches are _setjmp/_longjmp (no signal-mask system call per switch: ~10x faster).
static ucontext_t emu_sched_ctx;
static jmp_buf emu_sched;
static std::vector<ucontext_t> emu_ctx;
struct emu_jmp_t { jmp_buf buf; };
static std::vector<emu_jmp_t> emu_jmp;
static std::vector<char> emu_done, emu_started;
static int emu_cur = 0;
static std::function<void()>* emu_body = nullptr;

static void emu_trampoline() {
    (*emu_body)();
    emu_done[emu_cur] = 1;
    _longjmp(emu_sched, 1);  // never returns
}
static inline void emu_yield() {
    if (!_setjmp(emu_jmp[emu_cur].buf)) _longjmp(emu_sched, 1);
}

struct emu_barrier { int count = 0, arrived = 0; unsigned gen = 0; };
static emu_barrier emu_block_bar;
static std::vector<emu_barrier> emu_warp_bar;
static inline void emu_wait(emu_barrier& b) {
    const unsigned g = b.gen;
    if (++b.arrived == b.count) { b.arrived = 0; ++b.gen; return; }
    while (b.gen == g) emu_yield();
}
// Warp exchanges: each lane writes its value, one warp barrier, each lane reads. Two slot
// buffers alternate (every lane of a warp makes the same sequence of exchanges), so a lane
// cannot overwrite a value another lane has yet to read: one barrier per exchange.
static std::vector<unsigned long long> emu_slots;  // 2 x 32 per warp
static std::vector<unsigned> emu_xcount;           // exchanges made, per thread

inline void __syncthreads() { emu_wait(emu_block_bar); }
inline void __threadfence() {}

template <class T>
inline T emu_exchange(T v, int src) {
    const int me = threadIdx.x, warp = me >> 5;
    const size_t half = (emu_xcount[me]++ & 1) ? emu_slots.size() / 2 : 0;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    emu_slots[half + me] = bits;
    emu_wait(emu_warp_bar[warp]);
    const unsigned long long got = emu_slots[half + warp * 32 + (src & 31)];
    T r;
    std::memcpy(&r, &got, sizeof(T));
    return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return emu_exchange(v, src); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) {
    return emu_exchange(v, (int)(threadIdx.x & 31) ^ o);
}
template <class T> inline T __shfl_down_sync(unsigned, T v, int o) {
    const int lane = threadIdx.x & 31;
    return emu_exchange(v, lane + o < 32 ? lane + o : lane);
}
inline bool __all_sync(unsigned, bool p) {
    const int me = threadIdx.x, warp = me >> 5;
    const size_t half = (emu_xcount[me]++ & 1) ? emu_slots.size() / 2 : 0;
    emu_slots[half + me] = p;
    emu_wait(emu_warp_bar[warp]);
    bool all = true;
    for (int i = 0; i < 32; ++i) all = all && emu_slots[half + warp * 32 + i];
    return all;
}

// Bulk warp exchange (the tensor-core emulation below): each lane publishes up to 32 bytes,
// one warp barrier, then reads any lane's; the halves alternate as emu_exchange's do.
static std::vector<unsigned char> emu_wslots;  // 2 x 32 lanes x 32 bytes per warp
inline const unsigned char* emu_publish(const void* v, size_t bytes) {
    const int me = threadIdx.x, warp = me >> 5;
    const size_t half = (emu_xcount[me]++ & 1) ? emu_wslots.size() / 2 : 0;
    std::memcpy(&emu_wslots[half + (size_t)me * 32], v, bytes);
    emu_wait(emu_warp_bar[warp]);
    return &emu_wslots[half + (size_t)warp * 32 * 32];
}

inline double atomicAdd(double* p, double v) { double old = *p; *p = old + v; return old; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    unsigned long long old = *p; *p = old + v; return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned old = *p; *p = old + v; return old; }
inline int atomicAdd(int* p, int v) { int old = *p; *p = old + v; return old; }
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    unsigned long long old = *p; if (v > old) *p = v; return old;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __double2float_rn(double v) { return (float)v; }
inline long long __double2ll_rn(double v) { return std::llrint(v); }
inline double __ll2double_rn(long long v) { return (double)v; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double f; std::memcpy(&f, &i, 8); return f; }
inline long long __double_as_longlong(double f) { long long i; std::memcpy(&i, &f, 8); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
template <class T> inline T __ldg(const T* p) { return *p; }

// The PTX of the tensor-core kernels (cuda/fused_mma.cu), by the PTX ISA's definitions:
// shared addresses are offsets into the dynamic shared memory; ldmatrix .x4 .b16 gives lane
// L word L%4 of the row whose address lane 8i + L/4 gave, for matrix i; mma m16n8k8 .tf32
// takes the fragments A a0 (g,t), a1 (g+8,t), a2 (g,t+4), a3 (g+8,t+4), B b0 (k=t,n=g),
// b1 (k=t+4,n=g), C c0 (g,2t), c1 (g,2t+1), c2 (g+8,2t), c3 (g+8,2t+1) (g = lane/4,
// t = lane%4), ignores the operands' low 13 bits and here sums in k order in FP32 (the
// hardware's order and rounding inside one mma may differ); cp.async copies at once (the
// wait is then trivially satisfied; the kernel's barriers still order stage reuse).
#define KMEANS_MMA_EMULATED 1
inline unsigned smem_u32(const void* p) {
    return (unsigned)(reinterpret_cast<const unsigned char*>(p) - emu_dynamic_smem);
}
inline void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    const unsigned char* s = emu_publish(&addr, 4);
    const int lane = threadIdx.x & 31;
    for (int i = 0; i < 4; ++i) {
        unsigned row;
        std::memcpy(&row, s + (size_t)(8 * i + lane / 4) * 32, 4);
        std::memcpy(&r[i], emu_dynamic_smem + row + 4 * (lane % 4), 4);
    }
}
inline void mma_tf32_16x8x8(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const unsigned mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const unsigned char* s = emu_publish(mine, sizeof mine);
    auto word = [&](int lane, int reg) {
        unsigned w;
        std::memcpy(&w, s + (size_t)lane * 32 + 4 * reg, 4);
        return __uint_as_float(w & 0xffffe000u);
    };
    const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float sum = c[i];
        for (int k = 0; k < 8; ++k) {
            const float av = word((row % 8) * 4 + k % 4, (row >= 8) + 2 * (k >= 4));
            const float bv = word(col * 4 + k % 4, 4 + (k >= 4));
            sum = std::fmaf(av, bv, sum);
        }
        c[i] = sum;
    }
}
inline void cp_async16(unsigned dst, const void* src, bool valid) {
    if (valid) std::memcpy(emu_dynamic_smem + dst, src, 16);
    else std::memset(emu_dynamic_smem + dst, 0, 16);
}
inline void cp_async4(unsigned dst, const void* src, bool valid) {
    if (valid) std::memcpy(emu_dynamic_smem + dst, src, 4);
    else std::memset(emu_dynamic_smem + dst, 0, 4);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}
template <class T> inline T __ldcg(const T* p) { return *p; }

// The wgmma of cuda/fused_wgmma.cu, by the PTX ISA: a warpgroup (128 threads; warp q its q-th)
// makes D (64 x 64, FP32) += A (64 x K) B (64 x K)^T for one 32-byte K step (k8 of TF32, k16
// of fp16 / bf16), the operands in shared memory through descriptors (start address >> 4 in
// bits 0-13; K-major rows of 128 bytes, 8-row groups 1024 bytes apart; the 128-byte swizzle:
// address bits 4-6 ^= bits 7-9), or A from registers (the mma.sync A fragment, TF32). Each
// thread makes its own fragment (d[j][e] at row 16q + g + 8 (e / 2), column 8j + 2t + e % 2)
// at once, in k order in FP32 (the hardware's order may differ); TF32 ignores the low 13
// bits. fence, commit and wait are then no-ops (the kernel's barriers still order stage reuse).
#define KMEANS_WGMMA_EMULATED 1
inline void wg_fence() {}
inline void wg_commit() {}
template <int N> inline void wg_wait() {}
inline void fence_async_shared() {}
template <int NT> inline void wg_pin(float (&)[NT][4]) {}
inline float emu_half_value(unsigned short h, int fmt) {
    if (fmt == 2) return __uint_as_float((unsigned)h << 16);  // bf16: float's top half
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? std::ldexp((float)m, -24)
                    : e == 31 ? (m ? NAN : INFINITY) : std::ldexp((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}
inline float emu_operand(unsigned long long desc, int row, int kk, int fmt) {
    unsigned a = ((unsigned)(desc & 0x3FFF) << 4) + row * 128 + kk * (fmt ? 2 : 4);
    a ^= ((a >> 7) & 7) << 4;
    if (fmt) {
        unsigned short h;
        std::memcpy(&h, emu_dynamic_smem + a, 2);
        return emu_half_value(h, fmt);
    }
    unsigned w;
    std::memcpy(&w, emu_dynamic_smem + a, 4);
    return __uint_as_float(w & 0xffffe000u);
}
template <int FMT>
inline void wgmma_64(float (&d)[8][4], unsigned long long da, unsigned long long db,
                     int scale_d) {
    const int q = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e) {
            const int row = 16 * q + g + 8 * (e / 2), col = 8 * j + 2 * t + e % 2;
            float sum = scale_d ? d[j][e] : 0.0f;
            for (int kk = 0; kk < (FMT ? 16 : 8); ++kk)
                sum = std::fmaf(emu_operand(da, row, kk, FMT), emu_operand(db, col, kk, FMT),
                                sum);
            d[j][e] = sum;
        }
}
// A from registers: the mma.sync A fragment, TF32 (FMT 0: a[r] one value, k8) or a half
// format (k16, the m16n8k16 fragment: a[r] two values, the lower k in the low half), its
// word columns w (k, or k / 2) in lanes 4g + w % 4, registers (row >= 8) + 2 (w >= 4)
template <int FMT = 0>
inline void wgmma_64_rs(float (&d)[8][4], const unsigned (&a)[4], unsigned long long db,
                        int scale_d) {
    const unsigned char* s = emu_publish(a, sizeof a);
    const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e) {
            const int r = g + 8 * (e / 2), col = 8 * j + 2 * t + e % 2;
            float sum = scale_d ? d[j][e] : 0.0f;
            for (int k = 0; k < (FMT ? 16 : 8); ++k) {
                const int w = FMT ? k / 2 : k;
                unsigned word;
                std::memcpy(&word, s + (size_t)((r % 8) * 4 + w % 4) * 32
                                       + 4 * ((r >= 8) + 2 * (w >= 4)), 4);
                const float av = FMT ? emu_half_value((unsigned short)(k % 2 ? word >> 16
                                                                       : word & 0xffff), FMT)
                                     : __uint_as_float(word & 0xffffe000u);
                sum = std::fmaf(av, emu_operand(db, col, k, FMT), sum);
            }
            d[j][e] = sum;
        }
}

template <class F>
void emu_launch(int grid, int grid_y, int block, size_t smem, F body) {
    std::function<void()> fn = body;
    emu_body = &fn;
    gridDim.x = grid;
    gridDim.y = grid_y;
    blockDim.x = block;
    std::vector<unsigned char> dyn(smem + 64);
    emu_dynamic_smem = dyn.data() + (64 - reinterpret_cast<size_t>(dyn.data()) % 64) % 64;
    const size_t stack = 1 << 16;
    std::vector<char> stacks((size_t)block * stack);
    emu_ctx.assign(block, ucontext_t{});
    emu_jmp.resize(block);
    emu_done.assign(block, 0);
    emu_started.assign(block, 0);
    emu_slots.assign(2 * (size_t)((block + 31) / 32 * 32), 0);
    emu_xcount.assign(block, 0);
    emu_wslots.assign(2 * (size_t)((block + 31) / 32 * 32) * 32, 0);
    for (int b = 0; b < grid * grid_y; ++b) {
        blockIdx.x = b % grid;
        blockIdx.y = b / grid;
        emu_block_bar = emu_barrier{block, 0, 0};
        emu_warp_bar.assign((block + 31) / 32, emu_barrier{32, 0, 0});
        for (int t = 0; t < block; ++t) {
            getcontext(&emu_ctx[t]);
            emu_ctx[t].uc_stack.ss_sp = stacks.data() + (size_t)t * stack;
            emu_ctx[t].uc_stack.ss_size = stack;
            emu_ctx[t].uc_link = &emu_sched_ctx;
            makecontext(&emu_ctx[t], emu_trampoline, 0);
            emu_done[t] = 0;
            emu_started[t] = 0;
        }
        int remaining = block;
        while (remaining) {
            for (int t = 0; t < block; ++t) {
                if (emu_done[t]) continue;
                emu_cur = t;
                threadIdx.x = t;
                if (!_setjmp(emu_sched)) {
                    if (emu_started[t]) {
                        _longjmp(emu_jmp[t].buf, 1);
                    } else {
                        emu_started[t] = 1;
                        swapcontext(&emu_sched_ctx, &emu_ctx[t]);
                    }
                }
                if (emu_done[t]) --remaining;
            }
        }
    }
}

// kinds of parameters: 1 pointer, 2 pointer to xhalf (formats.cuh's fp16 X), 3 pointer to
// xbf16 (bf16 X), 4 float, 8 double, 100 + 10 * size + signed for integers
struct xhalf;
struct xbf16;
template <class T> constexpr int emu_kind() {
    if constexpr (std::is_pointer_v<T>) {
        using P = std::remove_cv_t<std::remove_pointer_t<T>>;
        return std::is_same_v<P, xhalf> ? 2 : std::is_same_v<P, xbf16> ? 3 : 1;
    }
    else if constexpr (std::is_same_v<T, float>) return 4;
    else if constexpr (std::is_same_v<T, double>) return 8;
    else return 100 + 10 * (int)sizeof(T) + (std::is_signed_v<T> ? 1 : 0);
}
template <class... A> int emu_arity(void (*)(A...)) { return (int)sizeof...(A); }
template <class... A> void emu_kinds(void (*)(A...), int* out) {
    int i = 0;
    ((out[i++] = emu_kind<A>()), ...);
}
template <class... A, size_t... I>
void emu_call_impl(void (*f)(A...), void** a, std::index_sequence<I...>) {
    f(*reinterpret_cast<A*>(a[I])...);
}
template <class... A> void emu_call(void (*f)(A...), void** a) {
    emu_call_impl(f, a, std::index_sequence_for<A...>{});
}
"""

_SCALARS = {np.dtype(np.int32): (141, ctypes.c_int32), np.dtype(np.int64): (181, ctypes.c_int64),
            np.dtype(np.uint32): (140, ctypes.c_uint32), np.dtype(np.float64): (8, ctypes.c_double),
            np.dtype(np.float32): (4, ctypes.c_float)}
# what a `const xhalf*` (kind 2) and a `const xbf16*` (kind 3) read: values of the format (by
# dtype name: ml_dtypes' bfloat16), or the same bits as uint16
_HALF_ARRAYS = {2: ("float16", "uint16"), 3: ("bfloat16", "uint16")}


class EmulatedKernels:
    """Kernel instances compiled for the CPU on first use (one library each, cached on disk
    by the hash of its code); `launch(file, name, grid, args, smem=0, block=256)`, grid an int or
    (x, y)."""

    def __init__(self, build_dir=None):
        self.build_dir = build_dir or os.path.join(tempfile.gettempdir(), "kmeans_xp_emu")
        os.makedirs(self.build_dir, exist_ok=True)
        self._libs = {}
        self._lock = threading.Lock()

    @staticmethod
    def available():
        return shutil.which("g++") is not None

    def _lib(self, file, name):
        key = (file, name)
        with self._lock:
            if key not in self._libs:
                self._libs[key] = self._build(file, name)
            return self._libs[key]

    def _build(self, file, name):
        code = (HEADER + common.source(file)
                + f'\nextern "C" int emu_arity() {{ return emu_arity(&{name}); }}\n'
                + f'extern "C" void emu_kinds(int* out) {{ emu_kinds(&{name}, out); }}\n'
                + 'extern "C" void emu_run(int grid, int grid_y, int block, size_t smem, '
                + 'void** args) {\n'
                + f'    emu_launch(grid, grid_y, block, smem, [&] {{ emu_call(&{name}, args); }});'
                + '\n}\n')
        digest = hashlib.sha1(code.encode()).hexdigest()[:16]
        lib = os.path.join(self.build_dir, f"kernel_{digest}.so")
        if not os.path.exists(lib):
            src = os.path.join(self.build_dir, f"kernel_{digest}.cpp")
            with open(src, "w") as f:
                f.write(code)
            tmp = lib + f".{os.getpid()}"
            cmd = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC",
                   "-U_FORTIFY_SOURCE", "-shared", "-w", "-o", tmp, src]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"{name} ({file}) does not build for the CPU:\n"
                                   f"{proc.stderr[-4000:]}")
            os.replace(tmp, lib)
        handle = ctypes.CDLL(lib)
        arity = handle.emu_arity()
        kinds = (ctypes.c_int * max(arity, 1))()
        handle.emu_kinds(kinds)
        return handle, list(kinds)[:arity]

    def launch(self, file, name, grid, args, smem=0, block=common.BLOCK):
        """grid: blocks along x, or (x, y)."""
        gx, gy = (grid, 1) if isinstance(grid, int) else (grid + (1,))[:2]
        handle, kinds = self._lib(file, name)
        if len(args) != len(kinds):
            raise TypeError(f"{name}: {len(args)} arguments for {len(kinds)} parameters")
        keep = []
        for i, (a, kind) in enumerate(zip(args, kinds)):
            keep.append(self._argument(name, i, a, kind))
        ptrs = (ctypes.c_void_p * max(len(keep), 1))(*[ctypes.addressof(k) for k in keep])
        handle.emu_run(ctypes.c_int(gx), ctypes.c_int(gy), ctypes.c_int(block),
                       ctypes.c_size_t(smem), ptrs)

    @staticmethod
    def _argument(name, i, a, kind):
        if isinstance(a, np.ndarray):
            if kind not in (1, 2, 3):
                raise TypeError(f"{name}: argument {i} is an array, the parameter is not a "
                                f"pointer (kind {kind})")
            if kind in _HALF_ARRAYS and a.dtype.name not in _HALF_ARRAYS[kind]:
                raise TypeError(f"{name}: argument {i} is a {a.dtype} array, the parameter is "
                                f"a pointer to {_HALF_ARRAYS[kind][0]} values")
            if a.size and not a.flags.c_contiguous:
                raise TypeError(f"{name}: argument {i} is not C-contiguous")
            return ctypes.c_void_p(a.ctypes.data if a.size else 0)
        if isinstance(a, np.uint64) and int(a) == 0 and kind in (1, 2, 3):
            return ctypes.c_void_p(0)  # the null pointer
        dt = np.asarray(a).dtype if isinstance(a, np.generic) else None
        if dt not in _SCALARS:
            raise TypeError(f"{name}: argument {i} is {a!r} ({type(a).__name__}); pass a NumPy "
                            f"scalar of the parameter's exact type")
        want, ctype = _SCALARS[dt]
        if want != kind:
            raise TypeError(f"{name}: argument {i} is {dt} (kind {want}), the parameter's "
                            f"kind is {kind}")
        return ctype(a.item())
