"""Chunks of CSR rows on the host's cores for the sparse path (`sparse`): how many rows a
chunk and how many threads (`steps`), and the per-cluster sums that the chunks add from their
own threads in row order (`OrderedSums`), so that a threaded fit gives the same bits from run
to run."""
from __future__ import annotations

import threading

import numpy as np

from kmeans_xp.contract.chunks import usable_cores


#: fewest rows in a chunk of a threaded pass: a sparse row costs k products per stored value
#: (1024 TF-IDF rows at k=100: milliseconds, far more than handing a chunk to a thread)
MIN_CHUNK_ROWS = 1024
#: fewest products (stored values x clusters) of a pass that runs on threads: below, handing
#: out chunks costs more than it gives (n=3000 at k=10: 9 ms an iteration on 2 threads, 7.5
#: on one)
MIN_THREADED_WORK = 1 << 24


def steps(n, rows, work, lib):
    """(rows per chunk, threads) of a pass of `work` products whose budget allows `rows` rows
    at once. On the host the chunks run on all cores, each thread holding at most rows /
    threads rows (the threads together stay within the budget), in a multiple of `threads`
    chunks of equal rows, four per thread or more: the last round of chunks keeps every core
    busy (37 chunks on 16 cores left 11 idle for a third of the pass) and a thread slowed
    down holds it up less. On a GPU in turn (it queues them)."""
    threads = usable_cores() if lib is np else 1
    share = rows // threads
    if threads == 1 or work < MIN_THREADED_WORK or n < 2 * MIN_CHUNK_ROWS or share == 0:
        return rows, 1
    rounds = max(4, -(-n // (threads * share)))
    return min(share, max(MIN_CHUNK_ROWS, -(-n // (threads * rounds)))), threads


class OrderedSums:
    """The (k, d) float64 sums per cluster of a pass, which each chunk of rows adds its own
    into from its thread. The clusters are split in stripes; a chunk adds into a stripe once
    the chunk before it (in row order) has, so every sum is added in row order whatever the
    threads' timing (a fit is the same from run to run), while chunks add into different
    stripes at once (one thread adding every chunk's sums was slower than the chunks
    themselves on 16 cores). A chunk waits only for earlier chunks, which the pool took
    before it (first in, first out): running or done, never waiting for it.

    A chunk's sparse sums (each (cluster, column) once) go in by a gather, an add and a
    fancy assignment (take and the assignment release the GIL; `+=` on a fancy index took
    three times as long); a GPU's dense ones (its chunks run in turn) by `+=`."""

    def __init__(self, lib, k, d, stripes=None):
        if stripes is None:   # (one a core: the threads seldom meet)
            stripes = usable_cores() if lib is np else 1
        self.d = d
        self.sums = lib.zeros((k, d), dtype=lib.float64)
        edges = np.linspace(0, k, max(1, min(stripes, k)) + 1).astype(np.int64).tolist()
        self.stripes = list(zip(edges[:-1], edges[1:]))
        self.next_start = [0] * len(self.stripes)   # the first row of the chunk due next
        self.failed_at = None   # the first row of the earliest chunk that raised
        self.cond = threading.Condition()

    def fold(self, sl, compute):
        """compute() -> (the sums of rows `sl`, the rest): the sums added, the rest returned.
        A chunk that raises lets the later ones stop waiting for it."""
        try:
            part, rest = compute()
            self.add(sl, part)
            return rest
        except BaseException:
            with self.cond:
                self.failed_at = (sl.start if self.failed_at is None
                                  else min(self.failed_at, sl.start))
                self.cond.notify_all()
            raise

    def add(self, sl, part):
        if not hasattr(part, "indptr"):
            self.sums += part
            return
        ip, flat = part.indptr, self.sums.reshape(-1)
        at = np.repeat(np.arange(part.shape[0], dtype=np.int64) * self.d, np.diff(ip))
        at += part.indices
        todo = list(range(len(self.stripes)))
        while todo:
            ready = self._due(sl, todo)
            for s in ready:   # (stripe s is this chunk's until next_start moves on)
                lo, hi = int(ip[self.stripes[s][0]]), int(ip[self.stripes[s][1]])
                if hi > lo:
                    pos = at[lo:hi]
                    values = np.take(flat, pos)
                    values += part.data[lo:hi]
                    flat[pos] = values
                with self.cond:
                    self.next_start[s] = sl.stop
                    self.cond.notify_all()
            todo = [s for s in todo if s not in ready]

    def _due(self, sl, todo):
        """The stripes of `todo` that rows `sl` are due to add into (waits for one)."""
        with self.cond:
            while True:
                if self.failed_at is not None and self.failed_at < sl.start:
                    raise RuntimeError("an earlier chunk of rows failed")
                ready = [s for s in todo if self.next_start[s] == sl.start]
                if ready:
                    return ready
                self.cond.wait()


def in_order(parts, total):
    """total (float64 zeros) += the chunks' small results, in row order."""
    for part in parts:
        total += part
    return total
