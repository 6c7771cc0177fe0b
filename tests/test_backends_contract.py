"""The contract suite on our backends, its power to catch the seed's bugs, and namespaces."""
import array_api_strict as xps
import numpy as np
import pytest
from kmeans_xp_backends.array_api.backend import ArrayAPIBackend
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp import AssignResult, KMeans, KMeansBackend, ReduceResult
from kmeans_xp.contract import registry
from kmeans_xp.contract.backend import Placement
from kmeans_xp.testing import asymmetric_data, check_backend
from tests._helpers import AUTO_CPU


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    registry._runtime.clear()
    registry.list_backends.cache_clear()


def test_numpy_backend_passes_contract():
    assert check_backend(NumpyBackend) > 50


def test_numpy_backend_single_thread_passes_contract():
    class OneThread(NumpyBackend):
        name = "numpy-one-thread"

        def __init__(self, max_memory="auto"):
            super().__init__(max_memory, n_threads=1)

    assert check_backend(OneThread) > 50


def test_array_api_backend_passes_contract_on_numpy():
    assert check_backend(ArrayAPIBackend) > 50


def test_array_api_backend_passes_contract_on_array_api_strict():
    assert check_backend(ArrayAPIBackend, make_array=xps.asarray) > 50


def test_array_api_backend_passes_contract_on_torch_cpu():
    torch = pytest.importorskip("torch")
    assert check_backend(ArrayAPIBackend, make_array=torch.from_numpy) > 50


# -- the suite catches the seed's bugs ---------------------------------------------------------
class FirstTwoFeatures(NumpyBackend):
    """The seed's fit_custom bug: distances from the first 2 of d features only."""
    name = "bad-first-two"

    def assign(self, X, centers, *, xp=None):
        d = min(2, X.shape[1])
        return super().assign(np.ascontiguousarray(X[:, :d]),
                              np.ascontiguousarray(centers[:, :d]), xp=xp)

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        return KMeansBackend.lloyd_iter(self, X, sample_weight, centers, labels_old, xp=xp)


class SwappedXY(FirstTwoFeatures):
    """The seed's other bug: the centers' x and y passed swapped."""
    name = "bad-swapped"

    def assign(self, X, centers, *, xp=None):
        c = np.array(centers, copy=True)
        if c.shape[1] >= 2:
            c[:, [0, 1]] = c[:, [1, 0]]
        return NumpyBackend.assign(self, X, c, xp=xp)


class IgnoresWeights(FirstTwoFeatures):
    name = "bad-weights"

    def assign(self, X, centers, *, xp=None):
        return NumpyBackend.assign(self, X, centers, xp=xp)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        return super().reduce(X, labels, None, n_clusters, xp=xp)


class NegativeDistances(FirstTwoFeatures):
    name = "bad-negative"

    def assign(self, X, centers, *, xp=None):
        labels, mins = NumpyBackend.assign(self, X, centers, xp=xp)
        return AssignResult(labels, mins - 1e-3)


class DropsLastChunk(FirstTwoFeatures):
    """Loses the rows of a ragged last chunk: n not a multiple of the chunk size catches it."""
    name = "bad-ragged"

    def assign(self, X, centers, *, xp=None):
        return NumpyBackend.assign(self, X, centers, xp=xp)

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp=None):
        keep = (X.shape[0] // 64) * 64 or X.shape[0]
        w = None if sample_weight is None else sample_weight[:keep]
        sums, weights = NumpyBackend.reduce(self, X[:keep], labels[:keep], w, n_clusters,
                                            xp=xp)
        return ReduceResult(sums, weights)


class FinalPassIgnoresWeights(NumpyBackend):
    """Its one-pass final assignment forgets the weights in the inertia."""
    name = "bad-final-pass"

    def labels_inertia(self, X, sample_weight, centers, *, xp=None):
        return super().labels_inertia(X, None, centers, xp=xp)


class SkipsWhateverTheFlag(NumpyBackend):
    """Says it honours the driver's skip flag (ahead_gate), but leaves the sums out whenever
    a flag is passed, set or not."""
    name = "bad-gate"
    ahead_gate = True

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None, skip=None):
        it = super().lloyd_iter(X, sample_weight, centers, labels_old, xp=xp)
        return it if skip is None else it._replace(weighted_sums=it.weighted_sums * 0)


@pytest.mark.parametrize("bad,match", [
    (FirstTwoFeatures, "labels are not the argmin"), (SwappedXY, "labels are not the argmin"),
    (IgnoresWeights, "weight_in_clusters wrong"), (NegativeDistances, "negative min_sq_dist"),
    (DropsLastChunk, "weight_in_clusters wrong"),
    (FinalPassIgnoresWeights, "labels_inertia's inertia"),
    (SkipsWhateverTheFlag, "ahead_gate"),
])
def test_contract_catches_broken_backends(bad, match):
    with pytest.raises(AssertionError, match=match):
        check_backend(bad, cases=[(257, 3, 7), (1031, 3, 13)], dtypes=(np.float64,))


class SeedsWithTheFirstCandidate(NumpyBackend):
    """Its own k-means++ steps take the first candidate, not the best: other rows."""

    def seeding(self, X, sample_weight, n_local_trials, *, xp):
        from kmeans_xp.algorithms.init import Seeding
        steps = Seeding(X, sample_weight, xp, X.shape[0])
        trial = steps.trial
        steps.trial = lambda closest, cand: (cand[:1], trial(closest, cand[:1])[1])
        return steps


def test_contract_catches_a_seeding_that_draws_other_rows():
    with pytest.raises(AssertionError, match="seeding drew rows"):
        check_backend(SeedsWithTheFirstCandidate, cases=[(1031, 3, 13)], dtypes=(np.float64,))


class OwnLoop(NumpyBackend):
    """Runs the whole Lloyd loop itself (`lloyd`): here the driver's loop on its own
    primitives, so it is the driver's, fit for fit."""
    name = "own-loop"
    runs = 0

    def lloyd(self, X, sample_weight, centers, *, xp, max_iter, tol, spherical=False):
        from kmeans_xp.algorithms.lloyd import kmeans_single_lloyd
        type(self).runs += 1
        return kmeans_single_lloyd(self, X, sample_weight, centers, xp=xp,
                                   max_iter=self.iterations(max_iter), tol=tol,
                                   spherical=spherical, backend_loop=False)

    def iterations(self, max_iter):
        return max_iter


class OwnLoopStopsEarly(OwnLoop):
    """Its own loop never runs more than two iterations."""
    name = "bad-own-loop"

    def iterations(self, max_iter):
        return min(max_iter, 2)


def test_the_driver_runs_a_backend_s_own_loop_and_the_suite_proves_it():
    from kmeans_xp.testing import check_own_loop
    X = asymmetric_data(1031, 3, 6, seed=6)
    with registry.registered(OwnLoop):
        km = KMeans(6, init=X[:6], backend="own-loop").fit(X)
    assert OwnLoop.runs == 1 and km.backend_ == "own-loop"
    assert check_backend(OwnLoop, cases=[(257, 3, 7)], dtypes=(np.float64,)) > 0
    assert check_own_loop(OwnLoop(), lambda a: a, np.float32) > 0
    with pytest.raises(AssertionError, match="its own loop|partition differs|n_iter"):
        check_backend(OwnLoopStopsEarly, cases=[(257, 3, 7)], dtypes=(np.float64,))
    with pytest.raises(AssertionError, match="its own loop"):
        check_own_loop(OwnLoopStopsEarly(), lambda a: a, np.float64)


class NeverChanges(NumpyBackend):
    """Primitives right, but its iterations report no changed label once there was a previous
    one, so every run stops after two; it even takes the name of the built-in, which the
    suite must not test in its place."""
    name = "numpy"

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        it = super().lloyd_iter(X, sample_weight, centers, labels_old, xp=xp)
        return it if labels_old is None else it._replace(n_changed=np.float64(0))


def test_contract_tests_the_class_given_not_the_installed_namesake():
    with pytest.raises(AssertionError, match="partition differs|n_iter|n_changed"):
        check_backend(NeverChanges, cases=[(257, 3, 7)], dtypes=(np.float64,))
    assert registry.get_backend("numpy") is NumpyBackend  # the registry is as it was
    assert "numpy" not in registry._runtime


def test_contract_leaves_registry_as_it_was():
    class Fresh(NumpyBackend):
        name = "fresh-backend"

    check_backend(Fresh, cases=[(97, 2, 3)], dtypes=(np.float64,))
    assert "fresh-backend" not in registry.list_backends()


def test_contract_rejects_non_backends():
    class NoName(NumpyBackend):
        name = ""

    with pytest.raises(AssertionError, match="name"):
        check_backend(NoName)
    with pytest.raises(AssertionError, match="KMeansBackend"):
        check_backend(dict)


# -- results in the caller's namespace ---------------------------------------------------------
@pytest.mark.parametrize("dev", [None, "device1"])
def test_array_api_results_in_callers_namespace_and_device(dev):
    device = xps.Device(dev) if dev else None
    X_np = asymmetric_data(1031, 3, 6, seed=6)
    X = xps.asarray(X_np, device=device)
    init = X_np[:6].copy()
    km = KMeans(6, init=init, backend="array-api").fit(X)
    ref = KMeans(6, init=init, backend="numpy").fit(X_np)
    expect_dev = X.device
    for name, arr in [("labels_", km.labels_), ("cluster_centers_", km.cluster_centers_),
                      ("predict", km.predict(X)), ("transform", km.transform(X)),
                      ("fit_predict", KMeans(6, init=init).fit_predict(X))]:
        assert isinstance(arr, type(X)), f"{name} is {type(arr)}"
        assert arr.device == expect_dev, f"{name} on {arr.device}"
    # int32 labels, as the numpy backend's and scikit-learn's (`kmeans_xp.contract.backend`'s
    # "Labels"; sklearn's check_array_api_input compares the dtypes)
    assert km.labels_.dtype == xps.int32 and km.cluster_centers_.dtype == xps.float64
    assert km.predict(X).dtype == xps.int32
    assert km.transform(X).shape == (1031, 6)
    np.testing.assert_array_equal(np.from_dlpack(km.labels_), ref.labels_)
    np.testing.assert_allclose(np.from_dlpack(km.cluster_centers_), ref.cluster_centers_,
                               rtol=1e-12)
    assert km.n_iter_ == ref.n_iter_
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)
    assert isinstance(km.score(X), float)
    assert km.score(X) == pytest.approx(-km.inertia_, rel=1e-10)


def test_array_api_float32_stays_float32():
    X = xps.asarray(asymmetric_data(509, 4, 3, seed=1, dtype=np.float32))
    km = KMeans(3, random_state=0, backend="array-api").fit(X)
    assert km.cluster_centers_.dtype == xps.float32
    assert km.transform(X).dtype == xps.float32


def test_numpy_results_are_numpy():
    X = asymmetric_data(509, 4, 3, seed=1)
    km = KMeans(3, random_state=0, backend="array-api").fit(X)
    for arr in (km.labels_, km.cluster_centers_, km.predict(X), km.transform(X)):
        assert type(arr) is np.ndarray


def test_predict_in_another_namespace_after_auto_fit():
    """An "auto" fit on NumPy predicts array-api-strict input with the backend "auto" picks
    for it, and answers in that namespace."""
    X_np = asymmetric_data(509, 3, 4, seed=3)
    km = KMeans(4, random_state=0).fit(X_np)
    assert km.backend_ == AUTO_CPU
    X = xps.asarray(X_np)
    labels = km.predict(X)
    assert isinstance(labels, type(X))
    np.testing.assert_array_equal(np.from_dlpack(labels), km.labels_)
    np.testing.assert_allclose(np.from_dlpack(km.transform(X)), km.transform(X_np))
    assert km.score(X) == pytest.approx(km.score(X_np))


def test_predict_in_another_namespace_after_named_fit_says_what_would():
    X_np = asymmetric_data(509, 3, 4, seed=3)
    km = KMeans(4, random_state=0, backend="numpy").fit(X_np)
    with pytest.raises(ValueError, match=r"'numpy' cannot take.*would: \['array-api'\]"):
        km.predict(xps.asarray(X_np))


def test_contract_default_input_is_the_backends_own_when_it_refuses_numpy():
    """A backend that computes only on array-api-strict gets its input through to_backend."""
    class StrictOnly(ArrayAPIBackend):
        name = "strict-only"
        namespaces = frozenset({"array_api_strict"})

        def reject_reason(self, X, *, n_clusters, sample_weight=None):
            ns = type(X).__module__.split(".")[0]
            return None if ns == "array_api_strict" else f"not {ns}"

        class placement_class(Placement):
            def to_backend(self, X):
                return X if type(X).__module__.startswith("array_api_strict") else \
                    xps.asarray(X)

    assert check_backend(StrictOnly, cases=[(97, 3, 5)]) > 0


class ReusesBuffers(NumpyBackend):
    """Writes every result into the same labels array: fast, but the driver keeps the last
    labels (and may issue the next iteration before reading them)."""
    name = "bad-reuse"

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        it = super().lloyd_iter(X, sample_weight, centers, labels_old, xp=xp)
        if getattr(self, "_buf", None) is None or self._buf.shape != it.labels.shape:
            self._buf = np.empty_like(it.labels)
        self._buf[...] = it.labels
        return it._replace(labels=self._buf)


def test_contract_catches_reused_output_buffers():
    with pytest.raises(AssertionError, match="reused output buffers"):
        check_backend(ReusesBuffers, cases=[(257, 3, 7)], dtypes=(np.float64,))


class BigTemporaries(NumpyBackend):
    """The seed's own mistake in a plugin: an (n, k, d) broadcast for the distances."""
    name = "bad-broadcast"

    def assign(self, X, centers, *, xp=None):
        d2 = ((X[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
        labels = d2.argmin(axis=1)
        return AssignResult(labels, d2[np.arange(len(X)), labels])

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        return KMeansBackend.lloyd_iter(self, X, sample_weight, centers, labels_old, xp=xp)


def test_contract_measures_the_memory_bound():
    with pytest.raises(AssertionError, match="more than its estimate"):
        check_backend(BigTemporaries, cases=[(97, 3, 5)], dtypes=(np.float64,))
