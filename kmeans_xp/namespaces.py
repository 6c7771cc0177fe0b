"""Small per-library differences, kept in one place (array-api-compat does the rest)."""
from __future__ import annotations

import sys

import numpy as np
from array_api_compat import array_namespace, device, is_array_api_obj  # noqa: F401


def namespace_name(X) -> str:
    """'numpy', 'cupy', 'torch', 'dask.array', 'array_api_strict', ... for an array; 'list' else."""
    if isinstance(X, np.ndarray):
        return "numpy"
    if not is_array_api_obj(X):
        return "list"
    mod = type(X).__module__.split(".")[0]
    if mod == "dask":
        return "dask.array"
    return mod


def is_cupy(X) -> bool:
    return "cupy" in sys.modules and namespace_name(X) == "cupy"


def torch_device_type(X):
    """'cuda', 'cpu', ... for a torch tensor; None for anything else (torch is not imported:
    a tensor exists only where torch already is)."""
    if namespace_name(X) != "torch":
        return None
    return getattr(getattr(X, "device", None), "type", None)


def as_like(arr, like):
    """arr (a NumPy or CuPy result) as a torch tensor on `like`'s device when `like` is one,
    zero-copy where it can be (DLPack from CuPy, `torch.from_numpy` on the host); else arr."""
    if arr is None or namespace_name(like) != "torch" or namespace_name(arr) == "torch":
        return arr
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
        return X.detach().cpu().numpy()
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
        counts = np.bincount(to_numpy(labels), minlength=n_clusters)
    return to_numpy(counts)


def xp_float_dtype(xp, dtype_name: str):
    return getattr(xp, dtype_name)


def dtype_name(dtype) -> str:
    """'float32' / 'float64' for a dtype of any namespace."""
    s = str(dtype)
    for name in ("float64", "float32", "float16", "bfloat16"):
        if name in s:
            return name
    return s
