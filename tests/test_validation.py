"""Bad input gets a clear error before any work; good input is converted as documented."""
import importlib.util

import array_api_strict as xps
import numpy as np
import pytest
import scipy.sparse
from kmeans_xp_backends.array_api.backend import ArrayAPIBackend
from kmeans_xp_backends.numpy.backend import NumpyBackend

import kmeans_xp
import kmeans_xp.estimators.kmeans as est_mod
import kmeans_xp.algorithms.init as init_mod
from kmeans_xp import KMeans, NotFittedError
from kmeans_xp.contract.backend import Placement
from kmeans_xp.testing import asymmetric_data

X = asymmetric_data(50, 3, 3, seed=0)


class WorkStarted(AssertionError):
    pass


@pytest.fixture
def no_work(monkeypatch):
    """Any init or Lloyd work, on any backend, fails the test."""
    def boom(*args, **kwargs):
        raise WorkStarted("work started before the input was validated")

    for target, name in [(init_mod, "kmeans_plusplus"), (init_mod, "random_init"),
                         (est_mod, "kmeans_single_lloyd")]:
        monkeypatch.setattr(target, name, boom)
    for cls in (NumpyBackend, ArrayAPIBackend):
        for name in ("assign", "reduce", "lloyd_iter"):
            monkeypatch.setattr(cls, name, boom)
    for name in ("to_backend", "feature_stats"):
        monkeypatch.setattr(Placement, name, boom)


def _with(i, j, value, A=X):
    A = A.copy()
    A[i, j] = value
    return A


# (id, estimator kwargs, fit X, fit kwargs, error type, words the message must contain)
BAD_FITS = [
    ("nan", {}, _with(3, 1, np.nan), {}, ValueError, ["NaN"]),
    ("inf", {}, _with(7, 2, np.inf), {}, ValueError, ["infinity"]),
    ("neg-inf", {}, _with(7, 0, -np.inf), {}, ValueError, ["infinity"]),
    ("k>n", {"n_clusters": 51}, X, {}, ValueError, ["n_samples=50", "n_clusters=51"]),
    ("k=0", {"n_clusters": 0}, X, {}, ValueError, ["n_clusters", "Got 0"]),
    ("k<0", {"n_clusters": -2}, X, {}, ValueError, ["n_clusters", "Got -2"]),
    ("k float", {"n_clusters": 2.5}, X, {}, ValueError, ["n_clusters", "int", "2.5"]),
    ("k whole float", {"n_clusters": 3.0}, X, {}, ValueError, ["n_clusters", "3.0"]),
    ("k str", {"n_clusters": "3"}, X, {}, ValueError, ["n_clusters", "'3'"]),
    ("k bool", {"n_clusters": True}, X, {}, ValueError, ["n_clusters", "True"]),
    ("0 samples", {}, np.empty((0, 3)), {}, ValueError, ["0 sample", "(0, 3)"]),
    ("0 features", {}, np.empty((10, 0)), {}, ValueError, ["0 feature", "(10, 0)"]),
    ("1-D", {}, X[:, 0], {}, ValueError, ["1D", "reshape(-1, 1)"]),
    ("0-D", {}, np.float64(1.0), {}, ValueError, ["0D", "reshape"]),
    ("4-D", {}, X[:48].reshape(2, 2, 12, 3), {}, ValueError, ["4 dimensions", "(2, 2, 12, 3)",
                                                              "(n_problems, n_samples"]),
    ("complex", {}, X + 1j, {}, ValueError, ["Complex"]),
    ("strings", {}, np.array([["a", "b"], ["c", "d"]] * 5), {}, ValueError, ["<U1", "numeric"]),
    ("object strings", {"n_clusters": 1}, np.array([["a", 1.0], [2.0, 3.0]], dtype=object), {},
     ValueError, ["object", "'a'"]),
    ("object dict", {"n_clusters": 1}, np.array([[{"a": 1}, 1.0], [2.0, 3.0]], dtype=object),
     {}, TypeError, ["object", "dict"]),
    ("sparse NaN", {}, scipy.sparse.csr_matrix(np.where(X > 0, np.nan, X)), {}, ValueError,
     ["NaN"]),
    ("np.matrix", {}, np.matrix(X), {}, TypeError, ["np.matrix", "np.asarray"]),
    ("sparse inf", {}, scipy.sparse.csc_array(np.where(X > 0, np.inf, X)), {}, ValueError,
     ["infinity"]),
    ("sparse complex", {}, scipy.sparse.csr_array(X + 1j), {}, ValueError, ["Complex"]),
    ("sparse 0 samples", {}, scipy.sparse.csr_array((0, 3)), {}, ValueError, ["0 sample"]),
    ("list of strings", {"n_clusters": 1}, [["x", "y"], ["z", "w"]], {}, ValueError,
     ["numeric"]),
    ("ragged list", {"n_clusters": 1}, [[1.0, 2.0], [3.0]], {}, ValueError, ["2-D"]),
    ("datetime", {"n_clusters": 1}, np.zeros((3, 2), dtype="datetime64[s]"), {}, ValueError,
     ["datetime64", "numeric"]),
    ("init rows", {"init": X[:2]}, X, {}, ValueError, ["(2, 3)", "(3, 3)"]),
    ("init cols", {"init": X[:3, :2]}, X, {}, ValueError, ["(3, 2)", "(3, 3)"]),
    ("init 1-D", {"init": X[0]}, X, {}, ValueError, ["(3,)", "(3, 3)"]),
    ("init nan", {"init": _with(0, 0, np.nan, X[:3])}, X, {}, ValueError, ["NaN"]),
    ("init inf", {"init": _with(1, 2, np.inf, X[:3])}, X, {}, ValueError, ["infinity"]),
    ("init strings", {"init": np.array([["a"] * 3] * 3)}, X, {}, ValueError, ["dtype"]),
    ("init unknown", {"init": "kmeans++"}, X, {}, ValueError,
     ["'init'", "'k-means++'", "'random'", "'kmeans++'"]),
    ("init object", {"init": 42}, X, {}, ValueError, ["'init'", "42"]),
    ("sw length", {}, X, {"sample_weight": np.ones(49)}, ValueError, ["(49,)", "(50,)"]),
    ("sw negative", {}, X, {"sample_weight": _with(4, 0, -1.0, np.ones((50, 1)))[:, 0]},
     ValueError, ["Negative", "-1"]),
    ("sw nan", {}, X, {"sample_weight": np.r_[np.nan, np.ones(49)]}, ValueError, ["NaN"]),
    ("sw 2-D", {}, X, {"sample_weight": np.ones((50, 1))}, ValueError, ["1-D", "(50, 1)"]),
    ("sw strings", {}, X, {"sample_weight": np.array(["1"] * 50)}, ValueError, ["dtype"]),
    ("sw too few positive", {"n_clusters": 3}, X,
     {"sample_weight": np.r_[1.0, 1.0, np.zeros(48)]}, ValueError, ["2 samples", "positive"]),
    ("max_iter 0", {"max_iter": 0}, X, {}, ValueError, ["max_iter", "Got 0"]),
    ("max_iter float", {"max_iter": 10.5}, X, {}, ValueError, ["max_iter", "10.5"]),
    ("tol < 0", {"tol": -1e-3}, X, {}, ValueError, ["tol", "-0.001"]),
    ("tol nan", {"tol": float("nan")}, X, {}, ValueError, ["tol", "nan"]),
    ("n_init 0", {"n_init": 0}, X, {}, ValueError, ["n_init", "'auto'", "Got 0"]),
    ("n_init str", {"n_init": "many"}, X, {}, ValueError, ["n_init", "'many'"]),
    ("max_memory str", {"max_memory": "lots"}, X, {}, ValueError, ["max_memory", "'lots'", "2GB"]),
    ("max_memory unit", {"max_memory": "2XB"}, X, {}, ValueError, ["max_memory", "'2XB'"]),
    ("max_memory 0", {"max_memory": 0}, X, {}, ValueError, ["max_memory", "Got 0"]),
    ("max_memory 0GB", {"max_memory": "0GB"}, X, {}, ValueError, ["max_memory", "'0GB'"]),
    ("max_memory neg", {"max_memory": -5}, X, {}, ValueError, ["max_memory", "-5"]),
    ("random_state", {"random_state": "seed"}, X, {}, ValueError, ["random_state", "'seed'"]),
    ("verbose", {"verbose": -1}, X, {}, ValueError, ["verbose", "-1"]),
    ("copy_x", {"copy_x": "yes"}, X, {}, ValueError, ["copy_x", "'yes'"]),
    ("backend type", {"backend": 3}, X, {}, ValueError, ["backend", "3"]),
    ("backend_options", {"backend_options": [1]}, X, {}, ValueError, ["backend_options"]),
    ("unknown backend", {"backend": "nope"}, X, {}, ValueError,
     ["'nope'", "Installed backends", "'numpy'", "'array-api'"]),
]


@pytest.mark.parametrize("kwargs,data,fit_kwargs,exc,words",
                         [c[1:] for c in BAD_FITS], ids=[c[0] for c in BAD_FITS])
def test_bad_input_fails_before_work(no_work, kwargs, data, fit_kwargs, exc, words):
    kwargs = {"n_clusters": 3, **kwargs}
    with pytest.raises(exc) as info:
        KMeans(**kwargs).fit(data, **fit_kwargs)
    assert not isinstance(info.value, WorkStarted)
    msg = str(info.value)
    for word in words:
        assert word in msg, f"{word!r} missing from the message: {msg}"


def test_known_but_unavailable_backend_says_what_to_install(no_work):
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is importable here, so cupy-fused is not missing its library")
    with pytest.raises(kmeans_xp.BackendNotAvailableError) as info:
        KMeans(3, backend="cupy-fused").fit(X)
    msg = str(info.value)
    assert "'cupy-fused'" in msg and "cupy is not installed" in msg
    assert "pip install 'kmeans_xp[cuda12]'" in msg and "kmeans_xp[cuda13]" in msg
    assert "'numpy'" in msg  # what is installed instead
    assert isinstance(info.value, ImportError)


def test_dask_unavailable_says_what_to_install(no_work):
    if importlib.util.find_spec("dask") is not None:
        pytest.skip("checks the error for a missing dask; dask is installed here")
    with pytest.raises(kmeans_xp.BackendNotAvailableError, match=r"kmeans_xp\[dask\]"):
        KMeans(3, backend="dask").fit(X)


def test_unknown_backend_option_is_named(no_work):
    with pytest.raises(TypeError, match="foo"):
        KMeans(3, backend="array-api", backend_options={"foo": 1}).fit(X)


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_use_before_fit(method):
    with pytest.raises(NotFittedError, match="not fitted"):
        getattr(KMeans(3), method)(X)
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)


@pytest.fixture(scope="module")
def fitted():
    return KMeans(3, random_state=0).fit(X)


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_wrong_number_of_features(fitted, method):
    with pytest.raises(ValueError, match="X has 2 features, but KMeans is expecting 3"):
        getattr(fitted, method)(X[:, :2])


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_nan_at_predict(fitted, method):
    with pytest.raises(ValueError, match="NaN"):
        getattr(fitted, method)(_with(0, 0, np.nan))


def test_predict_1d_suggests_reshape(fitted):
    with pytest.raises(ValueError, match=r"reshape\(1, -1\)"):
        fitted.predict(X[0])


# -- conversion -----------------------------------------------------------------------------
CONVERSIONS = [
    ("float64", lambda A: A, np.float64),
    ("float32", lambda A: A.astype(np.float32), np.float32),
    ("float16", lambda A: A.astype(np.float16), np.float32),
    ("longdouble", lambda A: A.astype(np.longdouble), np.float64),
    ("int32", lambda A: (A * 10).astype(np.int32), np.float64),
    ("int64", lambda A: (A * 10).astype(np.int64), np.float64),
    ("uint8", lambda A: np.abs(A).astype(np.uint8), np.float64),
    ("bool", lambda A: A > A.mean(0), np.float64),
    ("F float64", np.asfortranarray, np.float64),
    ("F float32", lambda A: np.asfortranarray(A.astype(np.float32)), np.float32),
    ("strided", lambda A: np.repeat(A, 2, axis=1)[:, ::2], np.float64),
    ("list", lambda A: A.tolist(), np.float64),
    ("list of ints", lambda A: (A * 10).astype(int).tolist(), np.float64),
    ("object numbers", lambda A: A.astype(object), np.float64),
]


@pytest.mark.parametrize("make,dtype", [c[1:] for c in CONVERSIONS],
                         ids=[c[0] for c in CONVERSIONS])
def test_input_conversion(make, dtype):
    data = make(X)
    ref = np.asarray(np.asarray(data, dtype=np.float64) if not isinstance(data, list)
                     else data, dtype=np.float64)
    init = ref[[0, 20, 40]]
    km = KMeans(3, init=init).fit(data)
    assert km.cluster_centers_.dtype == dtype
    # (the numpy backend's labels are scikit-learn's int32, predict's as labels_)
    assert isinstance(km.cluster_centers_, np.ndarray) and km.labels_.dtype == np.int32
    assert km.n_features_in_ == 3
    # same answer as float64 data computed directly (to float32 precision where used)
    ref_km = KMeans(3, init=init).fit(ref.astype(dtype))
    np.testing.assert_array_equal(km.labels_, ref_km.labels_)
    np.testing.assert_array_equal(km.predict(data), km.labels_)
    assert km.predict(data).dtype == km.labels_.dtype
    assert km.transform(data).dtype == dtype


def test_input_conversion_array_api_strict():
    data = xps.asarray((X * 10).astype(np.int32))
    km = KMeans(3, random_state=0).fit(data)
    assert km.cluster_centers_.dtype == xps.float64
    data16 = xps.asarray(X.astype(np.float32))
    assert KMeans(3, random_state=0).fit(data16).cluster_centers_.dtype == xps.float32


def test_float16_init_and_weights_follow_x():
    km = KMeans(3, init=X[:3].astype(np.float64)).fit(X.astype(np.float16),
                                                       sample_weight=np.arange(50) % 3 + 1)
    assert km.cluster_centers_.dtype == np.float32


# -- copy_x=False ------------------------------------------------------------------------------
def _integral_data(dtype):
    """Integer-valued data with integer column means: centering and un-centering are exact."""
    rng = np.random.default_rng(5)
    A = rng.integers(-500, 500, size=(97, 4)).astype(np.float64)
    A[-1] -= A.sum(0) % 97  # column sums divisible by n: the means are integers
    A[:, 2] += 10_000  # an offset, as in the seed's data
    return np.asfortranarray(A.astype(dtype)) if dtype == np.float32 else A.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_copy_x_false_restores_x(dtype):
    A = _integral_data(dtype)
    before = A.copy()
    km = KMeans(4, copy_x=False, random_state=0).fit(A)
    np.testing.assert_array_equal(A, before)  # exact: the arithmetic is exact for these data
    ref = KMeans(4, copy_x=True, random_state=0).fit(before.copy())
    np.testing.assert_array_equal(km.labels_, ref.labels_)
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_)


def test_copy_x_false_general_data_within_rounding():
    """For general data X comes back up to the rounding of (x - mean) + mean, as in sklearn."""
    A = asymmetric_data(301, 3, 4, seed=2, offset=1e3)
    before = A.copy()
    KMeans(4, copy_x=False, random_state=0).fit(A)
    bound = 2 * np.finfo(A.dtype).eps * (np.abs(before) + np.abs(before.mean(0)))
    assert np.all(np.abs(A - before) <= bound)


def test_copy_x_true_never_touches_x():
    A = asymmetric_data(301, 3, 4, seed=2, offset=1e3)
    before = A.copy()
    KMeans(4, copy_x=True, random_state=0).fit(A)
    np.testing.assert_array_equal(A, before)


@pytest.mark.parametrize("where", ["lloyd_iter", "kmeans_plusplus"])
def test_copy_x_false_restores_x_when_fit_raises(monkeypatch, where):
    A = _integral_data(np.float64)
    before = A.copy()

    def fail(*args, **kwargs):
        raise RuntimeError("injected failure")

    if where == "lloyd_iter":
        monkeypatch.setattr(NumpyBackend, "lloyd_iter", fail)
    else:
        monkeypatch.setattr(init_mod, "kmeans_plusplus", fail)
    with pytest.raises(RuntimeError, match="injected failure"):
        KMeans(4, copy_x=False, backend="numpy", random_state=0).fit(A)
    np.testing.assert_array_equal(A, before)


def test_copy_x_false_callable_init_sees_user_data():
    """A callable init gets X as the user gave it, whether or not X is centered in place."""
    A = _integral_data(np.float64)
    seen = []

    def first_rows(data, k, random_state):
        seen.append(np.asarray(data).mean(0))
        return np.asarray(data)[:k]

    for copy_x in (True, False):
        km = KMeans(4, init=first_rows, n_init=1, copy_x=copy_x, max_iter=1).fit(A)
        np.testing.assert_allclose(seen[-1], A.mean(0))
        ref = KMeans(4, init=A[:4], max_iter=1).fit(A)
        np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_)


def test_copy_x_false_init_view_of_x():
    """init given as a view of X must not move when X is centered in place."""
    A = _integral_data(np.float64)
    ref = KMeans(4, init=A[:4].copy(), max_iter=1).fit(A.copy())
    km = KMeans(4, init=A[:4], copy_x=False, max_iter=1).fit(A)
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(km.labels_, ref.labels_)


@pytest.mark.parametrize("n,d", [(n, d) for n in (1, 7, 4095, 3 * 4096 + 7, 100_003)
                                 for d in (1, 3, 5000) if n * d < 10**8])  # (2 GB: 25 s)
def test_device_extremes_see_every_value(n, d):
    """The device path of the finiteness check (X seen as (n / g, g * d) so that a GPU
    reduction has enough outputs, the rows left over on their own) reads every value: its
    extremes are X's, and a NaN anywhere (in the view or the rows left over) shows."""
    from kmeans_xp.contract.finite import _spread_extremes
    rng = np.random.default_rng(n + d)
    X = rng.standard_normal((n, d)).astype(np.float32)

    def extremes(Y):
        parts = _spread_extremes(Y, np)
        ext = np.concatenate([np.reshape(p, (2, -1)) for p in parts], axis=1)
        return ext[0].max(), -ext[1].max()

    assert extremes(X) == (X.max(), X.min())
    assert extremes(X[:, ::-1]) == (X.max(), X.min())  # strided: reduced as it is
    for row in {0, n // 2, n - 1}:
        Y = X.copy()
        Y[row, d - 1] = np.nan
        assert np.isnan(extremes(Y)).all()


def test_dtype_names_tell_bfloat16_from_float16():
    """One name per dtype, of any library's dtype object or string: bfloat16 is not float16
    (its name contains it)."""
    from kmeans_xp.contract.namespaces import dtype_name
    assert dtype_name(np.dtype(np.float16)) == "float16"
    assert dtype_name("torch.bfloat16") == "bfloat16"
    assert dtype_name(np.dtype(np.float32)) == "float32"
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert dtype_name(np.dtype(ml_dtypes.bfloat16)) == "bfloat16"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n,d", [(1, 1), (5, 3), (4097, 3), (70_001, 129)])
def test_cupy_absmax_sees_every_value(cp, dtype, n, d):
    """A contiguous CuPy X's check (one reduction over a (4096, size / 4096) view, the values
    left over as one more row) returns max |X| exactly and sees a NaN or an infinity
    anywhere, in the view or among the values left over; a strided X takes the spread path
    with the same answer. The user's array is never written."""
    from array_api_compat import array_namespace

    from kmeans_xp.contract.finite import check_finite
    rng = np.random.default_rng(n * d)
    Xh = (rng.standard_normal((n, d)) * 3 - 1).astype(dtype)
    Xh[n // 2, d - 1] = -50   # the largest |x| is negative
    X = cp.asarray(Xh)
    assert check_finite(X, array_namespace(X)) == 50.0
    if d > 1:
        Xs = X[:, ::2]
        assert check_finite(Xs, array_namespace(Xs)) == float(np.abs(Xh[:, ::2]).max())
    for value, what in ((np.nan, "NaN"), (np.inf, "infinity"), (-np.inf, "infinity")):
        for at in {0, n * d // 2, n * d - 1}:
            Y = X.copy()
            Y.reshape(-1)[at] = value
            with pytest.raises(ValueError, match=what):
                check_finite(Y, array_namespace(Y))
            assert int(cp.isnan(Y).sum() + cp.isinf(Y).sum()) == 1   # not written
