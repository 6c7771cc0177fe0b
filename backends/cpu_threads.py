"""Threads of the CPU backends (numpy, numba): the cores they may use, the one pool of threads
their passes run on (`PASS_THREADS`, shared by every backend of the process: a fitted model
holds no thread), and BLAS held to one thread while their own threads call it (one BLAS
thread pool inside each of T threads would run T x T threads)."""
from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import time

from kmeans_xp.contract.chunks import usable_cores
from kmeans_xp.contract.threads import ThreadPool, ctrl_c_deferred


def thread_count(requested=None) -> int:
    """`requested`, else the cores this process may run on."""
    if requested is not None:
        return max(1, int(requested))
    return usable_cores()


_CONTROLLER = None
_MODULES_SEEN = -1   # len(sys.modules) when _CONTROLLER was made


def blas_controller():
    """threadpoolctl's controller, else False (a library it cannot introspect). Making one
    inspects the loaded libraries (6 ms), too slow for every pass: it is made again only when
    a module was imported since, as a BLAS library comes with an import (SciPy's, which
    numba calls; FAISS's). A controller that missed a library would leave it at its
    threads, inside each of our pass threads."""
    global _CONTROLLER, _MODULES_SEEN
    if _CONTROLLER is None or len(sys.modules) != _MODULES_SEEN:
        try:
            from threadpoolctl import ThreadpoolController
            _CONTROLLER = ThreadpoolController()
        except Exception:  # not installed, or a library it cannot introspect
            _CONTROLLER = False
        _MODULES_SEEN = len(sys.modules)
    return _CONTROLLER


class BlasOneThread:
    """BLAS held to one thread while any pass of any fit needs it, restored when the last one
    ends. threadpoolctl's limits are process-wide, and since 3.8 only the thread that set a
    limit may change it again (others silently do nothing): so one thread of ours sets and
    restores it, counting the passes in between. Two fits in two threads, each entering and
    leaving its own limit, left BLAS at one thread for good.

    Where the caller's thread holds a limit of its own (``with threadpool_limits(2): fit``),
    ours would do nothing, and BLAS's threads would run inside each pass thread (a fit 3x
    slower on 2 cores): the limit then comes from the caller's thread, which restores it.

    Our limit lingers LINGER_S after the last pass that needed it: the next pass of the same
    fit takes it over with no trip to our thread (setting and restoring it there cost 0.23
    ms a pass, a tenth of an iteration at n=15k, d=32, k=256 on 2 threads); a fit's end
    restores it at once (`settle`, from `NumpyPlacement.finish`, the numpy and numba
    backends'), so the user's BLAS threads are back when `fit` returns."""

    #: seconds our limit outlives the last pass that needed it (a driver's step between two
    #: passes takes far less)
    LINGER_S = 0.05

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._limit = None    # (threadpoolctl's limit, the thread it was set on or None: ours,
        #                        the controller it was set with)
        self._thread = None
        # our limit's restore job (on our thread, while it lingers) and what it reads, under
        # _handoff (never held while waiting on our thread): whether a pass holds the limit,
        # when the last one ended, whether to restore now
        self._handoff = threading.Lock()
        self._wake = threading.Event()
        self._lingering = False
        self._active = False
        self._last_exit = 0.0
        self._restore_now = False

    def _on_own_thread(self, fn):
        if self._thread is None:
            self._thread = ThreadPool(1, "kmeans_xp-blas")
        return self._thread.submit(fn).result()

    def __enter__(self):
        with self._lock:
            if self._users == 0:
                controller = blas_controller()
                if controller and not self._take_over(controller):
                    self._limit = self._set_limit(controller)
            self._users += 1
        return self

    def _take_over(self, controller):
        """Whether our lingering limit, set with this controller (no BLAS library loaded
        since), is kept for this pass; otherwise a lingering one is restored first."""
        with self._handoff:
            if not self._lingering:
                return False
            if self._limit[2] is controller:
                self._active = True
                return True
        self.settle()
        return False

    def _set_limit(self, controller):
        """One BLAS thread, set on our thread, else (another thread holds the limit) on the
        caller's; the limit, the thread it was set on (None: ours), the controller."""
        def limit():
            lim = controller.limit(limits=1, user_api="blas")
            lim.__enter__()   # owns the limit until __exit__ (threadpoolctl 3.8)
            return lim

        lim = self._on_own_thread(limit)
        if _held_to_one(controller):
            return lim, None, controller
        self._on_own_thread(lambda: lim.__exit__(None, None, None))
        return limit(), threading.current_thread(), controller

    def __exit__(self, *exc):
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._limit is not None:
                lim, owner = self._limit[:2]
                if owner is None:   # ours: restored on our thread once it has lingered
                    with self._handoff:
                        self._active, self._last_exit = False, time.monotonic()
                        start = not self._lingering
                        self._lingering = True
                    if start:
                        self._thread.submit(self._restore_later)
                else:   # (from another thread it would do nothing: the caller's own
                    self._limit = None    # limit restores BLAS when it ends)
                    lim.__exit__(None, None, None)

    def _restore_later(self):
        """(On our thread.) Restore our limit once no pass has held it for LINGER_S."""
        while True:
            with self._handoff:
                left = self._last_exit + self.LINGER_S - time.monotonic()
                if self._restore_now or (not self._active and left <= 0):
                    lim = self._limit[0]
                    self._limit, self._lingering, self._restore_now = None, False, False
                    break
                self._wake.clear()
            self._wake.wait(left if left > 0 else self.LINGER_S)
        lim.__exit__(None, None, None)

    def settle(self):
        """Restore a lingering limit now, and return once it is (the end of a fit; a BLAS
        library loaded since it was set)."""
        with self._handoff:
            if not self._lingering or self._active:
                return
            self._restore_now = True
            self._wake.set()
        self._on_own_thread(lambda: None)   # (after the restore job: one thread, in order)

    def _after_fork(self):
        """In a forked child: no pass runs, and the thread that owned the limit is gone
        (threadpoolctl's limit, inherited, stays as it was)."""
        self._lock, self._users, self._limit, self._thread = threading.Lock(), 0, None, None
        self._handoff, self._wake = threading.Lock(), threading.Event()
        self._lingering = self._active = self._restore_now = False


def _held_to_one(controller):
    """Whether every BLAS library with a process-wide pool runs one thread now. An OpenBLAS
    on OpenMP (FAISS's) keeps a limit per thread: one set on our thread shows only there,
    and none of the passes' threads calls it (they call NumPy's and SciPy's)."""
    return all(lib.num_threads in (1, None)
               for lib in controller.select(user_api="blas").lib_controllers
               if getattr(lib, "threading_layer", None) != "openmp")


#: the one instance all CPU backends share
BLAS_ONE_THREAD = BlasOneThread()


class PassStopped(Exception):
    """Raised inside a pass's job whose pass was stopped (`PassThreads.run`)."""


class PassThreads:
    """The process's one pool of pass threads, shared by every CPU backend instance (so ten
    fitted models hold no thread of their own), grown to the most threads a pass has asked
    for. A pass's jobs poll `stop` between GEMM sub-chunks: when the caller is interrupted
    (Ctrl-C) or one job fails, the others stop within one sub-chunk, so the interpreter,
    which joins these threads at exit, does not wait for the rest of the pass."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pool, self._size = None, 0

    def run(self, job, count, stop):
        """[job(0), ..., job(count - 1)], on `count` threads; `stop` (a threading.Event)
        is set when the caller stops waiting for them."""
        with self._lock:
            if self._pool is None or self._size < count:
                old = self._pool
                self._pool = ThreadPool(count, "kmeans_xp-pass")
                self._size = count
                if old is not None:   # (its threads leave once their jobs end)
                    old.shutdown(wait=False)
            pool = self._pool
        futures = []
        try:
            with ctrl_c_deferred():   # (a Ctrl-C among the submits: every job is waited for)
                futures.extend(pool.submit(job, t) for t in range(count))
            return [f.result() for f in futures]
        except BaseException:
            stop.set()
            for f in futures:
                f.cancel()
            concurrent.futures.wait(futures)
            raise

    def _after_fork(self):
        """In a forked child the pool's threads are gone: the next pass makes a new pool."""
        self._lock, self._pool, self._size = threading.Lock(), None, 0


#: the pass threads all CPU backends share
PASS_THREADS = PassThreads()


def check_stop(stop):
    """Raise `PassStopped` where the pass this job belongs to was stopped."""
    if stop is not None and stop.is_set():
        raise PassStopped


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BLAS_ONE_THREAD._after_fork)
    os.register_at_fork(after_in_child=PASS_THREADS._after_fork)
