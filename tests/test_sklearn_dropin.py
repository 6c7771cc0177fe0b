"""What code written for scikit-learn's KMeans relies on beyond the estimator API: the
functions `k_means` and `kmeans_plusplus`, `_n_init`, the verbose lines and error wording it
matches on, feature names on MiniBatchKMeans, the global `transform_output`, transform's
zeros, and the fitted state in the input's namespace."""
import inspect
import re

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
import sklearn.cluster as skc  # noqa: E402

import kmeans_xp  # noqa: E402
from kmeans_xp import KMeans, MiniBatchKMeans  # noqa: E402
from kmeans_xp.testing import asymmetric_data  # noqa: E402

X = asymmetric_data(500, 4, 5, seed=4) + 1000.0   # an offset: the expansion's worst case


@pytest.mark.parametrize("name", ["k_means", "kmeans_plusplus"])
def test_functions_have_sklearns_signature(name):
    ours = inspect.signature(getattr(kmeans_xp, name)).parameters
    theirs = inspect.signature(getattr(skc, name)).parameters
    assert [p for p in theirs] == [p for p in ours if ours[p].kind != ours[p].VAR_KEYWORD]
    for p in theirs:
        assert ours[p].default == theirs[p].default, p


def test_k_means_returns_what_the_estimator_fits():
    init = X[[0, 100, 200, 300, 400]]
    c, labels, inertia, n_iter = kmeans_xp.k_means(X, 5, init=init, return_n_iter=True)
    km = KMeans(5, init=init).fit(X)
    np.testing.assert_array_equal(labels, km.labels_)
    np.testing.assert_allclose(c, km.cluster_centers_)
    assert (inertia, n_iter) == (km.inertia_, km.n_iter_)
    assert len(kmeans_xp.k_means(X, 5, init=init)) == 3
    c_ref, idx_ref = skc.kmeans_plusplus(X, 5, random_state=0)
    c, idx = kmeans_xp.kmeans_plusplus(X, 5, random_state=0)
    np.testing.assert_array_equal(idx, idx_ref)
    np.testing.assert_array_equal(c, c_ref)


@pytest.mark.parametrize("Estimator", [KMeans, MiniBatchKMeans])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transform_of_the_centers_has_a_zero_diagonal(Estimator, dtype):
    for seed in range(20):
        km = Estimator(5, random_state=seed, n_init=1).fit(X.astype(dtype))
        D = km.transform(km.cluster_centers_)
        np.testing.assert_array_equal(np.diag(D), 0)
        off = ~np.eye(5, dtype=bool)
        ref = np.linalg.norm(km.cluster_centers_.astype(np.float64)[:, None]
                             - km.cluster_centers_.astype(np.float64)[None], axis=2)
        np.testing.assert_allclose(D[off], ref[off], rtol=1e-5 if dtype == np.float32
                                   else 1e-12)


def test_n_init_is_recorded():
    assert KMeans(3, init="random", random_state=0).fit(X)._n_init == 10
    assert KMeans(3, random_state=0).fit(X)._n_init == 1
    assert KMeans(3, init=X[:3]).fit(X)._n_init == 1


def test_verbose_says_when_initialization_is_complete(capsys):
    KMeans(3, random_state=0, verbose=1, tol=0).fit(X)
    out = capsys.readouterr().out
    assert "Initialization complete" in out and "strict convergence" in out
    assert out.index("Initialization complete") < out.index("Iteration 0")


@pytest.mark.parametrize("Estimator", [KMeans, MiniBatchKMeans])
def test_init_shape_errors_use_sklearns_words_and_ours(Estimator):
    with pytest.raises(ValueError, match="does not match the number of features of the data"
                       ) as e:
        Estimator(5, init=X[:5, :2], n_init=1).fit(X)
    assert "expected (5, 4)" in str(e.value)
    with pytest.raises(ValueError, match="does not match the number of clusters"):
        Estimator(5, init=X[:3], n_init=1).fit(X)


@pytest.mark.parametrize("Estimator", [KMeans, MiniBatchKMeans])
def test_feature_names_are_recorded_and_checked(Estimator):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    km = Estimator(3, random_state=0).fit(df)
    np.testing.assert_array_equal(km.feature_names_in_, ["a", "b", "c", "d"])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        km.predict(df)   # no warning on the frame it was fitted on
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        km.predict(X)
    with pytest.raises(ValueError, match=re.escape(
            "Feature names must be in the same order as they were in fit")) as e:
        km.predict(df[["b", "a", "c", "d"]])
    assert "feature_names_in_" in str(e.value)
    with pytest.raises(ValueError, match="Feature names unseen at fit time:\n- e"):
        km.predict(df.rename(columns={"d": "e"}))


@pytest.mark.parametrize("Estimator", [KMeans, MiniBatchKMeans])
def test_global_transform_output_is_honoured(Estimator):
    pd = pytest.importorskip("pandas")
    km = Estimator(3, random_state=0).fit(X)
    with sklearn.config_context(transform_output="pandas"):
        out = km.transform(X)
        assert isinstance(out, pd.DataFrame)
        assert list(out.columns) == list(km.get_feature_names_out())
        # the estimator's own choice wins, as in scikit-learn
        assert isinstance(km.set_output(transform="default").transform(X), np.ndarray)
    assert isinstance(Estimator(3, random_state=0).fit_transform(X), np.ndarray)


def test_fitted_state_in_the_input_namespace_array_api_strict():
    xps = pytest.importorskip("array_api_strict")
    Xs = xps.asarray(X)
    for est in (KMeans(3, random_state=0), MiniBatchKMeans(3, random_state=0)):
        est.fit(Xs)
        for name in ("_centers_fit", "_X_mean", "cluster_centers_"):
            assert type(getattr(est, name)).__module__.startswith("array_api_strict"), name


def test_fitted_state_in_the_input_namespace_torch_cpu():
    torch = pytest.importorskip("torch")
    Xt = torch.asarray(X)
    km = KMeans(3, random_state=0).fit(Xt)
    mb = MiniBatchKMeans(3, random_state=0).fit(Xt)
    for est, names in ((km, ("_centers_fit", "_X_mean")),
                       (mb, ("_centers_fit", "_X_mean", "_counts"))):
        for name in names:
            assert isinstance(getattr(est, name), torch.Tensor), name
        np.testing.assert_array_equal(est.predict(Xt).numpy(), est.labels_.numpy())
    mb.partial_fit(Xt)
    assert isinstance(mb._counts, torch.Tensor)
