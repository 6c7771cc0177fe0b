"""cupy-fused's batch in one launch per step (backends/cupy/fused_batch.py): each problem's
labels, inertia and changed count must be its own `lloyd_iter`'s bit for bit (the same tile
kernel, with the problems along the grid's y), its sums equal to float64 rounding; on the
CPU through the NumPy stand-in for CuPy with the real kernels emulated, for every tile path
(SIMT float64, 3xTF32 and TF32 on mma.sync, and on Hopper the wgmma kernel's TF32, 3xTF32
and fp16), n and k off every tile size, weights with zeros, active subsets (runs of
problems), and the loop where the batch has no batched kernel; on the device (marked gpu),
the same and whole fits against single ones."""
import warnings

import numpy as np
import pytest
from kmeans_xp_backends.cupy import fused_batch, fused_plan

from kmeans_xp import KMeans, get_backend
from kmeans_xp.contract.batching import BatchArray, row
from kmeans_xp.contract.namespaces import to_numpy
from kmeans_xp.testing import asymmetric_data

HOPPER = fused_plan.DeviceFacts(2, 227 * 1024, 228 * 1024, 90)

# (precision, dtype, d, Hopper?, the path the problem takes)
PATHS = [("exact", np.float64, 33, False, "gemm"), ("exact", np.float32, 33, False, "mma3"),
         ("tf32", np.float32, 20, False, "mma"), ("tf32", np.float32, 36, True, "wgmma"),
         ("exact", np.float32, 24, True, "wgmma3"), ("fp16", np.float32, 40, True, "wgmma-fp16")]


def _backend(precision, hopper, monkeypatch, **options):
    if hopper:
        monkeypatch.setattr(fused_plan, "device_facts", lambda device_id: HOPPER)
    be = get_backend("cupy-fused")(**options)
    be.use_precision(precision)
    return be


def _batch(B, n, d, k, dtype, seed=0):
    """(B, n, d) asymmetric centered problems, weights with zeros, (B, k, d) centers."""
    X = np.stack([asymmetric_data(n, d, 5, dtype=dtype, seed=seed + b, offset=3.0 * b)
                  for b in range(B)])
    X -= X.mean(axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 2.0, (B, n)).astype(dtype)
    w[rng.random((B, n)) < 0.1] = 0
    C = np.stack([X[b, rng.choice(n, k, replace=False)] for b in range(B)])
    C += rng.normal(size=C.shape).astype(dtype) * 0.05
    C[1, :2] += 100   # clusters no point is near
    return np.ascontiguousarray(X), w, np.ascontiguousarray(C.astype(dtype))


def _spy(monkeypatch):
    runs = []
    real = fused_batch._run_iteration
    monkeypatch.setattr(fused_batch, "_run_iteration",
                        lambda be, ws, *a: runs.append(ws.problems) or real(be, ws, *a))
    return runs


def _against_lloyd_iter(be, X, w, C, active, labels_old=None):
    """The batch's statistics against each active problem's lloyd_iter, from labels_old."""
    got = be.batch_lloyd_iter(BatchArray(X), None if w is None else BatchArray(w), C,
                              labels_old, active)
    for j, b in enumerate(active):
        one = be.lloyd_iter(X[b], None if w is None else w[b], C[j],
                            None if labels_old is None else row(labels_old, j))
        where = f"problem {b} of {active}"
        assert np.array_equal(to_numpy(got.labels[j]), to_numpy(one.labels)), where
        assert float(got.inertia[j]) == float(one.inertia), where
        assert float(got.n_changed[j]) == float(one.n_changed), where
        assert np.allclose(to_numpy(got.weight_in_clusters[j]),
                           to_numpy(one.weight_in_clusters), rtol=1e-12, atol=0), where
        scale = float(np.abs(to_numpy(one.weighted_sums)).max())
        assert np.allclose(to_numpy(got.weighted_sums[j]), to_numpy(one.weighted_sums),
                           rtol=1e-12, atol=1e-13 * scale), where
    return got


@pytest.mark.parametrize("precision,dtype,d,hopper,path", PATHS)
def test_batch_equals_each_problems_lloyd_iter(fake_cupy, monkeypatch, precision, dtype, d,
                                               hopper, path):
    be = _backend(precision, hopper, monkeypatch)
    runs = _spy(monkeypatch)
    X, w, C = _batch(4, 300, d, 70, dtype, seed=d)
    assert be._plan_for(X[0], 70).path == path
    got = _against_lloyd_iter(be, X, w, C, (0, 1, 2, 3))
    assert runs == [4]   # one run of all four: one launch per step
    # the next iterations (the run's workspace again), from the last labels
    for shrink in (0.9, 0.8):
        got = _against_lloyd_iter(be, X, w, C * dtype(shrink), (0, 1, 2, 3),
                                  labels_old=got.labels)
    # an active subset (two runs), unweighted
    keep = [0, 2, 3]
    _against_lloyd_iter(be, X, None, C[keep], (0, 2, 3), labels_old=got.labels[keep])
    assert runs == [4, 4, 4, 1, 2]


def test_a_run_beyond_the_budget_takes_the_loop(fake_cupy, monkeypatch):
    be = _backend("tf32", False, monkeypatch)
    runs = _spy(monkeypatch)
    X, w, C = _batch(3, 257, 20, 9, np.float32)
    one = fused_batch.batch_plan(be, X[0], 9, 1)
    monkeypatch.setattr(type(be.memory), "bytes",
                        lambda self: int(sum(one.fixed_bytes.values()) * 1.5))
    _against_lloyd_iter(be, X, w, C, (0, 1, 2))
    assert runs == []


def test_batches_without_a_batched_kernel_loop(fake_cupy, monkeypatch):
    be = _backend("exact", False, monkeypatch)
    X, _, C = _batch(2, 100, 5, 4, np.float32)
    assert fused_batch.loop_reason(be, BatchArray(X), 4) == \
        "its path 'small' has no batched kernel"
    assert fused_batch.loop_reason(be, [X[0], X[1][:50]], 4) == "a ragged batch"
    runs = _spy(monkeypatch)
    _against_lloyd_iter(be, X, None, C, (0, 1))
    assert runs == []


def _fit_against_single_fits(d, k, precision="exact", B=3, n=1031):
    """The batched fit against each problem's single cupy-fused fit (the same partition:
    the same kernels) and the numpy backend's (inertia close: over 30 iterations a near
    tie rounded otherwise by 3xTF32 or a reduced precision may lead elsewhere)."""
    X, _, _ = _batch(B, n, d, k, np.float32, seed=7)
    rng = np.random.default_rng(1)
    inits = np.stack([X[b, rng.choice(n, k, replace=False)] for b in range(B)])
    fit = dict(max_iter=30, backend="cupy-fused", precision=precision)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = KMeans(k, init=inits, **fit).fit(X)
        for b in range(B):
            one = KMeans(k, init=inits[b], **fit).fit(X[b])
            ref = KMeans(k, init=inits[b], max_iter=30, backend="numpy").fit(X[b])
            labels = to_numpy(got.labels_[b])
            assert np.mean(labels != to_numpy(one.labels_)) <= 1e-3, f"problem {b}"
            assert got.n_iter_[b] == one.n_iter_ or np.any(labels != to_numpy(one.labels_))
            assert got.inertia_[b] == pytest.approx(ref.inertia_, rel=1e-2), f"problem {b}"


@pytest.mark.slow
def test_emulated_batched_fit_matches_numpy(fake_cupy, monkeypatch):
    runs = _spy(monkeypatch)
    _fit_against_single_fits(33, 12)
    assert runs and set(runs) <= {1, 2, 3}


@pytest.mark.slow
def test_emulated_fp16_batch_computes_on_float16_data_as_single_fits(fake_cupy, monkeypatch):
    """At fp16 a batch is centered into float16 as each single fit is, so the same kernels
    read the same values: the same partitions."""
    monkeypatch.setattr(fused_plan, "device_facts", lambda device_id: HOPPER)
    runs = _spy(monkeypatch)
    real = fused_batch._workspace
    data = []
    monkeypatch.setattr(fused_batch, "_workspace",
                        lambda be, arr, *a: data.append(str(arr.dtype)) or real(be, arr, *a))
    _fit_against_single_fits(40, 12, "fp16")
    assert runs and data and set(data) == {"float16"}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["exact", "tf32", "fp16"])
def test_batched_fit_on_the_device_runs_batched(monkeypatch, precision):
    import cupy
    if precision == "fp16" and cupy.cuda.Device().compute_capability != "90":
        pytest.skip("fp16 runs on the wgmma kernel (compute capability 9.0)")
    runs = _spy(monkeypatch)
    _fit_against_single_fits(64, 50, precision, B=5, n=4099)
    assert runs and max(runs) == 5


@pytest.mark.gpu
@pytest.mark.parametrize("precision,dtype,d", [("exact", np.float32, 64),
                                               ("exact", np.float64, 40),
                                               ("tf32", np.float32, 128),
                                               ("fp16", np.float32, 100)])
def test_batch_equals_each_problems_lloyd_iter_on_the_device(monkeypatch, precision, dtype, d):
    import cupy
    if precision == "fp16" and cupy.cuda.Device().compute_capability != "90":
        pytest.skip("fp16 runs on the wgmma kernel (compute capability 9.0)")
    be = get_backend("cupy-fused")()
    be.use_precision(precision)
    X, w, C = (cupy.asarray(a) for a in _batch(6, 5003, d, 300, dtype, seed=3))
    got = _against_lloyd_iter(be, X, w, C, tuple(range(6)))
    keep = [1, 2, 4]
    _against_lloyd_iter(be, X, None, C[keep], (1, 2, 4), labels_old=got.labels[keep])


def test_a_runs_scales_come_from_its_problems_measured_once(emulated_cupy, monkeypatch):
    """A run's fixed-point scales are the max of its problems' max |x|, measured once per
    batch (one column_absmax launch for all its problems, none when the active set later
    splits into new runs), and equal those of a pass over the run's own rows."""
    from kmeans_xp_backends.cupy import fused_sums
    be = _backend("exact", False, monkeypatch)
    X, w, C = _batch(4, 301, 33, 9, np.float32)
    X[2, :, :16] *= 40    # the run (2, 3) takes some features' scales from problem 2,
    X[3, :, 16:] *= 60    # the others' from problem 3
    passes = []
    real = fused_sums.absmax_bits
    monkeypatch.setattr(fused_sums, "absmax_bits",
                        lambda Xr, out: passes.append(Xr.shape) or real(Xr, out))
    be.batch_lloyd_iter(BatchArray(X), BatchArray(w), C, None, (0, 1, 2, 3))
    assert passes == [X.shape]
    be.batch_lloyd_iter(BatchArray(X), BatchArray(w), C[[0, 2, 3]], None, (0, 2, 3))
    assert len(passes) == 1   # runs (0) and (2, 3): no pass over their rows
    for (b0, m), ws in be._batch_ws.items():
        fresh = type(ws)(emulated_cupy, ws.plan, ws.X, ws.w, ws.k // m, HOPPER, problems=m)
        want = fused_sums.scales(fresh, be.scratch)   # (a pass over the run's rows)
        for got, ref in zip(ws.scales, want):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


@pytest.mark.slow
def test_emulated_batch_relocating_together_matches_single_fits(fake_cupy, monkeypatch):
    """Every problem has clusters no point is near, so all relocate in the same iterations,
    their farthest points ranked together (`reductions.farthest_many`, one sort of a (P, n)
    key array), with weights that are zero on some rows: each problem's partition, centers
    and inertia are its own single fit's."""
    from kmeans_xp_backends.cupy import reductions
    ranked = []
    real = reductions.farthest_many
    monkeypatch.setattr(reductions, "farthest_many",
                        lambda problems: ranked.append(len(problems)) or real(problems))
    B, n, d, k = 3, 1031, 33, 12
    X, w, _ = _batch(B, n, d, k, np.float32, seed=5)
    rng = np.random.default_rng(2)
    inits = np.stack([X[b, rng.choice(n, k, replace=False)] for b in range(B)])
    inits[:, :3] += 1e3   # nobody's nearest: three empty clusters in every problem
    fit = dict(max_iter=8, backend="cupy-fused", tol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = KMeans(k, init=inits, **fit).fit(X, sample_weight=w)
        for b in range(B):
            one = KMeans(k, init=inits[b], **fit).fit(X[b], sample_weight=w[b])
            assert np.array_equal(to_numpy(got.labels_[b]), to_numpy(one.labels_)), b
            np.testing.assert_allclose(to_numpy(got.cluster_centers_[b]),
                                       to_numpy(one.cluster_centers_), rtol=1e-6, atol=1e-4)
            assert got.inertia_[b] == pytest.approx(one.inertia_, rel=1e-6)
    assert ranked and max(ranked) == B
