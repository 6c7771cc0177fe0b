"""The `precision` option and half-precision X (docs/precision.md): validated before any work,
carried by the fit plan to backends that declare it, emulated by the numpy backend, and within
the documented bound of the exact fit from the same initial centers."""
import sys
import warnings

import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp import KMeans, SphericalKMeans
from kmeans_xp.contract import precision as prec
from kmeans_xp.contract.registry import get_backend
from kmeans_xp.testing.precision_checks import (
    check_assignment_bound,
    check_fit_within_bound,
    half_case,
)

REDUCED = ("tf32", "fp16", "bf16")


def _fit(X, init, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return KMeans(len(init), init=init, **{"tol": 0, "max_iter": 100, **kw}).fit(X)


@pytest.mark.parametrize("precision", REDUCED)
def test_rounding_is_the_format_s(precision):
    """Round to nearest: relative error at most u, and idempotent (a rounded value is one
    of the format's)."""
    x = np.random.default_rng(0).normal(size=10001).astype(np.float32) * 1e3
    r = prec.round_to(x, precision)
    assert np.all(np.abs(r - x) <= prec.UNIT_ROUNDOFF[precision] * np.abs(x))
    assert np.array_equal(prec.round_to(r, precision), r)
    assert np.mean(r != x) > 0.9   # (it rounds: float32 data has bits below the format's)


def test_bf16_rounding_is_ml_dtypes_s():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(1).normal(size=4099).astype(np.float32)
    x[:3] = [np.inf, -np.inf, 0.0]
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(prec.round_to(x, "bf16"), want)


def test_storage_dtype_names_a_half_format_only_where_the_namespace_computes_with_it(
        monkeypatch):
    """float16 everywhere; bfloat16 through ml_dtypes where the namespace converts, gathers
    and subtracts it (NumPy does); a namespace that names the type but cannot compute with
    it (a CuPy before its kernels took bfloat16) gets None, so a fit keeps float32 data."""
    import types

    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert prec.storage_dtype("fp16", np) is np.float16
    assert prec.storage_dtype("bf16", np) == np.dtype(ml_dtypes.bfloat16)
    assert prec.storage_dtype("tf32", np) is None and prec.storage_dtype("exact", np) is None

    def refuse(*args, **kwargs):
        raise TypeError("no bfloat16 loop")

    class Arr(np.ndarray):   # the arrays of a library that has no bfloat16 subtraction
        pass

    Arr.__module__ = "names_only_lib"
    lib = types.SimpleNamespace(asarray=lambda a: np.asarray(a).view(Arr), subtract=refuse,
                                isnan=np.isnan, any=np.any)
    monkeypatch.setitem(sys.modules, "names_only_lib", lib)
    assert prec.storage_dtype("bf16", lib) is None
    assert prec.storage_dtype("bf16", np) == np.dtype(ml_dtypes.bfloat16)   # (its own answer)


@pytest.mark.parametrize("precision", REDUCED)
def test_reduced_fit_within_the_documented_bound(precision):
    X, init = half_case()
    ref = _fit(X, init, backend="numpy")
    got = _fit(X, init, backend="numpy", precision=precision)
    check_fit_within_bound(got, ref, precision, X.shape[1], precision)
    assert got.cluster_centers_.dtype == np.float32
    assert np.array_equal(got.predict(X), got.labels_)   # predict at the fit's precision


@pytest.mark.parametrize("precision", REDUCED)
def test_each_assignment_within_the_certified_bound(precision):
    check_assignment_bound(NumpyBackend(), np.asarray, precision, precision)


def test_reduced_precision_changes_labels_near_ties_only():
    """On data without clusters (every label a near tie somewhere), bf16 moves some labels:
    the emulation does round (a no-op would pass the bound tests too)."""
    rng = np.random.default_rng(3)
    X = (rng.uniform(size=(3001, 16)) * np.arange(1, 17) + 100).astype(np.float32)
    init = X[:9].copy()
    backend = NumpyBackend()
    exact = backend.assign(X - X.mean(0), init - X.mean(0)).labels
    backend.use_precision("bf16")
    rounded = backend.assign(X - X.mean(0), init - X.mean(0)).labels
    assert 0 < np.mean(exact != rounded) < 0.2


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_half_x_fits_on_the_cpu_with_float32_centers(dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    X, init = half_case()
    Xh = X.astype(dtype)
    ref = _fit(Xh.astype(np.float32), init, backend="numpy")
    for backend in ("numpy", "auto"):
        got = _fit(Xh, init, backend=backend)
        assert got.cluster_centers_.dtype == np.float32
        assert np.array_equal(got.labels_, ref.labels_)
        assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-5)


@pytest.mark.parametrize("backend", ["numpy", "array-api"])
def test_half_x_costs_one_float32_copy_and_is_left_as_given(backend, monkeypatch):
    """Validation's float32 copy of half X is the fit's own: centered in place, not copied
    again (the fit's traced peak is a float32 X smaller than when the copy is centered on
    a second copy), the same fit as of X.astype(float32), and the user's X not written."""
    import tracemalloc

    from kmeans_xp.estimators import kmeans as estimator
    rng = np.random.default_rng(3)
    X = (rng.standard_normal((100_003, 8)) * 2 + 5).astype(np.float16)
    given = X.copy()
    init = X[:7].astype(np.float32)

    def peak():
        tracemalloc.start()
        try:
            return _fit(X, init, backend=backend), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    ref = _fit(X.astype(np.float32), init, backend=backend)   # (and first-use allocations)
    got, peak_owned = peak()
    with monkeypatch.context() as m:
        m.setattr(estimator, "converted_copy", lambda X_user, X: False)
        _, peak_copied = peak()
    np.testing.assert_array_equal(X, given)
    assert np.array_equal(got.labels_, ref.labels_)
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
    if backend == "numpy":
        return   # (its centered copy is shared memory, which tracemalloc does not see)
    x32 = X.size * 4
    assert peak_owned < peak_copied - 3 * x32 // 4, (peak_owned, peak_copied, x32)


def test_half_x_at_its_own_format():
    X, init = half_case()
    X16 = X.astype(np.float16)
    ref = _fit(X16.astype(np.float32), init, backend="numpy")
    got = _fit(X16, init, backend="numpy", precision="fp16")
    check_fit_within_bound(got, ref, "fp16", X.shape[1], "fp16 X")


def test_spherical_takes_a_precision():
    X, init = half_case()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = SphericalKMeans(6, init=init, backend="numpy", precision="bf16").fit(X)
    assert np.allclose(np.linalg.norm(got.cluster_centers_, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("kwargs, X_dtype, match", [
    ({"precision": "fp8"}, np.float32, "'precision' parameter of KMeans must be"),
    ({"precision": "fp16"}, np.float64, "needs float32 or half X, got float64"),
    ({"precision": "bf16"}, np.float16, "half X computes at its own format"),
    ({"precision": "tf32", "backend": "numba"}, np.float32,
     r"computes at precision \['exact'\], not 'tf32'.*would: \[.*'numpy'"),
])
def test_bad_precision_is_refused_before_work(kwargs, X_dtype, match):
    if kwargs.get("backend") == "numba":
        pytest.importorskip("numba")
    X, init = half_case()
    with pytest.raises(ValueError, match=match):
        KMeans(6, init=init, **kwargs).fit(X.astype(X_dtype))


def test_auto_passes_over_backends_without_the_precision():
    X, init = half_case()
    got = _fit(np.tile(X, (60, 1)), init, backend="auto", precision="fp16", max_iter=2)
    assert "fp16" in get_backend(got.backend_).precisions


def test_backends_declare_their_precisions():
    assert set(NumpyBackend.precisions) == set(prec.PRECISIONS)
    from kmeans_xp.contract.backend import KMeansBackend
    assert KMeansBackend.precisions == ("exact",)
    from kmeans_xp_backends.cupy import paths
    assert set(paths.PRECISIONS) <= set(prec.PRECISIONS) and "exact" in paths.PRECISIONS


def test_plan_carries_the_precision():
    backend = NumpyBackend()
    backend.use_precision("tf32")
    assert backend.plan(np.zeros((10, 3), np.float32), 2).precision == "tf32"
    with pytest.raises(ValueError, match="not 'fp8'"):
        backend.use_precision("fp8")


def test_bound_is_documented_per_precision():
    assert prec.inertia_gap_bound("exact", 128) == 0
    assert prec.inertia_gap_bound("fp16", 8) < prec.inertia_gap_bound("bf16", 8) <= 0.5


# -- the GPU: cupy-fused's TF32 kernels at precision="tf32" ----------------------------------
@pytest.mark.gpu
def test_cupy_fused_tf32_within_the_bound_and_certified():
    import cupy as cp
    X, init = half_case()
    ref = _fit(X, init, backend="numpy")
    got = _fit(cp.asarray(X), init, backend="cupy-fused", precision="tf32")
    check_fit_within_bound(got, ref, "tf32", X.shape[1], "cupy-fused tf32")
    backend = get_backend("cupy-fused")()
    check_assignment_bound(backend, cp.asarray, "tf32", "cupy-fused tf32")


@pytest.mark.gpu
def test_cupy_fused_old_tf32_option_still_runs_tf32_and_warns():
    import cupy as cp
    X, init = half_case()
    new = _fit(cp.asarray(X), init, backend="cupy-fused", precision="tf32")
    with pytest.warns(DeprecationWarning, match="precision='tf32'"):
        old = KMeans(6, init=init, tol=0, max_iter=100, backend="cupy-fused",
                     backend_options={"precision": "tf32"}).fit(cp.asarray(X))
    assert np.array_equal(cp.asnumpy(old.labels_), cp.asnumpy(new.labels_))


@pytest.mark.gpu
@pytest.mark.parametrize("half_kernel", ["shared", "registers"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cupy_fused_half_precision_within_the_bound_and_certified(precision, half_kernel):
    """The wgmma kernel's half formats (Hopper), X's rows in shared memory or its fragments
    in registers: the fit within the documented bound of the exact one, and each assignment
    within the certified bound, at d across the atoms of K (tails of 16 and of 64), n past a
    block's 256 rows and k past a column block's 64 (d > 128 with registers: the shared
    tile)."""
    import cupy as cp
    from kmeans_xp_backends.cupy import fused_plan, paths
    if not paths.wgmma_fits(8, fused_plan.device_facts(cp.cuda.Device().id), False, 1):
        pytest.skip("the half formats' kernel needs compute capability 9.0")
    X, init = half_case()
    ref = _fit(X, init, backend="numpy")
    got = _fit(cp.asarray(X), init, backend="cupy-fused", precision=precision,
               backend_options={"half_kernel": half_kernel})
    assert got.backend_ == "cupy-fused"
    check_fit_within_bound(got, ref, precision, X.shape[1], f"cupy-fused {precision}")
    backend = get_backend("cupy-fused")(half_kernel=half_kernel)
    rng = np.random.default_rng(3)
    for n, d, k in ((2003, 8, 6), (1001, 37, 203), (777, 100, 64), (4099, 200, 1000),
                    (300, 256, 130), (513, 3, 1)):
        X = (rng.normal(size=(n, d)) * np.linspace(0.5, 3, d) + 1).astype(np.float32)
        C = X[rng.choice(n, k, replace=k > n)] + np.float32(0.01)
        check_assignment_bound(backend, cp.asarray, precision,
                               f"cupy-fused {precision} n={n} d={d} k={k}", case=(X, C))


@pytest.mark.gpu
def test_cupy_fused_refuses_half_precision_past_its_kernel():
    import cupy as cp
    X = np.random.default_rng(0).normal(size=(300, 300)).astype(np.float32)
    with pytest.raises(ValueError, match="fp16.*wgmma kernel.*cupy-chunked"):
        KMeans(4, backend="cupy-fused", precision="fp16").fit(cp.asarray(X))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", REDUCED)
def test_cupy_chunked_reduced_precision_on_the_gpu(precision):
    import cupy as cp
    X, init = half_case()
    Xd = cp.asarray(X)
    rounded = prec.round_to(Xd, precision, cp.empty_like(Xd))
    assert np.array_equal(cp.asnumpy(rounded), prec.round_to(X, precision))
    ref = _fit(X, init, backend="numpy")
    got = _fit(Xd, init, backend="cupy-chunked", precision=precision)
    check_fit_within_bound(got, ref, precision, X.shape[1], f"{got.backend_} {precision}")
    check_assignment_bound(get_backend("cupy-chunked")(), cp.asarray, precision, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cupy-chunked", "cupy-fused"])
def test_cupy_float16_x_costs_one_float32_copy(backend):
    """On the device too, validation's float32 copy of a float16 X is centered in place:
    the pool's peak beyond X16 is within a float32 fit's peak beyond X32 plus half of X32
    (two float32 copies made it a whole X32 more), and X16 is not written."""
    import cupy as cp

    class PoolPeak(cp.cuda.memory_hook.MemoryHook):
        name = "kmeans_xp_test_half_peak"   # (the fit's stages install their own hook)

        def __init__(self):
            self.peak = 0

        def malloc_postprocess(self, **kwargs):
            self.peak = max(self.peak, cp.get_default_memory_pool().used_bytes())

    rng = np.random.default_rng(3)
    X = (rng.standard_normal((1_000_003, 16)) * 2 + 5).astype(np.float16)
    init = X[:50].astype(np.float32)
    pool = cp.get_default_memory_pool()

    def peak(data):
        d = cp.asarray(data)
        before = d.copy()
        _fit(d[:5000], init, backend=backend)   # kernels compiled
        pool.free_all_blocks()
        base = pool.used_bytes()
        hook = PoolPeak()
        with hook:
            km = _fit(d, init, backend=backend)
            cp.cuda.get_current_stream().synchronize()
        assert bool((d == before).all())
        return km, max(hook.peak, pool.used_bytes()) - base

    X32 = X.astype(np.float32)
    ref, peak32 = peak(X32)
    got, peak16 = peak(X)
    assert np.array_equal(cp.asnumpy(got.labels_), cp.asnumpy(ref.labels_))
    assert peak16 < peak32 + X32.nbytes // 2, (peak16, peak32, X32.nbytes)


@pytest.mark.gpu
def test_cupy_float16_x_fits_with_float32_centers():
    import cupy as cp
    X, init = half_case()
    X16 = X.astype(np.float16)
    ref = _fit(X16, init, backend="numpy")
    got = _fit(cp.asarray(X16), init, backend="auto")
    check_fit_within_bound(got, ref, "fp16", X.shape[1], "cupy float16 X")


@pytest.mark.parametrize("precision", REDUCED)
def test_minibatch_takes_a_precision(precision):
    from kmeans_xp import MiniBatchKMeans
    X, init = half_case()
    kw = dict(init=init, backend="numpy", random_state=0, batch_size=256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = MiniBatchKMeans(6, **kw).fit(X)
        got = MiniBatchKMeans(6, precision=precision, **kw).fit(X)
    check_fit_within_bound(got, ref, precision, X.shape[1], f"MiniBatchKMeans {precision}")
    assert np.array_equal(got.predict(X), got.labels_)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_torch_half_x_fits_with_float32_centers(dtype_name):
    torch = pytest.importorskip("torch")
    X, init = half_case()
    T = torch.from_numpy(X).to(getattr(torch, dtype_name))
    ref = _fit(T.float().numpy(), init, backend="numpy")
    own = "fp16" if dtype_name == "float16" else "bf16"
    for precision in ("exact", own):
        got = _fit(T, init, precision=precision)
        assert got.cluster_centers_.dtype == torch.float32
        check_fit_within_bound(got, ref, own, X.shape[1], f"torch {dtype_name} {precision}")


def test_cupy_fused_maps_the_fit_precision_onto_its_kernel_paths(fake_cupy):
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    backend = CupyFusedBackend()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the new option warns about nothing
        backend.use_precision("tf32")
        assert (backend.precision, backend.compute_precision) == ("tf32", "tf32")
        backend.use_precision("exact")
        assert (backend.precision, backend.compute_precision) == ("fp32", "exact")
        backend.use_precision("bf16")   # (the wgmma kernel's half formats)
        assert (backend.precision, backend.compute_precision) == ("bf16", "bf16")
    with pytest.raises(ValueError, match="not 'fp8'"):
        backend.use_precision("fp8")
    old = CupyFusedBackend(precision="tf32")
    with pytest.warns(DeprecationWarning, match="KMeans\\(precision='tf32'\\)"):
        old.use_precision("exact")
    assert (old.precision, old.compute_precision) == ("tf32", "tf32")


@pytest.mark.parametrize("precision", REDUCED)
def test_cupy_chunked_reduced_precision_on_the_emulated_device(fake_cupy, precision):
    """cupy-chunked rounds X's rows and the centers as the numpy emulation does, then its FP32
    GEMM: the same fit up to the order of the sums."""
    X, init = half_case()
    assert np.array_equal(prec.round_to(X, precision, np.empty_like(X)),
                          prec.round_to(X, precision))
    ref = _fit(X, init, backend="numpy", precision=precision)
    got = _fit(fake_cupy.asarray(X), init, backend="cupy-chunked", precision=precision)
    assert got.backend_ == "cupy-chunked"
    check_fit_within_bound(got, ref, precision, X.shape[1], f"cupy-chunked {precision}")
    assert np.mean(fake_cupy.asnumpy(got.labels_) != ref.labels_) <= 0.001


@pytest.mark.parametrize("factor", [2.0 ** 20, 1e6, 2.0 ** -30])
def test_fp16_fit_of_data_outside_float16s_range(factor):
    """precision="fp16" on float32 X past float16's 65504 (or deep in its subnormals) fits
    within the bound as X in range does: the fit's power of two brings X into range."""
    X, init = half_case()
    X, init = X * np.float32(factor), init * np.float32(factor)
    ref = _fit(X, init, backend="numpy")
    got = _fit(X, init, backend="numpy", precision="fp16")
    assert np.isfinite(got.inertia_) and np.isfinite(got.cluster_centers_).all()
    check_fit_within_bound(got, ref, "fp16", X.shape[1], f"fp16 X * {factor:g}")


def test_batch_outside_float16s_range_is_refused_at_fp16():
    X, init = half_case()
    batch = np.stack([X, X * np.float32(1e6)])
    with pytest.raises(ValueError, match="Problem 1 .*float16's range"):
        KMeans(6, precision="fp16", n_init=1).fit(batch)
    KMeans(6, precision="bf16", n_init=1, max_iter=3).fit(batch)   # (bf16 keeps the range)


@pytest.mark.parametrize("partial", [False, True])
def test_minibatch_fp16_of_data_outside_float16s_range(partial):
    """MiniBatchKMeans resolves its precision before its guard too: fit and partial_fit at
    fp16 on X past 65504 stay within the bound (before: the fit overflowed, 15x the
    inertia)."""
    from kmeans_xp import MiniBatchKMeans
    X, init = half_case()
    X, init = X * np.float32(1e6), init * np.float32(1e6)
    kw = dict(init=init, backend="numpy", random_state=0, batch_size=256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = MiniBatchKMeans(6, **kw).fit(X)
        got = MiniBatchKMeans(6, precision="fp16", **kw)
        if partial:
            for _ in range(3):
                got.partial_fit(X)
            ref = MiniBatchKMeans(6, **kw)
            for _ in range(3):
                ref.partial_fit(X)
            got.inertia_ = got.score(X) * -1   # (partial_fit keeps no inertia_)
            ref.inertia_ = ref.score(X) * -1
            got.labels_, ref.labels_ = got.predict(X), ref.predict(X)
        else:
            got.fit(X)
    check_fit_within_bound(got, ref, "fp16", X.shape[1], f"MiniBatchKMeans fp16 {partial}")
