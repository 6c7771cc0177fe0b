"""Resources a fit owns (issue 37, R4 and R5): the threads and scratch buffers of the CPU
backends are the fit's while it runs (released at the end of `fit` and `partial_fit`, the
threads shared in one pool per process), a worker pool is started only for a fit that will
run, and process exit or Ctrl-C leaves no traceback and stops the pass in flight at once."""
import gc
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

from kmeans_xp import KMeans, MiniBatchKMeans
from kmeans_xp_backends.numpy import pool as npool

CPU_BACKENDS = ["numpy"] + (["numba"] if importlib.util.find_spec("numba") else [])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data(n=60_001, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 3)) * [1.0, 3.0, 0.5] + [0, 5, -2]).astype(np.float32)


def _array_bytes(model):
    """Bytes of the NumPy arrays a model keeps as attributes (its fitted state)."""
    return sum(v.nbytes for v in vars(model).values() if isinstance(v, np.ndarray))


def _fits(kind, backend):
    """A fit of `kind` on the backend with two threads (a 1-core runner too)."""
    X = _data()
    options = {"n_threads": 2}

    def fit(seed):
        if kind == "KMeans":
            return KMeans(64, n_init=1, max_iter=3, random_state=seed, backend=backend,
                          backend_options=options).fit(X)
        model = MiniBatchKMeans(64, batch_size=4096, max_iter=2, n_init=1,
                                random_state=seed, backend=backend, backend_options=options)
        if kind == "MiniBatchKMeans":
            return model.fit(X)
        for start in range(0, 30_000, 10_000):   # partial_fit
            model.partial_fit(X[start:start + 10_000])
        return model
    return fit


@pytest.mark.parametrize("kind", ["KMeans", "MiniBatchKMeans", "partial_fit"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_fitted_models_hold_no_threads_nor_scratch_buffers(kind, backend):
    """Ten fitted models hold what a user sees (centers, labels, counts), no thread and no
    scratch buffer: before, each MiniBatchKMeans kept two threads and its blocks' buffers."""
    fit = _fits(kind, backend)
    fit(0)   # the process's shared threads, imports and kernels: there before the ten
    gc.collect()
    threads = threading.active_count()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        models = [fit(seed) for seed in range(1, 11)]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert threading.active_count() == threads
    kept = sum(_array_bytes(m) for m in models)
    # (slack: Python objects, a few KiB a model; one model's block buffers are MiBs)
    assert held - kept < 1 << 20, (held, kept)


def test_a_fit_refused_after_the_backend_was_chosen_starts_no_pool():
    """A callable init whose centers have the wrong shape is refused after the backend was
    chosen: the numpy backend's worker processes are not started for it."""
    if not npool.available():
        pytest.skip("the worker processes run on Linux")
    X = _data(400_000)
    old = npool._POOL
    npool._POOL = None
    try:
        with pytest.raises(ValueError, match="initial centers"):
            KMeans(3, init=lambda X, k, random_state: np.zeros((k + 1, 3)), n_init=1,
                   backend="numpy", backend_options={"n_threads": 2,
                                                     "processes": True}).fit(X)
        assert npool._POOL is None
    finally:
        if npool._POOL is not None:
            npool._POOL.close()
        npool._POOL = old


def _env():
    """This process's import path for a child (the worktree's packages first)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([p for p in sys.path if p]))


def _python(code, **kw):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, env=_env(), **kw)


@pytest.mark.skipif(not npool.available(), reason="the worker processes run on Linux")
@pytest.mark.parametrize("when", ["pool starting", "fit done"])
def test_process_exit_leaves_stderr_clean(when):
    """A process that ends while the worker processes start, or right after a fit that used
    them, writes nothing on stderr (before: a BrokenPipeError traceback per worker)."""
    if when == "pool starting":
        code = ("from kmeans_xp_backends.numpy import pool\n"
                "pool.start_pool(2)\n")
    else:
        code = ("import numpy as np\nfrom kmeans_xp import KMeans\n"
                "X = np.random.default_rng(0).normal(size=(300_001, 3)).astype(np.float32)\n"
                "KMeans(50, n_init=1, max_iter=3, random_state=0, backend='numpy', "
                "backend_options={'processes': True, 'n_threads': 2}).fit(X)\n")
    p = _python(code)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    assert err.decode() == ""


def _interrupted(p, after_line, delay):
    """Send Ctrl-C (SIGINT to the process group, as a terminal does) to `p` `delay` seconds
    after its stdout shows `after_line`: (seconds from the signal to its exit, its exit
    status, its stderr)."""
    try:
        while True:
            line = p.stdout.readline().decode()
            assert line, f"it ended before it was interrupted: {p.stderr.read().decode()}"
            if line.startswith(after_line):
                break
        time.sleep(delay)
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=60)
        took = time.monotonic() - t0
        err = p.stderr.read().decode()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return took, p.returncode, err


#: the exit status of an interrupted process: 130, or killed by SIGINT where CPython (3.11)
#: saw the KeyboardInterrupt go through an exec() of a string (array_api_compat imports
#: that way) and exits by the signal even though the command handled it
INTERRUPTED = (130, -signal.SIGINT)

#: a fit whose passes take seconds on each of two threads (1M points, 2000 clusters)
LONG_FIT = """
import sys
import numpy as np
from kmeans_xp import KMeans
X = np.random.default_rng(0).normal(size=(1_000_003, 3)).astype(np.float32)
km = KMeans(2000, init="random", n_init=1, max_iter=1000, tol=0, random_state=0,
            backend="numpy", backend_options={{"processes": {processes}, "n_threads": 2}})
print("fitting", flush=True)
try:
    km.fit(X)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
@pytest.mark.parametrize("processes", [False, True])
def test_ctrl_c_stops_the_pass_in_flight_at_once(processes):
    """Ctrl-C during a Lloyd pass (on the threads, or the worker processes once ready):
    the pass stops and the process exits at once, nothing on stderr (before: the threads'
    pass ran on, and the interpreter's exit waited for it: up to 19 s)."""
    if processes and not npool.available():
        pytest.skip("the worker processes run on Linux")
    p = _python(LONG_FIT.format(processes=processes), start_new_session=True)
    took, status, err = _interrupted(p, "fitting", 3.0)
    assert status in INTERRUPTED, err
    assert err == ""
    # (within a second: a sub-chunk and the interpreter's exit; slack for a loaded runner)
    assert took < 2.5, took


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
@pytest.mark.parametrize("delay", [0.1, 0.4])
def test_ctrl_c_before_the_worker_pool_is_ready_leaves_no_traceback(delay):
    """`kmeans-xp run` interrupted as its fit starts the worker processes: one line, status
    130, no traceback from a worker (before: a BrokenPipeError or KeyboardInterrupt each)."""
    p = subprocess.Popen([sys.executable, "-m", "kmeans_xp", "run", "--n", "1000000",
                          "--k", "500", "--backend", "numpy"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT, env=_env(), start_new_session=True)
    took, status, err = _interrupted(p, "backends available:", delay)
    assert status in INTERRUPTED
    assert err.strip() == "kmeans-xp: interrupted", err
    assert took < 2.5, took


#: Ctrl-C at the worst moment of a pool's growth: right after it started a thread, before
#: the interpreter's exit knows of it (ThreadPoolExecutor registers it just after)
CTRL_C_AS_A_THREAD_STARTS = """
import os, signal, threading
import numpy as np
real_start = threading.Thread.start
def start(self):
    real_start(self)
    if self.name.startswith("kmeans_xp-"):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):   # (bytecodes: the handler runs here, at the latest)
            pass
threading.Thread.start = start
try:
{use}
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""

POOL_USES = {
    "pass threads": "    from kmeans_xp_backends.cpu_threads import PASS_THREADS\n"
                    "    PASS_THREADS.run(lambda t: t, 2, threading.Event())",
    "row chunks": "    from kmeans_xp.contract.chunks import spawn\n"
                  "    spawn(lambda t: t, 2)",
    "BLAS thread": "    from kmeans_xp_backends.cpu_threads import BLAS_ONE_THREAD\n"
                   "    with BLAS_ONE_THREAD:\n        pass",
}


@pytest.mark.skipif(not hasattr(os, "kill"), reason="POSIX signals")
@pytest.mark.parametrize("use", list(POOL_USES))
def test_ctrl_c_as_a_pool_starts_a_thread_lets_the_process_end(use):
    """A Ctrl-C that lands as one of our thread pools starts a thread is a
    KeyboardInterrupt for the caller, and the process ends (before: the thread, started but
    not yet registered for the interpreter's exit, waited for work forever and the exit
    joined it: `kmeans-xp run` hung after a Ctrl-C, seen once in CI)."""
    p = _python(CTRL_C_AS_A_THREAD_STARTS.format(use=POOL_USES[use]))
    try:
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err.decode()
    if use == "BLAS thread" and out.decode() == "":
        pytest.skip("no BLAS library threadpoolctl sees here: no limit is set, no thread")
    assert out.decode() == "interrupted\n"
