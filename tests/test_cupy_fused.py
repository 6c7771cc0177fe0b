"""`cupy-fused` against the numpy backend, on asymmetric data (a swapped or dropped feature
fails), n never a multiple of any block size, k from 1 to 20000, d from 1 to 1024, float32 and
float64, weights with zeros, empty clusters forced by crafted inits, run-to-run bit identity.
Sizes keep n*k*d modest so the file runs in well under 3 minutes on an H200.

Labels: the kernels round every distance as numpy's BLAS expansion does (||c||^2 summed in
np.einsum's order, an in-order FMA chain for x.c), so labels equal numpy's wherever OpenBLAS's
kernel is such a chain. Where it is not (another BLAS, K blocking for large d), a label may
differ only on a near tie, within the rounding bound of `kmeans_xp.testing.label_bounds.near_tie`; that
is what is asserted, with no cap on how many (their number depends on how many near ties the
data has, not on the code). Whole fits in float32 with d >= 4 are compared by adjusted Rand
index and inertia when their partitions differ (a last-bit difference in one center can move a
near tie and then a few points); float64 fits, and float32 fits with d <= 3, must give numpy's
partition."""
import numpy as np
import pytest
from kmeans_xp_backends.cupy import fused_plan, paths
from kmeans_xp_backends.numpy.backend import NumpyBackend
from sklearn.metrics import adjusted_rand_score

from kmeans_xp import KMeans
from kmeans_xp.testing.label_bounds import near_tie, tf32_error
from kmeans_xp.testing import asymmetric_data, check_backend

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.float64]
D_VALUES = [1, 2, 3, 4, 7, 16, 33, 128, 1024]


def _backend(**options):
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    return CupyFusedBackend(**options)


def _problem(n, d, k, dtype, seed=0):
    """Mean-centred asymmetric X, centers near data points, weights in [0.5, 2] with ~10%
    zeros (what the driver hands a backend)."""
    X = asymmetric_data(n, d, max(1, min(k, 50)), dtype=dtype, seed=seed)
    X -= X.mean(axis=0)
    rng = np.random.default_rng(seed + 1)
    C = X[rng.choice(n, k, replace=k > n)] + rng.normal(size=(k, d)).astype(dtype) * 0.05
    w = rng.uniform(0.5, 2.0, n).astype(dtype)
    w[rng.random(n) < 0.1] = 0
    return X, C.astype(dtype), w


def _n_for(d, k):
    """n not a multiple of 256 / 1024 / 128 and n*k*d at most ~1e9."""
    n = int(min(20011, max(1031, 1e9 // (k * d))))
    return n | 1


def _assert_same_argmin(X, C, got, ref, dtype, where):
    bad = np.flatnonzero(got != ref)
    if bad.size:
        ties = near_tie(X[bad], C, got[bad], ref[bad], dtype)
        assert ties.all(), (f"{where}: {np.count_nonzero(~ties)} of {bad.size} differing labels "
                            f"are not near ties (rows {bad[~ties][:5]})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", D_VALUES)
def test_center_norms_are_numpys_einsum(cp, d, dtype):
    """||c||^2 as pack_centers writes it (small-d and GEMM layouts, for any centers) has the
    bits of np.einsum("ij,ij->i"), the numpy backend's norm."""
    from kmeans_xp_backends.cupy.einsum_order import einsum_order
    if einsum_order() is None:
        pytest.skip("this numpy's einsum order is not one the kernels reproduce")
    k = 300
    X, C, w = _problem(1031, d, k, dtype, seed=d)
    be = _backend()
    ws = be._workspace(cp.asarray(X), k, cp.asarray(w))

    def packed_norms():
        if ws.plan.layout == 0:
            return ws.ops.reshape(k, ws.plan.S)[:, d].get()
        return ws.cnorm[:k].get()

    for centers in (C, (C * 1.7 - 0.3).astype(dtype)):  # and again for other centers
        be._pack(ws, cp.asarray(centers))
        assert np.array_equal(packed_norms(), np.einsum("ij,ij->i", centers, centers))


def test_contract_suite(cp):
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    assert check_backend(CupyFusedBackend) > 0                                  # NumPy in
    assert check_backend(CupyFusedBackend, make_array=cp.asarray) > 0           # CuPy in


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", D_VALUES)
@pytest.mark.parametrize("k", [1, 13, 300])
def test_assign_reduce_iter_match_numpy(cp, d, k, dtype):
    _check_primitives(cp, _n_for(d, k), d, k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d,k", [(20011, 1, 20000), (20011, 3, 20000), (3001, 16, 5000),
                                   (3001, 128, 4097), (257, 3, 257)])
def test_large_k_matches_numpy(cp, n, d, k, dtype):
    _check_primitives(cp, n, d, k, dtype)


def _check_primitives(cp, n, d, k, dtype, **options):
    where = f"n={n} d={d} k={k} {np.dtype(dtype)} {options or ''}"
    X, C, w = _problem(n, d, k, dtype, seed=d + k)
    ref = NumpyBackend(n_threads=4)
    ref_lab, ref_min = ref.assign(X, C)
    be = _backend(**options)
    Xg, Cg, wg = cp.asarray(X), cp.asarray(C), cp.asarray(w)

    lab, msq = be.assign(Xg, Cg)
    lab, msq = lab.get(), msq.get()
    split = options.get("gemm_kernel", "auto") == "3xtf32" or (
        options.get("gemm_kernel", "auto") == "auto" and d <= paths.MMA3_AUTO_MAX_D)
    if split and d > 16 and dtype == np.float32:
        assert be._ws.plan.path in ("mma3", "wgmma3"), f"{where}: not the 3xTF32 kernel"
    assert lab.dtype == np.int32 and msq.dtype == dtype
    _assert_same_argmin(X, C, lab, ref_lab, dtype, where)
    same = lab == ref_lab
    eps = np.finfo(dtype).eps
    scale = (X.astype(np.float64) ** 2).sum(1) + (C.astype(np.float64) ** 2).sum(1)[lab]
    assert np.all(msq >= 0)
    tol = 16 * eps * scale[same]
    if split and d > paths.MMA3_AUTO_MAX_D:  # the tensor cores' FP32 accumulation over a
        # long K: the a-priori bound of any order of the d products and norms (both sides)
        g = (d + 2) * eps / 2 / (1 - (d + 2) * eps / 2)
        nx = np.sqrt((X.astype(np.float64) ** 2).sum(1))[same]
        nc = np.sqrt((C.astype(np.float64) ** 2).sum(1))[lab[same]]
        tol = 2 * g * (nx ** 2 + 2 * nx * nc + nc ** 2)
    assert np.all(np.abs(msq[same] - ref_min[same]) <= tol), \
        f"{where}: min_sq_dist differs from numpy's"

    sums, weights = be.reduce(Xg, cp.asarray(ref_lab), wg, k)
    r_sums, r_weights = ref.reduce(X, ref_lab, w, k)
    bound = np.zeros((k, d))
    np.add.at(bound, ref_lab, np.abs(X.astype(np.float64) * w[:, None]))
    # ours is exact to float64 rounding; numpy's sequential float64 sum is not quite
    assert np.all(np.abs(sums.get() - r_sums) <= 1e-11 * bound), \
        f"{where}: weighted sums differ from numpy's"
    assert np.allclose(weights.get(), r_weights, rtol=1e-11, atol=0), f"{where}: weights"

    it = be.lloyd_iter(Xg, wg, Cg, None)
    assert np.array_equal(it.labels.get(), lab), f"{where}: lloyd_iter labels != assign"
    it_sums, it_w = be.reduce(Xg, it.labels, wg, k)
    # fused or not, integer accumulation gives the same bits
    assert np.array_equal(it.weighted_sums.get(), it_sums.get()), f"{where}: fused sums"
    assert np.array_equal(it.weight_in_clusters.get(), it_w.get()), f"{where}: fused weights"
    inertia = float(np.sum(msq.astype(np.float64) * w.astype(np.float64)))
    assert float(it.inertia) == pytest.approx(inertia, rel=1e-9), f"{where}: inertia"
    assert float(it.n_changed) == n, f"{where}: n_changed without old labels"
    it2 = be.lloyd_iter(Xg, None, Cg[::-1].copy(), it.labels)
    lab2 = it2.labels.get()
    assert np.array_equal(it.labels.get(), lab), f"{where}: a later call overwrote labels"
    assert float(it2.n_changed) == np.count_nonzero(lab2 != lab), f"{where}: n_changed"
    assert np.array_equal(it2.weight_in_clusters.get(), np.bincount(lab2, minlength=k)), \
        f"{where}: unit weights (None)"


@pytest.mark.parametrize("d", [33, 128, 150, 1024])
@pytest.mark.parametrize("k", [1, 13, 300, 4097])
def test_3xtf32_primitives_match_numpy(cp, d, k):
    """gemm_kernel="3xtf32": the tensor cores in split precision (cuda/fused_mma.cu), X
    resident (d = 33, 128) or K-streamed (150, 1024), labels numpy's up to near ties."""
    n = _n_for(d, k) if k < 4000 else 3001 if d < 1024 else 1031
    _check_primitives(cp, n, d, k, np.float32, gemm_kernel="3xtf32")


@pytest.mark.parametrize("d,k", [(33, 13), (128, 300), (128, 4097)])
def test_simt_primitives_match_numpy(cp, d, k):
    """gemm_kernel="simt": the SIMT kernel (cuda/fused_gemm.cu), which "auto" keeps for
    float64 and d > 160."""
    n = _n_for(d, k) if k < 4000 else 3001
    _check_primitives(cp, n, d, k, np.float32, gemm_kernel="simt")


@pytest.mark.parametrize("d,k", [(33, 25), (128, 10), (128, 300)])
def test_3xtf32_fit_partition_equals_numpy(cp, d, k):
    X = asymmetric_data(6007, d, k, dtype=np.float32, seed=d * 7 + k)
    w = np.random.default_rng(k).uniform(0.5, 2, len(X)).astype(np.float32)
    init = X[np.random.default_rng(d).choice(len(X), k, replace=False)]
    _compare_fits(cp, X, w, init, np.float32, {"gemm_kernel": "3xtf32"},
                  f"3xtf32 d={d} k={k}")


@pytest.mark.parametrize("fuse", ["auto", False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,k", [(1, 5), (2, 12), (3, 12), (3, 200), (7, 30), (16, 20),
                                 (33, 25), (128, 10)])
def test_fit_partition_equals_numpy(cp, d, k, dtype, fuse):
    X = asymmetric_data(6007, d, k, dtype=dtype, seed=d * 7 + k)
    w = np.random.default_rng(k).uniform(0.5, 2, len(X)).astype(dtype)
    init = X[np.random.default_rng(d).choice(len(X), k, replace=False)]
    _compare_fits(cp, X, w, init, dtype, {"fuse": fuse}, f"d={d} k={k} {np.dtype(dtype)}")


def _compare_fits(cp, X, w, init, dtype, options, where, tol=1e-4, max_iter=100):
    ref = KMeans(len(init), init=init, backend="numpy", max_iter=max_iter, tol=tol).fit(
        X, sample_weight=w)
    got = KMeans(len(init), init=init, backend="cupy-fused", backend_options=options,
                 max_iter=max_iter, tol=tol).fit(cp.asarray(X), sample_weight=cp.asarray(w))
    labels = got.labels_.get()
    exact = dtype == np.float64 or X.shape[1] <= 3
    if not exact and not np.array_equal(labels, ref.labels_):
        # float32, d >= 4: see the module docstring
        ari = adjusted_rand_score(ref.labels_, labels)
        assert ari >= 0.999, f"{where}: adjusted Rand index {ari:.6f} against numpy's"
        assert abs(got.inertia_ - ref.inertia_) <= 1e-5 * ref.inertia_, f"{where}: inertia"
        assert got.backend_ == "cupy-fused"
        return got
    assert np.array_equal(labels, ref.labels_), \
        f"{where}: partition differs from numpy's ({np.mean(labels != ref.labels_):.3%})"
    assert got.n_iter_ == ref.n_iter_, f"{where}: n_iter {got.n_iter_} != {ref.n_iter_}"
    rtol = 1e-5 if dtype == np.float32 else 1e-11
    assert np.allclose(got.cluster_centers_.get(), ref.cluster_centers_, rtol=rtol,
                       atol=rtol * np.abs(X).max()), f"{where}: centers"
    assert abs(got.inertia_ - ref.inertia_) <= rtol * ref.inertia_, f"{where}: inertia"
    # an iteration's inertia comes from its assignment's distance expansions (float32 on the
    # device, float64 from the sums on the numpy backend): they agree to its rounding, about
    # eps * sum w ||x||^2, which outweighs rtol where most points sit on their centers
    Xc = X.astype(np.float64) - X.astype(np.float64).mean(axis=0)
    sq = np.sum(Xc * Xc, axis=1) * (1.0 if w is None else w.astype(np.float64))
    expansion = 8 * np.finfo(dtype).eps * float(np.sum(sq))
    assert np.allclose(got.history_["inertia"], ref.history_["inertia"], rtol=rtol,
                       atol=expansion), f"{where}: history"
    assert np.allclose(got.history_["center_shift"], ref.history_["center_shift"],
                       rtol=1e-3, atol=1e-6 * ref.history_["center_shift"][0])
    assert got.backend_ == "cupy-fused"
    return got


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,k,n_far", [(2, 6, 1), (3, 9, 3), (7, 40, 2), (33, 8, 1),
                                       (3, 20000, 1)])
def test_empty_clusters_relocated_like_numpy(cp, d, k, n_far, dtype):
    # zero weights on n // 50 points: n - n // 50 >= k positive-weight points must remain
    n = 22013 if k > 1000 else 4001
    X = asymmetric_data(n, d, min(k, 50), dtype=dtype, seed=k + d)
    w = np.random.default_rng(d).uniform(0.5, 2, n).astype(dtype)
    w[: n // 50] = 0  # zero-weight points are never taken as relocated centers
    rng = np.random.default_rng(k)
    init = X[rng.choice(n, k, replace=False)].copy()
    far = rng.choice(k, n_far, replace=False)
    init[far] = X.max(axis=0) + (np.abs(X).max() * (10 + np.arange(n_far)))[:, None]
    big = k > 1000  # ~1 point per cluster: many clusters go empty on the way
    _compare_fits(cp, X, w, init, dtype, {}, f"empty d={d} k={k} far={n_far}",
                  tol=0.0 if big else 1e-4, max_iter=12 if big else 100)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,k,fuse", [(3, 5, "auto"), (3, 1000, "auto"), (3, 1000, False),
                                      (3, 20000, "auto"), (33, 40, "auto"), (128, 2000, "auto")])
def test_bit_identical_run_to_run(cp, d, k, fuse, dtype):
    n = 40009
    X = cp.asarray(asymmetric_data(n, d, min(k, 50), dtype=dtype, seed=5))
    w = cp.asarray(np.random.default_rng(5).uniform(0, 2, n).astype(dtype))
    init = X[cp.asarray(np.random.default_rng(6).choice(n, k, replace=False))].get()
    fits = [KMeans(k, init=init, backend="cupy-fused", backend_options={"fuse": fuse},
                   max_iter=8, tol=0).fit(X, sample_weight=w) for _ in range(2)]
    a, b = fits
    assert cp.array_equal(a.labels_, b.labels_)
    assert a.cluster_centers_.tobytes() == b.cluster_centers_.tobytes()
    assert a.inertia_ == b.inertia_ and a.history_ == b.history_
    be = _backend(fuse=fuse)
    Xc = X - X.mean(0)
    it1, it2 = (be.lloyd_iter(Xc, w, cp.asarray(init), None) for _ in range(2))
    assert it1.weighted_sums.tobytes() == it2.weighted_sums.tobytes()
    assert it1.weight_in_clusters.tobytes() == it2.weight_in_clusters.tobytes()


def test_fused_and_split_passes_agree(cp):
    """The fused small-d pass and the assign-then-accumulate pass give the same bits."""
    X = cp.asarray(asymmetric_data(100003, 3, 50, dtype=np.float32, seed=9))
    init = X[:500].get()
    a = KMeans(500, init=init, backend="cupy-fused", backend_options={"fuse": True},
               max_iter=5, tol=0).fit(X)
    b = KMeans(500, init=init, backend="cupy-fused", backend_options={"fuse": False},
               max_iter=5, tol=0).fit(X)
    assert cp.array_equal(a.labels_, b.labels_)
    assert a.cluster_centers_.tobytes() == b.cluster_centers_.tobytes()


@pytest.mark.parametrize("kernel", ["cublas", "wgmma", "fused", "fused-v1"])
def test_tf32_option_close_to_fp32(cp, kernel):
    X = asymmetric_data(20011, 128, 64, dtype=np.float32, seed=3)
    init = X[np.random.default_rng(3).choice(len(X), 64, replace=False)]
    exact = KMeans(64, init=init, backend="cupy-fused", max_iter=20).fit(cp.asarray(X))
    fast = KMeans(64, init=init, backend="cupy-fused", max_iter=20, precision="tf32",
                  backend_options={"tf32_kernel": kernel}).fit(
        cp.asarray(X))
    agree = float(cp.mean(exact.labels_ == fast.labels_))
    # TF32 keeps 10 mantissa bits: near ties flip and the flips compound over 20 iterations,
    # so the fit is judged by its inertia; labels must still mostly agree
    assert agree >= 0.95, f"tf32 labels agree on {agree:.2%} only"
    assert abs(fast.inertia_ - exact.inertia_) <= 1e-2 * exact.inertia_
    with pytest.raises(ValueError, match="float32"):
        KMeans(4, backend="cupy-fused", precision="tf32").fit(
            cp.asarray(X[:100].astype(np.float64)))


@pytest.mark.parametrize("kernel", ["cublas", "wgmma", "fused", "fused-v1"])
@pytest.mark.parametrize("n,d,k", [(3001, 128, 300), (2999, 33, 1000), (20011, 20, 129),
                                   (1031, 1024, 77), (2053, 128, 1), (4099, 160, 300),
                                   (1031, 5, 3), (517, 64, 4097)])
def test_tf32_assignment_within_tf32_rounding(cp, kernel, n, d, k):
    """Every tf32 label is the exact argmin or a center whose exact distance is within the TF32
    rounding bound (`kmeans_xp.testing.label_bounds.tf32_error`). Covers the fused kernel's fragment
    layout, its K tail (d = 33, 20: not a multiple of 16 or 4, so the scalar loads), row and
    column tails (n, k not multiples of 128), and min_sq_dist. The v2 kernel ("fused") at d =
    160, 1024 streams X's K slices (past its resident limit); k = 1 and 4097: one and many
    column blocks."""
    X, C, w = _problem(n, d, k, np.float32, seed=d + k)
    be = _backend(precision="tf32", tf32_kernel=kernel)
    lab, msq = be.assign(cp.asarray(X), cp.asarray(C))
    lab, msq = lab.get(), msq.get()
    assert be._ws.plan.path == {"fused": "mma", "fused-v1": "tf32mma", "cublas": "tf32",
                                "wgmma": paths.choose(d, k, "float32", "tf32",
                                                      fused_plan.device_facts(0),
                                                      tf32_kernel="wgmma").path}[kernel]
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    rows = max(1, int(4e6 // (k * d)))  # exact distances in float64, ~32 MB at a time
    exact = np.concatenate([((X64[i:i + rows, None, :] - C64[None]) ** 2).sum(-1)
                            for i in range(0, n, rows)])
    best = exact.min(1)
    got = exact[np.arange(n), lab]
    nx = np.sqrt((X64 ** 2).sum(1))
    nc = np.sqrt((C64 ** 2).sum(1))
    err_lab = tf32_error(X, C, lab)
    bound = err_lab + tf32_error(X, C, exact.argmin(1)) + 1e-6 * (nx ** 2 + nc[lab] ** 2)
    bad = np.flatnonzero(got - best > bound)
    assert bad.size == 0, (f"{kernel} tf32 n={n} d={d} k={k}: {bad.size} labels farther than "
                           f"TF32 rounding allows (rows {bad[:5]}, excess "
                           f"{(got - best - bound)[bad[:5]]})")
    # min_sq_dist: the chosen center's distance, up to the same rounding
    assert np.all(np.abs(msq.astype(np.float64) - got) <= 2 * err_lab + 1e-5 * (nx ** 2 + 1))


def test_tf32_auto_takes_the_wgmma_kernel_on_hopper(cp):
    """tf32_kernel="auto" (the default) runs cuda/fused_wgmma.cu on compute capability 9.0
    for d <= 128 (so the TF32-bound tests above exercise it there), v2 past that or elsewhere."""
    facts = fused_plan.device_facts(0)
    for d, k in ((128, 300), (20, 129), (160, 300)):
        X, C, _ = _problem(2053, d, k, np.float32, seed=d)
        be = _backend(precision="tf32")
        be.assign(cp.asarray(X), cp.asarray(C))
        wanted = "wgmma" if facts.cc == 90 and d <= paths.WGMMA_MAX_D else "mma"
        assert be._ws.plan.path == wanted, (d, be._ws.plan.path)


def test_options_are_validated(cp):
    with pytest.raises(TypeError, match="precision"):
        _backend(bogus=1)
    with pytest.raises(ValueError):
        _backend(precision="bf16")
    with pytest.raises(ValueError, match="tf32_kernel"):
        _backend(precision="tf32", tf32_kernel="wmma")
    with pytest.raises(ValueError, match="gemm_kernel"):
        _backend(gemm_kernel="4xtf32")


@pytest.mark.parametrize("n,d,k", [(2_000_003, 3, 200), (300_007, 128, 512),
                                   (100_003, 3, 20000)])
def test_memory_stays_under_estimate(cp, n, d, k):
    from kmeans_xp import estimate_memory
    X = cp.asarray(asymmetric_data(n, d, 20, dtype=np.float32, seed=1))
    X -= X.mean(axis=0)
    init = X[:k].get()
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()  # X itself
    km = KMeans(k, init=init, max_iter=3, tol=0, backend="cupy-fused").fit(X)
    used = km.memory_report_["lloyd"] - before
    est = estimate_memory(n, d, k, dtype="float32", backend="cupy-fused")
    assert used <= est.total + (1 << 20), f"peak {used} B > estimate {est}"
    # O(n d + k d), never O(n k)
    assert est.total < (2 * d * 4 + 100) * n + 256 * k * (d + 1) + (16 << 20)
