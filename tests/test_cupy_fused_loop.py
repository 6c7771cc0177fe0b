"""cupy-fused through the driver (kmeans_xp.algorithms.lloyd) equals the numpy backend through the driver,
with the real kernels run on the CPU (tests/_fake_cupy.py): every case of the driver's matrix
(relocation guard, weights with zeros and None, empty clusters forcing relocation,
duplicates, tol 0 and > 0, max_iter 1, k = 1), float32 and float64, the fused small-d pass,
the split one and the GEMM-like kernel. And what one iteration costs: three launches (four
when the sums are a separate pass), nothing read back."""
import warnings

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data, lloyd_cases


def _same_fit(got, ref, dtype, where):
    assert np.array_equal(np.asarray(got.labels_), ref.labels_), \
        f"{where}: {np.mean(np.asarray(got.labels_) != ref.labels_):.3%} labels differ"
    assert got.n_iter_ == ref.n_iter_, f"{where}: n_iter {got.n_iter_} != {ref.n_iter_}"
    rtol = 1e-5 if dtype == np.float32 else 1e-11
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol, abs=1e-12), where
    np.testing.assert_allclose(np.asarray(got.cluster_centers_), ref.cluster_centers_,
                               rtol=rtol * 10, atol=rtol, err_msg=where)
    np.testing.assert_allclose(got.history_["inertia"], ref.history_["inertia"], rtol=rtol,
                               atol=1e-12, err_msg=where)


@pytest.mark.parametrize("fuse", ["auto", False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_driver_matrix_equals_numpy(fake_cupy, dtype, fuse):
    for case, kwargs, X, fit_kw in lloyd_cases(dtype):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = KMeans(backend="numpy", **kwargs).fit(X, **fit_kw)
            got = KMeans(backend="cupy-fused", backend_options={"fuse": fuse},
                         **kwargs).fit(X, **fit_kw)
        _same_fit(got, ref, dtype, f"{case} {np.dtype(dtype)} fuse={fuse}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_path_with_empty_clusters_equals_numpy(fake_cupy, dtype):
    """d > 16 (the GEMM-like kernel, sums in a second pass), weights, far centers."""
    X = asymmetric_data(1031, 17, 6, dtype=dtype, seed=3)
    w = np.random.default_rng(3).uniform(0.5, 2, len(X)).astype(dtype)
    w[::9] = 0
    init = X[np.random.default_rng(4).choice(len(X), 9, replace=False)].copy()
    init[[2, 5]] += 1e3  # empty at the first pass: relocated
    kw = dict(init=init, max_iter=30, tol=0)
    ref = KMeans(9, backend="numpy", **kw).fit(X, sample_weight=w)
    got = KMeans(9, backend="cupy-fused", **kw).fit(X, sample_weight=w)
    _same_fit(got, ref, dtype, f"gemm {np.dtype(dtype)}")


@pytest.mark.parametrize("fuse,launches", [("auto", 3), (False, 4)])
def test_one_iteration_is_three_launches_and_reads_nothing_back(fake_cupy, monkeypatch, fuse,
                                                                launches):
    import array_api_compat.numpy as xp
    from kmeans_xp_backends.cupy import common
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    X = asymmetric_data(3001, 3, 8, dtype=np.float32, seed=1)
    X -= X.mean(axis=0)
    C = X[:8].copy()
    be = CupyFusedBackend(fuse=fuse)
    be.placement.small_on_host = 0  # centers on the device: nothing is read back
    it = be.lloyd_iter(X, None, C, None, xp=xp)  # first call: workspace, scales
    calls = []
    real = common.launch
    for module in ("fused", "fused_sums"):
        monkeypatch.setattr(f"kmeans_xp_backends.cupy.{module}.launch",
                            lambda fn, *a, **k: (calls.append(fn.name), real(fn, *a, **k)))
    monkeypatch.setattr(fake_cupy, "asnumpy", lambda *a, **k: pytest.fail("read back"))
    it2 = be.lloyd_iter(X, None, C, it.labels, xp=xp)
    assert len(calls) == launches, calls
    assert calls[0].startswith("pack_centers") and calls[-1] == "finalize_sums"
    assert it2.labels is not it.labels and float(it2.n_changed) == 0
    assert it2.labels.dtype == np.int32



@pytest.mark.parametrize("d,fuse,sort", [(3, "auto", False), (3, False, False),
                                         (17, "auto", False), (17, "auto", True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_skipped_iteration_leaves_its_work_out(fake_cupy, monkeypatch, d, fuse, sort, dtype):
    """ahead_gate: with its `skip` flag set, lloyd_iter runs no assignment and no sums (the
    driver drops that iteration; sort: nor the counting sort, whose counts stay zeroed);
    with it clear, and on the next call, the iteration is the ungated one, bit for bit."""
    import array_api_compat.numpy as xp
    from kmeans_xp_backends.cupy import fused_plan
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    if sort:
        plan = fused_plan.plan
        monkeypatch.setattr(fused_plan, "plan", lambda *a, **kw: plan(*a, **kw)._replace(
            acc_mode="sorted", acc_rows=50, acc_grid=21, acc_smem=0))
    X = asymmetric_data(1031, d, 6, dtype=dtype, seed=5)
    X -= X.mean(axis=0)
    C = X[:6].copy()
    be = CupyFusedBackend(fuse=fuse)
    be.placement.small_on_host = 0
    ref = be.lloyd_iter(X, None, C, None, xp=xp)
    other = np.zeros(len(X), dtype=np.int32)  # labels_old unlike the labels: changed > 0
    skipped = be.lloyd_iter(X, None, C, other, xp=xp, skip=np.ones(1, dtype=bool))
    assert float(np.sum(skipped.weight_in_clusters)) == 0
    assert float(skipped.n_changed) == 0
    if sort:
        assert be._ws.plan.acc_mode == "sorted" and not be._ws.sort_counts.any()
    for skip in (np.zeros(1, dtype=bool), None):
        it = be.lloyd_iter(X, None, C, other, xp=xp, skip=skip)
        assert np.array_equal(it.labels, ref.labels)
        assert float(it.n_changed) == np.count_nonzero(ref.labels != 0) > 0
        np.testing.assert_array_equal(it.weighted_sums, ref.weighted_sums)
        np.testing.assert_array_equal(it.weight_in_clusters, ref.weight_in_clusters)
        assert float(it.inertia) == float(ref.inertia)


@pytest.mark.parametrize("d", [3, 17])
def test_the_driver_gates_what_it_issues_ahead(fake_cupy, monkeypatch, d):
    """The driver issues every next iteration ahead with the flag `a cluster came out
    empty`: set exactly where it relocates (and drops that iteration), clear elsewhere; the
    fit is the numpy backend's."""
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    X = asymmetric_data(1031, d, 6, dtype=np.float64, seed=3)
    init = X[np.random.default_rng(4).choice(len(X), 9, replace=False)].copy()
    init[[2, 5]] += 1e3  # empty at the first pass: relocated
    flags, real = [], CupyFusedBackend.lloyd_iter

    def recording(self, *args, skip=None, **kw):
        flags.append(None if skip is None else bool(np.asarray(skip)[0]))
        return real(self, *args, skip=skip, **kw)

    monkeypatch.setattr(CupyFusedBackend, "lloyd_iter", recording)
    monkeypatch.setattr("kmeans_xp_backends.cupy.fused.FusedPlacement.small_on_host", 0)
    kw = dict(init=init, max_iter=30, tol=0)
    got = KMeans(9, backend="cupy-fused", **kw).fit(X)
    ref = KMeans(9, backend="numpy", **kw).fit(X)
    _same_fit(got, ref, np.float64, f"gated d={d}")
    assert flags[0] is None and True in flags and False in flags[1:], flags


@pytest.mark.parametrize("centers_on", ["host", "device"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batches_of_one_shape_share_one_workspace(fake_cupy, centers_on, dtype):
    """A mini-batch fit hands lloyd_iter a new array each step: one workspace serves them
    all (before: a plan, zero fills and pinned buffers per step), each batch's labels, sums
    and inertia those of a fresh backend."""
    import array_api_compat.numpy as xp
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    X = asymmetric_data(3 * 2048, 3, 8, dtype=dtype, seed=4)
    X -= X.mean(axis=0)
    C = X[:8].copy()

    def backend():
        be = CupyFusedBackend()
        if centers_on == "device":
            be.placement.small_on_host = 0
        return be

    be, seen = backend(), set()
    for start in range(0, len(X), 2048):
        Xb = np.ascontiguousarray(X[start:start + 2048])
        got = be.lloyd_iter(Xb, None, C, None, xp=xp)
        seen.add(id(be._ws))
        ref = backend().lloyd_iter(Xb, None, C, None, xp=xp)
        np.testing.assert_array_equal(np.asarray(got.labels), np.asarray(ref.labels))
        np.testing.assert_array_equal(np.asarray(got.weighted_sums),
                                      np.asarray(ref.weighted_sums))
        np.testing.assert_array_equal(np.asarray(got.weight_in_clusters),
                                      np.asarray(ref.weight_in_clusters))
        assert float(got.inertia) == float(ref.inertia)
    assert len(seen) == 1


def test_minibatch_fit_on_cupy_fused_gives_the_numpy_backends_steps(fake_cupy):
    from kmeans_xp import MiniBatchKMeans

    X = asymmetric_data(12_011, 3, 10, dtype=np.float32, seed=9)
    p = dict(n_clusters=10, batch_size=1024, random_state=3, max_iter=2)
    ref = MiniBatchKMeans(backend="numpy", **p).fit(X)
    got = MiniBatchKMeans(backend="cupy-fused", **p).fit(X)
    assert got.n_steps_ == ref.n_steps_
    np.testing.assert_allclose(np.asarray(got.cluster_centers_), ref.cluster_centers_,
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got._counts), ref._counts, rtol=1e-5)
