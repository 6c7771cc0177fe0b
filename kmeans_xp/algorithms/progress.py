"""What a fit tells while it runs: the "kmeans_xp" logger, and progress bars.

Library code logs through `logger` and never prints. `verbose` on the estimator attaches a
handler writing to stdout for the fit's duration (scikit-learn's verbose output goes there);
users who configure logging themselves get the same records without it. Progress bars are
tqdm.auto's (a widget in Jupyter, text in a terminal) when tqdm is installed and the fit is
verbose; otherwise nothing.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time

logger = logging.getLogger("kmeans_xp")


@contextlib.contextmanager
def verbose_logging(verbose):
    """While a fit with verbose > 0 runs, the logger's records reach stdout."""
    if not verbose:
        yield
        return
    handler = logging.StreamHandler(sys.stdout)
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
    """A tqdm.auto bar of `total` steps when enabled and tqdm is installed, else a no-op."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
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
