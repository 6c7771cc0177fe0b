"""Every fit's NaN/inf check and max |X|, from one pass over X whose values are read back
together: on NumPy over row chunks on all cores; on a contiguous CuPy X one reduction at
memory bandwidth (`_cupy_absmax`); on other device arrays their library's max and min,
spread over the card (`_spread_extremes`). The fit rescales X by a power of two when its
squared distances would overflow or underflow (`scaling.pow2_scale`): max |X| decides."""
from __future__ import annotations

import math
import sys
from functools import cache

import numpy as np
from array_api_compat import is_numpy_namespace

from kmeans_xp.contract.chunks import MIN_THREAD_ROWS, c_contiguous, map_rows
from kmeans_xp.contract.namespaces import array_namespace, namespace_name, to_numpy

#: fewest bytes of X a thread of `check_finite` reads: thin X in MIN_THREAD_ROWS pieces
#: costs more in handing chunks to threads than in reading them (2M x 3 float32 on 16
#: threads: 64 chunks took 7 ms, one thread reads it in 2 ms)
MIN_THREAD_BYTES = 4 << 20
#: outputs a device reduction over the rows is spread across: along axis 0 of an (n, d) X
#: a GPU library reduces each of the d columns in one block (milliseconds at d=3 and
#: n=2M); seen as (n / g, g * d) it has g * d outputs to spread over the card
SPREAD_OUTPUTS = 4096
#: rows of the (rows, size / rows) view of a contiguous CuPy X that `_cupy_absmax` reduces
#: along its contiguous axis: CuPy gives each row one block of 512 threads reading it in
#: order, so this many blocks keep every SM of an H100 busy (its max and min over the
#: spread view read 4 GB in 13 ms, 9x the card's read time)
ABSMAX_ROWS = 4096


def check_finite(X, xp, name="X"):
    """Raise on NaN or infinity; return max |X| (float). An empty X (a dask block that a
    filter emptied) is finite, with max |X| 0: max and min have no identity."""
    n = X.shape[0]
    if n == 0 or X.shape[-1] == 0:
        return 0.0
    top = _absmax(X, xp)   # NaN where X has one, inf where it has an infinity
    if not math.isfinite(top):
        if math.isnan(top) or bool(xp.any(xp.isnan(X))):
            raise ValueError(f"Input {name} contains NaN. Remove or impute missing values "
                             f"before clustering.")
        raise ValueError(f"Input {name} contains infinity or a value too large for "
                         f"dtype('{X.dtype}').")
    return top


def _absmax(X, xp) -> float:
    """max |X| as a float, NaN propagating (max |X| = the larger of max X and -min X)."""
    if is_numpy_namespace(xp):  # the full reduction: 50x faster than per column on NumPy
        row_bytes = max(1, math.prod(X.shape[1:]) * X.dtype.itemsize)
        n = X.shape[0]
        parts = map_rows(lambda sl: np.stack([np.max(X[sl]), -np.min(X[sl])]), n, n, xp,
                         min_rows=max(MIN_THREAD_ROWS, MIN_THREAD_BYTES // row_bytes))
    elif namespace_name(X) == "cupy" and c_contiguous(X, unknown=False):
        return _cupy_absmax(X)
    else:
        parts = _spread_extremes(X, xp)
    return float(np.max(np.concatenate([np.ravel(to_numpy(p)).astype(np.float64) for p in parts])))


def _cupy_absmax(X) -> float:
    """max |x| of a C-contiguous CuPy X in one pass: X seen as (ABSMAX_ROWS, size / rows)
    and reduced along its rows, the values left over as one row more; one float64 per row
    read back. bfloat16 X by its bits (`_bf16_absmax`)."""
    if "bfloat16" in str(X.dtype):
        return _bf16_absmax(X)
    return float(np.max(_rows_reduced(X.reshape(-1), _absmax_kernel())))   # (a view)


def _rows_reduced(flat, kernel) -> np.ndarray:
    """A reduction kernel's results over a flat CuPy array seen as (ABSMAX_ROWS, size / rows)
    rows and the values left over as one row more, read back together."""
    rows = min(ABSMAX_ROWS, flat.size)
    width = flat.size // rows
    parts = [kernel(flat[:rows * width].reshape(rows, width), axis=1)]
    if rows * width < flat.size:
        parts.append(kernel(flat[rows * width:].reshape(1, -1), axis=1))
    return np.concatenate([p.get() for p in parts])


def _bf16_absmax(X) -> float:
    """max |x| of a bfloat16 CuPy X from its 16-bit patterns (CuPy's arithmetic on ml_dtypes'
    bfloat16 is young; integers are not): with the sign bit cleared the patterns order as
    the magnitudes do, and above 0x7f80 (infinity) they are NaNs."""
    cp = sys.modules["cupy"]
    top = int(np.max(_rows_reduced(X.reshape(-1).view(cp.uint16), _bits_max_kernel())))
    if top > 0x7F80:
        return math.nan
    return float(np.array([top << 16], dtype=np.uint32).view(np.float32)[0])


@cache
def _bits_max_kernel():
    """max of the 16-bit patterns with the sign bit cleared (`_bf16_absmax`)."""
    cp = sys.modules["cupy"]
    # (no hexadecimal literal: CuPy renames the parameters inside the expression as text,
    # and the "x" of "0x7fff" with them)
    return cp.ReductionKernel("uint16 bits", "uint32 y", "(unsigned)(bits & 32767)",
                              "max(a, b)", "y = a", "0", "kmeans_xp_bits_max")


def problems_absmax(problems, array=None) -> np.ndarray:
    """max |x| of each problem of a batch ((B,) float64; NaN for a problem that has one):
    a C-contiguous CuPy (B, n, d) `array` in one reduction (each problem seen as rows of
    its own), else problem by problem."""
    if (array is not None and namespace_name(array) == "cupy"
            and c_contiguous(array, unknown=False)):
        B, size = array.shape[0], math.prod(array.shape[1:])
        rows = math.gcd(size, max(1, ABSMAX_ROWS // B))   # rows of one problem only
        tops = _absmax_kernel()(array.reshape(B * rows, size // rows), axis=1).get()
        return np.max(np.reshape(tops, (B, rows)), axis=1)
    return np.array([_absmax(p, array_namespace(p)) if p.shape[0] and p.shape[-1] else 0.0
                     for p in problems], dtype=np.float64)


@cache
def _absmax_kernel():
    """max |x| in float64 (exact for every float dtype), NaN propagating: a NaN on either
    side wins (comparisons with NaN are false); CuPy compiles it once and caches it on disk.
    (Not CuPy's max: its CUB path compiles for seconds on a first fit.)"""
    cp = sys.modules["cupy"]
    return cp.ReductionKernel("T x", "float64 y", "fabs((double)x)",
                              "(a != a || a > b) ? a : b", "y = a", "0", "kmeans_xp_absmax")


def _extremes(V, xp):
    """(2, columns) max and -min over V's rows (NaN propagates through both)."""
    return xp.stack([xp.max(V, axis=0), -xp.min(V, axis=0)])


def _spread_extremes(X, xp):
    """Column extremes of a device X as parts of `_extremes`: per column (a GPU library's
    first full reduction compiles a heavy kernel: CuPy's CUB one, seconds), over a view of
    X's leading rows as (n / g, g * d) so that the reduction has SPREAD_OUTPUTS outputs,
    and the rows left over on their own. A strided X is reduced as it is (a view of it
    reshaped would be a copy)."""
    n, d = X.shape[0], math.prod(X.shape[1:])
    g = max(1, SPREAD_OUTPUTS // max(d, 1))
    n0 = n // g * g
    if g == 1 or n0 == 0 or not c_contiguous(X, unknown=False):
        return [_extremes(X, xp)]
    parts = [_extremes(xp.reshape(X[:n0, ...], (n0 // g, g * d)), xp)]
    if n0 < n:
        parts.append(_extremes(X[n0:, ...], xp))
    return parts
