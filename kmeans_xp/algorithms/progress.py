"""What a fit tells while it runs: the "kmeans_xp" logger, and progress bars.

Library code logs through `logger` and never prints. `verbose` on the estimator attaches a
handler writing to stdout for the fit's duration (scikit-learn's verbose output goes there);
users who configure logging themselves get the same records without it (with a bar on the
terminal, wrap the fit in tqdm's `tqdm.contrib.logging.logging_redirect_tqdm()`). Progress
bars are tqdm.auto's (a widget in Jupyter, text at a terminal, none in a pipe or a log)
when tqdm is installed and the fit is verbose; otherwise nothing. `progress_bars(False)`
turns them off for a block (the command's --no-progress) and leaves the lines.

The bar is on stderr and the lines on stdout, which a terminal shows on the same screen: a
line written while a bar is drawn would land after the bar's text and be overwritten by its
next redraw. So with tqdm installed the lines go through `tqdm.write`, which clears the bars,
writes the line, and draws them again below it: on a terminal or not, each line is whole.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time

logger = logging.getLogger("kmeans_xp")

#: whether a verbose fit draws bars (`progress_bars`); the lines are written either way
_BARS = contextvars.ContextVar("kmeans_xp_progress_bars", default=True)


@contextlib.contextmanager
def progress_bars(enabled=True):
    """Within the block, verbose fits draw progress bars only if `enabled`."""
    token = _BARS.set(bool(enabled))
    try:
        yield
    finally:
        _BARS.reset(token)


class _LineHandler(logging.StreamHandler):
    """A record per line on `stream`, through `tqdm.write` where tqdm is installed (so a
    bar drawn on the terminal is cleared first and redrawn after)."""

    def emit(self, record):
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return super().emit(record)
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: report, never raise
            self.handleError(record)


@contextlib.contextmanager
def verbose_logging(verbose):
    """While a fit with verbose > 0 runs, the logger's records reach stdout."""
    if not verbose:
        yield
        return
    handler = _LineHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def bar(total, desc, enabled):
    """A tqdm.auto bar of `total` steps when enabled (and not turned off by `progress_bars`)
    and tqdm is installed, else a no-op. Off a terminal (a pipe, a log file) there is no
    bar either: its redraws would be noise there, and the verbose lines say the progress;
    Jupyter's widget bar is drawn."""
    if not enabled or not _BARS.get():
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    widget = tqdm.__module__.startswith("tqdm.notebook")
    if not widget and not getattr(sys.stderr, "isatty", lambda: False)():
        return _NoBar()
    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr)


class Clock:
    """Wall-clock laps of a fit, for timings_: the seconds of each stage and the total."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.laps = {}

    def lap(self, name):
        now = time.perf_counter()
        self.laps[name] = now - self.last
        self.last = now

    def skip(self):
        """Move the mark on without a lap: a stage its caller times itself."""
        self.last = time.perf_counter()

    def total(self):
        return time.perf_counter() - self.start
