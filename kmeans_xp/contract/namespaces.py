"""Small per-library differences, kept in one place (array-api-compat does the rest)."""
from __future__ import annotations

import sys
from typing import Any, TypeAlias

import numpy as np
from array_api_compat import array_namespace, is_array_api_obj  # noqa: F401
from array_api_compat import device as _array_device

#: an array of the namespace a backend computes on (NumPy, CuPy, torch, dask, ...): the array
#: API standard gives no static type that all of them share
Array: TypeAlias = Any
#: an array namespace, the `xp` the array API standard's functions are called on
Namespace: TypeAlias = Any


def device(x):
    """array-api-compat's `device`, also for sparse X: the device of its stored values."""
    module = type(x).__module__
    if module.startswith(("scipy.sparse", "cupyx.scipy.sparse", "kmeans_xp.contract.sparse")):
        return _array_device(x.data) if hasattr(x, "nnz") else x.device
    return _array_device(x)


def namespace_name(X) -> str:
    """'numpy', 'cupy', 'torch', 'dask.array', 'array_api_strict', ... for an array;
    'scipy.sparse' or 'cupyx.scipy.sparse' for a sparse matrix or array; 'list' else."""
    if isinstance(X, np.ndarray):
        return "numpy"
    module = type(X).__module__
    if module.startswith(("scipy.sparse", "cupyx.scipy.sparse")):
        return "cupyx.scipy.sparse" if module.startswith("cupyx") else "scipy.sparse"
    if not is_array_api_obj(X):
        return "list"
    mod = type(X).__module__.split(".")[0]
    if mod == "dask":
        return "dask.array"
    if mod == "jaxlib":  # a jax.Array's class lives in jaxlib
        return "jax"
    return mod


def is_cupy(X) -> bool:
    return "cupy" in sys.modules and namespace_name(X) == "cupy"


#: libraries whose arrays reach the NumPy and CuPy backends through DLPack, by device
DLPACK_FOREIGN = ("torch", "jax")


def foreign_device_type(X):
    """'cuda', 'cpu', ... for a torch tensor or a JAX array (on one device); None for
    anything else (neither library is imported: their arrays exist only where they are)."""
    ns = namespace_name(X)
    if ns == "torch":
        return getattr(getattr(X, "device", None), "type", None)
    if ns == "jax":
        devices = X.devices()
        if len(devices) != 1:
            return None  # sharded over several devices: the array-api backend's
        platform = next(iter(devices)).platform
        return "cuda" if platform == "gpu" else platform
    return None


def dlpack_source(X):
    """What to hand to `from_dlpack` for a foreign array (a torch tensor, detached)."""
    return X.detach() if namespace_name(X) == "torch" else X


def as_like(arr, like):
    """arr (a NumPy or CuPy result) as the caller's torch tensor or JAX array on `like`'s
    device when `like` is one, zero-copy where it can be (DLPack from CuPy,
    `torch.from_numpy` on the host); else arr."""
    ns = namespace_name(like)
    if arr is None or ns not in DLPACK_FOREIGN or namespace_name(arr) == ns:
        return arr
    if ns == "jax":
        jax = sys.modules["jax"]
        if namespace_name(arr) == "cupy":
            return jax.dlpack.from_dlpack(arr)
        return jax.device_put(np.asarray(arr), next(iter(like.devices())))
    torch = sys.modules["torch"]
    if namespace_name(arr) == "cupy":
        out = torch.from_dlpack(arr)
        return out if out.device == like.device else out.to(like.device)
    host = np.asarray(arr)
    if like.device.type == "cpu" and host.flags.writeable:
        return torch.from_numpy(host)
    return torch.as_tensor(host, device=like.device)


def to_numpy(X):
    """A NumPy copy (or view) of any supported array, pulled to the host if needed."""
    if isinstance(X, np.ndarray):
        return X
    name = namespace_name(X)
    if name == "cupy":
        return X.get()
    if name == "torch":
        return _torch_to_numpy(X.detach().cpu())
    if name == "jax":
        return np.asarray(X)
    if name == "dask.array":
        return to_numpy(X.compute())  # the blocks may be CuPy arrays
    try:
        return np.asarray(X)
    except (TypeError, ValueError, RuntimeError):
        # array_api_strict refuses __array__ on purpose; go through DLPack
        return np.from_dlpack(X)


def label_counts(labels, n_clusters):
    """Points per cluster (NumPy, length n_clusters), counted where the labels live: only
    the k counts travel (gathering the labels of a dask or device array to the host would move
    all n of them)."""
    name = namespace_name(labels)
    if name == "dask.array":
        import dask.array as da
        counts = da.bincount(labels, minlength=n_clusters).compute()
    elif name == "cupy":
        counts = sys.modules["cupy"].bincount(labels, minlength=n_clusters)
    elif name == "torch":
        counts = labels.bincount(minlength=n_clusters)
    else:
        counts = _host_counts(to_numpy(labels), n_clusters)
    return to_numpy(counts)


#: rows per np.bincount of `label_counts` on the host: it converts labels of any other type
#: (int32, compact uint8) to an intp copy, 8 bytes a row, per call
COUNT_ROWS = 1 << 16


def _host_counts(labels, n_clusters):
    if labels.dtype == np.intp or labels.shape[0] <= COUNT_ROWS:
        return np.bincount(labels, minlength=n_clusters)
    counts = np.zeros(n_clusters, dtype=np.intp)
    for s in range(0, labels.shape[0], COUNT_ROWS):
        counts += np.bincount(labels[s:s + COUNT_ROWS], minlength=n_clusters)
    return counts


def xp_float_dtype(xp, dtype_name: str):
    return getattr(xp, dtype_name)


def dtype_name(dtype) -> str:
    """'float32' / 'float64' for a dtype of any namespace."""
    s = str(dtype)
    for name in ("float64", "float32", "bfloat16", "float16"):   # ("float16" is in "bfloat16")
        if name in s:
            return name
    return s


def _torch_to_numpy(t):
    """A host torch tensor as NumPy: bfloat16, which NumPy lacks, as ml_dtypes' bfloat16
    by its bits (what CuPy holds it as), or as its exact float32 values without ml_dtypes."""
    import torch
    if t.dtype != torch.bfloat16:
        return t.numpy()
    try:
        import ml_dtypes
    except ImportError:
        return t.float().numpy()
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def operand(value, like, xp):
    """`value` as a 0-d array of like's dtype on like's device: the other operand of an
    operator on `like`. (CuPy sends an operator with a host operand, a Python or NumPy scalar,
    through NumPy's ufunc dispatch, whose first use imports all of cupyx: 0.33 s of a warm
    first fit. tests/test_cupy_host_operands.py finds such operators in a fit.)"""
    return xp.asarray(value, dtype=like.dtype, device=device(like))
