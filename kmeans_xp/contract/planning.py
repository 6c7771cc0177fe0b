"""Planning a fit before it runs: `estimate_memory` for any backend, installed here or not.

A built-in backend whose library is missing (CuPy on a laptop) is still planned: its class is
imported without the library (the CuPy backends import CuPy only when instantiated) and its
`estimate_memory` plans without a device. So a GPU run can be sized where there is no GPU.
"""
from __future__ import annotations

import numbers
from typing import Any, cast

from kmeans_xp.contract.fitmemory import fit_memory
from kmeans_xp.contract.memory import MemoryEstimate, compute_itemsize
from kmeans_xp.contract.backend import KMeansBackend
from kmeans_xp.contract.registry import BUILTIN_BACKENDS, get_backend, get_backend_info, load_target


def planning_class(name: str) -> type[KMeansBackend]:
    """The backend class `name` for planning: `get_backend(name)` where it is available;
    else a built-in's class when its module imports without the missing library."""
    spec = BUILTIN_BACKENDS.get(name)
    known = get_backend_info(name)
    if spec is not None and known is not None and not known[0]:
        # loaded directly: get_backend's error would list the installed backends, and so
        # probe for a GPU (importing CuPy) only to be caught here
        try:
            return load_target(spec.target)  # type: ignore[no-any-return]
        except ImportError:  # the module itself needs the library (dask): say what to install
            pass
    return get_backend(name)


def _check_sizes(**sizes: Any) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def estimate_memory(n_samples: int, n_features: int, n_clusters: int, *,
                    dtype: Any = "float32", backend: str = "numpy",
                    max_memory: int | str = "auto", backend_options: dict[str, Any] | None = None,
                    weighted: bool = False, copy_x: bool = True) -> MemoryEstimate:
    """Estimate the bytes per part and in total that a fit needs, before anything runs.

    Parameters
    ----------
    n_samples, n_features, n_clusters : int
        The shape of X and the number of clusters.
    dtype : str or dtype, default="float32"
        X's dtype; the estimate is for the dtype the fit computes in (float32 stays float32,
        integers and float64 compute in float64).
    backend : str, default="numpy"
        A backend name, installed here or not: a GPU backend is planned on a machine
        without CuPy, with ``max_memory="auto"`` read as a share of an empty nominal GPU
        (an H200); give ``max_memory`` to plan for another device.
    max_memory : "auto", int or str, default="auto"
        The bound on everything the fit allocates beyond X ("2GB", "512MiB", bytes): the
        backend's buffers and the driver's arrays (centered copy, labels, init). Given in
        bytes, the parts sum to at most it (the backend's chunks shrink to fit), or
        `KMeansMemoryError` says what the fit needs at least and what to change.
    backend_options : dict, optional
        Options of the backend that change its plan (e.g. ``{"stream": True}``).
    weighted : bool, default=False
        Whether the fit gets ``sample_weight`` (the driver then keeps n weights).
    copy_x : bool, default=True
        Whether the fit centers a copy of X (``KMeans(copy_x=...)``).

    Returns
    -------
    MemoryEstimate
        ``parts`` (name -> bytes: the backend's working memory, and the driver's own arrays
        as ``driver_*`` parts), ``total`` and ``chunk_rows``. X itself is not bounded by
        max_memory: it is counted only as ``data`` where the backend copies it to its
        device (docs/memory.md lists what each part holds).

    Examples
    --------
    >>> from kmeans_xp import estimate_memory
    >>> est = estimate_memory(2_000_000, 3, 500, backend="cupy-fused")
    >>> est.total > 2_000_000 * 3 * 4
    True
    """
    _check_sizes(n_samples=n_samples, n_features=n_features, n_clusters=n_clusters)
    cls = planning_class(backend)
    itemsize = compute_itemsize(dtype)
    # (the sparse paths compute on X as given: no centered copy)
    copy_x = copy_x and getattr(cls, "centered_copy", True)
    _, est = fit_memory(cls, int(n_samples), int(n_features), int(n_clusters), itemsize,
                        max_memory, weighted=weighted, copy_x=copy_x,
                        options=backend_options or {})
    return cast(MemoryEstimate, est)
