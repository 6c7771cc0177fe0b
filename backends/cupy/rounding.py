"""X's rows and the centers rounded to a reduced format on the GPU ("tf32", "fp16", "bf16";
`kmeans_xp.contract.precision`), held in float32 for cuBLAS's FP32 GEMM. A product of two
values of at most 11 significant bits is exact in float32, so that GEMM then computes what a
tensor core computes on the format with FP32 accumulation (up to the order of the sum): the
semantics of reduced precision on any GPU, not its speed. Round to nearest even, as the
numpy backend's emulation (`contract.precision.round_to`), so both give the same rounded
operands."""
from __future__ import annotations

from kmeans_xp.contract.precision import PRECISIONS

#: float32 mantissa bits that tf32 and bf16 drop (fp16 goes through CuPy's float16 cast,
#: which also narrows the exponent range as float16 does)
DROPPED_BITS = {"tf32": 13, "bf16": 16}
#: float32 values per row a rounding needs beside X's row: the rounded row and a temporary
#: of d words (the float16 cast's temporary is smaller)
ROW_FACTOR = 2
assert set(DROPPED_BITS) | {"fp16", "exact"} == set(PRECISIONS)


def round_into(cp, x, precision, out):
    """x (2-d, on the device) rounded to `precision` into `out` (x's shape and dtype; float64
    only when predict gets float64 X from a fit at a reduced precision). Array operations
    in place (no kernel of its own: the CPU stand-in of CuPy runs it too)."""
    if x.dtype != "float32":
        out[...] = round_into(cp, x.astype("float32"), precision,
                              cp.empty(x.shape, dtype="float32"))
        return out
    if precision == "fp16":
        out[...] = x.astype("float16")
        return out
    drop = cp.uint32(DROPPED_BITS[precision])
    out[...] = x   # (finite: X and the centers are validated; inf would stay inf)
    bits = out.view(cp.uint32)
    bump = bits >> drop
    bump &= cp.uint32(1)                              # ties go to the even mantissa
    bump += cp.uint32((1 << (int(drop) - 1)) - 1)
    bits += bump
    bits >>= drop
    bits <<= drop
    return out
