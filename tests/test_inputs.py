"""Inputs and environments that used to end badly: each test failed before its fix."""
import subprocess
import sys
import threading
import time

import array_api_strict as xps
import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
from tests._helpers import blobs


def test_repr_of_numpy_scalars_is_the_number():
    assert repr(KMeans(np.int64(3))) == "KMeans(n_clusters=3)"
    assert repr(KMeans(3, tol=np.float32(0.5))) == "KMeans(n_clusters=3, tol=0.5)"


def test_big_endian_float32_is_fitted_in_float32():
    X = asymmetric_data(1001, 3, 4, seed=0, dtype=np.float32)
    init = X[:4].copy()
    big = KMeans(4, init=init, backend="numpy").fit(X.astype(">f4"))
    native = KMeans(4, init=init, backend="numpy").fit(X)
    assert big.cluster_centers_.dtype == np.float32
    np.testing.assert_array_equal(big.labels_, native.labels_)
    np.testing.assert_array_equal(big.cluster_centers_, native.cluster_centers_)


def test_ragged_init_names_init():
    with pytest.raises(ValueError, match=r"init could not be made into an array of shape "
                                         r"\(2, 2\)"):
        KMeans(2, init=[[1.0, 2.0], [3.0]]).fit(np.zeros((10, 2)))


def test_transform_float32_point_on_its_center():
    """sklearn gives 6.5e-7 at most there; the float32 expansion of centered copies gave
    2.8e-3."""
    X = (np.random.default_rng(0).normal(size=(3000, 3)) * 100 + 1000).astype(np.float32)
    km = KMeans(5, random_state=0, backend="numpy").fit(X)
    d = km.transform(km.cluster_centers_)
    assert d.dtype == np.float32
    assert np.max(np.diagonal(d)) < 1e-5
    ref = np.sqrt(((X[:50, None, :].astype(np.float64)
                    - km.cluster_centers_[None].astype(np.float64)) ** 2).sum(-1))
    np.testing.assert_allclose(km.transform(X[:50]), ref, rtol=1e-6)


def test_kmeans_plusplus_on_another_device():
    """k-means++ builds its arrays on X's device (array-api-strict's second device)."""
    X_np = asymmetric_data(701, 3, 5, seed=1)
    X = xps.asarray(X_np, device=xps.Device("device1"))
    km = KMeans(5, random_state=0, backend="array-api").fit(X)
    assert km.cluster_centers_.device == X.device
    ref = KMeans(5, random_state=0, backend="numpy").fit(X_np)
    np.testing.assert_array_equal(np.from_dlpack(km.labels_), ref.labels_)


def test_two_fits_in_two_threads_restore_blas_threads():
    """threadpoolctl limits are process-wide: the last fit to end restores them, also with
    an OpenBLAS on OpenMP loaded (FAISS's: its limit is per thread, so it looked unheld
    from the fit's thread, and the limit went to a thread that did not end it)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    try:
        import faiss  # noqa: F401 - loads an OpenBLAS on OpenMP where faiss-cpu is installed
    except ImportError:
        pass
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info()
              if i["user_api"] == "blas"]
    X = asymmetric_data(200_003, 3, 20, seed=2)
    errors = []

    def fit(seed):
        try:
            for _ in range(3):
                KMeans(20, init=X[seed:seed + 20].copy(), max_iter=5, backend="numpy",
                       backend_options={"n_threads": 2}).fit(X)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fit, args=(s,)) for s in (0, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    after = [i["num_threads"] for i in threadpoolctl.threadpool_info()
             if i["user_api"] == "blas"]
    assert after == before


def test_blas_limit_lingers_between_passes_and_is_back_after_a_fit():
    """The BLAS limit is set once for a fit's passes (each pass setting and restoring it on
    our thread cost 0.23 ms), the user's BLAS threads are back when `fit` returns, and after
    a lone pass (predict) within a short while."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from kmeans_xp_backends import cpu_threads

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    before = blas_threads()
    if not before or set(before) == {1}:
        pytest.skip("no BLAS library with more than one thread here: nothing to limit")
    limits = []
    real = cpu_threads.BlasOneThread._set_limit

    def counting(self, controller):
        limits.append(controller)
        return real(self, controller)

    X = asymmetric_data(60_007, 40, 16, dtype=np.float32, seed=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_threads.BlasOneThread, "_set_limit", counting)
        km = KMeans(16, init=X[:16].copy(), n_init=1, max_iter=10, tol=0, backend="numpy",
                    backend_options={"n_threads": 2, "processes": False}).fit(X)
        assert blas_threads() == before
        fit_limits = len(limits)
        assert km.n_iter_ == 10 and 1 <= fit_limits <= 2, fit_limits
        km.predict(X)
        deadline = time.monotonic() + 10 * cpu_threads.BlasOneThread.LINGER_S + 5
        while blas_threads() != before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert blas_threads() == before


_LATE_BLAS = """
import threadpoolctl
from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
from kmeans_xp_backends.numpy import blocks

def blas_threads():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas"]

seen, run_share = [], blocks.run_share
def recording(p, t, bufs):
    seen.append(blas_threads())
    return run_share(p, t, bufs)
blocks.run_share = recording

X = asymmetric_data(100_003, 8, 20, seed=3)
fit = lambda: KMeans(20, init=X[:20].copy(), max_iter=2, backend="numpy",
                     backend_options={"n_threads": 2, "processes": False}).fit(X)
fit()                         # BLAS's thread limit has looked at the loaded libraries
before = len(blas_threads())
import scipy.linalg           # loads SciPy's own BLAS after that
assert len(blas_threads()) > before, "SciPy's BLAS was loaded already"
seen.clear()
with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
    limited = blas_threads()
    fit()
    assert blas_threads() == limited, (blas_threads(), limited)
assert seen and all(set(s) <= {1} for s in seen), seen
"""


def test_blas_is_held_to_one_thread_inside_a_users_threadpool_limits():
    """Under the user's ``threadpool_limits(2)`` the passes' threads still call BLAS held to
    one thread (threadpoolctl lets only the thread that set a limit change it: ours did
    nothing, and BLAS's threads ran inside each pass thread, a fit 3x slower on 2 cores),
    also for a BLAS library loaded after the first fit (SciPy's, FAISS's: the limit missed
    it); the user's limit is back after the fit. In a fresh interpreter, so that SciPy's
    BLAS is loaded after the first fit whatever ran before."""
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("scipy")
    proc = subprocess.run([sys.executable, "-c", _LATE_BLAS], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("scale,dtype", [(1e19, np.float32), (1e-22, np.float32),
                                         (1e154, np.float64), (1e-160, np.float64)])
def test_extreme_scales_give_the_unit_scale_partition(scale, dtype):
    """Finite X whose squared distances overflow (or underflow) its dtype is rescaled by a
    power of two: the partition of X / scale, never a silent wrong answer."""
    X, init = blobs()
    ref = KMeans(5, init=init.astype(dtype), backend="numpy").fit(X.astype(dtype))
    big = (X * scale).astype(dtype)
    km = KMeans(5, init=(init * scale).astype(dtype), backend="numpy").fit(big)
    np.testing.assert_array_equal(km.labels_, ref.labels_)
    assert km.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(km.cluster_centers_ / scale, ref.cluster_centers_, rtol=1e-5)
    np.testing.assert_array_equal(km.predict(big), km.labels_)
    expect = ref.inertia_ * scale * scale   # inf where X's own units cannot hold it
    assert km.inertia_ == pytest.approx(expect, rel=1e-4) or (
        expect == np.inf and km.inertia_ == np.inf)


def test_scaling_all_weights_changes_nothing():
    X, _ = blobs(1)
    base = KMeans(5, random_state=0, backend="numpy").fit(X)
    for c in (1e-300, 3.0, 1e308):
        km = KMeans(5, random_state=0, backend="numpy").fit(X, sample_weight=np.full(len(X), c))
        assert np.all(np.isfinite(km.cluster_centers_))
        np.testing.assert_array_equal(km.labels_, base.labels_)
        np.testing.assert_allclose(km.cluster_centers_, base.cluster_centers_, rtol=1e-10)


def test_copy_x_false_leaves_x_bit_for_bit():
    X = (asymmetric_data(3000, 3, 10, seed=5, offset=1e3)).astype(np.float32)
    before = X.copy()
    KMeans(10, random_state=0, copy_x=False, backend="numpy").fit(X)
    assert np.array_equal(X.view(np.uint32), before.view(np.uint32))


def test_copy_x_false_never_writes_a_memmap(tmp_path):
    X = asymmetric_data(2000, 3, 5, seed=6, offset=50.0)
    path = tmp_path / "X.npy"
    np.save(path, X)
    raw = path.read_bytes()
    mm = np.load(path, mmap_mode="r+")
    KMeans(5, random_state=0, copy_x=False, backend="numpy").fit(mm)
    del mm
    assert path.read_bytes() == raw


def test_copy_x_false_leaves_x_when_the_fit_fails(monkeypatch):
    from kmeans_xp_backends.numpy.backend import NumpyBackend
    X = asymmetric_data(2000, 3, 5, seed=7, offset=10.0)
    before = X.copy()

    def boom(*a, **k):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(NumpyBackend, "lloyd_iter", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        KMeans(5, random_state=0, copy_x=False, backend="numpy").fit(X)
    assert np.array_equal(X, before)


@pytest.mark.parametrize("where", ["fit", "predict", "transform", "score"])
def test_a_library_out_of_memory_error_leaves_as_ours_with_the_fit_memory_freed(
        monkeypatch, where):
    """An out-of-memory error from the array library (CuPy's device one is a MemoryError) in
    fit, predict, transform or score leaves as a KMeansMemoryError that says what to change;
    the arrays of the work that failed are freed even while the error is held, and X is
    unchanged."""
    import weakref

    from kmeans_xp_backends.numpy.backend import NumpyBackend

    from kmeans_xp import KMeansMemoryError

    class DeviceOOM(MemoryError):
        """Stands in for cupy.cuda.memory.OutOfMemoryError."""

    X = asymmetric_data(2003, 3, 4, seed=8)
    X0 = X.copy()
    km = KMeans(4, init=X[:4].copy(), max_iter=3, backend="numpy")
    if where != "fit":
        km.fit(X)
    held = []

    def out_of_memory(*args, **kwargs):
        big = np.empty(1 << 20)  # held by this frame alone, as a device array would be
        held.append(weakref.ref(big))
        raise DeviceOOM("out of memory allocating 8 MB")

    if where == "transform":
        from kmeans_xp.estimators import predicting
        monkeypatch.setattr(predicting, "_distances", out_of_memory)
    else:
        # (score's labels and inertia come from one pass, `labels_inertia`)
        monkeypatch.setattr(NumpyBackend, {"fit": "lloyd_iter", "score": "labels_inertia"}
                            .get(where, "assign"), out_of_memory)
    with pytest.raises(KMeansMemoryError, match=rf"KMeans.{where} ran out of memory "
                                                r"\(.*DeviceOOM: out of memory allocating"
                                                r".*max_memory") as info:
        getattr(km, where)(X)
    assert isinstance(info.value.__cause__, DeviceOOM)
    assert len(held) == 1 and held[0]() is None  # freed although the error is still held
    np.testing.assert_array_equal(X, X0)


def test_torch_style_out_of_memory_is_ours_and_other_errors_pass_through(monkeypatch):
    """torch's OutOfMemoryError is a RuntimeError, not a MemoryError: it is recognised by
    its name and module; any other error leaves fit as it was raised."""
    from kmeans_xp_backends.numpy.backend import NumpyBackend

    from kmeans_xp import KMeansMemoryError

    TorchOOM = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch.cuda"})
    X = asymmetric_data(503, 3, 3, seed=2)
    for raised, expected in ((TorchOOM("CUDA out of memory"), KMeansMemoryError),
                             (RuntimeError("a bug"), RuntimeError)):
        def fail(self, *args, raised=raised, **kwargs):
            raise raised
        monkeypatch.setattr(NumpyBackend, "lloyd_iter", fail)
        with pytest.raises(expected) as info:
            KMeans(3, init=X[:3].copy(), backend="numpy").fit(X)
        assert (info.value is raised) == (expected is RuntimeError)


def test_predict_on_rescaled_copy_x_false_fit_never_writes_x():
    """A copy_x=False fit of values whose squared distances overflow float32 (rescaled by a
    power of two): predict and score rescale a copy, never the caller's X."""
    rng = np.random.default_rng(7)
    half = rng.uniform(1, 2, size=(501, 2)).astype(np.float32) * np.float32(3e19)
    X = np.concatenate([half, -half])
    keep = X.copy()
    km = KMeans(3, n_init=1, random_state=0, copy_x=False).fit(X)
    np.testing.assert_array_equal(X, keep)
    km.predict(X)
    km.score(X)
    np.testing.assert_array_equal(X, keep)
