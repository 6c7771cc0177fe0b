"""Compute precision of a fit's distances: the names, what each rounds, which backends take
which, and the documented bound on how far a reduced-precision fit may be from the exact one
(docs/precision.md derives it).

"exact" computes in X's dtype (float32 or float64). "tf32", "fp16" and "bf16" round X and the
centers to that format's mantissa before the distance product and accumulate in float32
(tensor cores on a GPU; the numpy backend emulates the rounding so CI tests the semantics).
Centers, sums and inertia stay float32. X of dtype float16 or bfloat16 takes "exact" (the
CPU backends compute its values in float32, which holds them exactly) or its own format
(the centers rounded to it too, as a tensor core reads them); another format is refused.
"""
from __future__ import annotations

import sys

import numpy as np

#: the names of the `precision` option, in order of decreasing accuracy
PRECISIONS = ("exact", "tf32", "fp16", "bf16")

#: unit roundoff u of each reduced format: 2^-(mantissa bits + 1) for round to nearest; tf32
#: and fp16 keep 10 mantissa bits, bf16 7 (float32 keeps 23). tf32's is 2^-10, which also
#: covers truncation (cuBLAS may truncate to TF32; `testing.label_bounds.tf32_error` too)
UNIT_ROUNDOFF = {"tf32": 2.0 ** -10, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}

#: mantissa bits of float32 that tf32 and bf16 drop (both keep float32's exponent)
_DROPPED_BITS = {"tf32": 13, "bf16": 16}

#: float16's largest finite value: an fp16 fit of float32 X beyond it would overflow
FP16_MAX = 65504.0


def half_kind(dtype) -> str | None:
    """"fp16" or "bf16" for a dtype of that format (NumPy, CuPy, torch, ml_dtypes), else None."""
    name = str(getattr(dtype, "name", dtype)).rsplit(".", 1)[-1]
    return {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(name)


#: the dtype (by name) that stores each half format's data (`KMeansBackend.half_data`)
HALF_STORAGE = {"fp16": "float16", "bf16": "bfloat16"}


def storage_dtype(precision: str, xp):
    """The dtype of namespace `xp` that stores data in `precision`'s half format (float16;
    bfloat16, which NumPy and CuPy name through ml_dtypes), or None: a precision without
    one, or a namespace that cannot hold it (ml_dtypes not installed, CuPy before 14)."""
    name = HALF_STORAGE.get(precision)
    if name is None:
        return None
    found = getattr(xp, name, None)
    return found if found is not None else _ml_dtype(name, xp)


def half_storage(backend, xp):
    """The dtype a fit on `backend` keeps its centered data in: its precision's half format
    where the backend computes on data so (`KMeansBackend.half_data`) and `xp` holds it,
    else None (the data stays in its compute dtype). Single fits and batches alike."""
    precision = backend.compute_precision
    return storage_dtype(precision, xp) if precision in backend.half_data else None


_HELD: dict = {}


def _ml_dtype(name: str, xp):
    """ml_dtypes' `name` where `xp` computes with it as a fit does (asked once per
    namespace), else None."""
    try:
        import ml_dtypes
        dtype = np.dtype(getattr(ml_dtypes, name))
        given = xp.asarray(np.array([1.5, -2.0, 0.0, 2.0 ** 100], dtype=np.float32))
        # (asked of the library itself, so that it and a compat wrapper of it agree)
        lib = sys.modules[type(given).__module__.split(".")[0]]
    except Exception:  # noqa: BLE001 - no ml_dtypes, or a namespace without arrays of it
        return None
    key = (id(lib), name)   # (libraries are modules: they live as long as the process)
    if key not in _HELD:
        try:
            _HELD[key] = dtype if _computes_with(lib, given, dtype) else None
        except Exception:  # noqa: BLE001 - a library that names the type but lacks loops
            _HELD[key] = None
    return _HELD[key]


def _computes_with(lib, given, dtype) -> bool:
    """Whether array library `lib` (NumPy, CuPy: the ones ml_dtypes' types are for) does
    with arrays of `dtype` what a fit on them asks of it (one that only names the type, as
    CuPy before its kernels took it, does not): conversions both ways, a row gather, the
    float32 difference of the centering, a NaN test; exact on `given`'s values."""
    values = _host(given)
    a = given.astype(dtype)
    back = a.astype(np.float32)
    rows = a[lib.asarray([3, 0])].astype(np.float32)
    diff = lib.subtract(a, given, dtype=np.float32)
    return (np.array_equal(_host(back), values) and np.array_equal(_host(rows), values[[3, 0]])
            and not np.any(_host(diff)) and not bool(lib.any(lib.isnan(a))))


def _host(a):
    """A NumPy or CuPy array on the host."""
    return np.asarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a)


def compute_dtype(dtype, xp):
    """The dtype of the centers, weights and distances of a fit on data of `dtype`: float32
    for half data (float16 X that a backend reads as it is: `KMeansBackend.half_data`),
    else the data's own."""
    return xp.float32 if half_kind(dtype) is not None else dtype


def resolve(precision: str, dtype) -> str:
    """The precision a fit of X of `dtype` computes at, or a ValueError saying what to change
    (raised before any device work). Half X takes "exact" or its own format."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {list(PRECISIONS)}.")
    kind = half_kind(dtype)
    if kind is not None:
        if precision not in ("exact", kind):
            raise ValueError(f"precision={precision!r} with X of dtype {_name(dtype)}: half "
                             f"X computes at its own format ({kind!r}); pass precision="
                             f"{kind!r} (or 'exact'), or X.astype(float32) for "
                             f"precision={precision!r}.")
        return precision
    if precision != "exact" and "64" in _name(dtype):
        raise ValueError(f"precision={precision!r} needs float32 or half X, got float64 "
                         f"(reduced precision of float64 data only wastes its bits); pass "
                         f"X.astype(np.float32), or precision='exact'.")
    return precision


def _name(dtype) -> str:
    return str(getattr(dtype, "name", dtype)).rsplit(".", 1)[-1]


def supported(backend_cls) -> tuple[str, ...]:
    """The precisions a backend class declares (`KMeansBackend.precisions`; "exact" alone when
    it declares none)."""
    return tuple(getattr(backend_cls, "precisions", ("exact",)))


def unsupported_reason(backend_cls, precision: str) -> str | None:
    """None when the backend computes at `precision`, else a sentence saying why not."""
    if precision in supported(backend_cls):
        return None
    return (f"it computes at precision {list(supported(backend_cls))}, not {precision!r}")


def round_to(x, precision: str, out=None):
    """Float32 `x` (NumPy, or CuPy on the device: the array's own methods, no kernel) rounded
    to the format of `precision`, round to nearest even, held in float32: what a tensor core
    reads, and the one rounding of the numpy emulation and cupy-chunked's reduced GEMM. Into
    `out` (x's shape; float64 when predict gets float64 X from a reduced fit) when given. No
    new dependency: fp16 through the library's float16 cast (which narrows the exponent
    range as float16 does: past 65504, inf), tf32 and bf16 by rounding away float32's low
    mantissa bits in place (a finite value past float32's range becomes inf)."""
    if getattr(x, "dtype", None) != np.float32:
        x = np.asarray(x, dtype=np.float32) if out is None or isinstance(out, np.ndarray) \
            else x.astype("float32")
    if out is not None and out.dtype != np.float32:
        out[...] = round_to(x, precision)
        return out
    r = x.copy() if out is None else out
    if precision == "exact":
        r[...] = x
        return r
    if precision == "fp16":
        with np.errstate(over="ignore"):
            r[...] = x.astype("float16")
        return r
    drop = _DROPPED_BITS[precision]
    r[...] = x
    bits = r.view("uint32")
    bump = bits >> np.uint32(drop)
    bump &= np.uint32(1)                                   # ties go to the even mantissa
    bump += np.uint32((1 << (drop - 1)) - 1)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    bump *= finite                                         # (inf and NaN stay as they are)
    bits += bump
    bits >>= np.uint32(drop)
    bits <<= np.uint32(drop)
    return r


def assignment_error(precision: str, d: int, x_norm, c_norm):
    """Bound on |computed - exact| of one squared distance ||x - c||^2 at `precision`, for
    rows of norm x_norm and a center of norm c_norm (arrays broadcast): rounding x and c to
    the format moves ||x - c|| by at most u (|x| + |c|), and the float32 accumulation of the
    expansion |x|^2 - 2 x.c + |c|^2 adds gamma_{d+2} (|x| + |c|)^2 (docs/precision.md)."""
    u = UNIT_ROUNDOFF.get(precision, 0.0)
    u32 = np.finfo(np.float32).eps / 2
    gamma = (d + 2) * u32 / (1 - (d + 2) * u32)
    s = np.asarray(x_norm, np.float64) + np.asarray(c_norm, np.float64)
    # (||x - c|| + u s)^2 - ||x - c||^2 <= 2 u s ||x - c|| + u^2 s^2 <= (2 u + u^2) s^2
    return (2 * u + u * u + gamma) * s * s


#: the documented whole-fit bound (docs/precision.md): relative inertia gap to the exact fit
#: from the same initial centers, on data whose clusters are separated beyond the assignment
#: error, as a multiple of the format's unit roundoff times sqrt(d)
WHOLE_FIT_FACTOR = 16.0
#: ... and the share of labels that may differ there (near ties only)
LABEL_SHARE = 0.01


def inertia_gap_bound(precision: str, d: int) -> float:
    """Documented relative inertia gap |I_p - I_exact| / I_exact of a whole fit at
    `precision` against the exact fit from the same initial centers (0 for "exact")."""
    if precision == "exact":
        return 0.0
    return min(WHOLE_FIT_FACTOR * UNIT_ROUNDOFF[precision] * float(np.sqrt(d)), 0.5)
