"""The CuPy backends' kernels run on the CPU (tests/_cuda_emulator.py: the CUDA source
compiled as C++ with one thread per CUDA thread), checked against NumPy: labels bit for bit
against the numpy backend's arithmetic (the exactness cupy-kernels promises), shared-memory
center tiles (resident and streamed), grid-stride loops with short last groups, the warp
reductions of the sums, the row argmin's tie rules, the streamed label store, the
deterministic reductions and the direct distances. Skipped without g++.
"""
import numpy as np
import pytest
from kmeans_xp_backends.cupy import nearest as K
from kmeans_xp_backends.cupy.common import BLOCK, CTYPE, NULL

from kmeans_xp.testing import asymmetric_data
from tests._cuda_emulator import EmulatedKernels

pytestmark = pytest.mark.skipif(not EmulatedKernels.available(), reason="needs g++")

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


class _Launcher:
    def __init__(self):
        self.emu = EmulatedKernels()

    def launch(self, name, grid, args, smem=0, block=BLOCK):
        base = name.split("<")[0]
        file = {"nearest_small": "nearest.cu", "nearest_tiled": "nearest.cu",
                "nearest_mem": "nearest.cu", "cluster_sums_shared": "sums.cu",
                "cluster_sums_global": "sums.cu", "row_argmin_shifted": "row_argmin.cu",
                "store_labels": "stats.cu", "weighted_total": "stats.cu",
                "count_changed": "stats.cu", "direct_inertia": "direct.cu",
                "labelled_sq_dist": "direct.cu", "seeding_draw": "seeding.cu"}[base]
        self.emu.launch(file, name, grid, args, smem=smem, block=block)


@pytest.fixture(scope="module")
def emu():
    return _Launcher()


def _host_operands(C, dtype):
    return K._host_operands(C, np.dtype(dtype), K.ops_stride(C.shape[1], np.dtype(dtype).itemsize))


def _numpy_assign(X, C):
    """The numpy backend's assignment arithmetic: X @ (-2 C).T + einsum(C, C), argmin."""
    dist = X @ np.ascontiguousarray((-2 * C).T)
    dist += np.einsum("ij,ij->i", C, C)
    labels = dist.argmin(axis=1)
    best = dist[np.arange(len(X)), labels]
    return labels, best


def _nearest(emu, X, C, grid):
    n, d = X.shape
    k = C.shape[0]
    ops = _host_operands(C, X.dtype)
    labels = np.full(n, -1, dtype=np.int32)
    min_sq = np.full(n, np.nan, dtype=X.dtype)
    name = K.nearest_kernel_name(d, X.dtype)
    if name.startswith("nearest_small"):
        args = (X, ops, np.int64(n), np.int32(k), labels, min_sq)
    else:
        args = (X, ops, np.int64(n), np.int32(k), np.int32(d), labels, min_sq)
    emu.launch(name, grid, args)
    return labels, min_sq


def _problem(n, d, k, dtype, seed, ties=False):
    X = asymmetric_data(n, d, max(1, k // 3), dtype=dtype, seed=seed)
    X -= X.mean(axis=0)
    rng = np.random.default_rng(seed)
    C = X[rng.choice(n, k, replace=False)] + (rng.normal(size=(k, d)) * 0.01).astype(dtype)
    if ties:  # duplicate centers: the first of equal distances must win
        C[k // 2:k // 2 + 3] = C[1]
    return np.ascontiguousarray(X), np.ascontiguousarray(C)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("d,k", [(1, 5), (2, 300), (3, 1), (3, 200), (3, 2500), (4, 1200)])
def test_nearest_small_is_numpys_assignment_bit_for_bit(emu, dtype, d, k):
    """d <= 4: the same labels as numpy's GEMM expansion, ties included, for centers held
    in shared memory once (k <= tile) or streamed through it in tiles (k > tile)."""
    P = K.points_per_thread(d, dtype.itemsize)
    # several groups of BLOCK * P points and a short one; grid 2: the grid-stride loop
    n = max(3 * BLOCK * P, 2 * k) + 77
    X, C = _problem(n, d, k, dtype, seed=d * 31 + k, ties=k > 8)
    labels, min_sq = _nearest(emu, X, C, grid=2)
    ref, best = _numpy_assign(X, C)
    np.testing.assert_array_equal(labels, ref)
    xnorm = np.zeros(n, dtype=dtype)
    for j in range(d):  # the kernel's ||x||^2: a sequential sum of rounded squares
        xnorm = (xnorm + X[:, j] * X[:, j]).astype(dtype)
    if k > 1:
        np.testing.assert_array_equal(min_sq, np.maximum(best + xnorm, 0))
    else:  # OpenBLAS hands a one-column GEMM to GEMV, which sums in another order: the two
        # differ by rounding of the terms' size (a relative bound fails where they cancel)
        terms = xnorm.astype(np.float64) + float(np.sum(C.astype(np.float64) ** 2)) \
            + 2 * np.abs(X.astype(np.float64)) @ np.abs(C[0].astype(np.float64))
        bound = 16 * np.finfo(dtype).eps * terms
        diff = np.abs(min_sq.astype(np.float64) - np.maximum(best + xnorm, 0))
        assert np.all(diff <= bound), float(np.max(diff / bound))


@pytest.mark.parametrize("dtype,d,k", [(F32, 5, 40), (F32, 17, 500), (F32, 30, 7),
                                       (F32, 128, 20), (F64, 9, 300), (F64, 64, 11),
                                       (F32, 129, 6), (F64, 65, 9)])
def test_wider_nearest_kernels_are_numpys_assignment(emu, dtype, d, k):
    """nearest_tiled (centers in shared-memory tiles, the point in registers) and
    nearest_mem: numpy's labels (its GEMM is the same fused multiply-add chain here)."""
    n = 2 * BLOCK + 45
    X, C = _problem(n, d, k, dtype, seed=d + k, ties=k > 8)
    labels, min_sq = _nearest(emu, X, C, grid=1)
    ref, best = _numpy_assign(X, C)
    np.testing.assert_array_equal(labels, ref)
    direct = ((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
    scale = float(np.abs(X).max()) ** 2 + 1
    np.testing.assert_allclose(min_sq, direct[np.arange(n), labels], rtol=1e-4,
                               atol=1e-5 * scale)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("order", ["random", "sorted"])
def test_cluster_sums_shared(emu, dtype, order):
    """Privatised float64 sums: random labels (per-lane shared atomics) and sorted labels
    (whole warps of one label reduced by shuffles), zero weights skipped."""
    n, d, k = 5 * BLOCK + 19, 3, 37
    X, _ = _problem(n, d, k, dtype, seed=5)
    rng = np.random.default_rng(6)
    labels = rng.integers(0, k, n).astype(np.int32)
    if order == "sorted":
        labels.sort()
    w = rng.uniform(0.5, 2, n).astype(dtype)
    w[rng.random(n) < 0.1] = 0
    sums = np.zeros((k, d))
    weights = np.zeros(k)
    emu.launch(f"cluster_sums_shared<{CTYPE[dtype]}>", 3,
               (X, labels, w, np.int64(n), np.int32(d), np.int32(k), sums, weights),
               smem=k * (d + 1) * 8)
    ref = np.zeros((k, d))
    np.add.at(ref, labels, X.astype(np.float64) * w.astype(np.float64)[:, None])
    np.testing.assert_allclose(sums, ref, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(weights, np.bincount(labels, weights=w.astype(np.float64),
                                                    minlength=k), rtol=1e-12)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_row_argmin_shifted_over_tiles(emu, dtype):
    """One warp per row: + ||c||^2 with one rounding, first index on ties within a tile, an
    earlier tile wins ties across tiles; rows > warps in the grid (the row loop)."""
    rng = np.random.default_rng(7)
    rows, k, tile = 103, 90, 40
    dist = rng.normal(size=(rows, k)).astype(dtype)
    c_norm = rng.uniform(0, 2, k).astype(dtype)
    dist[5, 7] = dist[5, 3] = -100            # a tie inside a tile: 3 wins
    dist[9, 12] = -50
    dist[9, 52] = -50 + c_norm[12] - c_norm[52]  # a tie across tiles (when exact)
    run_min = np.zeros(rows, dtype=dtype)
    labels = np.full(rows, -1, dtype=np.int32)
    for j0 in range(0, k, tile):
        j1 = min(j0 + tile, k)
        block = np.ascontiguousarray(dist[:, j0:j1])
        emu.launch(f"row_argmin_shifted<{CTYPE[dtype]}>", 2,
                   (block, np.ascontiguousarray(c_norm[j0:j1]), np.int64(rows),
                    np.int32(j1 - j0), np.int32(j0), np.int32(j0 == 0), run_min, labels))
    full = dist + c_norm
    np.testing.assert_array_equal(labels, full.argmin(axis=1))
    np.testing.assert_array_equal(run_min, full.min(axis=1))


@pytest.mark.parametrize("store_dtype", ["unsigned char", "unsigned short", "int"])
def test_store_labels_counts_and_writes(emu, store_dtype):
    """Host streaming's label store: a chunk's int32 labels into the compact type, counting
    those that differ from the previous iteration's (none counted without old labels)."""
    np_dtype = {"unsigned char": np.uint8, "unsigned short": np.uint16, "int": np.int32}
    rng = np.random.default_rng(8)
    m = 3 * BLOCK + 5
    old = rng.integers(0, 200, m).astype(np_dtype[store_dtype])
    labels = old.astype(np.int32)
    flip = rng.random(m) < 0.3
    labels[flip] = (labels[flip] + 1) % 200
    out = np.zeros(m, dtype=np_dtype[store_dtype])
    changed = np.zeros(1, dtype=np.uint64)
    emu.launch(f"store_labels<{store_dtype}>", 2, (labels, old, out, np.int64(m), changed))
    assert int(changed[0]) == int(flip.sum())
    np.testing.assert_array_equal(out.astype(np.int32), labels)
    emu.launch(f"store_labels<{store_dtype}>", 2, (labels, NULL, out, np.int64(m), changed))
    assert int(changed[0]) == int(flip.sum())


def _reduce(emu, name, args, grid):
    partials = np.zeros(grid)
    out = np.full(1, np.nan)
    done = np.zeros(1, dtype=np.uint32)
    emu.launch(name, grid, (*args, partials, out, done))
    assert done[0] == 0, "the last block resets the counter for the next launch"
    return float(out[0])


@pytest.mark.parametrize("dtype", [F32, F64])
def test_reductions_are_fixed_order_sums(emu, dtype):
    """weighted_total (with weights and unit ones) and count_changed (with old labels and
    without): one launch, partials per block, the last block sums them."""
    rng = np.random.default_rng(9)
    n = 5 * BLOCK * 8 + 77
    v = rng.uniform(0, 3, n).astype(dtype)
    w = rng.uniform(0, 2, n).astype(dtype)
    t = CTYPE[dtype]
    got = _reduce(emu, f"weighted_total<{t}>", (v, w, np.int64(n)), 3)
    assert got == pytest.approx(float(np.sum(v.astype(np.float64) * w)), rel=1e-12)
    got = _reduce(emu, f"weighted_total<{t}>", (v, NULL, np.int64(n)), 3)
    assert got == pytest.approx(float(np.sum(v.astype(np.float64))), rel=1e-12)
    a = rng.integers(0, 5, n).astype(np.int32)
    b = a.copy()
    b[::7] += 1
    assert _reduce(emu, "count_changed", (a, b, np.int64(n)), 3) == np.count_nonzero(a != b)
    assert _reduce(emu, "count_changed", (a, NULL, np.int64(n)), 3) == n


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("d", [1, 3, 15, 16, 17, 130])
def test_direct_distances_are_numpys_differences(emu, dtype, d):
    """||x - c_label||^2 by differences with numpy's pairwise summation (one thread per row
    below d = 16, eight lanes per row from 16 on): the bits of np.sum((x - c) ** 2, axis=1);
    and the weighted inertia of those distances."""
    n, k = 2 * BLOCK + 37, 9
    X, C = _problem(n, d, k, dtype, seed=d)
    labels = np.random.default_rng(d).integers(0, k, n).astype(np.int32)
    out = np.zeros(n, dtype=dtype)
    emu.launch(f"labelled_sq_dist<{CTYPE[dtype]}>", 3, (X, labels, C, np.int64(n), np.int32(d),
                                                       out))
    ref = np.sum((X - C[labels]) ** 2, axis=1)
    np.testing.assert_array_equal(out, ref)
    w = np.random.default_rng(1).uniform(0, 2, n).astype(dtype)
    got = _reduce(emu, f"direct_inertia<{CTYPE[dtype]}>",
                  (X, w, labels, C, np.int64(n), np.int32(d)), 3)
    assert got == pytest.approx(float(np.sum(ref.astype(np.float64) * w)), rel=1e-12)


@pytest.mark.parametrize("seg,segments", [(6144, 2), (2048, 4999)])
def test_seeding_draw_is_searchsorted_on_the_cumulative_sum(emu, seg, segments):
    """k-means++'s draws from per-segment totals (several tiles per segment, or several tiles
    of segment totals): numpy's searchsorted(cumsum, u * total, "right") for random u, never
    a zero value, and u * total rounded up to the total gives the last positive row."""
    rng = np.random.default_rng(seg)
    n = seg * (segments - 1) + 1031
    values = rng.uniform(0, 2, n)
    values[rng.random(n) < 0.3] = 0.0
    values[-700:] = 0.0
    bounds = np.arange(0, n, seg)
    seg_total = np.add.reduceat(values, bounds)
    u = np.concatenate([rng.uniform(size=14), [0.0, np.nextafter(1.0, 0.0)]])
    by_weight = np.arange(16, dtype=np.int64)
    cand = np.full(16, -1, dtype=np.int64)
    emu.launch("seeding_draw", 16, (values, np.int64(n), np.int64(seg), seg_total,
                                    np.int64(segments), u, by_weight, cand))
    ref = np.searchsorted(np.cumsum(values), u[:15] * values.sum(), side="right")
    np.testing.assert_array_equal(cand[:15], ref)
    assert np.all(values[cand] > 0)
    assert cand[15] == np.flatnonzero(values)[-1]
    values[:] = 0.0  # no potential left: the draws by weight
    emu.launch("seeding_draw", 16, (values, np.int64(n), np.int64(seg), np.zeros(segments),
                                    np.int64(segments), u, by_weight, cand))
    np.testing.assert_array_equal(cand, by_weight)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("d,k,tc", [(3, 37, 2048), (3, 100, 24), (2, 70, 33), (1, 17, 2048)])
def test_grouped_argmin_is_the_sequential_rule(emu, dtype, d, k, tc):
    """assign_small with G centers to an argmin group (a minimum per pair, the index found
    afterwards) gives the per-center loop's labels and distances bit for bit (G = 1), and
    numpy's first minimum: integer data, so distances are exact and ties everywhere (equal
    centers inside one group and across groups, the minimum in a group's middle), k not a
    multiple of G, tiles of tc centers that groups do not divide (the search then reads the
    centers from global memory), and rows whose distances overflow to inf or NaN."""
    rng = np.random.default_rng(d * 100 + k)
    P = 4 if d * dtype.itemsize <= 32 else 2
    n = 2 * BLOCK * P + 77
    X = rng.integers(-4, 5, (n, d)).astype(dtype)
    C = rng.integers(-4, 5, (k, d)).astype(dtype)
    C[k // 2] = C[1]
    C[k - 1] = C[k // 3]
    big = np.finfo(dtype).max / 4
    X[5] = big
    X[6, 0] = -big
    ops = _host_operands(C, dtype)
    S = ops.size // k
    outs = {}
    for G in (1, 8, 16, 32):
        labels = np.full(n, -1, dtype=np.int32)
        min_sq = np.zeros(n, dtype=dtype)
        partials, counter = np.zeros(3), np.zeros(1, dtype=np.uint64)
        emu.emu.launch("fused_small.cu", f"assign_small<{CTYPE[dtype]},{d},{P},false,{G}>", 3,
                       (X, NULL, ops, np.int32(n), np.int32(k), np.int32(tc), NULL, labels,
                        min_sq, partials, counter, NULL, NULL, NULL, np.float64(1.0)),
                       smem=min(tc, k) * S * dtype.itemsize)
        outs[G] = labels, min_sq
    for G in (8, 16, 32):
        np.testing.assert_array_equal(outs[G][0], outs[1][0], err_msg=f"labels, G={G}")
        np.testing.assert_array_equal(outs[G][1].view(np.uint8), outs[1][1].view(np.uint8),
                                      err_msg=f"min_sq bits, G={G}")
    ref, _ = _numpy_assign(X[7:], C)
    np.testing.assert_array_equal(outs[1][0][7:], ref)
    assert not np.all(np.isfinite(outs[1][1][5:7]))  # the overflow rows did overflow
