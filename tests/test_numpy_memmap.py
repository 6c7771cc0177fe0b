"""The numpy backend (and the numba backend) on a numpy.memmap reads X block by block
(`kmeans_xp.contract.rows.HostRows`): no centered copy, no n x d temporary. The anonymous memory of a
fit (RssAnon, sampled in a thread; and the NumPy allocations tracemalloc sees) stays within
max_memory (the backend's buffers are planned inside it), plus labels_ (int32, the output),
the compact labels of the last two iterations (1 byte a row each up to 256 clusters; gone
before the final pass writes labels_, which keeps no distances) and a few MiB of Python
objects; a centered copy would add n * d * 4 bytes and fail. The answer is the in-memory
fit's, and the file is never written. The n = 1e8 case (a 1.2 GB file) is marked slow."""
import ctypes
import hashlib
import importlib.util
import threading
import time
import tracemalloc

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.contract.backend import LABELS_DTYPE, compact_labels_dtype

SLACK = 6 << 20  # Python objects, the thread pool, allocator rounding
#: RssAnon only: what glibc's per-thread arenas keep of the small blocks freed in them
ARENA_SLACK = 16 << 20


def _rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status")


class _PeakAnon:
    """Peak RssAnon above the level at entry (a thread samples it every millisecond), and
    tracemalloc's peak of the NumPy and Python allocations, over the `with` body."""

    def __enter__(self):
        try:  # glibc: free memory it kept goes back, so that reusing it counts
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        self.base = _rss_anon()
        self.peak, self._stop = self.base, False
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        tracemalloc.start()
        return self

    def _sample(self):
        while not self._stop:
            self.peak = max(self.peak, _rss_anon())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self.traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self._stop = True
        self._thread.join()
        self.anon = max(self.peak, _rss_anon()) - self.base


def _write(path, n, d, k, seed=0):
    """A float32 file of n x d blob data written in pieces; k rows spread through it as the
    initial centers."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, (k, d)).astype(np.float32)
    mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(n, d))
    step = 1 << 22
    for s in range(0, n, step):
        m = min(step, n - s)
        mm[s:s + m] = centers[rng.integers(0, k, m)] + rng.normal(size=(m, d)).astype(np.float32)
    mm.flush()
    init = np.array(mm[:: n // k][:k])
    del mm
    return init


def _digest(path):
    h, buf = hashlib.sha256(), bytearray(1 << 16)
    with open(path, "rb") as f:
        while (m := f.readinto(buf)):
            h.update(memoryview(buf)[:m])
    return h.hexdigest()


def _allowed(n, k, max_memory, init_bytes=0):
    # max_memory + labels_ (int32: 4 n bytes, the fit's output) + the iterations' compact
    # labels, the last two generations (labels_old and the new ones: 2 n bytes for k <= 256)
    # + slack. (The two never peak together: the iterations' are dropped before the final
    # pass, except on strict convergence, where the last ones widen into labels_: 5 n.)
    # init_bytes: the init's own O(n) arrays, gone before Lloyd's come
    labels_out = n * LABELS_DTYPE.itemsize
    iterations = 2 * n * compact_labels_dtype(k).itemsize
    return max_memory + max(labels_out + iterations, init_bytes) + SLACK


def _beside_driver(n, d, k, budget, weighted=False, backend="numpy"):
    """max_memory leaving `budget` bytes to the backend's buffers beside the driver's arrays
    (labels, init, and the centered copy the in-memory reference fit makes: max_memory
    bounds them all)."""
    from kmeans_xp import get_backend
    from kmeans_xp.contract.fitmemory import least_max_memory
    return least_max_memory(get_backend(backend), n, d, k, 4, weighted=weighted) + budget


def _fit_and_compare(path, n, d, k, init, max_memory, backend="numpy", **kw):
    X = np.memmap(path, dtype=np.float32, mode="r+", shape=(n, d))
    before = _digest(path)
    km = KMeans(k, init=init, backend=backend, max_memory=max_memory, random_state=0, **kw)
    km.fit(np.array(X[:5000]))  # the thread pool, BLAS, imports: not the fit's memory
    with _PeakAnon() as peak:
        km.fit(X)
    assert _digest(path) == before, "the fit wrote to the memmap"
    labels, inertia = np.asarray(km.labels_), km.inertia_
    centers, n_iter = km.cluster_centers_, km.n_iter_
    del km
    ref = KMeans(k, init=init, backend=backend, max_memory=max_memory, random_state=0,
                 **kw).fit(np.array(X))
    np.testing.assert_array_equal(labels, ref.labels_)
    assert n_iter == ref.n_iter_
    assert inertia == pytest.approx(ref.inertia_, rel=1e-9)
    np.testing.assert_allclose(centers, ref.cluster_centers_, rtol=1e-6, atol=1e-6)
    return peak


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba is not installed"))])
@pytest.mark.parametrize("init", ["array", "k-means++"])
def test_memmap_fit_reads_blocks_and_gives_the_in_memory_fit(tmp_path, init, backend):
    n, d, k = 4_000_000, 3, 16
    path = tmp_path / "X.f32"
    centers = _write(path, n, d, k)
    max_memory = _beside_driver(n, d, k, 8 << 20, backend=backend)
    peak = _fit_and_compare(path, n, d, k, centers if init == "array" else init, max_memory,
                            backend=backend, max_iter=4, tol=1e-4)
    copy = n * d * 4
    # (k-means++'s running distances, their float64 cumulative sums and the next ones,
    # 20 n bytes measured, are gone before Lloyd's label arrays come; but glibc keeps much
    # of the heap they were cut from, RssAnon that no array holds: measured 66 MiB after it
    # at this n, 16 after malloc_trim)
    allowed = _allowed(n, k, max_memory, 20 * n if init == "k-means++" else 0)
    kept = 16 * n if init == "k-means++" else 0
    for what, used, bound in (("RssAnon", peak.anon, allowed + ARENA_SLACK + kept),
                              ("tracemalloc", peak.traced, allowed)):
        assert used <= bound, f"{what} rose {used / 2**20:.1f} MiB, more than " \
            f"{bound / 2**20:.1f} (X is {copy / 2**20:.1f} MiB)"
    path.unlink()


@pytest.mark.parametrize("init", ["random", "k-means||", "k-means++"])
@pytest.mark.parametrize("d", [3, 20])
def test_memmap_fits_match_in_memory_fits(tmp_path, init, d):
    """Every init, with weights and an empty cluster to relocate, the sorted sums (d >= 16)
    too; predict and score read the memmap in blocks the same way."""
    n, k = 50_021, 7
    path = tmp_path / "X.f32"
    _write(path, n, d, k, seed=d)
    X = np.memmap(path, dtype=np.float32, mode="r", shape=(n, d))
    w = np.random.default_rng(3).uniform(0.5, 2, n).astype(np.float32)
    kw = dict(init=init, max_iter=20, backend="numpy", random_state=4,
              max_memory=_beside_driver(n, d, k, 2 << 20, weighted=True))
    got = KMeans(k, **kw).fit(X, sample_weight=w)
    ref = KMeans(k, **kw).fit(np.array(X), sample_weight=w)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-9)
    np.testing.assert_array_equal(got.predict(X), ref.predict(np.array(X)))
    assert got.score(X) == pytest.approx(ref.score(np.array(X)), rel=1e-9)
    far = np.array(X[:k]).copy()
    far[0] += 1e4  # nobody's nearest: relocated to the farthest point
    bound = _beside_driver(n, d, k, 2 << 20)
    a = KMeans(k, init=far, max_iter=5, backend="numpy", max_memory=bound).fit(X)
    b = KMeans(k, init=far, max_iter=5, backend="numpy", max_memory=bound).fit(np.array(X))
    np.testing.assert_array_equal(a.labels_, b.labels_)


def test_memmap_fit_with_copy_x_false_computes_on_x_as_given(tmp_path):
    n, d, k = 200_003, 3, 8
    path = tmp_path / "X.f32"
    init = _write(path, n, d, k, seed=1)
    X = np.memmap(path, dtype=np.float32, mode="r+", shape=(n, d))
    before = _digest(path)
    km = KMeans(k, init=init, max_iter=5, backend="numpy", copy_x=False).fit(X)
    assert _digest(path) == before
    ref = KMeans(k, init=init, max_iter=5, backend="numpy", copy_x=False).fit(np.array(X))
    np.testing.assert_array_equal(km.labels_, ref.labels_)
    np.testing.assert_array_equal(km.predict(X), ref.labels_)


@pytest.mark.large
def test_memmap_fit_of_1e8_rows_stays_within_max_memory(tmp_path):
    """n = 1e8, d = 3, float32: a 1.2 GB file. A centered copy would be 1.2 GB more."""
    n, d, k = 100_000_000, 3, 8
    path = tmp_path / "X.f32"
    try:
        init = _write(path, n, d, k, seed=2)
        max_memory = _beside_driver(n, d, k, 256 << 20)
        peak = _fit_and_compare(path, n, d, k, init, max_memory, max_iter=3, tol=0)
        allowed = _allowed(n, k, max_memory)
        print(f"n={n}: RssAnon rose {peak.anon / 2**30:.3f} GiB, tracemalloc peak "
              f"{peak.traced / 2**30:.3f} GiB, allowed {allowed / 2**30:.3f} GiB")
        assert peak.anon <= allowed + ARENA_SLACK, f"RssAnon rose " \
            f"{peak.anon / 2**30:.2f} GiB, more than {allowed / 2**30:.2f}"
        assert peak.traced <= allowed
    finally:
        path.unlink(missing_ok=True)
