"""The CuPy backends' kernels that read X, run on the CPU (tests/_cuda_emulator.py) with X
stored in a half format (`const xhalf*` fp16, `const xbf16*` bf16, cuda/formats.cuh): the
`<float, ..., xhalf>` / `<float, ..., xbf16>` instance on the half bits gives bit for bit what
the `<float>` instance gives on the same values as float32, since every half value widens
exactly to float and the arithmetic stays in float and float64. Data of mixed signs and
magnitudes (subnormals, values near fp16's largest), n a multiple of no block, d a multiple
of 8 (accumulate_sorted's 16-byte pieces of 8 halves) and not. The widening itself is
checked on all 65536 bit patterns of each format, directly and through a kernel. Skipped
without g++.
"""
import ctypes
import subprocess

import numpy as np
import pytest
from kmeans_xp_backends.cupy import common
from kmeans_xp_backends.cupy.common import BLOCK, NULL

from tests._cuda_emulator import HEADER, EmulatedKernels

pytestmark = pytest.mark.skipif(not EmulatedKernels.available(), reason="needs g++")

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
#: the half storage types: X's bits as the kernels read them
FORMATS = ("xhalf", "xbf16")
#: d: below 16 (one thread a row in direct.cu), multiples of 8 and 16, and neither
DIMS = [3, 16, 37]
N = 1061  # not a multiple of BLOCK, of 8 or of any grid's threads


@pytest.fixture(scope="module")
def emu():
    return EmulatedKernels()


@pytest.fixture(params=FORMATS)
def fmt(request):
    return request.param


def bf16_bits(X32):
    """float32 values rounded to bf16, to nearest even (finite values), as uint16 bits."""
    u = np.ascontiguousarray(X32, dtype=F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits):
    """bf16 bits as their float32 values (exact: the upper half of a float)."""
    return (bits.astype(np.uint32) << 16).view(F32)


def _half_data(n, d, seed, fmt="xhalf"):
    """(Xh, X32): data in the half format `fmt` (float16, or bf16 bits as uint16) and its
    exact float32 copy. Per column a different offset and spread (magnitudes from 1e-3 to
    3e3, both signs), plus the format's subnormals, zeros of both signs and large values
    (near fp16's largest; for bf16 up to 1e17, whose squares float32 still holds)."""
    if fmt == "xbf16":
        return _bf16_data(n, d, seed)
    rng = np.random.default_rng(seed)
    mag = 10.0 ** rng.uniform(-3, 3.4, (n, d))
    X = np.where(rng.random((n, d)) < 0.4, -mag, mag) + np.linspace(-50, 80, d)
    special = np.array([3e-6, -3e-6, 6e-8, -6e-8, 0.0, -0.0, 3000.0, -3000.0, 60000.0,
                        -65504.0, 1.0009765625, 2.0 ** -14])
    at = rng.random((n, d)) < 0.08
    X[at] = rng.choice(special, int(at.sum()))
    X16 = np.ascontiguousarray(X.astype(F16))
    assert np.all(np.isfinite(X16))
    assert np.any((X16 != 0) & (np.abs(X16) < np.float16(2.0 ** -14)))  # subnormals in
    return X16, X16.astype(F32)


def _bf16_data(n, d, seed):
    rng = np.random.default_rng(seed)
    mag = 10.0 ** rng.uniform(-3, 3.4, (n, d))
    X = np.where(rng.random((n, d)) < 0.4, -mag, mag) + np.linspace(-50, 80, d)
    special = np.array([1e-39, -1e-39, 5e-41, 0.0, -0.0, 3e5, -3e5, 1e17, -1e17,
                        1.0078125, 2.0 ** -126])
    at = rng.random((n, d)) < 0.08
    X[at] = rng.choice(special, int(at.sum()))
    bits = bf16_bits(X.astype(F32))
    X32 = bf16_values(bits)
    assert np.any((X32 != 0) & (np.abs(X32) < 2.0 ** -126))  # float32 subnormals in
    return bits, X32


def _aligned(a, align=16):
    """a's copy at an `align`-byte boundary (accumulate_sorted's 16-byte loads)."""
    if a.ctypes.data % align == 0:
        return a
    buf = np.empty(a.nbytes + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _same(a, b, what=""):
    """The same bits (so -0 differs from +0, and NaN must match NaN)."""
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert np.array_equal(_bits(a), _bits(b)), f"{what}: {a.ravel()[:8]} vs {b.ravel()[:8]}"


def _both(Xh, X32, fmt="xhalf"):
    """(X, the type list's X part) of the half and float launches."""
    return ((Xh, f"float,{fmt}"), (X32, "float"))


def _weights(n, seed, zeros=True):
    w = np.random.default_rng(seed).uniform(0.25, 3.0, n).astype(F32)
    if zeros:
        w[::9] = 0
    return w


def _labels(n, k, seed):
    return np.random.default_rng(seed).integers(0, k, n).astype(np.int32)


# ---------------------------------------------------------------------------------------------
# the widening
# ---------------------------------------------------------------------------------------------
def _patterns(fmt):
    """The 65536 bit patterns of a half format and their values as float32 (NumPy's float16
    for fp16; the upper half of a float for bf16)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    return bits, (bits.view(F16).astype(F32) if fmt == "xhalf" else bf16_values(bits))


def test_every_half_bit_pattern_widens_to_its_float32_value(tmp_path, fmt):
    """xval<float> of every one of the 65536 patterns of the format (fp16_value, bf16_value),
    compiled as the emulator compiles the kernels: finite ones give exactly the value as
    float32 (same bits: -0 stays -0, subnormals exact), infinities stay infinities, NaNs
    NaNs of the same sign."""
    src = tmp_path / "widen.cpp"
    src.write_text(HEADER + common.source("common.cuh") + r"""
extern "C" void widen(const unsigned short* h, float* out, int n) {
    for (int i = 0; i < n; ++i) out[i] = xval<float>(reinterpret_cast<const FMT*>(h) + i);
}
""".replace("FMT", fmt))
    lib = tmp_path / "widen.so"
    proc = subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared",
                           "-w", "-o", str(lib), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bits, ref = _patterns(fmt)
    out = np.full(1 << 16, np.nan, dtype=F32)
    ctypes.CDLL(str(lib)).widen(ctypes.c_void_p(bits.ctypes.data),
                                ctypes.c_void_p(out.ctypes.data), ctypes.c_int(1 << 16))
    finite = np.isfinite(ref)
    # (an all-ones exponent: 2 infinities and the NaNs; fp16's has 5 bits, bf16's 8)
    assert finite.sum() == 65536 - (2 * 1024 if fmt == "xhalf" else 2 * 128)
    _same(out[finite], ref[finite], "finite values")
    inf = np.isinf(ref)
    _same(out[inf], ref[inf], "infinities")
    nan = np.isnan(ref)
    assert np.all(np.isnan(out[nan]))
    assert np.array_equal(np.signbit(out[nan]), bits[nan] >= 0x8000)


def test_every_finite_half_value_through_column_moments(emu, fmt):
    """The widening as a kernel does it: column_moments<float,fmt> over a (8, m) X of all m
    finite values of the format, column j's value in row j % 8 (each of the eight loads in
    flight carries values), the other rows +0. Per column the float64 sum is the value (+0
    for -0) and the sum of squares its square (exact: at most 22 significant bits, within
    float64's range); column_absmax its |x|."""
    bits, values = _patterns(fmt)
    finite = np.isfinite(values)
    vals, vbits = values[finite], bits[finite]
    m = vals.size
    assert m % BLOCK == 0
    Xh = np.zeros((8, m), dtype=np.uint16)
    Xh[np.arange(m) % 8, np.arange(m)] = vbits
    grid = m // BLOCK  # the stride is m: one pass of the unrolled loop a thread
    part_sum, part_sq = np.full(m, np.nan), np.full(m, np.nan)
    emu.launch("stats.cu", f"column_moments<float,{fmt}>", grid,
               (Xh, np.int64(Xh.size), np.int32(m), NULL, part_sum, part_sq, np.int64(0)))
    v64 = vals.astype(np.float64)
    _same(part_sum, v64 + 0.0, "sums")
    _same(part_sq, v64 * v64, "squares")
    out = np.zeros(m, dtype=np.uint64)
    emu.launch("stats.cu", f"column_absmax<float,{fmt}>", grid,
               (Xh, np.int64(Xh.size), np.int32(m), out, np.int64(0)))
    _same(out.view(np.float64), np.abs(v64), "absmax")


def test_a_half_pointer_parameter_takes_its_format_only(emu):
    """The emulator's launch check: float16 values (or their uint16 bits) or null for a
    `const xhalf*`; a float32 array there is the bug it catches, as float16 values for a
    `const xbf16*`."""
    X16, X32 = _half_data(40, 3, seed=1)
    out = np.zeros(3, dtype=np.uint64)
    args = (np.int64(X16.size), np.int32(3), out, np.int64(0))
    emu.launch("stats.cu", "column_absmax<float,xhalf>", 1, (X16.view(np.uint16), *args))
    _same(out.view(np.float64), np.abs(X32).max(axis=0).astype(np.float64))
    with pytest.raises(TypeError, match="float16"):
        emu.launch("stats.cu", "column_absmax<float,xhalf>", 1, (X32, *args))
    with pytest.raises(TypeError, match="bfloat16"):   # (nor float16 values for bf16)
        emu.launch("stats.cu", "column_absmax<float,xbf16>", 1, (X16, *args))
    emu.launch("stats.cu", "column_absmax<float>", 1, (X32, *args))  # (float: as before)


# ---------------------------------------------------------------------------------------------
# stats.cu
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", DIMS)
def test_column_absmax_and_moments_read_half_x(emu, fmt, d):
    """column_absmax, and column_moments for a batch of two problems along the grid's y
    (with a shift and without), at a stride that leaves both the eight-load loop and the
    tail something to do."""
    X16, X32 = _half_data(2 * N, d, seed=d, fmt=fmt)
    grid = 1
    stride = grid * BLOCK // d * d
    outs = {}
    for X, t in _both(X16, X32, fmt):
        absmax = np.zeros(d, dtype=np.uint64)
        emu.launch("stats.cu", f"column_absmax<{t}>", grid,
                   (X, np.int64(X.size), np.int32(d), absmax, np.int64(0)))
        res = [absmax]
        shift = np.random.default_rng(d).normal(0, 5, 2 * d)
        for sh in (shift, NULL):
            ps, pq = np.full(2 * stride, np.nan), np.full(2 * stride, np.nan)
            emu.launch("stats.cu", f"column_moments<{t}>", (grid, 2),
                       (X, np.int64(N * d), np.int32(d), sh, ps, pq, np.int64(N * d)))
            res += [ps, pq]
        outs[t] = res
    for a, b in zip(outs[f"float,{fmt}"], outs["float"]):
        _same(a, b, f"d={d}")
    assert N * d > 8 * stride and (N * d) % (8 * stride)  # (both loops ran)
    ref = np.abs(X32[:N].astype(np.float64)).max(axis=0)
    np.testing.assert_array_equal(outs["float"][0].view(np.float64), ref)


def test_column_absmax_takes_a_batch_along_the_grids_y(emu, fmt):
    """Three problems in one launch (problem y's values problem_stride after y - 1's, its
    maxima d words after): each problem's maxima, as a launch of its own gives them."""
    B, n, d = 3, 517, 11
    Xh, X32 = _half_data(B * n, d, seed=40, fmt=fmt)
    X32[n:2 * n] *= 0.5   # (the problems differ)
    Xh = np.ascontiguousarray(X32.astype(F16) if fmt == "xhalf" else bf16_bits(X32))
    X32 = Xh.astype(F32) if fmt == "xhalf" else bf16_values(Xh)
    for X, t in _both(Xh, X32, fmt):
        both = np.zeros(B * d, dtype=np.uint64)
        emu.launch("stats.cu", f"column_absmax<{t}>", (2, B),
                   (X, np.int64(n * d), np.int32(d), both, np.int64(n * d)))
        for b in range(B):
            one = np.zeros(d, dtype=np.uint64)
            emu.launch("stats.cu", f"column_absmax<{t}>", 2,
                       (X[b * n:(b + 1) * n], np.int64(n * d), np.int32(d), one, np.int64(0)))
            _same(both[b * d:(b + 1) * d], one, f"problem {b}")
            ref = np.abs(X32[b * n:(b + 1) * n].astype(np.float64)).max(axis=0)
            np.testing.assert_array_equal(one.view(np.float64), ref)


# ---------------------------------------------------------------------------------------------
# fused_sums.cu
# ---------------------------------------------------------------------------------------------
def _fixed_point(X32, w, n):
    """The fixed-point scales (fixed_point_scales' rule: 2^(61 - e) with max|x_j| * total
    weight below 2^e) and 2^L (fused_plan.fixed_point_lo)."""
    wt = float(np.sum(w, dtype=np.float64)) if w is not None else float(n)
    bound = np.append(np.abs(X32.astype(np.float64)).max(axis=0) * wt, wt)
    scale = np.ldexp(1.0, np.clip(61 - np.frexp(bound)[1], -1000, 1000))
    scale[bound == 0] = 1.0
    return scale, np.float64(2.0 ** max(1, 63 - int(n).bit_length()))


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("weighted", [True, False])
def test_shared_and_global_sums_read_half_x(emu, fmt, d, weighted):
    """accumulate_shared (one point a thread, warps of one cluster summed first: the first
    rows share a label) and accumulate_global (one thread an element), zero weights among
    the points: the fixed-point words of float32 X, and the same in both modes."""
    k = 7
    X16, X32 = _half_data(N, d, seed=10 + d, fmt=fmt)
    w = _weights(N, d) if weighted else None
    labels = _labels(N, k, d)
    labels[:96] = 3
    scale, two_l = _fixed_point(X32, w, N)
    W = NULL if w is None else w
    got = {}
    for X, t in _both(X16, X32, fmt):
        shared = np.zeros(k * (d + 1) * 2, dtype=np.uint64)
        emu.launch("fused_sums.cu", f"accumulate_shared<{t}>", 3,
                   (X, W, labels, np.int32(N), np.int32(d), np.int32(k), shared, scale, two_l,
                    NULL), smem=k * (d + 1) * 16 + (d + 1) * 8)
        glob = np.zeros_like(shared)
        emu.launch("fused_sums.cu", f"accumulate_global<{t}>", 5,
                   (X, W, labels, np.int32(N), np.int32(d), glob, scale, two_l, NULL))
        got[t] = shared, glob
    for a, b in zip(got[f"float,{fmt}"], got["float"]):
        _same(a, b, f"d={d}")
    _same(got["float"][0], got["float"][1], "shared vs global")
    assert np.count_nonzero(got["float"][0]) > k * d  # (the sums are not trivially zero)


def _sorted_sums(emu, name, X, w, labels, k, scale, two_l, rows):
    n, d = X.shape
    order = np.argsort(labels, kind="stable").astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=k))]).astype(np.int32)
    acc = np.zeros(k * (d + 1) * 2, dtype=np.uint64)
    emu.launch("fused_sums.cu", name, -(-n // rows),
               (X, NULL if w is None else w, order, starts, np.int32(n), np.int32(d),
                np.int32(k), np.int32(rows), acc, scale, two_l, NULL))
    return acc


@pytest.mark.parametrize("d,n,rows", [(3, N, 7), (16, N, 64), (37, N, 40), (24, 301, 9),
                                      (2056, 23, 5), (517, 31, 4)])
def test_sorted_sums_read_half_x_in_pieces_of_eight(emu, fmt, d, n, rows):
    """accumulate_sorted<float,8,xhalf> (16-byte pieces of 8 halves, where d % 8 == 0) and
    <float,1,xhalf> give the words of <float,1> and <float,4> on float32 X, and of
    accumulate_shared: clusters over several blocks and blocks of several clusters, an
    empty cluster, zero weights, and rows wider than a block's threads (d = 2056: 257 pieces
    of 8; d = 517: 517 features one at a time)."""
    k = 11
    X16, X32 = _half_data(n, d, seed=d, fmt=fmt)
    X16 = _aligned(X16)
    w = _weights(n, d)
    labels = _labels(n, k, d)
    labels[labels == 5] = 4  # cluster 5 empty
    scale, two_l = _fixed_point(X32, w, n)
    names = {f"accumulate_sorted<float,1,{fmt}>": X16, "accumulate_sorted<float,1>": X32}
    if d % 8 == 0:
        names[f"accumulate_sorted<float,8,{fmt}>"] = X16
    if d % 4 == 0:
        names["accumulate_sorted<float,4>"] = X32
    got = {name: _sorted_sums(emu, name, X, w, labels, k, scale, two_l, rows)
           for name, X in names.items()}
    ref = got["accumulate_sorted<float,1>"]
    for name, acc in got.items():
        _same(acc, ref, name)
    shared = np.zeros_like(ref)
    emu.launch("fused_sums.cu", f"accumulate_shared<float,{fmt}>", 2,
               (X16, w, labels, np.int32(n), np.int32(d), np.int32(k), shared, scale, two_l,
                NULL), smem=k * (d + 1) * 16 + (d + 1) * 8)
    _same(shared, ref, "shared")
    assert not ref.reshape(k, d + 1, 2)[5].any() and ref.reshape(k, d + 1, 2)[4].any()


# ---------------------------------------------------------------------------------------------
# direct.cu
# ---------------------------------------------------------------------------------------------
def _reduce(emu, name, args, grid):
    partials = np.zeros(grid)
    out = np.full(1, np.nan)
    done = np.zeros(1, dtype=np.uint32)
    emu.launch("direct.cu", name, grid, (*args, partials, out, done))
    assert done[0] == 0
    return out


@pytest.mark.parametrize("d", DIMS + [130])
def test_direct_distances_read_half_x(emu, fmt, d):
    """labelled_sq_dist, relocation_keys (-1 for zero weights) and direct_inertia (weighted
    and not): one thread a row below d = 16, eight lanes a row from 16 on, numpy's pairwise
    halving past 128 features; float32 centers. The bits of float32 X's."""
    k = 9
    X16, X32 = _half_data(N, d, seed=20 + d, fmt=fmt)
    C = (X32[:k] + np.random.default_rng(d).normal(0, 0.3, (k, d))).astype(F32)
    labels = _labels(N, k, d)
    w = _weights(N, d)
    args = (np.int64(N), np.int32(d))
    got = {}
    for X, t in _both(X16, X32, fmt):
        dist = np.full(N, np.nan, dtype=F32)
        emu.launch("direct.cu", f"labelled_sq_dist<{t}>", 3, (X, labels, C, *args, dist))
        keys = np.full(N, np.nan, dtype=F32)
        emu.launch("direct.cu", f"relocation_keys<{t}>", 2, (X, w, labels, C, *args, keys))
        inertia = [_reduce(emu, f"direct_inertia<{t}>", (X, W, labels, C, *args), 3)
                   for W in (w, NULL)]
        got[t] = [dist, keys, *inertia]
    for a, b in zip(got[f"float,{fmt}"], got["float"]):
        _same(a, b, f"d={d}")
    dist, keys = got["float"][:2]
    np.testing.assert_array_equal(dist, np.sum((X32 - C[labels]) ** 2, axis=1))
    np.testing.assert_array_equal(keys, np.where(w > 0, dist, np.float32(-1)))


# ---------------------------------------------------------------------------------------------
# seeding.cu
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("weighted", [True, False])
def test_seeding_steps_read_half_x(emu, fmt, d, centered, weighted):
    """seeding_update (first center, then a second: the running minimum) and
    seeding_potentials (several candidates, the best chosen), X as it is or centered on the
    fly (x - mean in float), float64 weights or none: closest, values, segment totals,
    partials and the choice of float32 X's."""
    n, seg, grid, trials = N, 256, 3, 5
    segments = -(-n // seg)
    X16, X32 = _half_data(n, d, seed=30 + d, fmt=fmt)
    mean = X32.mean(axis=0).astype(F32) if centered else NULL
    w = np.random.default_rng(d).uniform(0.2, 3.0, n) if weighted else NULL
    cand = np.array([5, 1000, 77, 5, 1060], dtype=np.int64)
    got = {}
    for X, t in _both(X16, X32, fmt):
        closest = np.full(n, np.nan, dtype=F32)
        values = np.full(n, np.nan)
        seg_total = np.full(segments, np.nan)
        res = []
        for first, row in ((1, 17), (0, 640)):
            emu.launch("seeding.cu", f"seeding_update<{t}>", segments,
                       (X, mean, w, np.int64(n), np.int32(d), np.int64(seg),
                        np.array([row], dtype=np.int64), np.int32(first), closest, values,
                        seg_total), smem=d * 4)
            res += [closest.copy(), values.copy(), seg_total.copy()]
        partials = np.full(grid * trials, np.nan)
        chosen = np.full(1, -1, dtype=np.int64)
        best = np.full(1, -1, dtype=np.int32)
        done = np.zeros(1, dtype=np.uint32)
        emu.launch("seeding.cu", f"seeding_potentials<{t}>", grid,
                   (X, mean, closest, w, np.int64(n), np.int32(d), cand, np.int32(trials),
                    partials, done, chosen, best), smem=trials * d * 4)
        assert done[0] == 0
        got[t] = res + [partials, chosen, best]
    for a, b in zip(got[f"float,{fmt}"], got["float"]):
        _same(a, b, f"d={d}")
    closest = got["float"][3]
    Xc = X32 - mean if centered else X32
    ref = np.zeros(n, dtype=F32)
    for j in range(d):  # the kernel's sum: feature by feature from 0, in float
        ref = ref + (Xc[:, j] - Xc[17, j]) ** 2
    ref2 = np.zeros(n, dtype=F32)
    for j in range(d):
        ref2 = ref2 + (Xc[:, j] - Xc[640, j]) ** 2
    np.testing.assert_array_equal(closest, np.minimum(ref, ref2))
    assert got["float"][-2][0] == cand[got["float"][-1][0]]
