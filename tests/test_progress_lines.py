"""verbose=1 with a progress bar: the bar (stderr) and the iteration lines (stdout) never share
a screen line, on a terminal (a pty, both streams on it) or not (both into one pipe); and
`progress_bars(False)` (the command's --no-progress) leaves the lines without the bar."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.algorithms.progress import progress_bars

pytest.importorskip("tqdm")

FIT = """
import numpy as np
from kmeans_xp import KMeans
X = np.random.default_rng(0).normal(size=(20001, 3)).astype(np.float32)
KMeans(8, init="random", n_init=1, max_iter=15, tol=0, random_state=0, backend="numpy",
       verbose=1).fit(X)
"""
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: the Lloyd progress bar's text as tqdm draws it: "Lloyd:  40%|####  | 6/15 [...]"
BAR = re.compile(r"Lloyd: +\d+%\|")


def screen(raw: str) -> list:
    """The lines a terminal shows for `raw`: a carriage return goes back to the line's
    start and what follows overwrites it; escape sequences (cursor moves) are dropped."""
    lines, line, col = [], [], 0
    for ch in CSI.sub("", raw):
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        else:
            line[col:col + 1] = [ch] if col < len(line) else line[col:] + [ch]
            col += 1
    lines.append("".join(line).rstrip())
    return lines


def run_on_a_pty(code):
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    # a terminal of 40 rows by 120 columns (a new pty is 0 x 0: tqdm would draw nothing)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=slave, stderr=slave,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    return b"".join(chunks).decode(errors="replace")


def run_into_one_pipe(code):
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout.decode()


@pytest.mark.parametrize("where", ["tty", "pipe"])
def test_bars_and_iteration_lines_never_overwrite_each_other(where):
    if where == "tty" and not sys.platform.startswith(("linux", "darwin")):
        pytest.skip("a pty: POSIX")
    raw = run_on_a_pty(FIT) if where == "tty" else run_into_one_pipe(FIT)
    shown = screen(raw)
    iteration = [line for line in shown if "Iteration" in line]
    assert len(iteration) == 15, shown
    for line in iteration:  # whole: no bar before it, no bar drawn over it
        assert re.fullmatch(r"Iteration \d+, inertia \S+, center shift \S+", line), line
    # the other verbose lines (e.g. "assignment: Lloyd's kernels: ...") are whole too
    assert any(line.startswith("assignment: ") for line in shown), shown
    for line in shown:
        if line.startswith("assignment: "):
            assert not BAR.search(line), line
    # the bar is told by its own text ("Lloyd:  40%|..."), not by the word "Lloyd", which
    # the "assignment: Lloyd's kernels" line also holds
    if where == "tty":
        assert BAR.search(raw)  # the bar was drawn (and cleared) around the lines
    else:
        assert not BAR.search(raw) and "\r" not in raw  # off a terminal: the lines alone


def test_no_progress_bars_keeps_the_lines_and_drops_the_bar(capsys):
    X = np.random.default_rng(0).normal(size=(2001, 3)).astype(np.float32)
    with progress_bars(False):
        KMeans(4, n_init=1, max_iter=5, tol=0, random_state=0, backend="numpy",
               verbose=1).fit(X)
    captured = capsys.readouterr()
    assert captured.out.count("Iteration") == 5
    assert "Lloyd" not in captured.err and "it/s" not in captured.err
