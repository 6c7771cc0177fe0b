"""Batches of problems (docs/batches.md): X of shape (B, n, d) or a ragged list fits B
problems through the driver's batched mode, each as it would be fitted alone."""
import warnings

import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp import KMeans
from kmeans_xp.contract.batching import loop_batch_lloyd_iter
from kmeans_xp.testing import asymmetric_data


def _problems(sizes, d, k, dtype, seed=0):
    """Asymmetric problems of different blob layouts (and offsets: each has its own mean)."""
    return [asymmetric_data(n, d, max(1, k // 2), dtype=dtype, seed=seed + b, offset=3.0 * b)
            for b, n in enumerate(sizes)]


def _inits(problems, k, seed=1):
    rng = np.random.default_rng(seed)
    return np.stack([p[rng.choice(len(p), k, replace=False)] for p in problems])


def _assert_same_as_alone(km, problems, inits, dtype, weights=None, **kw):
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    for b, X in enumerate(problems):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = KMeans(inits.shape[1], init=inits[b], backend="numpy", **kw).fit(
                X, sample_weight=None if weights is None else weights[b])
        labels = km.labels_[b]
        np.testing.assert_array_equal(labels, ref.labels_, err_msg=f"problem {b}")
        assert km.n_iter_[b] == ref.n_iter_, f"problem {b}"
        assert km.inertia_[b] == pytest.approx(ref.inertia_, rel=rtol, abs=1e-12)
        np.testing.assert_allclose(km.cluster_centers_[b], ref.cluster_centers_,
                                   rtol=rtol * 10, atol=rtol)
        assert km.history_[b]["inertia"] == pytest.approx(ref.history_["inertia"], rel=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 7, 50])
def test_dense_batch_equals_each_problem_fitted_alone(dtype, k):
    problems = _problems([1031] * 4, 3, k, dtype)
    inits = _inits(problems, k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        km = KMeans(k, init=inits, max_iter=60, backend="numpy").fit(np.stack(problems))
    assert km.cluster_centers_.shape == (4, k, 3) and km.labels_.shape == (4, 1031)
    assert km.inertia_.shape == (4,) and km.n_iter_.shape == (4,)
    assert km.cluster_centers_.dtype == dtype
    _assert_same_as_alone(km, problems, inits, dtype, max_iter=60)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ragged_batch_with_weights_equals_each_problem_alone(dtype):
    problems = _problems([1031, 257, 2003], 5, 9, dtype, seed=4)
    inits = _inits(problems, 9)
    rng = np.random.default_rng(3)
    weights = [rng.uniform(0.5, 2.0, len(p)).astype(dtype) for p in problems]
    weights[1][::5] = 0
    km = KMeans(9, init=inits, max_iter=80, backend="numpy").fit(problems,
                                                                  sample_weight=weights)
    assert isinstance(km.labels_, list) and [len(lab) for lab in km.labels_] == [1031, 257, 2003]
    _assert_same_as_alone(km, problems, inits, dtype, weights, max_iter=80)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_empty_clusters_relocate_per_problem(dtype):
    """Centers no point is near, in one problem only: that problem relocates as it would
    alone; the others are untouched."""
    problems = _problems([1031, 1031, 1031], 3, 12, dtype, seed=9)
    inits = _inits(problems, 12)
    inits[1, :3] += 1e3
    km = KMeans(12, init=inits, max_iter=50, backend="numpy").fit(np.stack(problems))
    _assert_same_as_alone(km, problems, inits, dtype, max_iter=50)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_several_problems_relocate_in_one_iteration(dtype, monkeypatch):
    """Empty clusters in three of four problems at once, weighted (zeros among them), one of
    them with more empty clusters than points to give (the heaviest-cluster fill): each
    relocates as it would alone, the four in one relocation call per iteration."""
    from kmeans_xp.algorithms import batches
    problems = _problems([523, 523, 523, 523], 3, 9, dtype, seed=4)
    problems[3] = problems[3].copy()
    problems[3][:, :] = problems[3][0]          # all rows equal: nothing to give
    inits = _inits(problems, 9)
    for b in (0, 1, 3):
        inits[b, 2:5] += 1e4                     # three centers no point is near
    weights = np.random.default_rng(3).uniform(0.5, 2.0, (4, 523))
    weights[:, ::11] = 0
    calls = []
    real = batches.relocate_empty_many

    def spy(backend, problems_, *args):
        calls.append([p.at for p in problems_])
        return real(backend, problems_, *args)

    monkeypatch.setattr(batches, "relocate_empty_many", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        km = KMeans(9, init=inits, max_iter=40, backend="numpy").fit(
            np.stack(problems), sample_weight=weights)
    assert calls and sorted(calls[0]) == [0, 1, 3]
    _assert_same_as_alone(km, problems, inits, dtype, weights=weights, max_iter=40)


def test_tol_and_max_iter_per_problem():
    problems = _problems([1031] * 3, 3, 8, np.float64, seed=2)
    inits = _inits(problems, 8)
    for kw in ({"tol": 1e-2, "max_iter": 50}, {"max_iter": 1}, {"max_iter": 3, "tol": 0}):
        km = KMeans(8, init=inits, backend="numpy", **kw).fit(np.stack(problems))
        _assert_same_as_alone(km, problems, inits, np.float64, **kw)


def test_a_converged_problem_costs_no_more_work(monkeypatch):
    """Problem 1 (its init on the answer) converges first and leaves the active set."""
    problems = _problems([1031] * 3, 3, 4, np.float64, seed=5)
    inits = _inits(problems, 4)
    solved = KMeans(4, init=inits[1], backend="numpy").fit(problems[1]).cluster_centers_
    inits[1] = solved
    seen = []

    def spy(self, X, sw, centers, labels_old, active, *, xp):
        seen.append(active)
        assert centers.shape[0] == len(active)
        return loop_batch_lloyd_iter(self, X, sw, centers, labels_old, active, xp=xp)

    monkeypatch.setattr(NumpyBackend, "batch_lloyd_iter", spy)
    km = KMeans(4, init=inits, tol=0, backend="numpy").fit(np.stack(problems))
    assert km.n_iter_[1] < km.n_iter_.max()
    assert seen[0] == (0, 1, 2) and all(1 not in a for a in seen[km.n_iter_[1]:])
    assert len(seen) == km.n_iter_.max()


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_batched_init_is_reproducible_and_labels_equal_predict(init):
    X = np.stack(_problems([1031] * 3, 4, 6, np.float32, seed=7))
    a = KMeans(6, init=init, n_init=1, random_state=3, backend="numpy").fit(X)
    b = KMeans(6, init=init, n_init=1, random_state=3, backend="numpy").fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.predict(X), a.labels_)
    assert a.transform(X).shape == (3, 1031, 6)
    np.testing.assert_allclose(-a.score(X), a.inertia_, rtol=1e-5)
    ragged = [X[0], X[1, :500], X[2, :777]]
    r = KMeans(6, init=init, n_init=1, random_state=3, backend="numpy").fit(ragged)
    pred = r.predict(ragged)
    assert all(np.array_equal(p, lab) for p, lab in zip(pred, r.labels_))
    assert [t.shape for t in r.transform(ragged)] == [(1031, 6), (500, 6), (777, 6)]


def test_n_init_keeps_the_best_run_per_problem():
    X = np.stack(_problems([1031] * 4, 3, 8, np.float64, seed=11))
    one = KMeans(8, init="random", n_init=1, random_state=0, backend="numpy").fit(X)
    many = KMeans(8, init="random", n_init=4, random_state=0, backend="numpy").fit(X)
    assert np.all(many.inertia_ <= one.inertia_)
    np.testing.assert_array_equal(many.predict(X), many.labels_)
    # each problem's centers, labels and inertia come from one and the same run
    np.testing.assert_allclose(-many.score(X), many.inertia_, rtol=1e-10)


def test_a_single_fit_after_a_batch_fit_is_a_single_model():
    X = np.stack(_problems([301] * 2, 3, 3, np.float64))
    km = KMeans(3, random_state=0, backend="numpy").fit(X)
    with pytest.raises(ValueError, match=r"fitted on a batch of 2 problems; predict"):
        km.predict(X[0])
    km.fit(X[0])
    assert km.labels_.shape == (301,)
    with pytest.raises(ValueError, match=r"fitted on one problem; predict"):
        km.predict(X)


@pytest.mark.parametrize("X,kw,sw,match", [
    (np.zeros((2, 3, 4, 5)), {}, None, r"shape \(2, 3, 4, 5\) has 4 dimensions"),
    ([np.ones((20, 3)), np.ones((20, 4))], {}, None, r"X\[1\] has 4 features but X\[0\] has 3"),
    ([np.ones((20, 3)), np.ones((2, 3))], {}, None, r"Problem 1 .* n_samples=2, fewer than "
                                                   r"n_clusters=3"),
    (np.ones((2, 20, 3)), {"init": np.zeros((3, 3))}, None,
     r"shape \(3, 3\); expected \(2, 3, 3\)"),
    (np.ones((2, 20, 3)), {"init": np.zeros((2, 4, 3))}, None,
     r"shape \(2, 4, 3\); expected \(2, 3, 3\)"),
    (np.ones((2, 20, 3)), {}, np.ones((2, 19)), r"sample_weight of shape \(2, 19\)"),
    (np.ones((2, 20, 3)), {}, [np.ones(20)], r"1 entries for a batch of 2"),
    ([np.ones((20, 3)), np.ones((30, 3))], {}, [np.ones(20), np.ones(20)],
     r"sample_weight\[1\] \(problem 1\)"),
    (np.full((2, 20, 3), np.nan), {}, None, r"NaN"),
])
def test_bad_batches_are_refused_before_any_work(X, kw, sw, match, monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("work started")
    monkeypatch.setattr(NumpyBackend, "batch_lloyd_iter", no_work)
    with pytest.raises(ValueError, match=match):
        KMeans(3, backend="numpy", **kw).fit(X, sample_weight=sw)


def test_predict_wants_the_fitted_number_of_problems():
    X = np.stack(_problems([301] * 3, 3, 3, np.float64))
    km = KMeans(3, random_state=0, backend="numpy").fit(X)
    with pytest.raises(ValueError, match=r"batch of 2 problems, but KMeans was fitted on 3"):
        km.predict(X[:2])
    with pytest.raises(ValueError, match=r"X has 2 features"):
        km.predict(X[..., :2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [3, 17])
@pytest.mark.parametrize("weighted", [False, True])
def test_batched_init_draws_what_each_problem_draws_alone(dtype, d, weighted):
    """k-means++ and random over the whole batch at once give problem b the centers the
    init method gives it alone with its seed (`batch_seeds`)."""
    import array_api_compat.numpy as xp

    from kmeans_xp.algorithms.batch_init import batch_plusplus, batch_random, batch_seeds
    from kmeans_xp.algorithms.init import kmeans_plusplus, random_init
    X = np.stack(_problems([1031] * 3, d, 6, dtype, seed=13))
    sw = None
    if weighted:
        sw = np.random.default_rng(0).uniform(0.5, 2.0, (3, 1031)).astype(dtype)
        sw[:, ::7] = 0
    seeds = batch_seeds(np.random.RandomState(5), 3)
    plus = batch_plusplus(X, 23, sw, seeds, xp=xp)
    rand = batch_random(X, 23, sw, seeds, xp=xp)
    for b in range(3):
        w = None if sw is None else sw[b]
        alone = kmeans_plusplus(X[b], 23, sample_weight=w, xp=xp, rows=1 << 20,
                                random_state=np.random.RandomState(seeds[b]))[0]
        np.testing.assert_array_equal(plus[b], alone)
        alone = random_init(X[b], 23, sample_weight=w, xp=xp,
                            random_state=np.random.RandomState(seeds[b]))[0]
        np.testing.assert_array_equal(rand[b], alone)


def test_a_batch_too_large_for_the_batched_init_runs_it_per_problem(monkeypatch):
    from kmeans_xp.algorithms import batch_init
    X = np.stack(_problems([1031] * 3, 3, 6, np.float64, seed=17))
    big = KMeans(6, random_state=1, max_iter=1, backend="numpy").fit(X)
    monkeypatch.setattr(batch_init, "batch_plusplus", None)   # (not called: per problem)
    small = KMeans(6, random_state=1, max_iter=1, backend="numpy", max_memory="200KB").fit(X)
    np.testing.assert_array_equal(big.labels_, small.labels_)


def test_spherical_and_verbose_batches(caplog):
    from kmeans_xp import SphericalKMeans
    X = np.stack(_problems([301] * 2, 3, 3, np.float64))
    with pytest.raises(ValueError, match="SphericalKMeans does not fit batches"):
        SphericalKMeans(3).fit(X)
    with caplog.at_level("INFO", logger="kmeans_xp"):
        KMeans(3, random_state=0, verbose=1, backend="numpy").fit(X)
    assert "Problem 1: Iteration 0, inertia" in caplog.text
    assert "Problem 0: Converged at iteration" in caplog.text


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_a_batch_at_reduced_precision_is_each_problem_alone(precision):
    """A batch at a reduced precision (numpy's emulation) gives problem b the fit of problem
    b alone at that precision, from the same initial centers."""
    rng = np.random.default_rng(3)
    X = np.stack(_problems([401] * 3, 5, 4, np.float32))
    init = np.stack([p[rng.choice(len(p), 4, replace=False)] for p in X])
    batch = KMeans(4, init=init, n_init=1, precision=precision, backend="numpy").fit(X)
    for b in range(3):
        one = KMeans(4, init=init[b], n_init=1, precision=precision,
                     backend="numpy").fit(X[b])
        np.testing.assert_array_equal(batch.labels_[b], one.labels_)
        assert batch.inertia_[b] == pytest.approx(one.inertia_, rel=1e-5)


def test_a_float16_batch_fits_with_float32_centers():
    X = np.stack(_problems([301] * 2, 4, 3, np.float32)).astype(np.float16)
    km = KMeans(3, n_init=1, random_state=0, precision="fp16").fit(X)
    assert km.cluster_centers_.shape == (2, 3, 4)
    assert km.cluster_centers_.dtype == np.float32
    assert km.predict(X).shape == (2, 301)


@pytest.mark.parametrize("form", ["rows of one array", "a list"])
def test_batch_labels_out_of_range_are_caught_in_either_form(form):
    """The driver's check of a batch hook's labels (first iteration): a 2-D array of a dense
    batch's labels is read once for all its rows, a list problem by problem; a label = k
    anywhere is a BackendContractError naming the hook, and shapes are checked per row."""
    from kmeans_xp.contract.batching import BatchStats, check_batch_stats
    from kmeans_xp.contract.return_checks import BackendContractError
    backend = NumpyBackend()
    X = [np.zeros((5, 2)), np.zeros((5, 2))]
    labels = np.zeros((2, 5), np.int32)
    as_form = (lambda a: a) if form == "rows of one array" else list
    stats = BatchStats(as_form(labels), np.zeros((2, 3, 2)), np.zeros((2, 3)), np.zeros(2),
                       np.zeros(2))
    assert check_batch_stats(backend, stats, X, (0, 1), 3) is not None
    bad = labels.copy()
    bad[1, 4] = 3
    with pytest.raises(BackendContractError, match="batch_lloyd_iter.*labels"):
        check_batch_stats(backend, stats._replace(labels=as_form(bad)), X, (0, 1), 3)
    check_batch_stats(backend, stats._replace(labels=as_form(bad)), X, (0, 1), 3,
                      values=False)   # (later iterations: shapes only)
    with pytest.raises(BackendContractError, match="labels"):
        check_batch_stats(backend, stats._replace(labels=as_form(labels[:, :4])), X, (0, 1), 3)


@pytest.mark.parametrize("dense", [True, False])
def test_fewer_distinct_clusters_warns_for_that_problem_only(dense):
    """Problem 1 has 2 distinct points for k=3 (a cluster stays empty): the warning names
    it, and problem 0 (well spread) and 2 are not named; a dense batch counts every
    problem's clusters at once (labels offset by b * k), a list problem by problem."""
    rng = np.random.default_rng(0)
    P = [rng.normal(size=(40, 2)) + 10 * np.arange(2), np.repeat([[0.0, 0.0], [5.0, 5.0]],
                                                                 20, axis=0),
         rng.normal(size=(40, 2))]
    X = np.stack(P) if dense else P
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        KMeans(3, n_init=1, random_state=0, backend="numpy").fit(X)
    named = [str(w.message) for w in caught if "distinct clusters" in str(w.message)]
    assert len(named) == 1 and "problem 1 " in named[0], named
