"""precision="fp16" on cupy-fused computes on float16 data (`KMeansBackend.half_data`): X
given in float16 stays float16 on the device, and a float32 X is centered into a float16
copy, so the fit reads X at half the bytes and holds half the memory of a float32 copy;
centers, sums, weights and inertia stay float32/float64. Run on the CPU through the NumPy
stand-in for CuPy and the kernel emulator on a Hopper GPU's facts (the wgmma kernel, which
fp16 needs). Skipped without g++."""

import numpy as np
import pytest
from kmeans_xp_backends.cupy import fused_plan, placement
from kmeans_xp_backends.cupy import workspace as ws_module

from kmeans_xp import KMeans
from kmeans_xp.contract.precision import inertia_gap_bound
from tests._cuda_emulator import EmulatedKernels
from tests._helpers import half_problem, quiet_fit

pytestmark = pytest.mark.skipif(not EmulatedKernels.available(), reason="needs g++")

HOPPER = fused_plan.DeviceFacts(2, 227 * 1024, 228 * 1024, 90)


@pytest.fixture
def hopper(emulated_cupy, monkeypatch):
    monkeypatch.setattr(fused_plan, "device_facts", lambda device_id: HOPPER)
    # (centering into half data a few rows a step: 42 at d=24, n off every multiple)
    monkeypatch.setattr(placement, "HALF_CHUNK_BYTES", 4096)
    seen = []
    real = ws_module.Workspace.__init__

    def spy(self, cp, plan, X, *args, **kwargs):
        seen.append((str(X.dtype), plan.path))
        real(self, cp, plan, X, *args, **kwargs)

    monkeypatch.setattr(ws_module.Workspace, "__init__", spy)
    emulated_cupy.workspaces = seen
    return emulated_cupy


def _data(n=1037, d=24, k=9, seed=3):
    return half_problem(n, d, k, seed, offset=50.0)


_fit = quiet_fit


def test_float16_x_is_computed_on_as_it_is(hopper):
    X16, init = _data()
    got = _fit(X16, init, precision="fp16")
    assert hopper.workspaces and all(dt == "float16" and path == "wgmma-fp16"
                                     for dt, path in hopper.workspaces)
    # the fit's only copy of X is X's own upload, centered in place, a float32 chunk at a
    # time: no float32 array of X
    assert max(hopper.allocations) < X16.size * 4
    assert got.cluster_centers_.dtype == np.float32
    assert np.asarray(got.cluster_centers_).shape == init.shape


def test_float16_x_equals_its_float32_values(hopper):
    """float32 X at fp16 is centered into a float16 copy, rounded once as float16 X's data
    is: the same data, so the same fit bit for bit (and both read as fp16)."""
    X16, init = _data(seed=5)
    a = _fit(X16, init, precision="fp16")
    b = _fit(X16.astype(np.float32), init, precision="fp16")
    assert {dt for dt, _ in hopper.workspaces} == {"float16"}
    assert np.array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    assert np.array_equal(np.asarray(a.cluster_centers_), np.asarray(b.cluster_centers_))
    assert a.inertia_ == b.inertia_ and a.n_iter_ == b.n_iter_


@pytest.mark.parametrize("n,d,k", [(1037, 24, 9), (515, 64, 1), (300, 7, 40), (777, 130, 33),
                                   (401, 136, 5)])
def test_half_data_within_the_documented_bound_of_the_exact_fit(hopper, n, d, k):
    """Against the exact fit of the same float16 values (numpy backend, float64 sums):
    the inertia gap within `inertia_gap_bound("fp16", d)`; d = 7 and 130 rows are not
    16-byte multiples (scalar loads), 24 and 64 are (cp.async), 136 too but past two
    atoms of K (16-byte loads through registers)."""
    X16, init = _data(n, d, k, seed=n + d)
    got = _fit(X16, init, precision="fp16")
    ref = _fit(X16.astype(np.float64), init.astype(np.float64), backend="numpy")
    gap = abs(got.inertia_ - ref.inertia_) / ref.inertia_
    assert gap <= inertia_gap_bound("fp16", d)
    assert np.mean(np.asarray(got.labels_) != ref.labels_) <= 0.05


def test_half_data_with_weights_relocation_and_kmeans_plus_plus(hopper):
    """Weights (some zero), an empty cluster relocated (the farthest rows, in float32) and
    k-means++ on the device, all on float16 data; labels_ == predict(X)."""
    X16, init = _data(n=901, d=16, k=6, seed=9)
    w = np.random.default_rng(1).uniform(0.5, 2, size=len(X16))
    w[::7] = 0
    far = init.copy()
    far[3] = 1e3   # nothing is nearest: empty after the first assignment
    got = _fit(X16, far, precision="fp16")
    assert len(np.unique(np.asarray(got.labels_))) == 6
    km = KMeans(6, init="k-means++", n_init=1, random_state=0, precision="fp16",
                backend="cupy-fused", max_iter=10).fit(X16, sample_weight=w)
    assert km.cluster_centers_.dtype == np.float32
    assert {dt for dt, _ in hopper.workspaces} == {"float16"}
    # (predict computes on float32 values of X: its rounding to fp16 gives the fit's data)
    assert np.array_equal(np.asarray(km.predict(X16)), np.asarray(km.labels_))


def test_copy_x_false_leaves_float16_x_as_given(hopper):
    X16, init = _data(seed=2)
    before = X16.copy()
    _fit(X16, init, precision="fp16", copy_x=False)
    assert np.array_equal(X16, before)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_x_on_the_cpu_and_at_exact_is_float32(hopper, precision):
    """Backends without half data (numpy), and cupy-fused at 'exact', compute on float32
    values of half X: the same fit as float32 X holding them. Another half format is
    refused before any work."""
    Xh, init = _data(seed=4) if precision == "fp16" else _bf16_data(seed=4)
    for backend, p in (("numpy", precision), ("cupy-fused", "exact")):
        a = _fit(Xh, init, precision=p, backend=backend)
        b = _fit(Xh.astype(np.float32), init, precision=p, backend=backend)
        assert np.array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
        assert a.inertia_ == b.inertia_
    assert {dt for dt, _ in hopper.workspaces} <= {"float32"}
    with pytest.raises(ValueError, match=precision):
        KMeans(3, precision="fp16" if precision == "bf16" else "bf16").fit(Xh)


def test_registers_form_on_float16_data_equals_the_shared_tile(hopper):
    """half_kernel='registers' reads float16 data's fragments as they are: the same fit."""
    X16, init = _data(n=613, d=40, k=11, seed=8)
    a = _fit(X16, init, precision="fp16", backend_options={"half_kernel": "registers"})
    b = _fit(X16, init, precision="fp16")
    assert ("float16", "wgmma-fp16r") in hopper.workspaces
    assert np.array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    assert np.array_equal(np.asarray(a.cluster_centers_), np.asarray(b.cluster_centers_))


# ---------------------------------------------------------------------------------------------
# bfloat16 data at precision="bf16" (ml_dtypes' bfloat16, the dtype CuPy 14 holds it in)
# ---------------------------------------------------------------------------------------------
def _bf16_data(n=1037, d=24, k=9, seed=3):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    X16, init = _data(n, d, k, seed)
    return X16.astype(np.float32).astype(ml_dtypes.bfloat16), init


def test_bfloat16_x_is_computed_on_as_it_is(hopper):
    Xb, init = _bf16_data()
    got = _fit(Xb, init, precision="bf16")
    assert hopper.workspaces and all(dt == "bfloat16" and path == "wgmma-bf16"
                                     for dt, path in hopper.workspaces)
    assert max(hopper.allocations) < Xb.size * 4   # no float32 array of X
    assert got.cluster_centers_.dtype == np.float32
    assert np.array_equal(np.asarray(got.predict(Xb)), np.asarray(got.labels_))


def test_bfloat16_x_equals_its_float32_values(hopper):
    """float32 X at bf16 is centered into a bfloat16 copy, x - mean rounded once, as
    bfloat16 X's data is: the same fit bit for bit (the registers form too)."""
    Xb, init = _bf16_data(n=613, d=40, k=11, seed=5)
    a = _fit(Xb, init, precision="bf16")
    b = _fit(Xb.astype(np.float32), init, precision="bf16")
    c = _fit(Xb, init, precision="bf16", backend_options={"half_kernel": "registers"})
    assert {dt for dt, _ in hopper.workspaces} == {"bfloat16"}
    assert ("bfloat16", "wgmma-bf16r") in hopper.workspaces
    for other in (b, c):
        assert np.array_equal(np.asarray(a.labels_), np.asarray(other.labels_))
        assert np.array_equal(np.asarray(a.cluster_centers_), np.asarray(other.cluster_centers_))
        assert a.inertia_ == other.inertia_ and a.n_iter_ == other.n_iter_


@pytest.mark.parametrize("n,d,k", [(1037, 24, 9), (300, 7, 40), (401, 136, 5)])
def test_bfloat16_data_within_the_documented_bound_of_the_exact_fit(hopper, n, d, k):
    """Against the exact fit of the same bfloat16 values (numpy backend, float64): the
    inertia gap within `inertia_gap_bound("bf16", d)`; row widths of scalar loads (7),
    cp.async (24) and 16-byte loads past two atoms (136); weights with zeros."""
    Xb, init = _bf16_data(n, d, k, seed=n + d)
    w = np.random.default_rng(d).uniform(0.5, 2, size=n)
    w[::5] = 0
    got = _fit(Xb, init, precision="bf16", sample_weight=w)
    ref = _fit(Xb.astype(np.float64), init.astype(np.float64), backend="numpy",
               sample_weight=w)
    gap = abs(got.inertia_ - ref.inertia_) / ref.inertia_
    assert gap <= inertia_gap_bound("bf16", d)


# ---------------------------------------------------------------------------------------------
# the memory plan counts the data the fit holds in its half format
# ---------------------------------------------------------------------------------------------
def _placement(precision):
    from kmeans_xp.contract.registry import get_backend
    backend = get_backend("cupy-fused")()
    backend.use_precision(precision)
    return backend, backend.placement


@pytest.mark.parametrize("precision,dtype,held", [
    ("fp16", np.float16, 2),       # X's own device copy, centered in place, in fp16
    ("fp16", np.float32, 4 + 2),   # float32 X's copy and the fp16 centered copy beside it
    ("exact", np.float32, 4),
    ("exact", np.float64, 8)])
def test_host_x_is_planned_at_the_bytes_the_fit_holds(hopper, precision, dtype, held):
    backend, place = _placement(precision)
    X = np.zeros((1000, 8), dtype=dtype)
    assert place.host_x_bytes(X) == held
    assert place.copy_bytes(X) == (2 if precision == "fp16" else np.dtype(dtype).itemsize)
    base = place.fit_state_bytes(1000, 8, 5, 4, 0)   # (the driver's arrays alone)
    assert place.fit_state_bytes(1000, 8, 5, 4, held) - base == 1000 * 8 * held


def test_the_plan_decides_at_the_half_bytes(hopper):
    """A device X's centered copy is planned at 2 bytes a value at fp16 (4 at exact): the
    free memory of the fp16 copy holds it, not the float32 one. A float32 host X at fp16
    needs its copy and the half copy (6 bytes a value): where only 4 fit, the fit is
    refused before any work (cupy-fused does not stream), as it is not at exact."""
    from kmeans_xp_backends.cupy.placement import STREAM_AUTO_SLACK
    n, d = 40_001, 24
    X = np.zeros((n, d), dtype=np.float32)
    (hb, half), (eb, exact) = _placement("fp16"), _placement("exact")   # (placements hold
    hopper.runtime.free = n * d * 2 + n * (3 * 4 + 2 * 4) + STREAM_AUTO_SLACK
    assert half.copy_fits(X) and not exact.copy_fits(X)
    four = exact.fit_state_bytes(n, d, 5, 4, 4)
    hopper.runtime.free = four + n * d   # 4 bytes a value and a bit, not 6
    from kmeans_xp import KMeansMemoryError
    for precision, refused in (("exact", False), ("fp16", True)):
        backend, place = _placement(precision)
        plan = backend.plan(X, 5, copy_x=True, weighted=False)
        if refused:
            with pytest.raises(KMeansMemoryError, match="does not fit on the GPU"):
                backend.check_memory(X, plan)
        else:
            backend.check_memory(X, plan)


def test_half_centering_of_no_rows(hopper):
    """Centering into half data a chunk at a time copes with X of no rows (a batch's empty
    problem): an empty float16 array, not a zero chunk step."""
    from kmeans_xp import get_backend
    be = get_backend("cupy-fused")()
    X = np.empty((0, 6), dtype=np.float32)
    out = be.placement._centered_as(X, np.zeros(6, np.float32), 1.0, np.float16)
    assert out.shape == (0, 6) and out.dtype == np.float16
