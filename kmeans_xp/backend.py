"""The backend contract: what every backend implements, and the small results it returns.

A backend does the O(n k d) work (distance + argmin, per-cluster sums) on one array library.
Everything else (convergence, empty clusters, inertia, n_init) belongs to the driver
(`kmeans_xp.lloyd`), so every backend gives the same answer for the same initial centers.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, ClassVar, NamedTuple

from .memory import MemoryEstimate, resolve_budget


class AssignResult(NamedTuple):
    labels: Any          # (n,) int64 index of the nearest center
    min_sq_dist: Any     # (n,) squared distance to it, clamped at 0


class ReduceResult(NamedTuple):
    weighted_sums: Any        # (k, d) sum of w * x per cluster
    weight_in_clusters: Any   # (k,) sum of w per cluster


class IterResult(NamedTuple):
    labels: Any
    min_sq_dist: Any
    weighted_sums: Any         # None when update_centers=False
    weight_in_clusters: Any    # None when update_centers=False


class KMeansBackend:
    """Base class of all backends. Subclasses set `name` and `namespaces` and implement
    `assign` and `reduce`; fused backends override `lloyd_iter`, and a backend that keeps the
    whole loop on its device may define `kmeans_single` (see `kmeans_xp.lloyd`)."""

    name: ClassVar[str] = ""
    namespaces: ClassVar[frozenset] = frozenset()
    #: the device kind the backend computes on, for reports and "auto": "cpu" or "gpu"
    device: ClassVar[str] = "cpu"

    def __init__(self, max_memory="auto", **options):
        if options:
            raise TypeError(
                f"backend {self.name!r} takes no options {sorted(options)}; "
                f"backend_options it knows: none")
        self.max_memory = max_memory
        self.memory_report = {}

    # -- capability -------------------------------------------------------------------------
    def accepts(self, X, *, n_clusters, sample_weight=None) -> bool:
        """Cheap check (no compute) that this backend can take X."""
        return self.reject_reason(X, n_clusters=n_clusters, sample_weight=sample_weight) is None

    def reject_reason(self, X, *, n_clusters, sample_weight=None):
        """None when the backend takes X, else a sentence saying why not."""
        from .namespaces import namespace_name
        ns = namespace_name(X)
        if ns not in self.namespaces and not self.converts_from(ns):
            return f"it computes on {sorted(self.namespaces)}, not {ns} arrays"
        return None

    def converts_from(self, namespace: str) -> bool:
        """Whether input of this namespace is copied in by `to_backend`."""
        return False

    # -- data movement ----------------------------------------------------------------------
    def to_backend(self, X):
        """X (validated, floating) in the backend's namespace; default: as given."""
        return X

    def from_backend(self, arr, like):
        """arr returned in the namespace and device of `like` (the user's input)."""
        return arr

    def budget(self, xp=None) -> int:
        """Working-memory bound in bytes for this fit."""
        return resolve_budget(self.max_memory, self.available_memory())

    def available_memory(self) -> int:
        from .memory import host_available_memory
        return host_available_memory()

    def driver_rows(self, n_samples, n_features, dtype) -> int:
        """Rows per chunk for the driver's own O(n d) passes (init, inertia, relocation)."""
        itemsize = 8 if "64" in str(dtype) else 4
        per_row = n_features * itemsize * 4 + 64 * itemsize  # diffs + k-means++ candidates
        return int(max(256, min(n_samples, self.budget() // 4 // per_row)))

    def synchronize(self):
        """Wait for the device, so a clock read after it measures finished work."""

    def finish(self):
        """Called by the estimator when a fit has ended, after it dropped its device arrays:
        release per-fit buffers (and, where the backend offers it, cached memory)."""

    def array_namespace(self, X):
        """The namespace the driver computes with on `X` (the output of `to_backend`).
        Default: array-api-compat's; a backend whose arrays need more (e.g. dask arrays with
        CuPy blocks, where new arrays must get CuPy blocks too) returns its own."""
        from .namespaces import array_namespace
        return array_namespace(X)

    def persist(self, x):
        """Make a lazily evaluated array concrete, so later passes reuse it instead of
        recomputing its whole history. The driver calls it on the small or reused arrays it
        builds (mean, weights, centers each iteration, k-means++ distances). Default: `x`."""
        return x

    @contextlib.contextmanager
    def stage(self, name):
        """Context of one stage ("transfer", "init", "assign", "update") for memory_report."""
        yield

    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto") -> MemoryEstimate:
        raise NotImplementedError(f"backend {cls.name!r} gives no memory estimate")

    def check_memory(self, X, n_clusters, options=None):
        """Raise KMeansMemoryError now, before any work, when max_memory cannot hold even the
        backend's smallest chunk: its `estimate_memory` applies the fit's plan, with the
        backend_options it takes (`options`). A backend without an estimate raises from its
        first chunk instead. Backends that know more about X (where it lives) override this."""
        n, d = X.shape
        estimate = type(self).estimate_memory
        itemsize = 4 if "float32" in str(X.dtype) else 8
        try:
            estimate(n, d, n_clusters, itemsize=itemsize, max_memory=self.max_memory,
                     **accepted_options(estimate, options or {}))
        except NotImplementedError:
            pass

    # -- the data the driver computes on ----------------------------------------------------
    def feature_stats(self, X, tol, *, xp):
        """(per-feature mean of X, sklearn's absolute tol for X): what the estimator centers
        X with and the driver stops on. A backend that streams X from the host computes both
        in its own pass instead of NumPy's full-size temporaries."""
        from .lloyd import feature_mean, tolerance
        return feature_mean(X, xp), tolerance(X, tol, xp)

    def center(self, X, mean, *, xp, in_place=False):
        """X - mean, the data the driver and the backend compute on (in place when asked: the
        estimator adds the mean back). A backend may return another object that it and the
        driver understand: host streaming returns a view that centers rows on the fly."""
        if in_place:
            X -= mean
            return X
        return X - mean

    # -- the heavy primitives -----------------------------------------------------------------
    def assign(self, X, centers, *, xp) -> AssignResult:
        raise NotImplementedError

    def reduce(self, X, labels, sample_weight, n_clusters, *, xp) -> ReduceResult:
        raise NotImplementedError

    def lloyd_iter(self, X, sample_weight, centers, *, xp, update_centers=True) -> IterResult:
        labels, min_sq = self.assign(X, centers, xp=xp)
        if not update_centers:
            return IterResult(labels, min_sq, None, None)
        sums, weights = self.reduce(X, labels, sample_weight, centers.shape[0], xp=xp)
        return IterResult(labels, min_sq, sums, weights)

    #: optional: ``kmeans_single(X, sample_weight, centers_init, *, xp, max_iter, tol,
    #: verbose) -> LloydResult`` keeps the whole loop on the device. None: the core loop runs.
    kmeans_single = None

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"


def accepted_options(fn, options):
    """The backend_options `fn` takes (an estimate plans with the fit's options, e.g. the
    numpy backend's n_threads), all of them when it takes **kwargs."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(options)
    return {k: v for k, v in options.items() if k in params}
