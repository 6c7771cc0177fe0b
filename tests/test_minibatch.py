"""MiniBatchKMeans against scikit-learn's: the same seed and init give its steps (centers,
labels, counts, n_steps_, n_iter_, inertia) on the numpy backend, in float32 and float64,
weighted or not, through reassignments and both early stops; partial_fit's semantics; X read
batch by batch (memmap), dask input and dask-ml's Incremental; the shape of the house."""
import logging
import pickle
import subprocess
import sys
import tracemalloc
import warnings

import numpy as np
import pytest

from kmeans_xp import MiniBatchKMeans
from kmeans_xp.testing import asymmetric_data

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans  # noqa: E402

N = 3001  # no multiple of any batch size below


def _data(dtype, seed=3, offset=0.0):
    X = asymmetric_data(N, 3, 10, dtype=dtype, seed=seed, offset=offset)
    w = np.random.default_rng(seed).uniform(0.2, 3.0, N).astype(dtype)
    w[::11] = 0
    return X, w


def _assert_same(got, ref, dtype, labels=True):
    rtol = 2e-4 if dtype == np.float32 else 1e-9
    assert got.n_steps_ == ref.n_steps_
    assert getattr(got, "n_iter_", None) == getattr(ref, "n_iter_", None)
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=rtol,
                               atol=rtol * 10)
    np.testing.assert_allclose(got._counts, ref._counts, rtol=rtol)
    assert got._counts.dtype == ref._counts.dtype
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=rtol)
    if labels:
        np.testing.assert_array_equal(got.labels_, ref.labels_)


CASES = {
    "k-means++": {},
    "explicit init": {"init": "rows"},
    "random, n_init=3": {"init": "random", "n_init": 3},
    "callable": {"init": "callable", "n_init": 2},
    "no early stop": {"max_no_improvement": None, "max_iter": 8},
    "tol stop": {"tol": 1e-3, "max_iter": 50},
    "small batches, reassignments": {"batch_size": 64, "reassignment_ratio": 0.5},
    "batch larger than 10 k": {"batch_size": 700},
    "init_size": {"init_size": 120},
}


def _params(case, X):
    p = dict(n_clusters=10, random_state=1, batch_size=256)
    p.update(CASES[case])
    if p.get("init") == "rows":
        p["init"] = X[np.random.default_rng(0).choice(len(X), 10, replace=False)]
    elif p.get("init") == "callable":
        p["init"] = lambda A, k, random_state: A[random_state.permutation(len(A))[:k]]
    return p


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_fit_gives_sklearns_steps(case, dtype, weighted):
    X, w = _data(dtype)
    sw = w if weighted else None
    p = _params(case, X)
    ref = SkMiniBatchKMeans(**p).fit(X, sample_weight=sw)
    got = MiniBatchKMeans(backend="numpy", **p).fit(X, sample_weight=sw)
    _assert_same(got, ref, dtype)
    assert got.cluster_centers_.dtype == X.dtype
    np.testing.assert_array_equal(got.predict(X), got.labels_)


def test_reassignment_and_both_stops_happen(caplog):
    """The cases above do reach what they are named for."""
    X, _ = _data(np.float64)
    far = X[:10].copy()
    far[:3] += 1e3  # nobody near: their centers move to batch rows
    with caplog.at_level(logging.INFO, logger="kmeans_xp"):
        got = MiniBatchKMeans(10, init=far, batch_size=64, random_state=1, backend="numpy",
                              verbose=1).fit(X)
    assert "Reassigning 3 cluster centers" in caplog.text
    assert "lack of improvement" in caplog.text
    ref = SkMiniBatchKMeans(10, init=far, batch_size=64, random_state=1).fit(X)
    _assert_same(got, ref, np.float64)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kmeans_xp"):
        MiniBatchKMeans(10, batch_size=256, tol=1e-3, max_iter=50, random_state=1,
                        backend="numpy", verbose=1).fit(X)
    assert "small centers change" in caplog.text


def test_compute_labels_false_inertia_from_the_smoothed_batches():
    X, w = _data(np.float64)
    p = dict(n_clusters=10, random_state=2, batch_size=200, compute_labels=False)
    ref = SkMiniBatchKMeans(**p).fit(X, sample_weight=w)
    got = MiniBatchKMeans(backend="numpy", **p).fit(X, sample_weight=w)
    assert not hasattr(got, "labels_")
    _assert_same(got, ref, np.float64, labels=False)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kw", [{}, {"init": "random"}, {"reassignment_ratio": 0.4}])
def test_partial_fit_gives_sklearns_updates(dtype, kw):
    X, w = _data(dtype)
    ref = SkMiniBatchKMeans(10, random_state=4, **kw)
    got = MiniBatchKMeans(10, random_state=4, backend="numpy", **kw)
    for start in range(0, N, 400):
        sl = slice(start, start + 400)
        ref.partial_fit(X[sl], sample_weight=w[sl])
        got.partial_fit(X[sl], sample_weight=w[sl])
        _assert_same(got, ref, dtype)
        assert got._n_since_last_reassign == ref._n_since_last_reassign
    assert got.n_steps_ == -(-N // 400)


def test_partial_fit_after_fit_goes_on_from_the_fit():
    X, _ = _data(np.float64)
    ref = SkMiniBatchKMeans(10, random_state=5, batch_size=300).fit(X)
    got = MiniBatchKMeans(10, random_state=5, batch_size=300, backend="numpy").fit(X)
    for est in (ref, got):
        est.partial_fit(X[:500])
    _assert_same(got, ref, np.float64)
    # and a fit starts again from scratch
    got.fit(X)
    ref.fit(X)
    _assert_same(got, ref, np.float64)


def test_partial_fit_checks_features_and_first_batch_size():
    X, _ = _data(np.float64)
    km = MiniBatchKMeans(10, backend="numpy", random_state=0)
    with pytest.raises(ValueError, match="n_samples=5 should be >= n_clusters=10"):
        km.partial_fit(X[:5])
    km.partial_fit(X[:100])
    km.partial_fit(X[100:103])  # later batches may be smaller than k, as in sklearn
    with pytest.raises(ValueError, match="X has 2 features, but MiniBatchKMeans is expecting 3"):
        km.partial_fit(X[:100, :2])


def test_float32_far_from_the_origin_stays_accurate():
    """float32 data offset by 3e4: sklearn's distances (||c||^2 - 2 x.c in float32) lose the
    clusters; the fit computes about the data's mean there and finds them."""
    X, _ = _data(np.float32, offset=3e4)
    X64 = X.astype(np.float64)
    got = MiniBatchKMeans(10, random_state=1, batch_size=256, backend="numpy").fit(X)
    ref64 = MiniBatchKMeans(10, random_state=1, batch_size=256, backend="numpy").fit(X64)
    assert got.inertia_ == pytest.approx(ref64.inertia_, rel=1e-3)
    np.testing.assert_allclose(got.cluster_centers_, ref64.cluster_centers_, rtol=1e-5)


def test_parameters_are_checked_like_sklearns():
    X, _ = _data(np.float64)
    for bad in ({"batch_size": 0}, {"max_no_improvement": -1}, {"init_size": 0},
                {"reassignment_ratio": -0.1}, {"compute_labels": "yes"}):
        with pytest.raises(ValueError, match=list(bad)[0]):
            MiniBatchKMeans(**bad).fit(X)
    with pytest.warns(RuntimeWarning, match="init_size=5 should be larger than n_clusters=10"):
        MiniBatchKMeans(10, init_size=5, backend="numpy", max_iter=1).fit(X)
    with pytest.warns(RuntimeWarning, match="performing only one init in MiniBatchKMeans"):
        MiniBatchKMeans(10, init=X[:10], n_init=3, backend="numpy", max_iter=1).fit(X)


def test_estimator_protocol_pickle_clone_and_sklearn_twin():
    X, _ = _data(np.float64)
    km = MiniBatchKMeans(10, random_state=0, batch_size=200, backend="numpy").fit(X)
    assert clone(km).get_params() == km.get_params()
    again = pickle.loads(pickle.dumps(km))
    np.testing.assert_array_equal(again.predict(X), km.labels_)
    sk = km.to_sklearn()
    assert isinstance(sk, SkMiniBatchKMeans)
    np.testing.assert_array_equal(sk.predict(X), km.labels_)
    np.testing.assert_array_equal(sk._counts, km._counts)
    ours = pickle.loads(pickle.dumps(km))
    for est in (sk, ours):
        est.partial_fit(X[:300])
    np.testing.assert_allclose(ours.cluster_centers_, sk.cluster_centers_, rtol=1e-12)
    assert "batch_size=200" in repr(km)
    assert km.transform(X[:4]).shape == (4, 10)
    assert km.score(X) == pytest.approx(-km.inertia_)


def test_memmap_is_read_batch_by_batch(tmp_path):
    """partial_fit over a memmap's slices and fit with compute_labels=False hold no copy of
    X: the traced peak is a few batches (fit: plus the cumulative weights, 8 bytes a row)."""
    n, d, b = 2_000_000, 3, 4096
    X = np.lib.format.open_memmap(tmp_path / "X.npy", mode="w+", dtype=np.float32,
                                  shape=(n, d))
    X[:] = asymmetric_data(n, d, 20, dtype=np.float32, seed=9)
    X.flush()
    X = np.load(tmp_path / "X.npy", mmap_mode="r")
    km = MiniBatchKMeans(20, random_state=0, batch_size=b, compute_labels=False,
                         backend="numpy", max_iter=1, max_no_improvement=None)
    km.partial_fit(X[:b])  # first call: init (3 batches of rows), buffers
    tracemalloc.start()
    try:
        for start in range(b, n, 16 * b):
            km.partial_fit(X[start:start + 16 * b])
        part_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        km.fit(X)
        fit_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    x_bytes = n * d * 4
    assert part_peak < 12 * (16 * b * d * 4) + (1 << 20) < x_bytes / 2
    assert fit_peak < n * 8 + x_bytes // 2  # a copy of X would be n * 8 + x_bytes
    assert km.n_steps_ == n // b and np.isfinite(km.inertia_)


def test_house_shape_one_lloyd_loop():
    """The mini-batch steps are another algorithm, not a second Lloyd loop: the house check
    still counts exactly one. (Module size is a signal the check prints, not a gate.)"""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1]
    tool = root.parent / "shared" / "tools" / "house_check.py"
    if not tool.exists():
        pytest.skip("the layout checker (house_check.py) ships beside the repository, not in "
                    "it; tests/test_architecture.py checks the layers here")
    out = subprocess.run([sys.executable, str(tool)], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    assert "Lloyd loops): 1\n" in out and "import circles: 0" in out


# -- dask -----------------------------------------------------------------------------------
def test_dask_fit_and_partial_fit_over_blocks():
    da = pytest.importorskip("dask.array")
    X, w = _data(np.float64)
    Xd = da.from_array(X, chunks=(500, 3))
    p = dict(n_clusters=10, random_state=0, batch_size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dask's own warnings about large graphs
        got = MiniBatchKMeans(**p).fit(Xd, sample_weight=w)
    ref = SkMiniBatchKMeans(**p).fit(X, sample_weight=w)
    assert got.backend_ == "dask" and "batches computed by 'numpy'" in got.backend_reason_
    assert isinstance(got.labels_, da.Array)
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    assert got.n_steps_ == ref.n_steps_
    np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-9)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-9)
    blocks = MiniBatchKMeans(**p).partial_fit(Xd)
    ref = SkMiniBatchKMeans(**p)
    for start in range(0, N, 500):
        ref.partial_fit(X[start:start + 500])
    _assert_same(blocks, ref, np.float64)


def test_dask_ml_incremental():
    pytest.importorskip("dask_ml")
    da = pytest.importorskip("dask.array")
    from dask_ml.wrappers import Incremental
    X, _ = _data(np.float64)
    X = X[:3000]  # equal blocks: a shuffled one-row block first would be fewer rows than k
    Xd = da.from_array(X, chunks=(500, 3))
    p = dict(n_clusters=10, random_state=0, batch_size=200)
    inc = Incremental(MiniBatchKMeans(**p), shuffle_blocks=False).fit(Xd)
    ref = SkMiniBatchKMeans(**p)
    for start in range(0, 3000, 500):
        ref.partial_fit(X[start:start + 500])
    assert isinstance(inc.estimator_, MiniBatchKMeans)
    _assert_same(inc.estimator_, ref, np.float64)
    np.testing.assert_array_equal(inc.predict(Xd).compute(), ref.predict(X))
    shuffled = Incremental(MiniBatchKMeans(**p), random_state=0).fit(Xd)
    assert shuffled.estimator_.n_steps_ == 6 and np.isfinite(shuffled.estimator_.score(X))


# -- the CuPy backends' code paths on the CPU (tests/_fake_cupy.py; the GPU tests run them on
#    a device: tests/test_minibatch_gpu.py) ----------------------------------------------------
@pytest.mark.parametrize("name", ["cupy-kernels", "cupy-chunked", "cupy-fused"])
def test_cupy_backends_steps_on_the_emulated_device(fake_cupy, name):
    X = asymmetric_data(3001, 3, 9, dtype=np.float32, seed=11)
    p = dict(n_clusters=9, random_state=0, batch_size=256, reassignment_ratio=0.2)
    ref = MiniBatchKMeans(backend="numpy", **p).fit(X)
    got = MiniBatchKMeans(backend=name, **p).fit(X)
    assert got.backend_ == name
    _assert_same(got, ref, np.float32)
    part, part_ref = MiniBatchKMeans(backend=name, **p), MiniBatchKMeans(backend="numpy", **p)
    for start in range(0, len(X), 500):
        part.partial_fit(X[start:start + 500])
        part_ref.partial_fit(X[start:start + 500])
    part.n_iter_ = part_ref.n_iter_ = None
    _assert_same(part, part_ref, np.float32)


def test_an_input_whose_device_raises_is_cached_without_one():
    """cupyx.scipy.sparse matrices raise NotImplementedError from `device`: the backend
    cache's key does without it instead of failing the fit."""
    from kmeans_xp.estimators.minibatch import _device_name

    class NoDevice:
        @property
        def device(self):
            raise NotImplementedError

    assert _device_name(NoDevice()) == "" and _device_name(np.zeros(2)) == "cpu"
