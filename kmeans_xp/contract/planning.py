"""Planning a fit before it runs: `estimate_memory` for any backend, installed here or not.

A built-in backend whose library is missing (CuPy on a laptop) is still planned: its class is
imported without the library (the CuPy backends import CuPy only when instantiated) and its
`estimate_memory` plans without a device. So a GPU run can be sized where there is no GPU.
"""
from __future__ import annotations

import numbers

from kmeans_xp.contract.memory import MemoryEstimate, accepted_options, compute_itemsize, driver_bytes
from kmeans_xp.contract.registry import BUILTIN_BACKENDS, BackendNotAvailableError, get_backend, load_target


def planning_class(name: str) -> type:
    """The backend class `name` for planning: `get_backend(name)` where it is available;
    else a built-in's class when its module imports without the missing library."""
    try:
        return get_backend(name)
    except BackendNotAvailableError as missing:
        spec = BUILTIN_BACKENDS.get(name)
        if spec is None:
            raise
        try:
            return load_target(spec.target)
        except ImportError:  # the module itself needs the library (dask): say what to install
            raise missing from None


def _check_sizes(**sizes):
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def estimate_memory(n_samples: int, n_features: int, n_clusters: int, *,
                    dtype="float32", backend: str = "numpy", max_memory="auto",
                    backend_options: dict | None = None,
                    weighted: bool = False) -> MemoryEstimate:
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
        The working-memory bound of the fit ("2GB", "512MiB", bytes).
    backend_options : dict, optional
        Options of the backend that change its plan (e.g. ``{"stream": True}``).
    weighted : bool, default=False
        Whether the fit gets ``sample_weight`` (the driver then keeps n weights).

    Returns
    -------
    MemoryEstimate
        ``parts`` (name -> bytes: the backend's working memory, and the driver's own arrays
        as ``driver_*`` parts), ``total`` and ``chunk_rows``. X itself is not counted,
        except as ``data`` where the backend copies it to its device.

    Examples
    --------
    >>> from kmeans_xp import estimate_memory
    >>> est = estimate_memory(2_000_000, 3, 500, backend="cupy-fused")
    >>> est.total > 2_000_000 * 3 * 4
    True
    """
    _check_sizes(n_samples=n_samples, n_features=n_features, n_clusters=n_clusters)
    cls = planning_class(backend)
    n, d, k = int(n_samples), int(n_features), int(n_clusters)
    itemsize = compute_itemsize(dtype)
    fn = cls.estimate_memory
    est = fn(n, d, k, itemsize=itemsize, max_memory=max_memory,
             **accepted_options(fn, backend_options or {}))
    parts = dict(est.parts)
    driver = driver_bytes(n, d, k, itemsize, weighted=weighted,
                          seeding=_seeding_bytes(cls, n, d, k, itemsize, backend_options))
    if not getattr(cls, "centered_copy", True):   # (the sparse paths: X is never copied)
        del driver["centered_copy"]
    parts.update({f"driver_{p}": v for p, v in driver.items()})
    return MemoryEstimate(parts, sum(parts.values()), est.chunk_rows)


def _seeding_bytes(cls, n, d, k, itemsize, backend_options):
    fn = cls.seeding_bytes
    return fn(n, d, k, itemsize, **accepted_options(fn, backend_options or {}))
