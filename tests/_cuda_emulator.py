"""Runs the CuPy backends' raw CUDA kernels (`_cupy_kmeans_kernels.RAW_SOURCE`) on the CPU.

The kernel source is compiled as C++20 with a small SIMT emulation in front of it: every
CUDA thread of a block is a coroutine (ucontext) on one OS thread, blocks run one after
another; `__syncthreads` is a block barrier, warp shuffles and votes exchange values through
a per-warp slot array between two warp barriers (a thread that waits yields to the next);
`__shared__` arrays are static (one block runs at a time), the dynamic one a per-launch
buffer; atomics are plain read-modify-writes (one OS thread); the rounding intrinsics are
std::fma and plain IEEE operations compiled with -ffp-contract=off (what the GPU does).

So the kernels' logic (indexing, tiles, grid-stride loops, warp reductions, tie rules) and
their arithmetic are checked bit for bit against NumPy without a GPU. Launch configuration,
occupancy and speed are not. Needs g++ (C++20) and <ucontext.h>; callers skip without it.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np
from kmeans_xp_backends import _cupy_kmeans_kernels as K

HEADER = r"""
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct emu_dim { unsigned x = 0; };
static emu_dim threadIdx, blockIdx, blockDim, gridDim;
static unsigned char* emu_dynamic_smem = nullptr;

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };

template <class T> inline T min(T a, T b) { return b < a ? b : a; }

// -- cooperative threads: every CUDA thread of a block is a ucontext on one OS thread;
//    a thread runs until it waits at a barrier, then the scheduler resumes the next one
static ucontext_t emu_sched;
static std::vector<ucontext_t> emu_ctx;
static std::vector<char> emu_done;
static int emu_cur = 0;
static std::function<void()>* emu_body = nullptr;

static void emu_trampoline() {
    (*emu_body)();
    emu_done[emu_cur] = 1;  // returning resumes the scheduler (uc_link)
}
static inline void emu_yield() { swapcontext(&emu_ctx[emu_cur], &emu_sched); }

struct emu_barrier { int count = 0, arrived = 0; unsigned gen = 0; };
static emu_barrier emu_block_bar;
static std::vector<emu_barrier> emu_warp_bar;
static inline void emu_wait(emu_barrier& b) {
    const unsigned g = b.gen;
    if (++b.arrived == b.count) { b.arrived = 0; ++b.gen; return; }
    while (b.gen == g) emu_yield();
}
static std::vector<unsigned long long> emu_slots;  // 32 per warp

inline void __syncthreads() { emu_wait(emu_block_bar); }
inline void __threadfence() {}

template <class T>
inline T emu_exchange(T v, int src) {
    const int me = threadIdx.x, warp = me >> 5;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    emu_slots[me] = bits;
    emu_wait(emu_warp_bar[warp]);
    const unsigned long long got = emu_slots[warp * 32 + (src & 31)];
    emu_wait(emu_warp_bar[warp]);
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
    emu_slots[me] = p;
    emu_wait(emu_warp_bar[warp]);
    bool all = true;
    for (int i = 0; i < 32; ++i) all = all && emu_slots[warp * 32 + i];
    emu_wait(emu_warp_bar[warp]);
    return all;
}

inline double atomicAdd(double* p, double v) { double old = *p; *p = old + v; return old; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    unsigned long long old = *p; *p = old + v; return old;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double f; std::memcpy(&f, &i, 8); return f; }
template <class T> inline T __ldg(const T* p) { return *p; }

template <class F>
void emu_launch(int grid, int block, size_t smem, F body) {
    std::function<void()> fn = body;
    emu_body = &fn;
    gridDim.x = grid;
    blockDim.x = block;
    std::vector<unsigned char> dyn(smem + 64);
    emu_dynamic_smem = dyn.data() + (64 - reinterpret_cast<size_t>(dyn.data()) % 64) % 64;
    const size_t stack = 1 << 16;
    std::vector<char> stacks((size_t)block * stack);
    emu_ctx.assign(block, ucontext_t{});
    emu_done.assign(block, 0);
    emu_slots.assign(block, 0);
    for (int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        emu_block_bar = emu_barrier{block, 0, 0};
        emu_warp_bar.assign(block / 32, emu_barrier{32, 0, 0});
        for (int t = 0; t < block; ++t) {
            getcontext(&emu_ctx[t]);
            emu_ctx[t].uc_stack.ss_sp = stacks.data() + (size_t)t * stack;
            emu_ctx[t].uc_stack.ss_size = stack;
            emu_ctx[t].uc_link = &emu_sched;
            makecontext(&emu_ctx[t], emu_trampoline, 0);
            emu_done[t] = 0;
        }
        int remaining = block;
        while (remaining) {
            for (int t = 0; t < block; ++t) {
                if (emu_done[t]) continue;
                emu_cur = t;
                threadIdx.x = t;
                swapcontext(&emu_sched, &emu_ctx[t]);
                if (emu_done[t]) --remaining;
            }
        }
    }
}
"""

_CT = {"float": np.float32, "double": np.float64}


def _wrappers(names):
    """extern "C" launchers, one per template instance: emu_<i>(grid, smem, args...)."""
    sig = {
        "nearest_small": ("const {T}* X, const {T}* ops, long long n, int k, long long* labels, "
                          "{T}* min_sq", "X, ops, n, k, labels, min_sq"),
        "nearest_tiled": ("const {T}* X, const {T}* ops, long long n, int k, int d, "
                          "long long* labels, {T}* min_sq", "X, ops, n, k, d, labels, min_sq"),
        "nearest_mem": ("const {T}* X, const {T}* ops, long long n, int k, int d, "
                        "long long* labels, {T}* min_sq", "X, ops, n, k, d, labels, min_sq"),
        "cluster_sums_shared": ("const {T}* X, const long long* labels, const {T}* w, long long n, "
                                "int d, int k, double* sums, double* wsum",
                                "X, labels, w, n, d, k, sums, wsum"),
        "row_argmin_shifted": ("const {T}* dist, const {T}* c_norm, long long rows, int width, "
                               "long long col0, int first, {T}* run_min, long long* labels",
                               "dist, c_norm, rows, width, col0, first, run_min, labels"),
        "update_label_store": ("const long long* labels, {T}* store, long long m, "
                               "unsigned long long* changed", "labels, store, m, changed"),
    }
    out = []
    for i, name in enumerate(names):
        base = name.split("<")[0]
        T = name.split("<")[1].split(",")[0].rstrip(">").strip()
        params, args = sig[base]
        out.append(f'extern "C" void emu_{i}(int grid, int block, size_t smem, '
                   f'{params.format(T=T)}) {{\n'
                   f'    emu_launch(grid, block, smem, [&] {{ {name}({args}); }});\n}}\n')
    return "".join(out)


class EmulatedKernels:
    """The raw kernels compiled for the CPU; `launch(name, grid, args, smem=0)`."""

    def __init__(self, names, build_dir=None):
        self.names = list(names)
        source = K.RAW_SOURCE.replace("extern __shared__ double acc[];",
                                      "double* acc = reinterpret_cast<double*>(emu_dynamic_smem);")
        code = HEADER + source + _wrappers(self.names)
        digest = hashlib.sha1(code.encode()).hexdigest()[:16]
        build_dir = build_dir or os.path.join(tempfile.gettempdir(), "kmeans_xp_emu")
        os.makedirs(build_dir, exist_ok=True)
        lib = os.path.join(build_dir, f"kernels_{digest}.so")
        if not os.path.exists(lib):
            src = os.path.join(build_dir, f"kernels_{digest}.cpp")
            with open(src, "w") as f:
                f.write(code)
            tmp = lib + f".{os.getpid()}"
            subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared",
                            "-o", tmp, src], check=True, capture_output=True,
                           text=True)
            os.replace(tmp, lib)
        self.lib = ctypes.CDLL(lib)

    @staticmethod
    def available():
        return shutil.which("g++") is not None

    def launch(self, name, grid, args, smem=0, block=K.BLOCK):
        fn = getattr(self.lib, f"emu_{self.names.index(name)}")
        cargs = [ctypes.c_int(grid), ctypes.c_int(block), ctypes.c_size_t(smem)]
        for a in args:
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous
                cargs.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, np.int64):
                cargs.append(ctypes.c_longlong(int(a)))
            elif isinstance(a, (np.int32, int)):
                cargs.append(ctypes.c_int(int(a)))
            else:
                raise TypeError(f"argument {a!r}")
        fn(*cargs)
