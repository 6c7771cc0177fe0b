"""The backend contract: the few members a backend implements, and who calls them.

A backend does the O(n k d) work (distance + argmin, per-cluster sums, and the statistics of
an iteration) on one array library. The Lloyd semantics (convergence, empty clusters, the
center update, inertia, n_init) belong to the driver (`kmeans_xp.algorithms.lloyd`) alone, so every
backend gives the same answer for the same initial centers.

The contract a plugin implements (docs/plugins.md is its page): twelve names.

    member            required  default / what
    name, namespaces  yes       registry key; array libraries it computes on
    assign            yes       (labels, min_sq_dist) against centers: driver, init, predict
    reduce            yes       per-cluster float64 sums of w*x and of w
    device            no        "cpu" ("gpu" for a device backend)
    options           no        {}: backend_options as {name: Option}, set as attributes
    reject_reason     no        None when X's namespace is in `namespaces` or the placement
                                converts it, else a sentence (cheap, no compute)
    lloyd_iter        no        one iteration's IterStats: assign + reduce + two reductions
    lloyd             no        None: the driver runs the loop. A backend whose whole loop is
                                one device program returns its LloydResult; check_backend
                                proves it equal to the driver's
    estimate_memory   no        none: no check before a fit (check_backend wants one on NumPy
                                input, to bound a lloyd_iter's peak)
    placement_class   no        `Placement`: X stays where it is; a device plugin overrides
                                converts_from, to_backend, from_backend, synchronize,
                                free_memory
    memory            given     the fit's `memory.Budget`: a backend chunks within
                                `memory.bytes()` (a share of the placement's free memory)

Hooks the first-party backends override for speed; each default derives from the members
above, and `check_backend` checks an override against it, so a plugin needs none of them:

    ahead_gate        derived: True when `lloyd_iter` takes `skip=`, a one-element bool
                      array on the device: where it holds when the work runs, the work may
                      be left out (the driver drops that iteration)
    inertia           sum of w * ||x - c_label||^2 by differences (driver, score)
    labels_inertia    assign + inertia (a backend that streams X does both in one pass)
    farthest          the m points farthest from their centers (only when a cluster is empty)
    farthest_many     `farthest` of a batch's problems, stacked: default, problem by problem
    batch_lloyd_iter  one iteration of a batch of problems (`contract.batching`): default,
                      each active problem's `lloyd_iter`; a GPU backend computes the batch
                      in one launch per step
    assign_bounded    labels with triangle-inequality bounds (a `bounds.Bounds` the driver
                      holds between iterations), equal to `assign`'s: the vectorised NumPy
                      bounds (the driver asks for it on NumPy X on the CPU only)
    nearest           each row's m nearest centers and their squared distances, nearest
                      first: the candidates of a balanced fit's assignment (`capacity`):
                      the norm expansion in xp code, chunk by chunk of rows
    batch_backend     the backend computing MiniBatchKMeans's gathered batches (itself; dask:
                      its blocks')
    seeding           k-means++'s O(n) steps on the backend's device (None: xp code)
    seeding_bytes     the bytes of those steps (None: the xp steps', memory.xp_seeding_bytes)
    check_memory      raise before any work when the fit's `FitPlan` cannot fit (default:
                      `estimate_memory` applied to the plan)
    budget_class      the `Budget` class (CuPy's measures its pool's peaks per stage)
    precisions        ("exact",): the compute precisions it takes (docs/precision.md); the
                      fit's, from its `FitPlan`, is in `compute_precision` when its
                      primitives run (`use_precision` sets it)
    half_data         (): the precisions at which the primitives compute on data in that
                      half format as it is (float16, bfloat16; float32 centers):
                      `placement.center(dtype=)`
    driver_rows       rows per chunk of the O(n d) passes done in xp code (a quarter of the
                      budget; dask: all rows, it chunks them itself)

Collaborators get what they need as arguments: the placement and the memory check receive
the fit's `FitPlan` (n, d, k, dtype, device, max_memory, copy_x, ...) rather than calling
back into the backend or remembering an earlier call, and nothing outside a backend writes
into its budget.

What the primitives return, and the labels' dtypes, are in `kmeans_xp.contract.results`.
`X` handed to the primitives is what `placement.center` returned (mean-centered X in the
backend's namespace; for a spherical fit, the unit rows of `placement.unit_rows`, not
centered); `sample_weight` is an (n,) array in X's namespace and dtype, or None for unit
weights. Centers and the small results (k-sized sums, 0-d statistics) live in the
namespace `placement.small` puts them in (X's own by default).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, ClassVar, cast

from kmeans_xp.contract import return_checks as returned
from kmeans_xp.contract.batching import BatchStats, loop_batch_lloyd_iter
from kmeans_xp.contract.bounds import assign_bounded_numpy
from kmeans_xp.contract.capacity import NearestResult, nearest_xp
from kmeans_xp.contract.chunks import count_changed, labelled_sq_dist, weighted_total
from kmeans_xp.contract.fitplan import FitPlan
from kmeans_xp.contract.memory import (
    Budget,
    MemoryEstimate,
    accepted_options,
    driver_chunk_rows,
    host_available_memory,
)
from kmeans_xp.contract.namespaces import array_namespace, as_like, device, label_counts, namespace_name, to_numpy
from kmeans_xp.contract.results import (  # noqa: F401 - what the contract returns, named here too
    LABELS_DTYPE,
    AssignResult,
    Farthest,
    IterStats,
    LloydResult,
    ReduceResult,
    compact_labels_dtype,
    farthest_order,
    stacked_farthest,
    user_labels,
    user_labels_dtype,
)
from kmeans_xp.contract.namespaces import Array, Namespace
from kmeans_xp.contract.placement import Placement

__all__ = ["KMeansBackend", "Placement", "Option", "InvalidOptionError", "WorkerLostError",
           "AssignResult", "ReduceResult", "IterStats", "BatchStats", "Farthest", "LloydResult",
           "Array", "Namespace"]


class WorkerLostError(RuntimeError):
    """A worker of a cluster, and the blocks of X it held, were lost during a computation
    that cannot recompute them; the message says which and what to do."""


class InvalidOptionError(ValueError, TypeError):
    """A backend_options entry the backend does not know, or a value it does not take
    (a TypeError too, as Python's own error for an unexpected keyword is)."""


class Option:
    """One backend option: its default and the values it takes (values, types, or
    `validation` constraints such as `Interval`)."""

    def __init__(self, default: Any, *allowed: Any, doc: str = "",
                 attr: str | None = None) -> None:
        # attr: the attribute the value is kept in, when the option's name is a member's
        self.default, self.allowed, self.doc, self.attr = default, allowed, doc, attr

    def accepts(self, value: Any) -> bool:
        for a in self.allowed:
            if isinstance(a, type):
                if isinstance(value, a) and not (isinstance(value, bool) and a is not bool):
                    return True
            elif callable(a):
                if a(value):
                    return True
            elif value is a or (type(value) is type(a) and value == a):
                return True
        return False

    def describe(self) -> str:
        parts = [a.__name__ if isinstance(a, type) else repr(a) if not callable(a) else str(a)
                 for a in self.allowed]
        return " or ".join(parts) + (f" ({self.doc})" if self.doc else "")


class KMeansBackend:
    """Base class of all backends. Subclasses set `name` and `namespaces` and implement
    `assign` and `reduce`; the rest has defaults (see the module's table)."""

    name: ClassVar[str] = ""
    namespaces: ClassVar[frozenset[str]] = frozenset()
    device: ClassVar[str] = "cpu"
    options: ClassVar[dict[str, Option]] = {}
    placement_class: ClassVar[type[Placement]] = Placement
    budget_class: ClassVar[type[Budget]] = Budget
    ahead_gate: ClassVar[bool] = False
    #: the compute precisions the backend takes (docs/precision.md); a fit at another is
    #: refused before any work, and backend="auto" passes over the backend
    precisions: ClassVar[tuple[str, ...]] = ("exact",)
    #: the precision of the fit being run (`use_precision`, from its `FitPlan.precision`)
    compute_precision: str = "exact"
    #: the precisions at which the primitives take data in that half format as it is (X
    #: given in float16 / bfloat16, or centered into it by `placement.center(dtype=)`:
    #: `precision.storage_dtype`), centers, weights and distances in float32: the data is
    #: read at half the bytes. Else half X is computed on in float32.
    half_data: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "ahead_gate" not in vars(cls) and "lloyd_iter" in vars(cls):
            # derived, not declared: a lloyd_iter that takes the driver's skip flag honours
            # it; one that passes **kwargs on keeps what it overrides
            params = inspect.signature(cls.lloyd_iter).parameters.values()
            if any(p.name == "skip" for p in params):
                cls.ahead_gate = True
            elif not any(p.kind is p.VAR_KEYWORD for p in params):
                cls.ahead_gate = False
        # options become attributes: one named like a member would hide it
        clash = sorted(k for k, o in cls.options.items()
                       if callable(getattr(cls, o.attr or k, None)))
        if clash:
            raise TypeError(f"{cls.__name__}: options {clash} are named like members of "
                            f"the backend; rename them")

    def __init__(self, max_memory: int | str = "auto", **options: Any) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise InvalidOptionError(
                f"backend {self.name!r} takes no option(s) {unknown}; backend_options it "
                f"knows: {sorted(self.options) or 'none'}")
        for key, opt in self.options.items():
            value = options.get(key, opt.default)
            if not opt.accepts(value):
                raise InvalidOptionError(
                    f"backend {self.name!r}: backend_options[{key!r}] must be "
                    f"{opt.describe()}, got {value!r}")
            setattr(self, opt.attr or key, value)
        self.placement = self.placement_class(self)
        # the budget's free memory is the placement's: a device placement reports its own
        own = type(self.placement).free_memory is not Placement.free_memory
        self.memory = self.budget_class(max_memory,
                                        free_memory=self.placement.free_memory if own else None)

    @property
    def max_memory(self) -> int | str:
        return cast("int | str", self.memory.max_memory)

    @property
    def memory_report(self) -> dict[str, int]:
        return cast("dict[str, int]", self.memory.report)

    # -- capability -------------------------------------------------------------------------
    def accepts(self, X: Array, *, n_clusters: int, sample_weight: Array | None = None) -> bool:
        return self.reject_reason(X, n_clusters=n_clusters, sample_weight=sample_weight) is None

    def reject_reason(self, X: Array, *, n_clusters: int,
                      sample_weight: Array | None = None) -> str | None:
        """None when the backend takes X, else a sentence saying why not (no compute)."""
        ns = namespace_name(X)
        if ns not in self.namespaces and not _converts_from(self.placement, ns, X):
            return f"it computes on {sorted(self.namespaces)}, not {ns} arrays"
        return None

    def plan(self, X: Array, n_clusters: int, *, copy_x: bool = True,
             weighted: bool = False) -> FitPlan:
        """The `FitPlan` of a fit of X (2-d, with a dtype) on this backend."""
        return FitPlan.of(X, n_clusters, device=self.device, max_memory=self.max_memory,
                          copy_x=copy_x, weighted=weighted, precision=self.compute_precision)

    def use_precision(self, precision: str) -> None:
        """Compute the fit's distances at `precision` (one of `precisions`; the registry
        checked it). A backend whose kernels take it as an option of their own overrides this
        to set that option."""
        if precision not in self.precisions:
            raise ValueError(f"backend {self.name!r} computes at precision "
                             f"{list(self.precisions)}, not {precision!r}")
        self.compute_precision = precision

    def check_memory(self, X: Array, plan: FitPlan,
                     options: dict[str, Any] | None = None) -> None:
        """Raise KMeansMemoryError now, before any work, when max_memory cannot hold even
        the smallest chunk of the fit `plan` describes: `estimate_memory` applies the plan
        and raises (a backend without an estimate is not checked)."""
        estimate = type(self).estimate_memory
        try:
            estimate(plan.n, plan.d, plan.k, itemsize=plan.itemsize, max_memory=self.max_memory,
                     **accepted_options(estimate, options or {}))
        except NotImplementedError:
            pass

    def driver_rows(self, X: Array) -> int:
        """Rows per chunk for the O(n d) passes done in xp code (init, defaults below): a
        quarter of the budget, at (d + 64) values a row."""
        n, d = X.shape
        itemsize = 8 if "64" in str(X.dtype) else 4
        return driver_chunk_rows(n, d, itemsize, self.memory.bytes())

    # -- the heavy primitives ---------------------------------------------------------------
    def assign(self, X: Array, centers: Array, *, xp: Namespace) -> AssignResult:
        """Required: `AssignResult(labels, min_sq_dist)`, each row's nearest center (int32,
        in [0, k)) and its squared distance (clamped at 0), as new arrays."""
        raise NotImplementedError

    def reduce(self, X: Array, labels: Array, sample_weight: Array | None, n_clusters: int, *,
               xp: Namespace) -> ReduceResult:
        """Required: `ReduceResult(weighted_sums, weight_in_clusters)`, float64 (k, d) sums
        of w * x and (k,) sums of w per cluster; `sample_weight` None means unit weights."""
        raise NotImplementedError

    def lloyd_iter(self, X: Array, sample_weight: Array | None, centers: Array,
                   labels_old: Array, *, xp: Namespace) -> IterStats:
        """One Lloyd iteration's `IterStats(labels, weighted_sums, weight_in_clusters,
        inertia, n_changed)`. Default: `assign`, `reduce`, the weighted sum of the distances
        and the count of labels that changed; override it to fuse them into one pass."""
        # assign's labels index reduce's sums: checked before they do (`return_checks`)
        labels, min_sq = self.assign(X, centers, xp=xp)
        returned.check_labels(self, "assign", labels, X.shape[0], centers.shape[0])
        sums, weights = self.reduce(X, labels, sample_weight, centers.shape[0], xp=xp)
        return IterStats(labels, sums, weights,
                         weighted_total(min_sq, sample_weight, xp),
                         count_changed(labels, labels_old, xp))

    def batch_lloyd_iter(self, X: Any, sample_weight: Any, centers: Array, labels_old: Any,
                         active: tuple[int, ...], *, xp: Namespace) -> BatchStats:
        """One Lloyd iteration of the `active` problems of a batch: their `IterStats`
        stacked as a `BatchStats` (arguments and shapes: `kmeans_xp.contract.batching`).
        Default: each active problem's `lloyd_iter`, in order."""
        return loop_batch_lloyd_iter(self, X, sample_weight, centers, labels_old, active,
                                     xp=xp)

    def assign_bounded(self, X: Array, centers: Array, bounds: Any, *,
                       xp: Namespace) -> Array:
        """(n,) int32 labels of NumPy X against `centers`, a new array, with `bounds` (a
        `kmeans_xp.contract.bounds.Bounds`, the driver's between iterations) moved to them:
        the labels `assign` gives, computing only the rows the bounds cannot keep. Default:
        the vectorised NumPy bounds with the expansion `bounds.plain_distances` (a backend
        passes its own distance formula, or row test, to `bounds.assign_bounded_numpy`).
        The driver asks for it only on NumPy X, on the CPU (`bounds.bound_path`)."""
        return assign_bounded_numpy(X, centers, bounds)

    def nearest(self, X: Array, centers: Array, m: int, *, xp: Namespace) -> NearestResult:
        """`NearestResult(index, sq_dist)`: each row's min(m, k) nearest centers (an (n, m)
        integer array, nearest first; ties in any order) and their squared distances
        (float64, clamped at 0), the candidates of a balanced fit's assignment
        (`kmeans_xp.contract.capacity`). Column 0 is `assign`'s label up to near ties.
        Default: the norm expansion in xp code over chunks of rows within the budget
        (`capacity.nearest_xp`); NumPy and CuPy keep the result where X is, other
        namespaces give it on the host."""
        return cast("NearestResult", nearest_xp(X, centers, m, xp, self.memory.bytes()))

    def lloyd(self, X: Array, sample_weight: Array | None, centers: Array, *, xp: Namespace,
              max_iter: int, tol: float, spherical: bool = False) -> LloydResult | None:
        """A whole Lloyd run from `centers` (the arguments of `algorithms.lloyd.
        kmeans_single_lloyd`): a `LloydResult` equal to the driver's (labels, iterations,
        inertia, centers, history: `check_backend` compares them), or None for the driver's
        own loop (the default; also a backend's answer for the fits its loop does not
        cover)."""
        return None

    def inertia(self, X: Array, sample_weight: Array | None, centers: Array, labels: Array, *,
                xp: Namespace) -> Array:
        """0-d float64: sum of w * ||x - c_label||^2, by differences (not the expansion)."""
        total = xp.zeros((), dtype=xp.float64, device=device(centers))
        for sl, dist in labelled_sq_dist(X, centers, labels, xp, self.driver_rows(X)):
            w = None if sample_weight is None else sample_weight[sl]
            total = total + weighted_total(dist, w, xp)
        return total

    def labels_inertia(self, X: Array, sample_weight: Array | None, centers: Array, *,
                       xp: Namespace) -> tuple[Array, Array]:
        """(labels against centers, their `inertia`): the final assignment of a run and
        `score`. Default: `assign`, whose distances are dropped, then `inertia`."""
        labels = self.assign(X, centers, xp=xp).labels
        returned.check_labels(self, "assign", labels, X.shape[0], centers.shape[0])
        return labels, self.inertia(X, sample_weight, centers, labels, xp=xp)

    def farthest(self, X: Array, sample_weight: Array | None, centers: Array, labels: Array,
                 m: int, *, xp: Namespace) -> Farthest:
        """The m farthest points (see `Farthest`); default: distances of all n points, then a
        stable descending sort (it runs only when a cluster is empty)."""
        parts = [xp.astype(dist, xp.float64)
                 for _, dist in labelled_sq_dist(X, centers, labels, xp, self.driver_rows(X))]
        dist = parts[0] if len(parts) == 1 else xp.concat(parts)
        if sample_weight is not None:
            dist = xp.where(sample_weight > 0, dist, xp.full_like(dist, -1.0))
        idx = xp.argsort(dist, descending=True, stable=True)[:m]
        w = (xp.ones(idx.shape[0], dtype=xp.float64, device=device(dist)) if sample_weight is None
             else xp.astype(xp.take(sample_weight, idx), xp.float64))
        return Farthest(xp.astype(idx, xp.int64), xp.take(X, idx, axis=0), w,
                        xp.take(labels, idx), xp.take(dist, idx))

    def farthest_many(self, problems: list[tuple[Any, ...]], *, xp: Namespace) -> Farthest:
        """`farthest` of several problems at once (a batch's relocation), each given as
        (X, sample_weight, centers, labels, m): one `Farthest` of fields (P, m_max, ...),
        row p problem p's points in `farthest`'s order, then padding whose sq_dist is -1
        (`stacked_farthest`). Default: `farthest` problem by problem; a device backend
        ranks them together, in a few launches for the whole batch."""
        return stacked_farthest([self.farthest(X, w, C, labels, m, xp=xp)
                                 for X, w, C, labels, m in problems], xp)

    def batch_backend(self, X: Array) -> KMeansBackend:
        """The backend that computes MiniBatchKMeans's batches of X, gathered from X's rows
        (default: this one). A backend whose X is spread over machines names a local one:
        a batch is small, cheaper to compute where it is gathered than to send out."""
        return self

    def seeding(self, X: Array, sample_weight: Array | None, n_local_trials: int, *,
                xp: Namespace) -> Any:
        """k-means++'s O(n) steps on X: an object with the methods of `kmeans_xp.algorithms.init.Seeding`
        (first, candidates, trial) giving the same draws, or None for that xp code itself."""
        return None

    # -- memory -----------------------------------------------------------------------------
    @classmethod
    def seeding_bytes(cls, n_samples: int, n_features: int, n_clusters: int,
                      itemsize: int) -> int | None:
        """Bytes of k-means++ by `seeding` for a fit of this shape, or None where it leaves
        k-means++ to the xp steps (the driver then counts `memory.xp_seeding_bytes`)."""
        return None

    @classmethod
    def estimate_memory(cls, n_samples: int, n_features: int, n_clusters: int, *,
                        itemsize: int, max_memory: int | str = "auto",
                        **options: Any) -> MemoryEstimate:
        """The working bytes of a fit of this shape before it runs: `MemoryEstimate(parts,
        total, chunk_rows)`, raising `KMeansMemoryError` when `max_memory` cannot hold one
        chunk. Default: no estimate (NotImplementedError), and the fit is not checked."""
        raise NotImplementedError(f"backend {cls.name!r} gives no memory estimate")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _converts_from(placement: Placement, namespace: str, X: Array) -> bool:
    """placement.converts_from(namespace, X); a plugin's placement written before the input
    was passed takes the namespace alone."""
    fn = placement.converts_from
    try:
        takes_x = len(inspect.signature(fn).parameters) >= 2
    except (TypeError, ValueError):  # a builtin or C callable: give it both
        takes_x = True
    return fn(namespace, X) if takes_x else fn(namespace)
