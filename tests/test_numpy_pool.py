"""The numpy backend's worker processes (`numpy_pool`, `numpy_worker`, `numpy_shm`): a Lloyd
run on X's centered copy in shared memory goes to the pool once it is ready; its fits are
the threads' fits bit for bit (labels, centers, inertia, iterations) in float32 and float64,
weighted, with relocations, strict convergence, k = 1 and k past 256 (16-bit labels); what
does not run a Lloyd loop (predict, mini-batch steps) stays on threads; a worker's error
reaches the caller and leaves the pool sound, a killed worker leaves the fit to the threads,
an idle pool leaves and comes back, and no run keeps the pool once its fit is over.

The two run the same NumPy code on the same blocks, but a worker's BLAS may run with another
thread count than the caller's: the fits are compared as users compare two correct fits
(the same partition up to near ties, inertia and centers up to rounding), not bit for bit."""
import os
import signal
import time
import types

import kmeans_xp_backends.numpy.backend as nb
import kmeans_xp_backends.numpy.pool as npool
import kmeans_xp_backends.numpy.shm as shm
import numpy as np
import pytest

from kmeans_xp import KMeans, MiniBatchKMeans, SphericalKMeans
from kmeans_xp.contract.registry import get_backend
from kmeans_xp.testing import asymmetric_data
from kmeans_xp.testing.label_bounds import fit_differences

pytestmark = pytest.mark.skipif(not npool.available(), reason="worker processes: Linux")

#: one pool size for every test here (a pool of another size starts anew)
WORKERS = 2


@pytest.fixture
def runs(monkeypatch):
    """The runs attached to the pool (their X's shapes); the pool is ready first, with small
    blocks (small data in several blocks, so on several threads) and small centered copies
    in shared memory; no run holds the pool once the test is over."""
    monkeypatch.setattr(nb, "TARGET_TASK_ROWS", 2000)
    monkeypatch.setattr(nb, "SHARED_MIN_BYTES", 0)
    monkeypatch.setattr(nb.stats, "MIN_PARALLEL_ROWS", 1000)
    assert npool.start_pool(WORKERS, timeout=60)
    attached = []
    attach = npool.RunWorkers._attach

    def counting(self, pool, X, *args):
        attached.append(X.shape)
        return attach(self, pool, X, *args)

    monkeypatch.setattr(npool.RunWorkers, "_attach", counting)
    yield attached
    assert npool._POOL is None or not npool._POOL.busy.locked()


def _both(X, fit_kw=None, cls=KMeans, **kw):
    out = []
    for processes in (False, True):
        km = cls(backend="numpy", backend_options={"processes": processes,
                                                   "n_threads": WORKERS}, **kw)
        out.append(km.fit(X, **(fit_kw or {})))
    return out


def _same(a, b, X, sample_weight=None):
    """The pool's fit `b` is the threads' fit `a`, up to rounding (see the module's note)."""
    assert a.labels_.dtype == b.labels_.dtype == np.int32
    assert fit_differences(X, b, a, sample_weight=sample_weight) == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 7, 300])
def test_pool_fit_is_the_threads_fit(runs, dtype, k):
    X = asymmetric_data(10_007, 3, max(k, 2), dtype=dtype, seed=k)
    init = X[np.random.default_rng(k).choice(len(X), k, replace=False)]
    a, b = _both(X, n_clusters=k, init=init, n_init=1, max_iter=6, tol=0)
    _same(a, b, X)
    assert runs == [X.shape]   # one run, on the pool


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weights_relocation_and_many_blocks(runs, monkeypatch, dtype):
    monkeypatch.setattr(nb, "TARGET_TASK_ROWS", 700)   # several blocks per worker
    monkeypatch.setattr(nb, "SUB_BYTES_PER_THREAD", 4096)   # several sub-chunks a block
    X = asymmetric_data(9_001, 5, 6, dtype=dtype, seed=3)
    init = X[np.random.default_rng(1).choice(len(X), 8, replace=False)].copy()
    init[:3] += 1e3   # nobody near: empty clusters, relocated
    w = np.random.default_rng(2).uniform(0.0, 3.0, len(X)).astype(dtype)
    w[::7] = 0
    a, b = _both(X, {"sample_weight": w}, n_clusters=8, init=init, n_init=1, max_iter=12,
                 tol=0)
    _same(a, b, X, sample_weight=w)
    assert runs == [X.shape]


def test_wide_data_label_grouped_sums(runs):
    X = asymmetric_data(6_007, 40, 9, dtype=np.float32, seed=8)   # d >= SORTED_SUMS_MIN_D
    a, b = _both(X, n_clusters=9, init=X[:9].copy(), n_init=1, max_iter=5, tol=0)
    _same(a, b, X)
    assert runs == [X.shape]


def test_strict_convergence_and_several_runs(runs):
    """A run that stops on unchanged labels ends with the "inertia" pass on the pool;
    n_init=3 attaches once per run."""
    X = asymmetric_data(6_001, 2, 4, dtype=np.float64, seed=9)
    a, b = _both(X, n_clusters=4, init="k-means++", n_init=3, max_iter=300, tol=0,
                 random_state=0)
    _same(a, b, X)
    assert a.n_iter_ < 300
    assert runs == [X.shape] * 3


def test_what_stays_on_threads(runs):
    """Spherical fits (unit rows, not the centered copy), copy_x=False (X centered in
    place: the user's memory), predict and mini-batch steps: no run on the pool, and the
    same results."""
    X = asymmetric_data(5_003, 4, 5, dtype=np.float32, seed=4)
    a, b = _both(X, cls=SphericalKMeans, n_clusters=5, n_init=1, random_state=1,
                 max_iter=8, tol=0)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    Xc = X.copy()
    a, b = (KMeans(5, init=X[:5], n_init=1, max_iter=5, tol=0, copy_x=False,
                   backend="numpy",
                   backend_options={"processes": p, "n_threads": WORKERS}).fit(Xc)
            for p in (False, True))
    _same(a, b, X)
    np.testing.assert_allclose(Xc, X, rtol=0, atol=1e-5)   # un-centered after each fit
    assert runs == []
    km = KMeans(5, n_init=1, random_state=0, max_iter=3, tol=0, backend="numpy",
                backend_options={"processes": True, "n_threads": WORKERS}).fit(X)
    assert runs == [X.shape]
    for _ in range(3):
        km.predict(X)
    MiniBatchKMeans(5, batch_size=1024, random_state=0, max_iter=3, n_init=1,
                    backend="numpy",
                    backend_options={"processes": True, "n_threads": WORKERS}).fit(X)
    assert runs == [X.shape]


def test_auto_goes_to_the_pool_past_its_threshold(runs, monkeypatch):
    X = asymmetric_data(8_000, 3, 5, dtype=np.float32, seed=1)

    def fit(threads=WORKERS):
        return KMeans(5, n_init=1, random_state=0, max_iter=4, tol=0, backend="numpy",
                      backend_options={"n_threads": threads}).fit(X)

    fit()
    assert runs == []   # 'auto': a pass far below PROCESS_MIN_NS
    monkeypatch.setattr(nb, "PROCESS_MIN_NS", 0)
    fit()
    assert runs == [X.shape]
    fit(threads=1)
    assert runs == [X.shape]   # one thread: nothing to share a GIL with
    wide = asymmetric_data(8_000, nb.PROCESS_MAX_D, 5, dtype=np.float32, seed=1)
    KMeans(5, n_init=1, random_state=0, max_iter=4, tol=0, backend="numpy",
           backend_options={"n_threads": WORKERS}).fit(wide)
    assert runs == [X.shape]   # 'auto': few features only


def test_centered_copy_in_shared_memory(monkeypatch):
    monkeypatch.setattr(nb, "SHARED_MIN_BYTES", 0)
    monkeypatch.setattr(nb.stats, "MIN_PARALLEL_ROWS", 10)
    X = asymmetric_data(100, 3, 2, dtype=np.float32, seed=0)
    mean = X.mean(axis=0)
    for processes, threads, shared in [(True, 2, True), ("auto", 2, True),
                                       (False, 2, False), ("auto", 1, False)]:
        be = get_backend("numpy")(processes=processes, n_threads=threads)
        Xc = be.placement.center(X, mean, xp=np)
        np.testing.assert_array_equal(Xc, X - mean)
        assert (shm.segment_of(Xc) is not None) is shared
        # a backend that shares numpy's placement but has no workers (numba's)
        other = nb.NumpyPlacement(types.SimpleNamespace(threads=threads))
        assert shm.segment_of(other.center(X, mean, xp=np)) is None
        if shared:
            fd, offset = shm.segment_of(Xc[10:])
            assert offset == 10 * 3 * 4 and os.fstat(fd).st_size >= Xc.nbytes
            assert shm.segment_of(Xc[:, :2]) is None   # not C-contiguous
    assert shm.segment_of(X) is None
    wide = asymmetric_data(100, nb.PROCESS_MAX_D, 2, dtype=np.float32, seed=0)
    for processes, shared in [("auto", False), (True, True)]:
        be = get_backend("numpy")(processes=processes, n_threads=2)
        Xc = be.placement.center(wide, wide.mean(axis=0), xp=np)
        assert (shm.segment_of(Xc) is not None) is shared   # 'auto': few features only


def test_shared_memory_goes_with_its_last_array():
    X = shm.shared_empty((1000, 3), np.float32)
    fd, _ = shm.segment_of(X)
    view = X[5:]
    del X
    os.fstat(fd)   # still open: a view holds the memory
    del view
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_workers_error_reaches_the_caller(runs, monkeypatch):
    """A worker that cannot make its buffers (a plan it cannot allocate) raises there;
    the fit raises it with the worker's traceback, X is untouched, and the pool serves the
    next fit."""
    plan = nb._Plan

    class BadPlan(plan):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.sub_alone = -1   # only the workers read it

    X = asymmetric_data(6_000, 3, 4, dtype=np.float32, seed=2)
    X0 = X.copy()
    monkeypatch.setattr(nb, "_Plan", BadPlan)
    km = KMeans(4, init=X[:4], n_init=1, max_iter=5, tol=0, backend="numpy",
                backend_options={"processes": True, "n_threads": WORKERS})
    with pytest.raises(ValueError, match="negative dimensions") as info:
        km.fit(X)
    assert any("worker process 0" in n for n in getattr(info.value, "__notes__", []))
    np.testing.assert_array_equal(X, X0)
    monkeypatch.setattr(nb, "_Plan", plan)
    pool = npool._POOL
    a, b = _both(X, n_clusters=4, init=X[:4], n_init=1, max_iter=5, tol=0)
    _same(a, b, X)
    assert npool._POOL is pool and len(runs) == 2


@pytest.mark.parametrize("dead_before_send", [True, False])
def test_a_killed_worker_leaves_the_fit_to_the_threads(runs, monkeypatch, dead_before_send):
    """A worker killed between passes (the next send meets a broken pipe) or as a pass
    starts (its reply never comes): the pass and the rest of the fit run on threads."""
    X = asymmetric_data(6_000, 3, 4, dtype=np.float64, seed=2)
    ref = KMeans(4, init=X[:4], n_init=1, max_iter=5, tol=0, backend="numpy",
                 backend_options={"processes": False, "n_threads": WORKERS}).fit(X)
    run, passes = npool.RunWorkers.run, []

    def killing(self, *a, **kw):
        passes.append(1)
        if len(passes) == 2:
            os.kill(self._run[0].procs[0].pid, signal.SIGKILL)
            if dead_before_send:
                self._run[0].procs[0].wait()
        return run(self, *a, **kw)

    monkeypatch.setattr(npool.RunWorkers, "run", killing)
    km = KMeans(4, init=X[:4], n_init=1, max_iter=5, tol=0, backend="numpy",
                backend_options={"processes": True, "n_threads": WORKERS})
    with pytest.warns(RuntimeWarning, match="worker process 0 .* ended during a pass"):
        km.fit(X)
    _same(km, ref, X)
    assert len(passes) == 2
    assert npool.start_pool(WORKERS, timeout=60)   # a new pool for the next test


def test_an_idle_pool_leaves_and_a_new_one_starts(runs, monkeypatch):
    monkeypatch.setattr(npool, "IDLE_S", 0.3)
    with npool._POOL_LOCK:
        npool._POOL.close()   # (the next one is started with the short idle time)
    assert npool.start_pool(WORKERS, timeout=60)
    old = npool._POOL
    deadline = time.perf_counter() + 30
    while old.alive() and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not old.alive()
    monkeypatch.setattr(npool, "IDLE_S", 300.0)
    assert npool.start_pool(WORKERS, timeout=60) and npool._POOL is not old
    X = asymmetric_data(6_000, 3, 4, dtype=np.float32, seed=5)
    _same(*_both(X, n_clusters=4, init=X[:4], n_init=1, max_iter=4, tol=0), X)
    assert runs == [X.shape]


def test_workers_leave_when_their_socket_closes():
    pool = npool.Pool(2)
    deadline = time.perf_counter() + 60
    while not pool.ready() and time.perf_counter() < deadline:
        time.sleep(0.01)
    procs = list(pool.procs)
    for c in pool.conns:
        c.close()
    assert [p.wait(10) for p in procs] == [0, 0]


def test_processes_true_needs_linux(monkeypatch):
    monkeypatch.setattr(npool, "available", lambda: False)
    with pytest.raises(ValueError, match="share memory as Linux does"):
        get_backend("numpy")(processes=True)
    assert get_backend("numpy")(processes="auto").shares_memory(1 << 30, 3) is False


def test_processes_option_is_checked():
    with pytest.raises(ValueError, match="processes"):
        KMeans(2, backend="numpy", backend_options={"processes": "yes"}).fit(
            np.zeros((4, 2), dtype=np.float32) + np.arange(4)[:, None])


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_fork_of_the_process_starts_its_own_pool(runs):
    """A child forked from a process with a pool (a user's multiprocessing) neither talks to
    its parent's workers nor waits on them: its fit starts a pool of its own."""
    X = asymmetric_data(6_000, 3, 4, dtype=np.float32, seed=6)
    ref = KMeans(4, init=X[:4], n_init=1, max_iter=4, tol=0, backend="numpy",
                 backend_options={"processes": False, "n_threads": WORKERS}).fit(X)
    parent_pool = npool._POOL
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report, and leave without the parent's exit handlers
        ok = 0
        try:
            os.close(r)
            ok = int(npool._POOL is None and npool.start_pool(WORKERS, timeout=60))
            km = KMeans(4, init=X[:4], n_init=1, max_iter=4, tol=0, backend="numpy",
                        backend_options={"processes": True, "n_threads": WORKERS}).fit(X)
            ok = ok and int(np.array_equal(km.labels_, ref.labels_) and
                            npool._POOL is not None and npool._POOL.pid == os.getpid())
        finally:
            os.write(w, bytes([ok]))
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"\x01"
    assert npool._POOL is parent_pool and parent_pool.alive()
    _same(*_both(X, n_clusters=4, init=X[:4], n_init=1, max_iter=4, tol=0), X)


def test_estimate_counts_a_run_on_the_workers():
    from kmeans_xp import estimate_memory
    on = estimate_memory(2_000_000, 3, 200, backend_options={"n_threads": 4}).parts
    off = estimate_memory(2_000_000, 3, 200, backend_options={"n_threads": 4,
                                                               "processes": False}).parts
    assert on["worker_run"] >= 2_000_000 + 4 * (200 * 3 + 203) * 8
    assert "worker_run" not in off
    one = estimate_memory(2_000_000, 3, 200, backend_options={"n_threads": 1}).parts
    assert "worker_run" not in one


def test_a_pool_that_cannot_start_warns_once_and_fits_run_on_threads(runs, monkeypatch):
    """Workers that die before they are ready (here: an interpreter that cannot import
    the worker) leave every later fit on threads, with one warning, and the same results."""
    with npool._POOL_LOCK:
        npool._POOL.close()
    monkeypatch.setattr(npool.sys, "executable", "/bin/false")
    monkeypatch.setattr(npool, "_FAILED", [])
    assert not npool.start_pool(WORKERS, timeout=2)
    X = asymmetric_data(6_000, 3, 4, dtype=np.float32, seed=7)
    with pytest.warns(RuntimeWarning, match="could not start"):
        b = KMeans(4, init=X[:4], n_init=1, max_iter=4, tol=0, backend="numpy",
                   backend_options={"processes": True, "n_threads": WORKERS}).fit(X)
    a = KMeans(4, init=X[:4], n_init=1, max_iter=4, tol=0, backend="numpy",
               backend_options={"processes": False, "n_threads": WORKERS}).fit(X)
    _same(a, b, X)
    assert runs == [] and npool._FAILED
    monkeypatch.undo()   # (the real interpreter back; the next test starts a pool)
    npool._POOL = None
    assert npool.start_pool(WORKERS, timeout=60)


def test_a_pool_of_another_size_replaces_one_still_starting(runs):
    with npool._POOL_LOCK:
        npool._POOL.close()
        npool._POOL = None
    npool.start_pool(WORKERS + 1)   # not waited for
    assert npool.start_pool(WORKERS, timeout=60)
    assert npool._POOL.count == WORKERS and not npool._FAILED


def test_a_worker_dead_at_attach_leaves_the_fit_to_the_threads(runs, monkeypatch):
    X = asymmetric_data(6_000, 3, 4, dtype=np.float32, seed=3)
    ref = KMeans(4, init=X[:4], n_init=1, max_iter=4, tol=0, backend="numpy",
                 backend_options={"processes": False, "n_threads": WORKERS}).fit(X)
    alive = npool.Pool.alive
    monkeypatch.setattr(npool.Pool, "alive", lambda self: True)   # (not seen before attach)
    pool = npool._POOL
    os.kill(pool.procs[1].pid, signal.SIGKILL)
    pool.procs[1].wait()
    with pytest.warns(RuntimeWarning, match="worker process 1 .* ended"):
        km = KMeans(4, init=X[:4], n_init=1, max_iter=4, tol=0, backend="numpy",
                    backend_options={"processes": True, "n_threads": WORKERS}).fit(X)
    _same(km, ref, X)
    monkeypatch.setattr(npool.Pool, "alive", alive)
    assert npool._POOL is None and npool.start_pool(WORKERS, timeout=60)


def test_a_fit_starts_the_pool_and_the_next_waits_for_it(runs, monkeypatch):
    """The first fit that will use the workers starts the pool in the background (its
    passes on threads meanwhile); a fit while the pool is still starting waits for it."""
    monkeypatch.setattr(nb, "PROCESS_MIN_NS", 0)
    with npool._POOL_LOCK:
        npool._POOL.close()
        npool._POOL = None
    X = asymmetric_data(6_000, 3, 4, dtype=np.float32, seed=4)
    fit = lambda: KMeans(4, init=X[:4], n_init=1, max_iter=3, tol=0,  # noqa: E731
                         backend="numpy", backend_options={"n_threads": WORKERS}).fit(X)
    a = fit()
    assert npool._POOL is not None and npool._POOL.count == WORKERS
    b = fit()   # (waits for the pool the first one started)
    _same(a, b, X)
    assert runs[-1:] == [X.shape]


def test_a_worker_dead_before_a_runs_end_ends_the_pool_quietly(runs):
    """A worker that dies after a run's last pass on it, before the run detaches (here: the
    backend's `finish`), costs the pool, not an error."""
    X = asymmetric_data(6_000, 3, 4, dtype=np.float32, seed=8)
    be = get_backend("numpy")(processes=True, n_threads=WORKERS)
    Xc = be.placement.center(X, X.mean(axis=0), xp=np)
    be.lloyd_iter(Xc, None, Xc[:4].copy(), None)
    assert runs == [X.shape]
    pool = npool._POOL
    os.kill(pool.procs[0].pid, signal.SIGKILL)
    pool.procs[0].wait()
    be.finish()   # detaches: the detach message meets a broken pipe
    assert npool._POOL is None and not pool.busy.locked()
    assert npool.start_pool(WORKERS, timeout=60)
