"""Host streaming of the CuPy backends, checked on the CPU through the NumPy stand-in for CuPy
(tests/_fake_cupy.py: the real kernels run on the CPU, streams and events that run at once,
pinned memory as bytearrays). What is checked: chunking with an uneven last chunk, the
centering on the "device", the labels in their compact type, the primitives through the
driver (relocation, strict convergence, final assignment), the plan against the budget, the
decisions of stream="auto", memmaps and page locking, and the memory estimate and report. The
GPU tests (test_cupy_streaming.py) run the real thing."""
import array_api_compat.numpy as np_xp
import numpy as np
import pytest
from kmeans_xp_backends.cupy import staging, streaming
from kmeans_xp_backends.cupy.staging import is_memmap
from kmeans_xp_backends.cupy.streaming import HostRows, plan_stream

from kmeans_xp import KMeans, KMeansMemoryError, estimate_memory, get_backend
from kmeans_xp.algorithms import lloyd
from kmeans_xp.algorithms.lloyd import kmeans_single_lloyd
from kmeans_xp.testing import asymmetric_data

BACKENDS = ("cupy-kernels", "cupy-chunked")


@pytest.mark.parametrize("name", BACKENDS)
def test_streamed_fit_with_the_real_kernels(emulated_cupy, name):
    """Streaming with the CUDA kernels themselves (run on the CPU): the label store kernel,
    the sums accumulated across chunks, the row argmin of each streamed chunk's GEMM."""
    X, init = _problem(2501, 3, 5, np.float64, seed=15)
    init[4] = X.max(axis=0) * 40  # an empty cluster: relocation reads the label store
    ref = KMeans(5, init=init, backend="numpy", max_iter=30).fit(X)
    got = KMeans(5, init=init, backend=name, max_iter=30,
                 backend_options={"stream": True, "stream_rows": 1100}).fit(X)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
    assert got.n_iter_ == ref.n_iter_


def _fit(name, X, k, init, **kw):
    options = kw.pop("backend_options", {})
    return KMeans(k, init=init, backend=name, backend_options=options, **kw).fit(X)


def _problem(n, d, k, dtype, seed):
    X = asymmetric_data(n, d, k, dtype=dtype, seed=seed, offset=5.0)
    init = X[np.random.default_rng(seed).choice(n, k, replace=False)].copy()
    return X, init


# -- exact Lloyd ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_streamed_fit_is_the_numpy_backends(fake_cupy, name, weighted):
    """float64: the same labels, centers, iterations and inertia as the numpy backend from
    the same init; n is prime, so the last chunk of 997 rows is a short one."""
    X, init = _problem(7919, 3, 9, np.float64, seed=1)
    w = np.random.default_rng(2).uniform(0.5, 2.0, 7919) if weighted else None
    ref = KMeans(9, init=init, backend="numpy", max_iter=50).fit(X, sample_weight=w)
    got = KMeans(9, init=init, backend=name, max_iter=50,
                 backend_options={"stream": True, "stream_rows": 997}).fit(X, sample_weight=w)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
    assert got.n_iter_ == ref.n_iter_
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)
    np.testing.assert_allclose(got.history_["inertia"], ref.history_["inertia"], rtol=1e-10)
    assert {"stream", "pinned_host"} <= set(got.memory_report_)
    assert "transfer" not in got.memory_report_  # X never went to the device whole
    np.testing.assert_array_equal(got.predict(X), got.labels_)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("max_iter", [1, 4])
def test_streamed_fit_reads_x_once_per_iteration_plus_two(fake_cupy, monkeypatch, name,
                                                        max_iter):
    """A fit stopped by max_iter streams X max_iter + 2 times: the mean, the iterations, and
    one final pass for the labels and the inertia together (no distances brought back to the
    host): at n=1e9 each pass is 12 GB over the bus, and the final assignment with its
    distances, then the inertia, took two passes and 1.2 s more. (As on such a device, no
    pass is issued ahead of the read: an iteration takes longer than the driver waits for.)"""
    monkeypatch.setattr(lloyd, "AHEAD_MAX_ITERATION_S", -1.0)
    passes = []
    run = streaming.StreamEngine.run

    def counted(self, mean, **kw):
        passes.append(kw)
        return run(self, mean, **kw)

    monkeypatch.setattr(streaming.StreamEngine, "run", counted)
    X, init = _problem(5003, 3, 7, np.float32, seed=4)
    got = _fit(name, X, 7, init, max_iter=max_iter, tol=0,
               backend_options={"stream": True, "stream_rows": 1000})
    assert len(passes) == max_iter + 2
    assert all(kw.get("min_out") is None for kw in passes)
    ref = _fit("numpy", X, 7, init, max_iter=max_iter, tol=0)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-5)
    assert got.labels_.dtype == np.int32


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_streamed_fit_is_the_in_memory_fit(fake_cupy, name, dtype):
    """The same backend streamed and in memory: the same fit (tol=0, fixed iterations). The
    streamed mean is a float64 sum in another order: the same float32 mean, float64 means
    that may differ in the last bit (so float64 centers agree to rounding)."""
    X, init = _problem(5003, 4, 12, dtype, seed=3)
    kw = dict(max_iter=8, tol=0)
    mem = _fit(name, X, 12, init, backend_options={"stream": False}, **kw)
    st = _fit(name, X, 12, init, backend_options={"stream": True, "stream_rows": 1024}, **kw)
    np.testing.assert_array_equal(st.labels_, mem.labels_)
    if dtype == np.float32:
        np.testing.assert_array_equal(st.cluster_centers_, mem.cluster_centers_)
    else:
        np.testing.assert_allclose(st.cluster_centers_, mem.cluster_centers_, rtol=1e-13)
    assert st.n_iter_ == mem.n_iter_
    assert st.inertia_ == pytest.approx(mem.inertia_, rel=1e-6)


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_streamed_inits_see_the_centered_rows(fake_cupy, init):
    """k-means++ and random init run on the host over HostRows: the rows numpy's backend
    sees after centering, so the same random_state gives the same fit."""
    X, _ = _problem(3001, 2, 6, np.float64, seed=4)
    ref = KMeans(6, init=init, n_init=2, random_state=7, backend="numpy").fit(X)
    got = KMeans(6, init=init, n_init=2, random_state=7, backend="cupy-kernels",
                 backend_options={"stream": True, "stream_rows": 1000}).fit(X)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-12)


@pytest.mark.parametrize("name", BACKENDS)
def test_empty_cluster_is_relocated_as_the_driver_does(fake_cupy, name):
    X, init = _problem(4001, 3, 5, np.float64, seed=5)
    init[2] = X.max(axis=0) * 50  # far away: empty after the first assignment
    ref = KMeans(5, init=init, backend="numpy").fit(X)
    got = KMeans(5, init=init, backend=name,
                 backend_options={"stream": True, "stream_rows": 1500}).fit(X)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
    assert got.n_iter_ == ref.n_iter_


def test_labels_live_on_the_device_in_a_compact_type(fake_cupy, monkeypatch):
    """k = 300: the streamed labels are uint16 on the device (three generations counted by
    the plan), the user gets int32, and the fit is the numpy backend's."""
    X, init = _problem(60013, 2, 300, np.float64, seed=6)
    plans = []
    real = streaming.plan_stream

    def spy(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(streaming, "plan_stream", spy)
    kw = dict(max_iter=4, tol=0)
    ref = KMeans(300, init=init, backend="numpy", **kw).fit(X)
    got = KMeans(300, init=init, backend="cupy-kernels", max_memory="2MB",
                 backend_options={"stream": True}, **kw).fit(X)
    assert plans and plans[-1].store_dtype == np.uint16
    assert plans[-1].parts["labels"] == 3 * 60013 * 2 and plans[-1].rows < 60013
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    assert got.labels_.dtype == np.int32


def _read_only_memmap(X, directory):
    """X written to a file and opened again as a read-only memmap."""
    path = directory / "X.bin"
    mm = np.memmap(path, dtype=X.dtype, mode="w+", shape=X.shape)
    mm[...] = X
    mm.flush()
    return np.memmap(path, dtype=X.dtype, mode="r", shape=X.shape)


def test_memmap_is_streamed_without_a_copy_or_page_lock(fake_cupy, tmp_path, monkeypatch):
    """A memmap too large for the host's available memory (here: said to be) is staged,
    never page-locked (which would read it all in) nor copied."""
    monkeypatch.setattr(staging, "available_host_bytes", lambda: 6007 * 12)
    X, init = _problem(6007, 3, 7, np.float32, seed=7)
    ro = _read_only_memmap(X, tmp_path)
    assert is_memmap(ro) and is_memmap(ro[10:]) and not is_memmap(X)
    ref = KMeans(7, init=init, backend="cupy-kernels", backend_options={"stream": True},
                 max_iter=20, tol=0).fit(X)
    got = KMeans(7, init=init, backend="cupy-kernels", backend_options={"stream": True},
                 max_iter=20, tol=0, copy_x=False).fit(ro)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    assert fake_cupy.runtime.register_calls == 1  # the in-memory X only, not the memmap
    assert not fake_cupy.runtime.registered      # unregistered when the fit ended


def test_memmap_that_fits_the_host_is_page_locked(fake_cupy, tmp_path, monkeypatch):
    """pin_input="auto" page-locks a memmap of at most MEMMAP_LOCK_SHARE of the available
    memory (read-only pages with cudaHostRegisterReadOnly), and stages a larger one."""
    _cupy_streaming = staging
    X, init = _problem(5003, 3, 5, np.float32, seed=9)
    ro = _read_only_memmap(X, tmp_path)
    share = _cupy_streaming.MEMMAP_LOCK_SHARE
    monkeypatch.setattr(_cupy_streaming, "available_host_bytes", lambda: X.nbytes / share)
    assert _cupy_streaming.lockable(ro) and _cupy_streaming.lockable(X)
    kw = dict(init=init, backend="cupy-kernels", backend_options={"stream": True},
              max_iter=10, tol=0)
    got = KMeans(5, **kw).fit(ro)
    assert fake_cupy.runtime.register_calls == 1 and not fake_cupy.runtime.registered
    assert fake_cupy.runtime.register_flags == [8]  # read-only pages
    monkeypatch.setattr(_cupy_streaming, "available_host_bytes", lambda: X.nbytes / share - 1)
    assert not _cupy_streaming.lockable(ro)
    monkeypatch.setattr(_cupy_streaming, "available_host_bytes", lambda: None)
    assert not _cupy_streaming.lockable(ro) and _cupy_streaming.lockable(X)
    np.testing.assert_array_equal(got.labels_, KMeans(5, **kw).fit(X).labels_)


def test_available_host_bytes_reads_the_host():
    got = staging.available_host_bytes()
    assert got is None or got > 0


def test_in_memory_x_is_page_locked_for_the_fit_then_released(fake_cupy):
    X, init = _problem(3001, 3, 4, np.float32, seed=8)
    X_before = X.copy()
    km = KMeans(4, init=init, backend="cupy-chunked", copy_x=False,
                backend_options={"stream": True, "stream_rows": 1024}).fit(X)
    assert fake_cupy.runtime.register_calls == 1 and not fake_cupy.runtime.registered
    np.testing.assert_array_equal(X, X_before)  # never centered in place
    staged = KMeans(4, init=init, backend="cupy-chunked",
                    backend_options={"stream": True, "stream_rows": 1024,
                                     "pin_input": False}).fit(X)
    assert fake_cupy.runtime.register_calls == 1
    np.testing.assert_array_equal(staged.labels_, km.labels_)


# -- stream="auto", the plan, the estimate ---------------------------------------------------
@pytest.mark.parametrize("name", BACKENDS)
def test_auto_streams_only_what_does_not_fit(fake_cupy, name):
    X, init = _problem(20011, 3, 5, np.float32, seed=9)
    fits = KMeans(5, init=init, backend=name, max_iter=5).fit(X)
    assert "stream" not in fits.memory_report_
    fake_cupy.runtime.free = 2 * X.nbytes  # X, not X with its centered copy and labels
    streamed = KMeans(5, init=init, backend=name, max_iter=5).fit(X)
    assert "stream" in streamed.memory_report_
    np.testing.assert_array_equal(streamed.labels_, fits.labels_)


@pytest.mark.parametrize("name", BACKENDS)
def test_no_stream_and_x_beyond_the_device_fails_early_saying_so(fake_cupy, name):
    X, init = _problem(20011, 3, 5, np.float32, seed=10)
    fake_cupy.runtime.free = X.nbytes // 2
    with pytest.raises(KMeansMemoryError) as info:
        KMeans(5, init=init, backend=name, backend_options={"stream": False}).fit(X)
    msg = str(info.value)
    assert "does not fit on the GPU" in msg and "float32" in msg and "'stream': True" in msg
    assert len(fake_cupy.allocations) == 0  # before any work


@pytest.mark.parametrize("name", BACKENDS)
def test_streaming_below_its_floor_fails_early_with_the_device_numbers(fake_cupy, name):
    X, init = _problem(20011, 3, 5, np.float32, seed=11)
    fake_cupy.runtime.free = 40_000  # a chunk of 1024 rows in 3 slots does not fit
    with pytest.raises(KMeansMemoryError) as info:
        KMeans(5, init=init, backend=name).fit(X)
    msg = str(info.value)
    assert "streaming X" in msg and "needs at least" in msg and "free of" in msg
    assert "max_memory='auto'" in msg and "set_limit" in msg and "'stream'" not in msg
    assert len(fake_cupy.allocations) == 0


@pytest.mark.parametrize("k,budget", [(7, 50 << 20), (1000, 8 << 20), (300, 7 << 20)])
@pytest.mark.parametrize("name", BACKENDS)
def test_plan_fits_the_budget_and_the_estimate_says_so(fake_cupy, name, k, budget):
    n, d = 1_000_003, 3
    backend = get_backend(name)(max_memory=budget)
    plan = plan_stream(n, d, k, 4, budget, weighted=True,
                       work_bytes=lambda r, share: backend.stream_work_bytes(r, d, k, 4, share))
    assert plan.device_bytes <= budget
    assert streaming.MIN_STREAM_ROWS <= plan.rows <= n
    est = estimate_memory(n, d, k, dtype="float32", backend=name)
    assert est.total > n * d * 4  # "auto": X on the device
    est = get_backend(name).estimate_memory(n, d, k, itemsize=4, max_memory=budget,
                                            stream=True)
    assert est.total <= budget and est.total == sum(
        v for key, v in est.parts.items() if not key.endswith("_host"))
    assert {"labels", "stream_buffers", "chunk_buffers", "centers_and_sums",
            "pinned_host", "assign_distances_host"} == set(est.parts)
    assert est.parts["pinned_host"] > 0


@pytest.mark.parametrize("name", BACKENDS)
def test_streaming_buffers_stay_within_the_plan(fake_cupy, name):
    """What the engine allocates on the device (chunk buffers of every slot, the label
    store, the GEMM blocks) and in pinned memory is what its plan counted."""
    X, init = _problem(20011, 3, 40, np.float32, seed=12)
    w = np.random.default_rng(0).uniform(0.5, 2, 20011).astype(np.float32)
    b = get_backend(name)(max_memory="2MB", stream=True, stream_rows=8192)
    mean = X.mean(axis=0)
    kmeans_single_lloyd(b, HostRows(X, mean), w, init - mean, xp=np_xp, max_iter=3, tol=0)
    e, plan = b._engine, b._engine.plan
    assert plan.rows < 20011
    assert sum(a.nbytes for a in e._dev.values()) <= plan.parts["stream_buffers"]
    if name == "cupy-chunked":
        blocks = [a for a in b._blocks if hasattr(a, "nbytes")]   # (after the key)
        assert sum(a.nbytes for a in blocks) <= plan.parts["chunk_buffers"]
    assert plan.device_bytes <= 2_000_000
    assert e.pinned_bytes <= plan.parts["pinned_host"]
    b.placement.finish()
    assert b._engine is None and not fake_cupy.runtime.registered


# -- the contract's primitives on HostRows ---------------------------------------------------
@pytest.mark.parametrize("name", BACKENDS)
def test_primitives_on_host_rows_match_the_in_memory_ones(fake_cupy, name):
    X, C = _problem(4099, 5, 11, np.float64, seed=13)
    mean = X.mean(axis=0)
    w = np.random.default_rng(1).uniform(0, 2, 4099)
    rows = HostRows(X, mean)
    b = get_backend(name)(stream=True, stream_rows=1024)
    Xc, Cc = X - mean, C - mean
    ref = b.lloyd_iter(Xc, w, Cc, None)
    ref_lab, ref_min = b.assign(Xc, Cc)
    got = b.lloyd_iter(rows, w, Cc, None)
    np.testing.assert_array_equal(got.labels, ref.labels)
    np.testing.assert_allclose(got.weighted_sums, ref.weighted_sums, rtol=1e-12)
    np.testing.assert_allclose(got.weight_in_clusters, ref.weight_in_clusters, rtol=1e-12)
    assert float(got.inertia) == pytest.approx(float(ref.inertia), rel=1e-12)
    assert float(got.n_changed) == 4099
    again = b.lloyd_iter(rows, None, Cc[::-1].copy(), got.labels)
    assert float(again.n_changed) == np.count_nonzero(
        np.asarray(again.labels) != np.asarray(got.labels))
    lab, mins = b.assign(rows, Cc)
    np.testing.assert_array_equal(lab, ref_lab)
    np.testing.assert_allclose(mins, ref_min, rtol=1e-12)
    sums, weights = b.reduce(rows, ref.labels, w, 11)
    np.testing.assert_allclose(sums, ref.weighted_sums, rtol=1e-12)
    np.testing.assert_allclose(weights, ref.weight_in_clusters, rtol=1e-12)
    labels = np.asarray(ref.labels)
    direct = float(b.inertia(Xc, w, Cc, labels))
    assert float(b.inertia(rows, w, Cc, labels)) == pytest.approx(direct, rel=1e-12)
    far, far_ref = b.farthest(rows, w, Cc, labels, 5), b.farthest(Xc, w, Cc, labels, 5)
    np.testing.assert_array_equal(far.index, far_ref.index)
    np.testing.assert_allclose(far.x, far_ref.x, rtol=1e-12)
    np.testing.assert_allclose(far.weight, far_ref.weight)
    b.placement.finish()


def test_host_rows_select_centered_rows_only():
    X = np.arange(12.0).reshape(4, 3)
    mean = X.mean(axis=0)
    rows = HostRows(X, mean)
    np.testing.assert_array_equal(rows[1:3, ...], (X - mean)[1:3])
    np.testing.assert_array_equal(rows[2, :], (X - mean)[2])
    np.testing.assert_array_equal(np.take(rows, [3, 0], axis=0), (X - mean)[[3, 0]])
    np.testing.assert_array_equal(np.asarray(rows), X - mean)
    assert rows.shape == (4, 3) and rows.dtype == X.dtype and len(rows) == 4
    with pytest.raises(TypeError):
        rows[:, 1]


def test_predict_score_transform_after_a_streamed_fit(fake_cupy):
    X, init = _problem(3001, 3, 4, np.float64, seed=14)
    ref = KMeans(4, init=init, backend="numpy").fit(X)
    km = KMeans(4, init=init, backend="cupy-kernels", backend_options={"stream": True}).fit(X)
    np.testing.assert_array_equal(km.predict(X), ref.predict(X))
    # predict's backend is never finished: its engine goes with it, X's pages unlocked
    assert fake_cupy.runtime.register_calls == 2 and not fake_cupy.runtime.registered
    assert km.score(X) == pytest.approx(ref.score(X), rel=1e-10)
    np.testing.assert_allclose(km.transform(X), ref.transform(X), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("name", BACKENDS)
def test_device_rows_through_the_driver_and_kmeans_plusplus(fake_cupy, name):
    """A device X centered chunk by chunk (DeviceRows; "device" arrays are NumPy here): the
    driver's fit, relocation included, is the numpy backend's on the centered copy, and
    k-means++ draws the same centers from it as from that copy."""
    from kmeans_xp_backends.cupy.streaming import DeviceRows

    from kmeans_xp.algorithms.init import kmeans_plusplus
    X, init = _problem(4099, 3, 9, np.float64, seed=16)
    init[4] = X.max(axis=0) * 40  # empty at first: relocation gathers rows of DeviceRows
    mean = X.mean(axis=0)
    rows = DeviceRows(X, mean)
    np.testing.assert_array_equal(rows[[5, 2], ...], (X - mean)[[5, 2]])
    b = get_backend(name)(stream=True, stream_rows=1024)
    got = kmeans_single_lloyd(b, rows, None, init - mean, xp=np_xp, max_iter=30, tol=0)
    ref = kmeans_single_lloyd(get_backend("numpy")(), X - mean, None, init - mean, xp=np_xp,
                              max_iter=30, tol=0)
    np.testing.assert_array_equal(np.asarray(got.labels), ref.labels)
    np.testing.assert_allclose(got.centers, ref.centers, rtol=1e-12)
    assert got.n_iter == ref.n_iter
    b.placement.finish()
    kw = dict(sample_weight=None, xp=np_xp, rows=1000, persist=lambda a: a)
    a = kmeans_plusplus(rows, 9, random_state=np.random.RandomState(0), **kw)[0]
    c = kmeans_plusplus(X - mean, 9, random_state=np.random.RandomState(0), **kw)[0]
    np.testing.assert_array_equal(a, c)


def test_a_pass_waits_for_the_previous_pass_before_reusing_a_slot(fake_cupy, monkeypatch):
    """A slot's device buffers are overwritten by the next pass's first chunks only after the
    previous pass's chunk in that slot has been computed (a page-locked X is copied in at
    once: without the wait the copy raced the previous pass's compute, which on the H200
    gave a 1.8x inertia at n=1e9)."""
    X, C = _problem(4099, 3, 5, np.float64, seed=4)
    rows = HostRows(X, X.mean(axis=0))
    b = get_backend("cupy-kernels")(stream=True, stream_rows=1024)
    log = []
    real_copy = staging.copy_to_device
    monkeypatch.setattr(staging, "copy_to_device",
                        lambda dst, src, stream: log.append("copy") or real_copy(dst, src, stream))
    first = b.lloyd_iter(rows, None, C - X.mean(axis=0), None)
    engine = b._engine
    for s, ev in enumerate(engine.ev_compute):
        real = ev.synchronize
        ev.synchronize = lambda real=real, s=s: log.append(f"wait {s}") or real()
    log.clear()
    b.lloyd_iter(rows, None, C - X.mean(axis=0), first.labels)
    slots = engine.plan.slots
    assert slots < 5  # 5 chunks: every slot is reused within the pass too
    assert log[:2] == ["wait 0", "copy"], log
    assert log.count("copy") == 5 and all(f"wait {s}" in log for s in range(slots)), log
