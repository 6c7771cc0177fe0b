"""What a comparison shows while it runs, on stderr: a tqdm bar at a terminal, a plain line
per fit elsewhere (a pipe, a CI log, a file), nothing when disabled.

A bar redrawn with carriage returns is unreadable in a log, and a comparison that prints
nothing for minutes looks hung; so off a terminal each step is one line. stdout stays the
table's (or the JSON's with --json).
"""
from __future__ import annotations

import sys


class LineProgress:
    """tqdm's `set_description_str`/`update`/`close`, as one plain line per step."""

    def __init__(self, total, file=None):
        self.total, self.done, self.text = total, 0, ""
        self.file = file

    def set_description_str(self, text):
        self.text = text

    def update(self, n=1):
        self.done += n
        file = self.file or sys.stderr
        file.write(f"kmeans-xp: [{self.done}/{self.total}] {self.text}\n")
        file.flush()

    def close(self):
        pass


def progress_for(total, enabled, file=None):
    """A tqdm bar on a terminal (when tqdm is installed), else `LineProgress`; None when not
    `enabled`."""
    if not enabled:
        return None
    file = file or sys.stderr
    if getattr(file, "isatty", lambda: False)():
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, unit="fit", leave=False, file=file)
    return LineProgress(total, file)
