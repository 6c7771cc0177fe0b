"""Checks on parameters and inputs, done before any device work.

Parameter constraints are data (`PARAMETER_CONSTRAINTS`); messages are generated from them and
name the parameter, what is allowed and what was given.
"""
from __future__ import annotations

import functools
import numbers
import sys

import numpy as np

from kmeans_xp.algorithms.init import INIT_METHODS
from kmeans_xp.contract.finite import check_finite
from kmeans_xp.contract.capacity import parse_balance
from kmeans_xp.contract.memory import parse_memory
from kmeans_xp.contract.precision import PRECISIONS, half_kind
from kmeans_xp.contract.constraints import Check, Interval, Options
from kmeans_xp.contract.sparse import is_sparse
from kmeans_xp.estimators.sparse_input import check_sparse
from kmeans_xp.contract.namespaces import array_namespace, is_array_api_obj, namespace_name, to_numpy


class NotFittedError(ValueError, AttributeError):
    """The estimator is used before `fit` (a ValueError and AttributeError, as in sklearn)."""


@functools.lru_cache(maxsize=4)
def _not_fitted_class(sklearn_error):
    return type("NotFittedError", (NotFittedError, sklearn_error), {
        "__module__": __name__, "__doc__": NotFittedError.__doc__})


def not_fitted_error(message):
    """A NotFittedError that is also sklearn's when the caller has imported scikit-learn, so
    `except sklearn.exceptions.NotFittedError` (and sklearn's own checks) catch it; without
    scikit-learn imported it is ours alone, and scikit-learn is never imported here."""
    sk = sys.modules.get("sklearn.exceptions")
    cls = _not_fitted_class(sk.NotFittedError) if sk is not None else NotFittedError
    return cls(message)


class InvalidParameterError(ValueError, TypeError):
    """A constructor parameter of the wrong type or value (a ValueError and a TypeError, as
    sklearn's InvalidParameterError, which it also is once the caller has imported
    scikit-learn)."""


@functools.lru_cache(maxsize=4)
def _invalid_parameter_class(sklearn_error):
    return type("InvalidParameterError", (InvalidParameterError, sklearn_error), {
        "__module__": __name__, "__doc__": InvalidParameterError.__doc__})


def invalid_parameter_error(message):
    """Ours, and sklearn's when sklearn's parameter validation is loaded (never imported
    here), so `except InvalidParameterError` written for sklearn catches it too."""
    sk = sys.modules.get("sklearn.utils._param_validation")
    error = getattr(sk, "InvalidParameterError", None)
    cls = InvalidParameterError if error is None else _invalid_parameter_class(error)
    return cls(message)


def _is_random_state(v):
    return v is None or isinstance(v, (numbers.Integral, np.random.RandomState,
                                       np.random.Generator)) and not isinstance(v, bool)


def _is_memory(v):
    try:
        parse_memory(v)
        return True
    except ValueError:
        return False


PARAMETER_CONSTRAINTS = {
    "n_clusters": [Interval(numbers.Integral, 1)],
    "init": [Options(*INIT_METHODS), Check(callable, "a callable"),
             Check(lambda v: isinstance(v, (list, tuple)) or is_array_api_obj(v),
                   "an array of shape (n_clusters, n_features)")],
    "n_init": [Options("auto"), Interval(numbers.Integral, 1)],
    "max_iter": [Interval(numbers.Integral, 1)],
    "tol": [Interval(numbers.Real, 0)],
    "verbose": [Interval(numbers.Integral, 0), Check(lambda v: isinstance(v, bool), "a bool")],
    "random_state": [Check(_is_random_state, "None, an int or a numpy RandomState")],
    "copy_x": [Check(lambda v: isinstance(v, (bool, np.bool_)), "a bool")],
    "algorithm": [Options("lloyd", "elkan")],
    "backend": [Check(lambda v: isinstance(v, str), "a backend name (str) or 'auto'")],
    "backend_options": [Check(lambda v: v is None or isinstance(v, dict), "None or a dict")],
    "max_memory": [Check(_is_memory, "'auto', a positive number of bytes or a string like "
                                     "'2GB'")],
    "balance": [Check(lambda v: v is None or isinstance(v, (float, dict)),
                      "None, a float >= 1 or a dict (docs/large_k.md)")],
    "precision": [Options(*PRECISIONS)],
    # MiniBatchKMeans's own
    "batch_size": [Interval(numbers.Integral, 1)],
    "compute_labels": [Check(lambda v: isinstance(v, (bool, np.bool_)), "a bool")],
    "max_no_improvement": [Interval(numbers.Integral, 0), Check(lambda v: v is None, "None")],
    "init_size": [Interval(numbers.Integral, 1), Check(lambda v: v is None, "None")],
    "reassignment_ratio": [Interval(numbers.Real, 0)],
}


def validate_params(params: dict, owner="KMeans"):
    """Each parameter against its constraints (every estimator parameter has some: a new one
    without them is a KeyError here, not a parameter left unchecked)."""
    for name, value in params.items():
        constraints = PARAMETER_CONSTRAINTS[name]
        if not any(c(value) for c in constraints):
            allowed = " or ".join(str(c) for c in constraints)
            raise invalid_parameter_error(f"The {name!r} parameter of {owner} must be "
                                          f"{allowed}. Got {value!r} instead.")


def check_balance(spec, owner="KMeans"):
    """The parsed `balance` parameter (`contract.capacity.parse_balance`), its errors as
    InvalidParameterError naming the parameter."""
    try:
        return parse_balance(spec)
    except ValueError as exc:
        raise invalid_parameter_error(f"The 'balance' parameter of {owner}: {exc}") from exc


def check_random_state(seed):
    if seed is None or isinstance(seed, numbers.Integral):
        return np.random.RandomState(seed)
    if isinstance(seed, np.random.RandomState):
        return seed
    if isinstance(seed, np.random.Generator):
        return np.random.RandomState(seed.integers(2**31))
    raise ValueError(f"random_state={seed!r} cannot seed a numpy RandomState")


def _float_dtype_for(xp, dtype):
    """The floating dtype computation uses for input of `dtype`, or an error."""
    if xp.isdtype(dtype, "complex floating"):
        raise ValueError("Complex data not supported; give real-valued X (e.g. X.real or "
                         "np.abs(X)).")
    if isinstance(dtype, np.dtype) and not dtype.isnative:
        dtype = dtype.newbyteorder("=")  # big-endian '>f4' computes as float32, not float64
    if dtype == xp.float64 or dtype == xp.float32:
        return dtype
    if xp.isdtype(dtype, "real floating"):
        # float16/bfloat16 gain precision in float32; long double would lose it there
        return xp.float32 if xp.finfo(dtype).bits < 32 else xp.float64
    if xp.isdtype(dtype, ("integral", "bool")):
        return xp.float64
    raise ValueError(f"X has dtype {dtype}, which is not numeric; give float32 or float64 data.")


def _numeric_from_python(X, name):
    """Lists and object arrays as a NumPy array of numbers, or a ValueError saying why not."""
    try:
        X = np.asarray(X)
    except ValueError as exc:
        raise ValueError(f"{name} could not be made into an array ({exc}); give a 2-D "
                         f"array of shape (n_samples, n_features).") from exc
    if X.dtype != object:
        return X  # numbers, or strings/bytes that the caller rejects by dtype
    try:
        return X.astype(np.float64)
    except (TypeError, ValueError) as exc:  # strings, None, dicts in the cells
        # the same class NumPy raises (sklearn does the same): ValueError for a string that
        # is not a number, TypeError for a cell of another type
        raise type(exc)(f"{name} has dtype object with a value that is not a number ({exc}); "
                        f"give float32 or float64 data.") from exc


def check_array(X, *, name="X", owner="KMeans", absmax=False, keep_half=None):
    """X as a 2-D float32/float64 array in its own namespace (lists become NumPy); with
    absmax=True, (X, max |X|) (None where X is checked lazily: dask). keep_half: a half
    precision ("fp16", "bf16") whose half X stays as it is (a fit at that precision, whose
    backend may compute on it so: `KMeansBackend.half_data`; the fit converts it otherwise)."""
    if isinstance(X, np.matrix):  # its * is a matrix product: the xp code would be wrong
        raise TypeError(f"np.matrix is not supported for {name}; convert it with "
                        f"np.asarray({name}).")
    if is_sparse(X):  # never densified (docs/sparse.md)
        return check_sparse(X, name=name, owner=owner, absmax=absmax)
    ns = namespace_name(X)
    if ns == "dask.array" and is_sparse(getattr(X, "_meta", None)):
        raise TypeError(f"{name} is a dask array of sparse chunks, which kmeans_xp does not "
                        f"fit (docs/sparse.md); give a scipy.sparse matrix ({name}.compute() "
                        f"of its CSR chunks) or dense chunks.")
    if ns == "list" or (isinstance(X, np.ndarray) and X.dtype == object):
        X = _numeric_from_python(X, name)
    keep = keep_half is not None and half_kind(getattr(X, "dtype", None)) == keep_half
    if isinstance(X, np.ndarray) and half_kind(X.dtype) == "bf16" and not keep:
        X = X.astype(np.float32)  # ml_dtypes' bfloat16 (kind "V"): its values, exactly
    if isinstance(X, np.ndarray) and X.dtype.kind in "USVO" and not keep:
        raise ValueError(f"{name} has dtype {X.dtype}, which is not numeric; give float32 or "
                         f"float64 data.")
    xp = array_namespace(X)
    if X.ndim == 1 or X.ndim == 0:
        raise ValueError(
            f"Expected 2D array, got {X.ndim}D array instead. Reshape your data either using "
            f"X.reshape(-1, 1) if your data has a single feature or X.reshape(1, -1) if it "
            f"contains a single sample.")
    if X.ndim > 2:
        raise ValueError(f"Found array with dim {X.ndim}. {owner} expected <= 2 (X of shape "
                         f"(n_samples, n_features)); got shape {tuple(X.shape)}.")
    if X.shape[0] == 0 or X.shape[1] == 0:
        what = "sample(s)" if X.shape[0] == 0 else "feature(s)"
        raise ValueError(f"Found array with 0 {what} (shape={tuple(X.shape)}) while a minimum "
                         f"of 1 is required.")
    dtype = X.dtype if keep else _float_dtype_for(xp, X.dtype)
    if dtype != X.dtype:
        X = xp.astype(X, dtype)
    top = None
    if ns != "dask.array":  # dask checks lazily while it persists X
        top = check_finite(X, xp, name)
    return (X, top) if absmax else X


def known_shape(X) -> bool:
    """Whether every dimension of X is a number (lazy arrays report None, dask NaN, for sizes
    they do not know before computing: a boolean filter's output)."""
    return all(s is not None and s == s for s in X.shape)


def unknown_shape_error(X, name="X"):
    return ValueError(f"{name} has an unknown shape {tuple(X.shape)}: its number of rows is "
                      f"not known before it is computed (a boolean filter's output); compute "
                      f"its sizes first (dask: {name}.compute_chunk_sizes()).")


def check_sample_weight(sample_weight, n_samples, dtype):
    """Validated weights as a NumPy array of `dtype` (they are small: n floats)."""
    if sample_weight is None:
        return np.ones(n_samples, dtype=dtype)
    if isinstance(sample_weight, numbers.Number):
        w = np.full(n_samples, sample_weight, dtype=dtype)
    else:
        w = np.asarray(to_numpy(sample_weight) if is_array_api_obj(sample_weight)
                       else sample_weight)
        if w.ndim != 1:
            raise ValueError(f"sample_weight must be 1-D of shape ({n_samples},), got shape "
                             f"{w.shape}.")
        if w.shape[0] != n_samples:
            raise ValueError(f"sample_weight.shape == ({w.shape[0]},), expected "
                             f"({n_samples},): one weight per sample.")
        if w.dtype.kind not in "biuf":
            raise ValueError(f"sample_weight has dtype {w.dtype}; give real numbers.")
        w = w.astype(dtype)
    if not np.all(np.isfinite(w)):
        raise ValueError("sample_weight contains NaN or infinity.")
    if np.any(w < 0):
        raise ValueError(f"Negative values in sample_weight (min {w.min()}); weights must be "
                         f">= 0.")
    return w


def check_init_array(init, n_clusters, n_features, *, xp_target=None):
    """The user's init centers as a NumPy float64 array, checked."""
    try:
        centers = to_numpy(init) if is_array_api_obj(init) else np.asarray(init)
    except ValueError as exc:  # ragged nested lists
        why = str(exc).rstrip(".")
        raise ValueError(f"init could not be made into an array of shape ({n_clusters}, "
                         f"{n_features}): {why}. Give one row of {n_features} values per "
                         f"cluster.") from exc
    if centers.dtype.kind not in "biuf":
        raise ValueError(f"init array has dtype {centers.dtype}; give real numbers.")
    if centers.shape != (n_clusters, n_features):
        # scikit-learn's wording (code matches on it), then what to do
        if centers.ndim != 2 or centers.shape[0] != n_clusters:
            what = f"the number of clusters {n_clusters}"
        else:
            what = f"the number of features of the data {n_features}"
        raise ValueError(f"The shape of the initial centers {centers.shape} does not match "
                         f"{what}: expected ({n_clusters}, {n_features}). Pass n_clusters="
                         f"{centers.shape[0] if centers.ndim else '?'} "
                         f"or an init of the right shape.")
    if not np.all(np.isfinite(centers)):
        raise ValueError("The initial centers (init) contain NaN or infinity.")
    # a copy: init is often a view of X, which copy_x=False centers in place during the fit
    return np.array(centers, dtype=np.float64)
