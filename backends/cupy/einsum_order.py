"""numpy's summation order for ||c||^2 (np.einsum("ij,ij->i", C, C)), detected once from
numpy itself, so that pack_centers (cuda/centers.cu) sums it in the same order on the device:
the expansion ||c||^2 - 2 x.c then rounds as the numpy backend's and near-ties break alike.
"""
from __future__ import annotations

import functools

import numpy as np

#: (vector bytes, fused multiply-add, horizontal sum) candidates, most likely first: x86-64
#: baseline (SSE: no FMA, hadd pairs), aarch64 (NEON: FMA, pairwise), AVX2 and AVX-512
#: baselines. Horizontal sum: 0 adjacent pairs, 1 halves folded, 2 folded to 16 bytes then pairs.
_EINSUM_CANDIDATES = ((16, False, 0), (16, True, 0), (32, True, 0), (32, True, 2),
                      (32, False, 0), (32, False, 2), (64, True, 1), (64, True, 2),
                      (64, True, 0), (64, False, 1), (64, False, 2), (64, False, 0))


def emulate_einsum_sq_norm(C, vec_bytes, fused, hmode):
    """np.einsum("ij,ij->i", C, C) for float32 C as numpy's SIMD loop would sum it with
    vectors of vec_bytes (the loop of einsum_sq_norm in cuda/centers.cu, row-parallel)."""
    C = np.asarray(C, dtype=np.float32)
    k, d = C.shape
    L = vec_bytes // 4

    def muladd(v, acc):
        if fused:  # the product is exact in float64; one more rounding (to float32) is rare
            return (v.astype(np.float64) * v.astype(np.float64) + acc).astype(np.float32)
        return v * v + acc

    acc = np.zeros((k, L), dtype=np.float32)
    p, cnt = 0, d
    while cnt >= 4 * L:
        t = muladd(C[:, p + 3 * L:p + 4 * L], acc)
        t = muladd(C[:, p + 2 * L:p + 3 * L], t)
        t = muladd(C[:, p + L:p + 2 * L], t)
        acc = muladd(C[:, p:p + L], t)
        p, cnt = p + 4 * L, cnt - 4 * L
    while cnt > 0:
        v = np.zeros((k, L), dtype=np.float32)
        v[:, :min(cnt, L)] = C[:, p:p + min(cnt, L)]
        acc = muladd(v, acc)
        p, cnt = p + L, cnt - L
    w = L
    while w > 1:
        fold = hmode == 1 or (hmode == 2 and w > 4)
        acc = acc[:, :w // 2] + acc[:, w // 2:w] if fold else acc[:, 0:w:2] + acc[:, 1:w:2]
        w //= 2
    return np.float32(0) + acc[:, 0]


@functools.lru_cache(maxsize=1)
def einsum_order():
    """(vector bytes, fused, horizontal mode) of this numpy's einsum, or None when no candidate
    reproduces it (the kernels then sum ||c||^2 sequentially)."""
    rng = np.random.default_rng(20240611)
    tests = [(rng.standard_normal((48, d)) * rng.uniform(0.1, 30.0, d)).astype(np.float32)
             for d in (5, 7, 9, 13, 17, 33, 67, 130, 261)]
    refs = [np.einsum("ij,ij->i", C, C) for C in tests]
    for cand in _EINSUM_CANDIDATES:
        if all(np.array_equal(emulate_einsum_sq_norm(C, *cand), r)
               for C, r in zip(tests, refs)):
            return cand
    return None


def norm_mode(dtype_name: str) -> int:
    """The `norm_mode` argument of pack_centers (cuda/centers.cu) for this dtype."""
    order = einsum_order()
    if order is None:
        return 0
    vec_bytes, fused, hmode = order
    lanes = vec_bytes // (4 if dtype_name == "float32" else 8)
    return lanes | (int(fused) << 8) | (hmode << 9)
