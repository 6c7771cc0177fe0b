"""The pool of worker processes for the numpy backend's Lloyd passes, and a run on it: one
worker per thread of the backend's plan, each running that thread's share of a pass
(`numpy_worker`, `numpy_blocks.run_share`).

Why processes: every NumPy call takes the GIL for its setup, so on many threads the calls
of a pass queue for it, and a GEMM sub-chunk must carry enough work to be worth the wait:
past L2, so its (rows, k) result goes through L3 (`numpy_.SUB_NS_PER_THREAD`). A process
has a GIL of its own: its sub-chunks stay in L2, as on one thread.

How:
- The pool: fresh interpreters (`subprocess`: no fork of a process with threads, and none of
  the parent's memory held), started once per process in the background while the passes
  run on threads, kept between fits, and ended after IDLE_S idle seconds (as joblib's loky
  does) or with the parent (their socket closes). BLAS runs on one thread in each.
- Data: X must lie in shared memory (`numpy_shm`). The numpy backend makes the fit's
  centered copy of X there; a run's labels, accumulator slots, centers and weights lie in a
  second segment. Both reach the workers as file descriptors, once per run.
- A run takes the pool at a Lloyd iteration on X in shared memory once the pool is ready
  (one run at a time: another fit meanwhile runs on threads) and gives it back with its last
  pass ("final" or "inertia"), a pass on anything else, or an error.
- Bits: worker t runs thread t's blocks and the parent adds the accumulators in worker
  order: the sums, labels and inertia are the threads', bit for bit.
"""
from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle

import numpy as np

from kmeans_xp_backends.numpy import blocks as blocks
from kmeans_xp_backends.numpy.shm import RunBuffers, segment_of

#: what a worker reads of the backend's plan (sent as values: the worker imports no plan)
PLAN_FIELDS = ("block", "sub_alone", "k", "d", "sorted_sums", "group",
               "diff_rows")
#: seconds a worker waits for work before it leaves
IDLE_S = 300.0
#: seconds a worker gets to leave after its socket closes before it is killed
JOIN_S = 2.0
#: ... at exit, or when a pass was abandoned (Ctrl-C, a broken socket): a worker then is
#: idle and leaves at once, or busy with a pass nobody waits for (killed: the process must
#: stop within a second)
ABANDON_S = 0.2


def available() -> bool:
    """Whether this platform runs the workers (Linux: memfd shared memory)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and bool(
        sys.executable)


class WorkerEnded(RuntimeError):
    """A worker process ended during a pass (killed: the OOM killer, a signal)."""


# -- the pool -------------------------------------------------------------------------------
class Pool:
    """`count` worker processes, started in the background (`ready` says when all are)."""

    def __init__(self, count):
        self.count, self.pid = count, os.getpid()   # (a fork of this process: not its pool)
        self.busy = threading.Lock()   # held by the run attached to the pool
        self._ready = [False] * count
        self.ready_once = False
        self.procs, self.conns, self.last_times = [], [], []
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   OMP_NUM_THREADS="1", BLIS_NUM_THREADS="1")
        path = [p or os.getcwd() for p in sys.path]
        # Ctrl-C is the parent's to handle (it ends the workers): ignored before the imports,
        # which take most of a worker's start
        code = (f"import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                f"import sys; sys.path[:0] = {path!r}; "
                f"from kmeans_xp_backends.numpy.worker import live; live()")
        try:
            for _ in range(count):
                mine, theirs = socket.socketpair()
                try:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-c", code, str(theirs.fileno()), str(IDLE_S)], env=env,
                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                        # (out of the terminal's process group: a Ctrl-C reaches the parent
                        # alone)
                        start_new_session=True))
                finally:
                    theirs.close()
                self.conns.append(Connection(mine.detach()))
        except BaseException:
            self.close(ABANDON_S)
            raise

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def ready(self) -> bool:
        """Whether every worker has started (reads their greetings, without waiting)."""
        for t, conn in enumerate(self.conns):
            try:
                if not self._ready[t] and conn.poll(0):
                    self._ready[t] = conn.recv() == "ready"
            except (EOFError, OSError):   # (it ended before its greeting)
                pass
        self.ready_once = self.ready_once or all(self._ready)
        return self.ready_once and self.alive()

    def send(self, message, t=None):
        """`message` to worker t, or to all; raises `WorkerEnded` where one has ended."""
        for i in range(len(self.conns)) if t is None else (t,):
            try:
                self.conns[i].send(message)
            except OSError:   # (a broken pipe: it ended)
                raise self._ended(i) from None

    def _ended(self, t):
        proc = self.procs[t]
        try:
            proc.wait(JOIN_S)
        except subprocess.TimeoutExpired:
            pass
        return WorkerEnded(f"the numpy backend's worker process {t} (pid {proc.pid}) ended "
                           f"during a pass, exit code {proc.returncode}")

    def replies(self):
        """Each worker's reply to the last message, in worker order: the first error a
        worker raised (returned, all replies read: the pool stays sound), or None; raises
        `WorkerEnded`. `last_times`: each worker's (wall, CPU) seconds for it."""
        failed, self.last_times = None, []
        for t, conn in enumerate(self.conns):
            try:
                reply = conn.recv()
            except (EOFError, OSError):
                raise self._ended(t) from None
            if reply[0] == "ok":
                self.last_times.append(reply[1:])
            elif failed is None:
                _, exc, text = reply
                if hasattr(exc, "add_note"):
                    exc.add_note(f"(in the numpy backend's worker process {t}):\n{text}")
                failed = exc
        return failed

    def close(self, grace=JOIN_S):
        """End the workers: each leaves when its socket closes, or is killed once `grace`
        seconds (for all of them) have passed: at exit, or with a pass abandoned midway, a
        short one (`ABANDON_S`). (In a fork of the process that started them: only this
        process's copies of the sockets close.)"""
        for conn in self.conns:
            conn.close()
        deadline = time.monotonic() + grace
        for proc in self.procs if self.pid == os.getpid() else ():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.conns, self.procs = [], []


def start_pool(count, timeout=None):
    """The process's pool of `count` workers, started if need be; with a timeout, waited for
    until ready (a benchmark's warm-up, a test): False if it was not ready in time."""
    pool = _pool(count)
    deadline = time.perf_counter() + (timeout or 0)
    while (pool is not None and not pool.ready() and pool.alive() and
           time.perf_counter() < deadline):
        time.sleep(0.005)
    return pool is not None and pool.ready()


def warm(count, wait_s):
    """Start the pool of `count` workers in the background, or wait up to `wait_s` for one
    that is starting."""
    with _POOL_LOCK:
        pool = _POOL
        starting = pool is not None and pool.count == count and pool.alive()
    start_pool(count, wait_s if starting else None)


_POOL = None
_POOL_LOCK = threading.Lock()
_FAILED = []   # why a pool could not start in this process (then none is tried again)


def _pool(count):
    """The process's pool of `count` workers (started now if there is none, or none of that
    size alive and free), or None while another run holds it, or when a pool could not
    start here (a warning says why, once)."""
    global _POOL
    with _POOL_LOCK:
        pool = _POOL
        if _FAILED:
            return None
        if pool is not None and pool.count == count and pool.alive():
            return pool
        if pool is not None:
            if not pool.busy.acquire(blocking=False):
                return None
            pool.ready()
            # (a worker ended before it said it was ready: it could not start)
            failed = not pool.alive() and not pool.ready_once
            pool.close()
            pool.busy.release()
            _POOL = None
            if failed:
                _FAILED.append("a worker process ended before it was ready")
                warnings.warn("the numpy backend's worker processes could not start (see "
                              "their error above); it runs on threads", RuntimeWarning,
                              stacklevel=4)
                return None
        try:
            _POOL = Pool(count)
        except OSError as exc:
            _FAILED.append(str(exc))
            warnings.warn(f"the numpy backend's worker processes could not start ({exc}); "
                          f"it runs on threads", RuntimeWarning, stacklevel=4)
            return None
        return _POOL


def _shutdown():
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close(ABANDON_S)


def _after_fork():
    """In a forked child: the parent's pool is not this process's (`_pool` starts another);
    the child's copies of its sockets close."""
    global _POOL
    pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


atexit.register(_shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


# -- a run on the pool ------------------------------------------------------------------------
class RunWorkers:
    """A backend's runs on the pool: when a pass goes there, attaching a run, a pass on it
    (as the backend's `_run` returns it), detaching."""

    def __init__(self):
        self._run = None       # (pool, _RunBuffers, seen) of the attached run
        self._held = None      # weakref to the labels array the run's labels hold
        self._finalizer = None

    def pass_on_workers(self, X, mean, w, mode, plan, threads, n_tasks, wanted) -> bool:
        """Whether this pass runs on the workers: a Lloyd iteration on X in shared memory
        (`shared_empty`) with `wanted` true attaches a run once the pool is ready (it is
        started at the first such pass); the run's passes to its last ("final",
        "inertia") use it; anything else ends it."""
        seen = _Seen(X, w, (plan.threads, plan.block, X.shape, X.dtype.str, plan.k))
        if self._run is not None:
            if self._run[0].pid != os.getpid():   # (attached in the process this one forked)
                self._run, self._held = None, None
                self._finalizer.detach()
            elif self._run[2].same(seen) and mode in ("iter", "final", "inertia"):
                return True
            else:
                self.detach()
        if mode != "iter" or not wanted or mean is not None or threads < 2:
            return False
        where = segment_of(X)
        if where is None:
            return False
        pool = _pool(threads)
        if pool is None or not pool.ready() or not pool.busy.acquire(blocking=False):
            return False
        self._attach(pool, X, w, where, plan, threads, n_tasks, seen)
        return True

    def _attach(self, pool, X, w, where, plan, threads, n_tasks, seen):
        """Attach a run (`pool.busy` held): the workers map X and the run's memory."""
        from kmeans_xp.contract.backend import compact_labels_dtype
        try:
            bufs = RunBuffers(X.shape[0], compact_labels_dtype(plan.k), threads,
                              blocks.Acc.flat_size(plan.k, plan.d), (plan.k, plan.d),
                              X.dtype, w)
        except BaseException:
            pool.busy.release()
            raise
        self._run, self._held = (pool, bufs, seen), None
        self._finalizer = weakref.finalize(self, _release, pool, bufs)
        plan_fields = {a: getattr(plan, a) for a in PLAN_FIELDS}
        meta = {"x": (where[1], X.dtype.str, X.shape), "plan": plan_fields, "threads": threads,
                "n_tasks": n_tasks, **bufs.meta}
        self._call(lambda: [_send_attach(pool, t, meta, (where[0], bufs.fd))
                            for t in range(threads)])

    def _call(self, send):
        """send(), then every worker's reply. A worker's error is raised once all replies
        are read (the run ends, the pool stays); anything else (a worker ended, an
        interruption, a broken socket) may leave replies unread: the pool goes."""
        pool = self._run[0]
        try:
            send()
            failed = pool.replies()
        except BaseException:
            self.detach(broken=True)
            raise
        if failed is not None:
            self.detach()
            raise failed

    def run(self, X, centers, mode, labels_in, labels_old, plan):
        """(labels, None, summed accumulators, operands) of one pass on the workers."""
        pool, bufs, _ = self._run
        try:
            if mode != "final":   # the labels the workers read
                self._put_labels(bufs, labels_old if mode == "iter" else labels_in)
            np.copyto(bufs.centers, centers, casting="unsafe")
        except BaseException:
            self.detach()
            raise
        self._call(lambda: pool.send(("pass", mode)))
        accs = [blocks.Acc.from_flat(s, plan.k, plan.d, plan.sorted_sums)
                for s in bufs.slots]
        labels = None if mode == "inertia" else self._take_labels(
            bufs, bufs.labels.dtype if mode == "iter" else np.int32)
        ops = blocks.Operands(bufs.centers.copy(), X.dtype) if (
            mode == "iter") else None
        if mode != "iter":   # the run's last pass
            self.detach()
        return labels, None, blocks.merged(accs), ops

    def _put_labels(self, bufs, labels):
        if labels is None:
            return
        if self._held is None or self._held() is not labels:
            np.copyto(bufs.labels, labels, casting="unsafe")
        self._held = None

    def _take_labels(self, bufs, dtype):
        out = np.empty(bufs.labels.shape, dtype=dtype)
        np.copyto(out, bufs.labels, casting="unsafe")
        self._held = weakref.ref(out) if out.dtype == bufs.labels.dtype else None
        return out

    def detach(self, broken=False):
        """End the attached run: the workers drop its memory (broken: the pool goes)."""
        run, self._run, self._held = self._run, None, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if run is not None:
            _release(run[0], run[1], broken)


def _send_attach(pool, t, meta, fds):
    pool.send(("attach", t, meta), t)   # (t: its share of each pass)
    try:
        for fd in fds:
            send_handle(pool.conns[t], fd, pool.procs[t].pid)
    except OSError:
        raise pool._ended(t) from None


def _release(pool, bufs, broken=False):
    global _POOL
    try:
        if not broken:
            try:
                pool.send(("detach",))
            except WorkerEnded:   # (one ended since the run's last pass)
                broken = True
        if broken:
            with _POOL_LOCK:
                pool.close(ABANDON_S)
                if _POOL is pool:
                    _POOL = None
    finally:
        bufs.close()
        pool.busy.release()


class _Seen:
    """The X and weights of a pass (by identity, held weakly) and its plan's key."""

    __slots__ = ("x", "w", "key")

    def __init__(self, X, w, key):
        self.x, self.key = weakref.ref(X), key
        self.w = None if w is None else weakref.ref(w)

    def same(self, other):
        x = self.x()
        return other is not None and self.key == other.key and x is not None and (
            x is other.x()) and (self.w is None if other.w is None else (
                self.w is not None and self.w() is other.w()))
