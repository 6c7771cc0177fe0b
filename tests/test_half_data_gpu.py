"""precision="fp16" on cupy-fused computes on float16 data on the GPU, and "bf16" on bfloat16
data where CuPy holds it (tests/test_half_data.py runs the same on the kernel emulator):
half X stays in its dtype, a float32 X holding the same values gives the same fit, the fit
is within the documented bound of the exact one, and no float32 copy of X is made."""
import numpy as np
import pytest

from kmeans_xp.contract.precision import inertia_gap_bound, storage_dtype
from tests._helpers import half_problem, quiet_fit

pytestmark = pytest.mark.gpu


def _hopper(cp):
    if int(cp.cuda.Device().compute_capability) != 90:
        pytest.skip("fp16 runs on the wgmma kernel (compute capability 9.0)")


def _data(n=1037, d=24, k=9, seed=3):
    return half_problem(n, d, k, seed, offset=20.0)


_fit = quiet_fit


@pytest.mark.parametrize("n,d,k", [(100_003, 128, 100), (50_021, 40, 7), (20_011, 200, 257)])
def test_float16_x_equals_its_float32_values_within_the_bound(cp, n, d, k):
    _hopper(cp)
    X16, init = _data(n, d, k, seed=d)
    a = _fit(cp.asarray(X16), init, precision="fp16")
    b = _fit(cp.asarray(X16.astype(np.float32)), init, precision="fp16")
    assert np.array_equal(cp.asnumpy(a.labels_), cp.asnumpy(b.labels_))
    assert np.array_equal(cp.asnumpy(a.cluster_centers_), cp.asnumpy(b.cluster_centers_))
    assert a.inertia_ == b.inertia_
    assert a.cluster_centers_.dtype == cp.float32
    ref = _fit(X16.astype(np.float64), init.astype(np.float64), backend="numpy")
    assert abs(a.inertia_ - ref.inertia_) / ref.inertia_ <= inertia_gap_bound("fp16", d)
    assert np.array_equal(cp.asnumpy(a.predict(cp.asarray(X16))), cp.asnumpy(a.labels_))


def test_float16_fit_makes_no_float32_copy(cp):
    """The pool's peak over the fit of float16 X: X, its float16 centered copy, the
    centering's one float32 chunk (64 MiB) and the fit's small buffers; a float32 copy of X
    alone would be twice X's bytes more."""
    _hopper(cp)
    n, d, k = 1_000_003, 128, 64
    X16, init = _data(n, d, k, seed=1)
    X = cp.asarray(X16)
    pool = cp.get_default_memory_pool()
    _fit(X, init, precision="fp16", max_iter=2)   # compile, warm the pool
    pool.free_all_blocks()
    top = [pool.used_bytes()]

    class Peak(cp.cuda.memory_hook.MemoryHook):
        name = "half_data_peak"

        def malloc_postprocess(self, **kwargs):
            top[0] = max(top[0], pool.used_bytes())

    with Peak():
        _fit(X, init, precision="fp16", max_iter=3)
    beyond_x = top[0] - X.nbytes
    assert beyond_x < X.nbytes + 128 * 2**20, f"{beyond_x} bytes beyond X"


def test_torch_float16_through_dlpack(cp):
    _hopper(cp)
    torch = pytest.importorskip("torch")
    X16, init = _data(30_011, 64, 12, seed=7)
    t = torch.from_numpy(X16).cuda()
    got = _fit(t, init, precision="fp16")
    assert isinstance(got.cluster_centers_, torch.Tensor)
    assert got.cluster_centers_.dtype == torch.float32
    ref = _fit(cp.asarray(X16), init, precision="fp16")
    assert np.array_equal(got.labels_.cpu().numpy(), cp.asnumpy(ref.labels_))


def _bf16(cp):
    """ml_dtypes' bfloat16, where this CuPy holds it (else the test skips)."""
    dtype = storage_dtype("bf16", cp)
    if dtype is None:
        pytest.skip("this CuPy holds no bfloat16 (CuPy 14 with ml_dtypes)")
    return dtype


@pytest.mark.parametrize("n,d,k", [(100_003, 128, 100), (20_011, 200, 257)])
def test_bfloat16_x_equals_its_float32_values_within_the_bound(cp, n, d, k):
    _hopper(cp)
    bf16 = _bf16(cp)
    X16, init = _data(n, d, k, seed=d)
    Xb = X16.astype(np.float32).astype(bf16)
    a = _fit(cp.asarray(Xb), init, precision="bf16")
    b = _fit(cp.asarray(Xb.astype(np.float32)), init, precision="bf16")
    assert np.array_equal(cp.asnumpy(a.labels_), cp.asnumpy(b.labels_))
    assert np.array_equal(cp.asnumpy(a.cluster_centers_), cp.asnumpy(b.cluster_centers_))
    assert a.inertia_ == b.inertia_
    ref = _fit(Xb.astype(np.float64), init.astype(np.float64), backend="numpy")
    assert abs(a.inertia_ - ref.inertia_) / ref.inertia_ <= inertia_gap_bound("bf16", d)
    host = _fit(Xb, init, precision="bf16")   # NumPy bfloat16 X: copied in as it is
    assert np.array_equal(np.asarray(host.labels_), cp.asnumpy(a.labels_))


def test_torch_bfloat16_through_dlpack(cp):
    _hopper(cp)
    _bf16(cp)
    torch = pytest.importorskip("torch")
    X16, init = _data(30_011, 64, 12, seed=7)
    t = torch.from_numpy(X16.astype(np.float32)).to(torch.bfloat16).cuda()
    got = _fit(t, init, precision="bf16")
    assert got.cluster_centers_.dtype == torch.float32
    ref = _fit(cp.asarray(t.float().cpu().numpy()), init, precision="bf16")
    assert np.array_equal(got.labels_.cpu().numpy(), cp.asnumpy(ref.labels_))


def test_bfloat16_nan_and_infinity_are_refused_by_their_bits(cp):
    """A CuPy bfloat16 X's NaN/inf check and max |x| read its 16-bit patterns
    (`finite._bf16_absmax`): NaN and infinity at any position refused with their own
    messages, a finite X's max |x| exact."""
    bf16 = _bf16(cp)
    from kmeans_xp import KMeans
    from kmeans_xp.contract.finite import check_finite
    X = np.random.default_rng(0).normal(size=(5003, 7)).astype(np.float32)
    X[17, 3] = -2.0 ** 90
    Xb = cp.asarray(X.astype(bf16))
    assert check_finite(Xb, cp) == 2.0 ** 90
    for bad, what in ((np.nan, "NaN"), (np.inf, "infinity"), (-np.inf, "infinity")):
        for at in ((0, 0), (5002, 6), (2500, 3)):
            Y = X.copy()
            Y[at] = bad
            with pytest.raises(ValueError, match=what):
                KMeans(3, precision="bf16", backend="cupy-fused").fit(cp.asarray(Y.astype(bf16)))
