"""Powers of two that keep squared distances inside X's dtype, and the way back.

Finite X can still be out of reach of its own arithmetic: float32 values near 1e19 square
past its largest number, values near 1e-22 square to zero, and weights near 1e308 overflow
w * x. Multiplying by a power of two is exact, so the fit runs on X * scale (weights * w_scale)
and its results are brought back to X's units; nothing is silently wrong.
"""
from __future__ import annotations

import math

import numpy as np


def pow2_scale(absmax, dtype, d):
    """A power of two that brings X into the range where squared distances neither overflow
    nor underflow in its dtype (1.0 when it is there already, or absmax is unknown)."""
    if not absmax:
        return 1.0
    info = np.finfo(host_dtype_of(dtype))
    span = 2 * absmax   # |x - c| for centered x and centers inside the data's range
    too_big = span * span * d * 4 >= float(info.max)
    too_small = span * span <= float(info.tiny) * 2.0 ** (info.nmant + 2)
    if not (too_big or too_small):
        return 1.0
    return math.ldexp(1.0, -math.frexp(absmax)[1])   # absmax * scale in [0.5, 1)


def pow2_scale_weights(sw):
    """A power of two for weights so large that w * x would overflow (all weights 1e308)."""
    if sw is None or sw.size == 0:
        return 1.0
    top = float(sw.max())
    if top == 0 or top < float(np.finfo(sw.dtype).max) ** 0.5:
        return 1.0
    return math.ldexp(1.0, -math.frexp(top)[1])


def rescaled(Xc, scale, xp):
    """Xc * scale, in place when the fit owns Xc (exact: a power of two)."""
    try:
        Xc *= xp.asarray(scale, dtype=Xc.dtype)
        return Xc
    except (TypeError, ValueError, AttributeError):
        return Xc * scale


def unscaled(best, scale, w_scale):
    """A LloydResult computed on X * scale with weights * w_scale, in X's own units (powers
    of two throughout, so nothing overflows on the way back)."""
    if scale == 1 and w_scale == 1:
        return best
    e = math.frexp(scale)[1] - 1          # scale == 2**e
    def dist(v):  # squared distances: back by 2**(-2e); inf when X's units cannot hold it
        try:
            return math.ldexp(v, -2 * e)
        except OverflowError:
            return math.inf
    history = {"inertia": [dist(v) / w_scale for v in best.history["inertia"]],
               "center_shift": [dist(v) for v in best.history["center_shift"]]}
    return best._replace(centers=best.centers / scale, inertia=dist(best.inertia) / w_scale,
                         history=history)


def ldexp_or_inf(v, e):
    try:
        return math.ldexp(v, e)
    except OverflowError:
        return math.inf


def host_dtype_of(dtype):
    return np.float32 if "float32" in str(dtype) else np.float64
