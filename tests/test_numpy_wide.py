"""The numpy backend's wide-data path (d >= WIDE_D: sub-chunks of at least WIDE_MIN_ROWS rows;
label-grouped sums whose groups all reduce into one per-thread buffer, added to the thread's
accumulators once per block; the threads' sums totalled by the threads, a share of the features
each) gives bit for bit what the formulation before it gave (256-row sub-chunks, one add per
feature group, the total added on the calling thread), on asymmetric float32 and float64 data
whose n is a multiple of neither the block nor the sub-chunk, with and without weights and empty
clusters, on one, two and five threads; and a pass whose thread fails raises its error (no
thread waits for it at the total)."""
import kmeans_xp_backends.numpy_ as nb
import kmeans_xp_backends.numpy_blocks as blocks
import numpy as np
import pytest

from kmeans_xp.testing import asymmetric_data


def _sorted_sums_per_group(Xb, src, lab, w64, acc, bufs, sq_norms):
    """`blocks.sorted_sums` as it was: each feature group's reduceat result (a new array)
    added into acc by its own call."""
    r = len(lab)
    if r == 0:
        return
    d, k = Xb.shape[1], acc.weights.shape[0]
    keys, ks = bufs["keys"][:r], bufs["ks"][:r]
    np.copyto(keys, lab, casting="unsafe")
    order = np.argsort(keys, kind="stable")
    np.take(keys, order, out=ks, mode="clip")
    starts = ks.searchsorted(bufs["key_range"])
    counts = np.empty(k, dtype=np.intp)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1])
    counts[-1] = r - starts[-1]
    filled = counts > 0
    rows = bufs["gathered"][:r * src.shape[1]].reshape(r, src.shape[1])
    np.take(src, order, axis=0, out=rows, mode="clip")
    if w64 is None:
        acc.weights += counts
    else:
        ws = bufs["ws"][:r]
        np.take(w64, order, out=ws, mode="clip")
        acc.weights += np.bincount(lab, weights=w64, minlength=k)
    where = True if filled.all() else filled
    g = bufs["group"]
    runs = (starts + np.arange(0, min(g, d) * r, r, dtype=np.intp)[:, None]).reshape(-1)
    for j0 in range(0, d, g):
        j1 = min(j0 + g, d)
        flat = bufs["cols"][:r * (j1 - j0) + 1]
        flat[-1] = 0.0
        cols = flat[:-1].reshape(j1 - j0, r)
        np.copyto(cols, rows[:, j0:j1].T)
        if sq_norms:
            if w64 is None:
                v = cols.reshape(-1)
                acc.sq_norms += float(np.dot(v, v))
            else:
                m = bufs["m64"][:r]
                np.einsum("ji,ji->i", cols, cols, out=m)
                acc.sq_norms += float(np.dot(m, ws))
        if w64 is not None:
            cols *= ws
        part = np.add.reduceat(flat, runs[:(j1 - j0) * k]).reshape(j1 - j0, k)
        out = acc.sums[j0:j1]
        np.add(out, part, out=out, where=where)


def _iterate(monkeypatch, X, w, C, threads, before):
    with monkeypatch.context() as m:
        m.setattr(nb, "TARGET_TASK_ROWS", 1500)   # several blocks per thread, a short last
        if before:
            m.setattr(nb, "WIDE_MIN_ROWS", nb.MIN_ROWS)
            m.setattr(nb, "SUMS_TOTAL_ON_THREADS", False)
            m.setattr(blocks, "sorted_sums", _sorted_sums_per_group)
        be = nb.NumpyBackend(n_threads=threads)
        first = be.lloyd_iter(X, w, C, None)
        second = be.lloyd_iter(X, w, C[::-1].copy(), first.labels)
        be.finish()
    return first, second


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_wide_path_is_the_earlier_one_bit_for_bit(monkeypatch, dtype, weighted, threads):
    n, d, k = 7_777, 130, 300
    X = asymmetric_data(n, d, 40, dtype=dtype, seed=2)
    C = X[np.random.default_rng(1).choice(n, k, replace=False)].copy()
    C[:5] += 1e3                       # clusters nobody joins (empty, skipped by `where`)
    w = (np.random.default_rng(4).uniform(0.5, 2, n).astype(dtype) if weighted else None)
    plan = nb._Plan(n, d, k, X.dtype.itemsize, "auto", threads)
    assert plan.sub >= nb.WIDE_MIN_ROWS and n % plan.sub and n % 1500
    new = _iterate(monkeypatch, X, w, C, threads, before=False)
    old = _iterate(monkeypatch, X, w, C, threads, before=True)
    for a, b in zip(new, old):
        np.testing.assert_array_equal(a.labels, b.labels)
        assert a.weighted_sums.tobytes() == b.weighted_sums.tobytes()
        assert a.weight_in_clusters.tobytes() == b.weight_in_clusters.tobytes()
        assert a.inertia.tobytes() == b.inertia.tobytes()
        assert float(a.n_changed) == float(b.n_changed)
    assert not new[0].weight_in_clusters[:5].any()


def test_a_failing_thread_fails_the_pass(monkeypatch):
    X = asymmetric_data(4_001, 70, 6, dtype=np.float32, seed=3)
    calls, sorted_sums = [], blocks.sorted_sums

    def fail_once(Xb, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("block failed")
        return sorted_sums(Xb, *args, **kwargs)

    monkeypatch.setattr(nb, "TARGET_TASK_ROWS", 1000)
    monkeypatch.setattr(blocks, "sorted_sums", fail_once)
    be = nb.NumpyBackend(n_threads=3)
    with pytest.raises(RuntimeError, match="block failed"):
        be.lloyd_iter(X, None, X[:6].copy(), None)
    be.finish()
