"""The scipy-sparse backend's threads (`kmeans_xp_backends.numpy.sparse`): chunks of rows on
several threads give the one-thread fit, the same bits from run to run (the sums per cluster
added in row order), within the memory budget, and a chunk that fails stops the others."""
import threading
import time

import numpy as np
import pytest

sp = pytest.importorskip("scipy.sparse")

from kmeans_xp_backends.numpy import sparse_threads  # noqa: E402

from kmeans_xp import KMeans  # noqa: E402


def _data(n, d=150, seed=5):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=0.05, format="csr", random_state=seed, dtype=np.float64)
    X = X + sp.csr_matrix((np.full(n, 4.0), (np.arange(n), rng.integers(0, 6, n))),
                          shape=(n, d))
    return sp.csr_matrix(X), rng.uniform(0.5, 2.0, n)


def _fit(X, w, threads, monkeypatch):
    monkeypatch.setattr(sparse_threads, "usable_cores", lambda: threads)
    monkeypatch.setattr(sparse_threads, "MIN_THREADED_WORK", 0)
    return KMeans(6, init=X[:6].toarray(), n_init=1, max_iter=20, tol=0,
                  backend="scipy-sparse").fit(X, sample_weight=w)


def test_threaded_fit_is_the_one_thread_fit(monkeypatch):
    """n = 20_003 rows on 3 threads: 12 chunks, the last one row short; the labels are the
    one-thread fit's, the centers its own up to the order of the float64 sums, and a second
    threaded fit gives the same bits."""
    X, w = _data(20_003)
    one = _fit(X, w, 1, monkeypatch)
    three = _fit(X, w, 3, monkeypatch)
    step, threads = sparse_threads.steps(X.shape[0], X.shape[0], 1 << 40, np)
    assert threads == 3 and X.shape[0] % step and -(-X.shape[0] // step) == 12
    again = _fit(X, w, 3, monkeypatch)
    np.testing.assert_array_equal(three.labels_, one.labels_)
    assert three.n_iter_ == one.n_iter_
    np.testing.assert_allclose(three.cluster_centers_, one.cluster_centers_, rtol=1e-12,
                               atol=1e-12)
    assert three.inertia_ == pytest.approx(one.inertia_, rel=1e-12)
    np.testing.assert_array_equal(again.cluster_centers_, three.cluster_centers_)
    np.testing.assert_array_equal(again.labels_, three.labels_)


@pytest.mark.parametrize("threads", [2, 3, 16])
@pytest.mark.parametrize("n,rows", [(20_003, 20_003), (300_000, 435_000), (10**6, 20_000),
                                    (50_000, 5_000), (5_000, 100)])
def test_threads_stay_within_the_budget(monkeypatch, threads, n, rows):
    """Each thread holds at most its share of the budget's rows; chunks come in whole
    rounds of the threads where the rows allow it."""
    monkeypatch.setattr(sparse_threads, "usable_cores", lambda: threads)
    step, used = sparse_threads.steps(n, rows, 1 << 40, np)
    assert step >= 1
    if used == 1:
        assert step <= rows
        return
    assert used == threads and step * threads <= rows
    chunks = -(-n // step)
    if step > sparse_threads.MIN_CHUNK_ROWS:
        assert chunks % threads == 0 and chunks >= 4 * threads


def _parts(count, k, d, seed=0):
    """Sparse (k, d) sums of `count` chunks, values of many scales (so the order of the
    additions shows in the bits), and the chunks' row slices (uneven)."""
    rng = np.random.default_rng(seed)
    parts = [sp.random(k, d, density=0.3, format="csr", random_state=seed + i,
                       data_rvs=lambda m: rng.standard_normal(m) * 10.0 ** rng.integers(
                           -8, 8, m)) for i in range(count)]
    stops = np.cumsum(rng.integers(1, 50, count))
    return parts, [slice(int(a), int(b)) for a, b in zip(np.r_[0, stops[:-1]], stops)]


def test_sums_are_added_in_row_order_whatever_the_threads():
    k, d = 7, 40
    parts, slices = _parts(8, k, d)
    expected = np.zeros((k, d))
    for part in parts:
        expected += part.toarray()   # (+ 0.0 changes no bits: the row order's sums)
    acc = sparse_threads.OrderedSums(np, k, d, stripes=3)
    rng = np.random.default_rng(1)
    delays = rng.uniform(0, 0.01, len(parts))

    def chunk(i):
        time.sleep(delays[i])
        return parts[i], i

    order = list(range(len(parts)))[::-1]   # the last chunk first
    workers = [threading.Thread(target=acc.fold, args=(slices[i], lambda i=i: chunk(i)))
               for i in order]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in workers)
    np.testing.assert_array_equal(acc.sums, expected)


def test_a_failing_chunk_stops_the_later_ones():
    """A chunk that raises lets the chunks after it raise instead of waiting for it forever;
    the chunks before it add their sums."""
    k, d = 5, 20
    parts, slices = _parts(4, k, d)
    acc = sparse_threads.OrderedSums(np, k, d, stripes=2)
    errors = {}

    def run(i):
        def compute():
            if i == 1:
                raise MemoryError("chunk 1")
            return parts[i], i
        try:
            acc.fold(slices[i], compute)
        except BaseException as e:   # noqa: BLE001 (the test reads it)
            errors[i] = e

    workers = [threading.Thread(target=run, args=(i,)) for i in (3, 2, 1, 0)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in workers)
    assert isinstance(errors.pop(1), MemoryError)
    assert set(errors) == {2, 3} and all(isinstance(e, RuntimeError) for e in errors.values())
    np.testing.assert_array_equal(acc.sums, parts[0].toarray())
