"""KMeans among other libraries: scikit-learn's feature names and `set_output`, a fitted
`sklearn.cluster.KMeans` on request, and pickles that hold host copies.

scikit-learn is imported only by `to_sklearn` (the user asked for it); pandas and polars only
to build the output a user asked for with `set_output`.
"""
from __future__ import annotations

import functools
import html
import inspect
import sys
import warnings
from typing import Any

import numpy as np

from kmeans_xp.contract.namespaces import device, namespace_name, to_numpy

#: fitted attributes that may live on a device; a pickle holds them as NumPy
_ARRAYS = ("cluster_centers_", "labels_", "_X_mean", "_centers_fit")


def _where(a):
    """(namespace, device) of an array, ("list", "array-like") for other input."""
    name = namespace_name(a)
    return name, "array-like" if name == "list" else str(device(a))


def feature_names(X):
    """X's column names as an object array when X is a table whose names are all strings
    (scikit-learn's rule), else None."""
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = list(columns)
    if not names or not all(isinstance(c, str) for c in names):
        return None
    return np.asarray(names, dtype=object)


@functools.lru_cache(maxsize=64)
def _init_parameter_names(init):
    """An __init__'s parameter names, sorted (inspect.signature costs ~0.1 ms: once each)."""
    return tuple(sorted(p for p in inspect.signature(init).parameters if p != "self"))


class SklearnInterop:
    """Mixed into KMeans: what scikit-learn's meta-estimators and exporters expect."""

    # -- scikit-learn estimator protocol ------------------------------------------------------
    @classmethod
    def _param_names(cls):
        return _init_parameter_names(cls.__init__)

    def get_params(self, deep: bool = True) -> dict:
        """Get the parameters of this estimator.

        Parameters
        ----------
        deep : bool, default=True
            Kept for sklearn's API: no parameter is an estimator.

        Returns
        -------
        params : dict
            Parameter names mapped to their values.
        """
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params):
        """Set the parameters of this estimator.

        Parameters
        ----------
        **params : dict
            Estimator parameters by name.

        Returns
        -------
        self : KMeans
            The estimator.
        """
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"Invalid parameter {name!r} for estimator {self!r}. Valid "
                                 f"parameters are: {valid}.")
            setattr(self, name, value)
        return self

    def __repr__(self):
        defaults = {p.name: p.default for p in
                    inspect.signature(type(self).__init__).parameters.values()}
        changed = []
        for name, value in self.get_params().items():
            default = defaults[name]
            same = value is default or (type(value) is type(default) and not hasattr(
                value, "shape") and value == default)
            if not same:
                array = getattr(value, "ndim", 0) > 0  # NumPy scalars print as numbers
                changed.append(f"{name}=array(shape={tuple(value.shape)})" if array
                               else f"{name}={_scalar(value)!r}")
        return f"{type(self).__name__}({', '.join(changed)})"

    def __sklearn_tags__(self):
        # only scikit-learn calls this, so importing it here adds no run-time dependency
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags
        # transform keeps float32 as float32 (sklearn's KMeans declares the same); array API
        # input (array-api-strict, torch, CuPy) computes and comes back in its namespace;
        # scipy.sparse X is fitted without densifying it (docs/sparse.md)
        return Tags(estimator_type="clusterer", target_tags=TargetTags(required=False),
                    transformer_tags=TransformerTags(preserves_dtype=["float64", "float32"]),
                    input_tags=InputTags(sparse=True), array_api_support=True)

    def __sklearn_is_fitted__(self):
        return hasattr(self, "cluster_centers_")

    # -- feature names ------------------------------------------------------------------------
    def _record_feature_names(self, X):
        names = feature_names(X)
        if names is None:
            self.__dict__.pop("feature_names_in_", None)
        else:
            self.feature_names_in_ = names

    def _check_feature_names(self, X):
        """scikit-learn's checks at predict time: the same names in the same order."""
        fitted = getattr(self, "feature_names_in_", None)
        given = feature_names(X)
        owner = type(self).__name__
        if fitted is None and given is not None:
            warnings.warn(f"X has feature names, but {owner} was fitted without feature "
                          f"names", UserWarning, stacklevel=3)
        elif fitted is not None and given is None:
            warnings.warn(f"X does not have valid feature names, but {owner} was fitted with "
                          f"feature names", UserWarning, stacklevel=3)
        elif fitted is not None and not np.array_equal(fitted, given):
            unseen = sorted(set(given) - set(fitted))
            missing = sorted(set(fitted) - set(given))
            # scikit-learn's wording (code matches on it), then what to do
            lines = ["The feature names should match those that were passed during fit."]
            if unseen:
                lines += ["Feature names unseen at fit time:"] + [f"- {n}" for n in unseen]
            if missing:
                lines += ["Feature names seen at fit time, yet now missing:"] + [
                    f"- {n}" for n in missing]
            if not unseen and not missing:
                lines.append("Feature names must be in the same order as they were in fit.")
            lines.append(f"Select the columns as at fit time: X[{owner.lower()}."
                         f"feature_names_in_].")
            raise ValueError("\n".join(lines))

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        """Get the output feature names of transform.

        Parameters
        ----------
        input_features : array-like of str or None, default=None
            Ignored: the names depend on the clusters only (sklearn's signature).

        Returns
        -------
        feature_names_out : ndarray of str objects
            ``kmeans0``, ``kmeans1``, ... (scikit-learn's names).
        """
        self._check_fitted()
        prefix = type(self).__name__.lower()
        return np.asarray([f"{prefix}{i}" for i in range(self.cluster_centers_.shape[0])],
                          dtype=object)

    # -- set_output -----------------------------------------------------------------------------
    def set_output(self, *, transform: str | None = None):
        """Set the output container of transform and fit_transform.

        Parameters
        ----------
        transform : {"default", "pandas", "polars"} or None, default=None
            "default": the input's namespace; "pandas" or "polars": a DataFrame with
            ``get_feature_names_out()`` as columns; None: unchanged.

        Returns
        -------
        self : KMeans
            The estimator.
        """
        if transform is None:
            return self
        if transform not in ("default", "pandas", "polars"):
            raise ValueError(f"set_output(transform={transform!r}): give 'default', 'pandas' "
                             f"or 'polars'.")
        self._output = transform
        # (where sklearn reads an estimator's choice: its clone copies it)
        self._sklearn_output_config = {"transform": transform}
        return self

    def _output_kind(self):
        """This estimator's set_output, else scikit-learn's global
        ``set_config(transform_output=...)`` when scikit-learn is loaded (never imported
        here), else "default"."""
        sk = sys.modules.get("sklearn")
        if sk is None:
            return getattr(self, "_output", "default")
        try:
            from sklearn.utils._set_output import _get_output_config
            return _get_output_config("transform", self)["dense"]
        except (ImportError, KeyError, TypeError):   # a private helper: its own rules
            own = getattr(self, "_output", None)
            return own or sk.get_config().get("transform_output", "default")

    def _wrap_output(self, out, X):
        kind = self._output_kind()
        if kind == "default":
            return out
        values = to_numpy(out)
        columns = list(self.get_feature_names_out())
        if kind == "pandas":
            import pandas as pd
            index = X.index if hasattr(X, "iloc") else None  # a DataFrame keeps its index
            return pd.DataFrame(values, columns=columns, index=index)
        import polars as pl
        return pl.DataFrame(values, schema=columns)

    # -- sklearn's array API dispatch -------------------------------------------------------------
    def _check_same_namespace(self, X, method):
        """Under sklearn's ``array_api_dispatch`` an estimator fitted on one namespace or
        device refuses input from another (sklearn's rule, its message). Without it a model
        predicts on any input, choosing a backend for it (a GPU fit predicting on NumPy)."""
        sk = sys.modules.get("sklearn")
        if sk is None or not sk.get_config().get("array_api_dispatch", False):
            return
        fitted, given = _where(self.cluster_centers_), _where(X)
        host = ("numpy", "list")  # array-likes go with NumPy, as in sklearn
        if fitted == given or (fitted[0] in host and given[0] in host):
            return
        raise ValueError(
            f"Inputs passed to {type(self).__name__}.{method}() must use the same namespace "
            f"and the same device as those passed to fit(). Fitted on {fitted[0]} "
            f"({fitted[1]}), given {given[0]} ({given[1]}). Convert X, or call "
            f"{method}() outside sklearn's array_api_dispatch (then any input is taken).")

    # -- Jupyter ----------------------------------------------------------------------------------
    def _repr_html_(self):
        """Jupyter's view: the parameters that differ from the defaults and, once fitted,
        what the fit found. Plain HTML: no scikit-learn needed."""
        rows = [("fitted", "no")]
        if hasattr(self, "cluster_centers_"):
            rows = [("backend", f"{self.backend_} ({self.backend_reason_})"),
                    ("n_iter_", self.n_iter_), ("inertia_", f"{self.inertia_:.6g}"),
                    ("n_features_in_", self.n_features_in_),
                    ("fit time", f"{self.timings_.get('total', 0.0):.3f} s")]
        cells = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                        f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
                        for k, v in rows)
        return (f"<div class='kmeans-xp-estimator'><pre>{html.escape(repr(self))}</pre>"
                f"<table>{cells}</table></div>")

    # -- scikit-learn's own estimator ------------------------------------------------------------
    #: fitted attributes a scikit-learn twin gets beside centers, labels and inertia (host
    #: copies of arrays)
    _SKLEARN_STATE: tuple[str, ...] = ("n_iter_",)

    def to_sklearn(self):
        """Return a fitted `sklearn.cluster.KMeans` with this model's centers.

        Centers (float64 or float32 as fitted), labels, inertia and iterations are copied to
        the host: it predicts as this model does, and exporters such as skl2onnx take it.
        (MiniBatchKMeans gives a `sklearn.cluster.MiniBatchKMeans`, with its counts, whose
        ``partial_fit`` goes on from here.)

        Returns
        -------
        sklearn.cluster.KMeans
            The fitted scikit-learn estimator.
        """
        import sklearn.cluster
        cls = getattr(sklearn.cluster, type(self).__name__)
        self._check_fitted()
        params = {k: v for k, v in self.get_params().items()
                  if k in cls().get_params() and k != "init"}
        sk = cls(**params)
        sk.cluster_centers_ = np.ascontiguousarray(to_numpy(self.cluster_centers_))
        if hasattr(self, "labels_"):
            sk.labels_ = to_numpy(self.labels_).astype(np.int32)
        for name in ("inertia_", *self._SKLEARN_STATE):
            if hasattr(self, name):
                value = getattr(self, name)
                setattr(sk, name, value if np.isscalar(value) else np.asarray(to_numpy(value)))
        sk.n_features_in_ = int(self.n_features_in_)
        sk._n_features_out = sk.cluster_centers_.shape[0]
        sk._n_threads = 1
        if hasattr(self, "feature_names_in_"):
            sk.feature_names_in_ = self.feature_names_in_
        return sk

    # -- pickling -------------------------------------------------------------------------------
    #: fitted attributes that may live on a device; a pickle holds them as NumPy
    _HOST_ON_PICKLE: tuple[str, ...] = _ARRAYS

    def __getstate__(self):
        """Device arrays as NumPy: a model fitted on a GPU loads and predicts on a machine
        without one (predict then picks a backend for the input it gets). Backends kept
        between calls stay out (thread pools and device buffers do not pickle)."""
        state = dict(self.__dict__)
        state.pop("_backend_cache", None)
        state.pop("_fallback_warned", None)
        for name in self._HOST_ON_PICKLE:
            if name in state and namespace_name(state[name]) not in ("numpy", "list"):
                state[name] = np.asarray(to_numpy(state[name]))
                state["_moved_to_host"] = True
        return state


def _scalar(value):
    """np.int64(3) as 3 (its repr is np.int64(3) in NumPy 2)."""
    return value.item() if isinstance(value, np.generic) else value
