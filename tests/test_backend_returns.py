"""What a backend returns is checked against the contract (R3): a plugin that returns float
labels, a list, too few labels, labels out of range, NaN sums or sums of the wrong shape
gets an error naming it and its member, never NaN centers or a NumPy error from deep inside
`fit`; `check_backend` reports each as a failed check; labels reach the user as int32
whatever the plugin returns."""
import numpy as np
import pytest

from kmeans_xp import AssignResult, KMeans, KMeansBackend, MiniBatchKMeans, ReduceResult, SphericalKMeans
from kmeans_xp.contract.registry import registered
from kmeans_xp import BackendContractError
from kmeans_xp.testing import check_backend


class Plain(KMeansBackend):
    """A correct plugin in a few lines: brute-force NumPy, int64 labels (numpy's argmin)."""
    name = "test-plain"
    namespaces = frozenset({"numpy"})

    def assign(self, X, centers, *, xp):
        d = ((X[:, None, :] - centers[None, :, :]) ** 2).sum(-1)
        labels = d.argmin(1)   # int64: a plugin's natural labels
        return AssignResult(labels, d[np.arange(len(X)), labels])

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp):
        w = np.ones(len(X)) if sample_weight is None else sample_weight.astype(np.float64)
        sums = np.zeros((n_clusters, X.shape[1]))
        np.add.at(sums, labels, X * w[:, None])
        return ReduceResult(sums, np.bincount(labels, weights=w, minlength=n_clusters))

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize, max_memory="auto"):
        from kmeans_xp import MemoryEstimate
        parts = {"distances": 3 * n_samples * n_clusters * n_features * 8}
        return MemoryEstimate(parts, sum(parts.values()), n_samples)


def _broken(name, member, fault):
    """Plain whose `member` passes its result through `fault`."""
    def method(self, *args, **kwargs):
        return fault(getattr(Plain, member)(self, *args, **kwargs))
    return type(f"Broken_{name}", (Plain,), {"name": f"test-{name}", member: method})


BROKEN = {
    "float-labels": ("assign", lambda r: AssignResult(r.labels.astype(np.float64),
                                                      r.min_sq_dist), "assign", "dtype"),
    "list-labels": ("assign", lambda r: AssignResult(r.labels.tolist(), r.min_sq_dist),
                    "assign", "list"),
    "short-labels": ("assign", lambda r: AssignResult(r.labels[:-1], r.min_sq_dist[:-1]),
                     "assign", "shape"),
    "labels-out-of-range": ("assign", lambda r: AssignResult(r.labels + 1, r.min_sq_dist),
                            "assign", "labels are in"),
    "nan-sums": ("reduce", lambda r: ReduceResult(r.weighted_sums * np.nan,
                                                  r.weight_in_clusters), "reduce", "NaN"),
    "short-sums": ("reduce", lambda r: ReduceResult(r.weighted_sums[:-1],
                                                    r.weight_in_clusters), "reduce", "shape"),
}


def _X(n=203, seed=1):
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0, 0.0], [6.0, 1.0, -2.0], [-3.0, 8.0, 1.0]]) * [1, 2, 3]
    return centers[rng.integers(0, 3, n)] + rng.normal(size=(n, 3)) + [1, 2, 3]


@pytest.mark.parametrize("estimator", [KMeans, MiniBatchKMeans, SphericalKMeans],
                         ids=lambda c: c.__name__)
@pytest.mark.parametrize("fault", list(BROKEN))
def test_fit_names_the_backend_and_member(fault, estimator):
    member, how, named, what = BROKEN[fault]
    cls = _broken(fault, member, how)
    X = _X()
    with registered(cls), pytest.raises(BackendContractError) as info:
        estimator(3, random_state=0, backend=cls.name).fit(X)
    text = str(info.value)
    assert f"backend {cls.name!r}" in text and f"{named} returned" in text, text
    assert what in text, text


@pytest.mark.parametrize("fault", list(BROKEN))
def test_check_backend_reports_a_failed_check(fault):
    member, how, named, what = BROKEN[fault]
    cls = _broken(fault, member, how)
    with pytest.raises(AssertionError) as info:
        check_backend(cls, dtypes=(np.float64,), cases=[(97, 3, 5)])
    text = str(info.value)
    assert cls.name in text and f"{named} returned" in text and what in text, text


LLOYD_FAULTS = {
    "labels-out-of-range": (lambda it: it._replace(labels=it.labels + 1), "labels are in"),
    "nan-sums": (lambda it: it._replace(weighted_sums=it.weighted_sums * np.nan), "NaN"),
}


@pytest.mark.parametrize("fault", list(LLOYD_FAULTS))
def test_a_queued_fit_checks_its_first_iteration_with_its_first_read(fault, monkeypatch):
    """On a placement that queues work (a GPU's), the first iteration's data checks are
    copied behind it and read with its statistics: a fault in what `lloyd_iter` returns
    still stops the fit with the contract's error, before relocation reads the labels."""
    from kmeans_xp.contract.backend import Placement

    class Queued(Placement):
        asynchronous = True

    how, what = LLOYD_FAULTS[fault]

    def lloyd_iter(self, *args, **kwargs):
        return how(KMeansBackend.lloyd_iter(self, *args, **kwargs))

    cls = type("QueuedBroken", (Plain,), {"name": "test-queued", "placement_class": Queued,
                                          "lloyd_iter": lloyd_iter})
    waits = []
    real = Placement.fetch

    def fetch(self, values):
        done = real(self, values)
        return lambda: (waits.append(values.shape), done())[1]

    monkeypatch.setattr(Placement, "fetch", fetch)
    X = _X()
    with registered(cls), pytest.raises(BackendContractError, match=what) as info:
        KMeans(3, init=X[:3], n_init=1, backend=cls.name).fit(X)
    assert "lloyd_iter returned" in str(info.value)
    assert len(waits) == 2   # the first statistics, then the checks copied behind them


def test_nan_sums_in_a_later_iteration_are_caught():
    """Only the first iteration is checked in full; later NaN sums show in the center shift
    the driver reads anyway."""
    class LateNaN(Plain):
        name = "test-late-nan"
        calls = 0

        def reduce(self, X, labels, sample_weight, n_clusters, *, xp):
            out = Plain.reduce(self, X, labels, sample_weight, n_clusters, xp=xp)
            type(self).calls += 1
            return out if type(self).calls < 3 else ReduceResult(out.weighted_sums * np.nan,
                                                                 out.weight_in_clusters)

    X = _X()
    with registered(LateNaN), pytest.raises(BackendContractError, match="reduce returned"):
        KMeans(3, init=X[:3], n_init=1, tol=0, backend=LateNaN.name).fit(X)


def test_own_loop_result_is_checked():
    class BadLoop(Plain):
        name = "test-bad-loop"

        def lloyd(self, X, sample_weight, centers, *, xp, max_iter, tol, spherical=False):
            from kmeans_xp import LloydResult
            return LloydResult(np.zeros(3, dtype=np.int32), 0.0, centers, 1,
                               {"inertia": [0.0], "center_shift": [0.0]})

    with registered(BadLoop), pytest.raises(BackendContractError, match="lloyd returned"):
        KMeans(3, random_state=0, backend=BadLoop.name).fit(_X())


@pytest.mark.parametrize("estimator", [KMeans, MiniBatchKMeans, SphericalKMeans],
                         ids=lambda c: c.__name__)
def test_a_plugins_int64_labels_reach_the_user_as_int32(estimator):
    X = _X()
    with registered(Plain):
        km = estimator(3, random_state=0, backend=Plain.name).fit(X)
        assert km.labels_.dtype == np.int32
        assert km.predict(X).dtype == np.int32
        assert km.fit_predict(X).dtype == np.int32
        if estimator is MiniBatchKMeans:
            assert km.partial_fit(X).labels_.dtype == np.int32
    ref = estimator(3, random_state=0, backend="numpy").fit(X)
    assert np.array_equal(km.labels_, ref.labels_)
