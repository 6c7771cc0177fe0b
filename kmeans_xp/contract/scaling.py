"""The numeric guard of every fit: powers of two that keep squared distances inside X's
dtype, and the way back.

Finite X can still be out of reach of its own arithmetic: float32 values near 1e19 square
past its largest number, values near 1e-22 square to zero, float64 subnormals (1e-310) have
no power of two of their own to come back by, and weights near 1e308 overflow w * x.
Multiplying by a power of two is exact, so the fit runs on X * scale (weights * w_scale)
and its results are brought back to X's units; nothing is silently wrong. `NumericGuard`
holds both powers for one fit; every estimator (KMeans, SphericalKMeans, MiniBatchKMeans and
its partial_fit) makes one in its input checks (`estimators.fitting.Fitting._guard`), so none
computes on X or weights the guard has not seen, whatever the backend.
"""
from __future__ import annotations

import math

import numpy as np

from kmeans_xp.contract.chunks import column_sums, row_chunks
from kmeans_xp.contract.namespaces import operand


class NumericGuard:
    """The powers of two of one fit: X's (`scale`, None until a lazily checked X is
    measured) and the weights' (`w_scale`), and the conversions between X's units and the
    units the fit computes in."""

    def __init__(self, dtype, d, total_weight=1.0, w_scale=1.0, absmax=None,
                 precision="exact"):
        self.dtype, self.d, self.total_weight, self.w_scale = dtype, d, total_weight, w_scale
        self.precision = precision
        self.scale = None
        if absmax is not None:
            self.measure(absmax)

    @classmethod
    def of(cls, dtype, d, n, sample_weight=None, absmax=None, precision="exact"):
        """(the guard of a fit of n rows of X's dtype, the weights in X's dtype times the
        guard's w_scale: validated float64 weights in, a new array out; None stays None)."""
        w_scale = pow2_scale_weights(sample_weight, dtype)
        sw, total = None, float(n)
        if sample_weight is not None:
            sw = (sample_weight * w_scale if w_scale != 1 else sample_weight).astype(
                host_dtype_of(dtype))
            total = max(total, float(np.sum(sw, dtype=np.float64)))
        return cls(dtype, d, total, w_scale, absmax, precision), sw

    def measure(self, absmax):
        """Set X's power of two from its max |x| (the fit's own, or a lazy X's, measured
        where it was checked for NaN/inf); returns it."""
        self.scale = pow2_scale(absmax, self.dtype, self.d, self.total_weight, self.precision)
        return self.scale

    @property
    def exponent(self):
        return math.frexp(self.scale)[1] - 1   # scale == 2**exponent

    def data(self, Xc, xp):
        """Centered X (an array the fit owns) in the fit's units."""
        return Xc if self.scale == 1 else rescaled(Xc, self.scale, xp)

    def centers_in(self, c, xp):
        """Centers (centered, X's units) in the fit's units."""
        return c if self.scale == 1 else c * operand(self.scale, c, xp)

    def centers_out(self, c, xp):
        """Centers in the fit's units back in X's units (centered)."""
        return c if self.scale == 1 else c / operand(self.scale, c, xp)

    def counts_in(self, c, xp, dtype):
        """Weight totals (MiniBatchKMeans's counts) in the fit's weight units and `dtype`."""
        if self.w_scale == 1:
            return c if c.dtype == dtype else xp.astype(c, dtype)
        return xp.astype(xp.astype(c, xp.float64) * self.w_scale, dtype)

    def counts_out(self, c, xp):
        """Weight totals in the weights' own units: float64 where a scale brought them
        into X's dtype (they may lie outside it)."""
        return c if self.w_scale == 1 else xp.astype(c, xp.float64) / self.w_scale

    def sq_dist(self, v):
        """An unweighted squared distance (or a sum of them) in X's squared units."""
        return float(v) if self.scale == 1 else ldexp_or_inf(float(v), -2 * self.exponent)

    def history(self, history):
        """{name: per-step squared distances (None kept)} in X's squared units."""
        return {key: [None if v is None else self.sq_dist(v) for v in values]
                for key, values in history.items()}

    def objective(self, v):
        """A weighted sum of squared distances (inertia) in X's and the weights' units."""
        return self.sq_dist(v) / self.w_scale

    def result(self, best):
        """A LloydResult of the fit's units in X's (`unscaled`)."""
        return unscaled(best, self.scale, self.w_scale)

    def mean_overflows(self, n):
        """Whether X's float64 column sums can overflow (n values near float64's largest):
        then X's mean is taken on X times the scale (`scaled_mean`)."""
        return self.scale < 1 and n * math.ldexp(1.0, -self.exponent) >= _F64_MAX_HALF


def scaled_mean(X, scale, xp, rows):
    """X's per-feature mean, from float64 sums of X * scale chunk by chunk (X's own sums
    would overflow), in X's dtype."""
    s = operand(scale, X, xp)
    total = None
    for sl in row_chunks(X.shape[0], rows):
        part = column_sums(X[sl, ...] * s, xp)
        total = part if total is None else total + part
    mean = total / operand(float(X.shape[0]) * scale, total, xp)
    return xp.astype(mean, X.dtype)


#: precision="fp16" keeps max |x| in [2^-6, 2^13]: centered X and the centers (within twice
#: it) stay below float16's 65504 and, for most values, above its smallest normal 2^-14
FP16_RANGE = (2.0 ** -6, 2.0 ** 13)


def pow2_scale(absmax, dtype, d, total_weight=1.0, precision="exact"):
    """A power of two that brings X into the range where squared distances neither overflow
    nor underflow in its dtype, nor their float64 sum over `total_weight`, and, at
    precision="fp16", where X and the centers fit float16's narrow range (`FP16_RANGE`;
    the other formats keep float32's exponent) (1.0 when it is there already, or absmax is
    unknown)."""
    if not absmax:
        return 1.0
    if precision == "fp16" and not FP16_RANGE[0] <= absmax <= FP16_RANGE[1]:
        return _pow2_toward_one(absmax, np.finfo(host_dtype_of(dtype)))
    info = np.finfo(host_dtype_of(dtype))
    span = 2 * absmax   # |x - c| for centered x and centers inside the data's range
    sq = span * span * d * 4
    too_big = sq >= float(info.max) or sq * max(total_weight, 1.0) >= _F64_MAX
    too_small = span * span <= float(info.tiny) * 2.0 ** (info.nmant + 2)
    if not (too_big or too_small):
        return 1.0
    return _pow2_toward_one(absmax, info)


def pow2_scale_weights(sw, dtype=None):
    """A power of two for weights so large that w * x would overflow (all weights 1e308),
    or so small that they would round to zero or lose bits in X's dtype (subnormal)."""
    if sw is None or sw.size == 0:
        return 1.0
    info = np.finfo(host_dtype_of(sw.dtype if dtype is None else dtype))
    top = float(sw.max())
    if top == 0 or float(info.tiny) ** 0.5 <= top < float(info.max) ** 0.5:
        return 1.0
    # (float64's range: the weights are scaled in float64, then cast to X's dtype)
    return _pow2_toward_one(top, np.finfo(np.float64))


def _pow2_toward_one(top, info):
    """2**e with top * 2**e in [0.5, 1), e capped where 2**e itself is a number of the
    dtype (float64 subnormals near 1e-310 would need 2**1030: 2**1023 brings them to
    about 2**-7, far from underflow)."""
    e = -math.frexp(top)[1]
    return math.ldexp(1.0, max(min(e, info.maxexp - 1), info.minexp))


#: the largest float64: the driver's sums and inertia are float64
_F64_MAX = float(np.finfo(np.float64).max)
_F64_MAX_HALF = _F64_MAX / 2


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
    """The NumPy dtype of host values that go with X of `dtype`: float32 for float32 and the
    half formats (a float16 X computes in float32), else float64."""
    return np.float32 if any(s in str(dtype) for s in ("float32", "float16", "bfloat16")) \
        else np.float64
