"""A worker process of the numpy backend (`numpy_pool` starts them): it greets, then serves
its parent's messages: "attach" (a run: X's and the run's shared memory arrive as
descriptors, `numpy_shm`), "pass" (its share of a pass, `numpy_blocks.run_share`),
"detach"; it leaves when its socket closes or after its idle seconds without a message."""
from __future__ import annotations

import mmap
import os
import pickle
import signal
import sys
import time
import traceback
import types
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

from kmeans_xp_backends.numpy import blocks as blocks
from kmeans_xp_backends.numpy.shm import view


def live():
    """The worker's life (`main`), silent when its parent goes: a socket closed at any
    point, even before the greeting (the parent exited or was interrupted while this
    process started), ends it without a traceback."""
    try:
        main()
    except (OSError, EOFError, KeyboardInterrupt):
        pass


def main():
    """A worker process: greet, then serve messages until its socket closes or IDLE_S pass
    without one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # (the parent, interrupted, ends it)
    conn, idle_s = Connection(int(sys.argv[1])), float(sys.argv[2])
    conn.send("ready")
    run = None
    while True:
        try:
            if not conn.poll(idle_s):
                return
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            if message[0] == "attach":
                run = None
                run = _WorkerRun(message[1], message[2], recv_handle(conn),
                                 recv_handle(conn))
            elif message[0] == "pass":
                run.serve(message[1])
            else:   # "detach": nothing to reply
                run = None
                continue
            reply = ("ok", time.perf_counter() - t0, time.process_time() - c0)
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, raised there
            reply = ("error", _portable(exc), traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:   # the parent is gone
            return


class _WorkerRun:
    """A worker's view of an attached run: X and the run's segment mapped, its buffers."""

    def __init__(self, t, meta, x_fd, run_fd):
        self.t, self.meta = t, meta
        try:
            # (X read only: a worker never writes it)
            self._maps = [mmap.mmap(x_fd, 0, access=mmap.ACCESS_READ),
                          mmap.mmap(run_fd, 0, access=mmap.ACCESS_WRITE)]
        finally:
            os.close(x_fd)
            os.close(run_fd)
        self.X = view(self._maps[0], meta["x"])
        self.labels, slots, self.centers, self.w = (
            None if meta[name] is None else view(self._maps[1], meta[name])
            for name in ("labels", "slots", "centers", "w"))
        self.slot = slots[t]
        self.plan = plan = types.SimpleNamespace(**meta["plan"])
        self.bufs = blocks.allocate(plan.block, plan.sub_alone, plan.k, plan.d, self.X.dtype,
                                    sorted_sums=plan.sorted_sums, group=plan.group,
                                    diff_rows=plan.diff_rows)

    def serve(self, mode):
        """This worker's share of a pass: labels in the shared labels (the old ones read
        there), accumulators into its slot. Its GEMM sub-chunks are one thread's
        (`sub_alone` of the backend's plan): it shares no GIL."""
        m, plan = self.meta, self.plan
        c = self.centers.copy()
        ops = None if mode == "inertia" else blocks.Operands(c, self.X.dtype)
        p = blocks.Pass(mode, self.X, None, self.w, plan, ops, c, threads=m["threads"],
                        n_tasks=m["n_tasks"], sub=plan.sub_alone,
                        labels=None if mode == "inertia" else self.labels,
                        labels_in=self.labels if mode == "inertia" else None,
                        labels_old=self.labels if mode == "iter" else None)
        blocks.run_share(p, self.t, self.bufs).to_flat(self.slot)


def _portable(exc):
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception that does not pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")
