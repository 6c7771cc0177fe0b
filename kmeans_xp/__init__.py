"""kmeans_xp: KMeans written once against the Python array API, on pluggable backends.

    >>> from kmeans_xp import KMeans
    >>> KMeans(n_clusters=500, backend="cupy-chunked").fit(X)      # doctest: +SKIP

`list_backends()` says what is installed; `estimate_memory(...)` says what a fit will need.
"""
from kmeans_xp.contract.backend import (
    AssignResult,
    Farthest,
    IterStats,
    KMeansBackend,
    Option,
    Placement,
    ReduceResult,
    WorkerLostError,
)
from kmeans_xp.estimators.kmeans import ConvergenceWarning, KMeans
from kmeans_xp.algorithms.lloyd import LloydResult
from kmeans_xp.contract.memory import Budget, KMeansMemoryError, MemoryEstimate
from kmeans_xp.estimators.functions import k_means, kmeans_plusplus
from kmeans_xp.estimators.minibatch import MiniBatchKMeans
from kmeans_xp.contract.planning import estimate_memory
from kmeans_xp.contract.return_checks import BackendContractError
from kmeans_xp.contract.registry import (
    BackendNotAvailableError,
    available_backends,
    get_backend,
    list_backends,
    register_backend,
)
from kmeans_xp.estimators.spherical import SphericalKMeans
from kmeans_xp.estimators.validation import InvalidParameterError, NotFittedError

__version__ = "0.1.0"

__all__ = [
    "KMeans", "MiniBatchKMeans", "SphericalKMeans", "k_means", "kmeans_plusplus", "KMeansBackend", "AssignResult",
    "ReduceResult", "IterStats", "Farthest", "Option", "Placement", "Budget", "LloydResult",
    "KMeansMemoryError", "MemoryEstimate", "estimate_memory", "list_backends", "get_backend",
    "available_backends", "register_backend", "BackendNotAvailableError", "NotFittedError",
    "WorkerLostError", "InvalidParameterError", "BackendContractError",
    "ConvergenceWarning", "__version__",
]
