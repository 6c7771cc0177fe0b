"""Thread pools a Ctrl-C cannot split. `ThreadPoolExecutor.submit` starts a thread and then
registers it for the interpreter's exit; a KeyboardInterrupt between the two (a Ctrl-C as a
fit starts its threads) leaves a thread that nobody wakes and that the interpreter joins at
exit: the process hangs instead of ending. Here a Ctrl-C during `submit` is held back and
delivered once the thread is registered."""
from __future__ import annotations

import contextlib
import signal
import threading
from concurrent.futures import ThreadPoolExecutor


_deferring = False   # (the main thread is inside `ctrl_c_deferred`)


@contextlib.contextmanager
def ctrl_c_deferred():
    """Run the block with SIGINT's Python handler held back: a Ctrl-C during it is handed to
    that handler (KeyboardInterrupt, by default) when the block ends. Only the main thread
    runs Python signal handlers; elsewhere, or where SIGINT has no Python handler (ignored,
    the C default), the block runs as it is."""
    global _deferring
    handler = None
    if threading.current_thread() is threading.main_thread() and not _deferring:
        handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):   # (also inside a deferred block: the outer one delivers it)
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
        signal.signal(signal.SIGINT, handler)
        if caught:
            handler(signal.SIGINT, caught[0])


class ThreadPool(ThreadPoolExecutor):
    """A `ThreadPoolExecutor` whose `submit` (which may start a thread) a Ctrl-C does not
    split: the interrupt comes when `submit` returns, with the job queued and its thread
    known to the interpreter's exit."""

    def __init__(self, count, name):
        super().__init__(count, thread_name_prefix=name)

    def submit(self, fn, /, *args, **kwargs):
        with ctrl_c_deferred():
            return super().submit(fn, *args, **kwargs)
