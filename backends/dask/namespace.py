"""The namespace the driver computes with on a dask X (`DaskPlacement.namespace`)."""
from __future__ import annotations

import sys

import numpy as np

from kmeans_xp.contract.namespaces import namespace_name, to_numpy

from .blocks import block_kind, cupy


class DaskNamespace:
    """The namespace the driver uses on a dask X: dask for per-sample arrays, the blocks'
    own library (NumPy or CuPy, through array-api-compat) for small ones.

    - An array whose leading dimension is n_samples is a dask array chunked like X's rows,
      so sample weights, distances and labels line up block for block; a constant one (unit
      sample weights) is created on the workers instead of shipped from the client.
    - Anything else (centers, sums, the mean, k-means++ candidates) is an ordinary NumPy or
      CuPy array on the client: a function given no dask array runs eagerly there, so the
      driver's per-iteration work on k x d arrays costs no scheduler round trip; a function
      given a dask array runs in dask, with the small arrays lifted into one-block arrays.
    """

    def __init__(self, base, n_samples, row_chunks, kind):
        self._base = base                     # array-api-compat's dask namespace
        self._eager = _eager_namespace(kind)  # array-api-compat's numpy or cupy namespace
        self._n = int(n_samples)
        self._row_chunks = tuple(row_chunks)
        self._kind = kind
        self.__name__ = base.__name__  # array-api-compat's is_dask_namespace() checks this

    @classmethod
    def for_array(cls, X):
        """The namespace for dask array X (2-D, or per-sample 1-D): building it computes
        nothing."""
        from array_api_compat import array_namespace
        return cls(array_namespace(X), X.shape[0], X.chunks[0], block_kind(X))

    def __repr__(self):
        return f"<kmeans_xp DaskNamespace: dask per sample, {self._kind} for small arrays>"

    # -- dispatch -------------------------------------------------------------------------
    def __getattr__(self, name):
        attr = getattr(self._base, name)
        if not callable(attr) or isinstance(attr, type) or name.startswith("_"):
            return attr  # dtypes, constants, classes

        def dispatch(*args, **kwargs):
            if _has_dask(args) or _has_dask(kwargs.values()):
                args = [self._lift_any(a) for a in args]
                kwargs = {k: self._lift_any(v) for k, v in kwargs.items()}
                kwargs.pop("device", None)
                return attr(*args, **kwargs)
            if "device" in kwargs:
                kwargs["device"] = None
            return getattr(self._eager, name)(*args, **kwargs)

        dispatch.__name__ = name
        return dispatch

    def _per_sample(self, shape):
        return len(shape) >= 1 and shape[0] == self._n

    def _chunks(self, shape):
        return (self._row_chunks,) + tuple((s,) for s in shape[1:])

    def _lift(self, a):
        """A NumPy/CuPy array as a dask array (one block, or X's row blocks if per-sample)."""
        import dask.array as da
        shape = tuple(a.shape)
        return da.from_array(a, chunks=self._chunks(shape) if self._per_sample(shape)
                             else (shape or ()), asarray=False)

    def _lift_any(self, v):
        if isinstance(v, (list, tuple)):
            return type(v)(self._lift_any(x) for x in v)
        if _is_eager_array(v):
            return self._lift(v)
        return v

    def _blocks(self, arr):
        if self._kind == "cupy" and block_kind(arr) == "numpy":
            cp = cupy()
            return arr.map_blocks(cp.asarray, dtype=arr.dtype,
                                  meta=cp.empty((0,) * arr.ndim, dtype=arr.dtype))
        return arr

    # -- creation: per-sample arrays are dask, chunked like X --------------------------------
    def asarray(self, obj, /, *, dtype=None, device=None, copy=None):
        import dask.array as da
        if isinstance(obj, da.Array):
            if not self._per_sample(obj.shape):
                return self._eager.asarray(to_numpy(obj) if self._kind == "numpy"
                                           else obj.compute(), dtype=dtype)
            out = self._base.asarray(obj, dtype=dtype, copy=copy)
            if out.chunks[0] != self._row_chunks:
                out = out.rechunk({0: self._row_chunks})
            return self._blocks(out)
        shape = getattr(obj, "shape", None)
        if shape is None:
            obj = np.asarray(obj)
            shape = obj.shape
        if not self._per_sample(shape):
            return self._eager.asarray(obj, dtype=dtype, copy=copy)
        host = np.asarray(to_numpy(obj) if namespace_name(obj) != "list" else obj, dtype=dtype)
        if host.ndim == 1 and self._n > 1 and host[0] == host[-1] and np.all(host == host[0]):
            out = da.full(host.shape, host[0], dtype=host.dtype, chunks=self._chunks(host.shape))
        else:
            out = da.from_array(host, chunks=self._chunks(host.shape))
        return self._blocks(out)

    def _create(self, fname, shape, *args, dtype=None):
        import dask.array as da
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if not self._per_sample(shape):
            return getattr(self._eager, fname)(shape, *args, dtype=dtype)
        return self._blocks(getattr(da, fname)(shape, *args, dtype=dtype,
                                               chunks=self._chunks(shape)))

    def zeros(self, shape, *, dtype=None, device=None):
        return self._create("zeros", shape, dtype=dtype)

    def ones(self, shape, *, dtype=None, device=None):
        return self._create("ones", shape, dtype=dtype)

    def empty(self, shape, *, dtype=None, device=None):
        return self._create("empty", shape, dtype=dtype)

    def full(self, shape, fill_value, *, dtype=None, device=None):
        return self._create("full", shape, fill_value, dtype=dtype)


def _eager_namespace(kind):
    if kind == "cupy":
        import array_api_compat.cupy as xp
    else:
        import array_api_compat.numpy as xp
    return xp


def _is_eager_array(v):
    return isinstance(v, np.ndarray) or (
        "cupy" in sys.modules and isinstance(v, sys.modules["cupy"].ndarray))


def _has_dask(values):
    import dask.array as da
    for v in values:
        if isinstance(v, da.Array):
            return True
        if isinstance(v, (list, tuple)) and _has_dask(v):
            return True
    return False
