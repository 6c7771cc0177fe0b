"""`KMeans`: scikit-learn's estimator API and semantics, without scikit-learn at run time.

This layer validates, converts input, runs `n_init` Lloyd runs through the driver on the
chosen backend, keeps the best, and stores the fitted attributes in the caller's namespace.
"""
from __future__ import annotations

import functools
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from kmeans_xp.contract.bounds import bound_path, room as bound_room
from kmeans_xp.contract.capacity import cluster_cap
from kmeans_xp.contract.chunks import tolerance
from kmeans_xp.estimators.batched import fit_batch, is_batch
from kmeans_xp.estimators.fitting import Fitting
from kmeans_xp.estimators.interop import SklearnInterop
from kmeans_xp.algorithms.init import seeding_dtype
from kmeans_xp.algorithms.lloyd import kmeans_single_lloyd
from kmeans_xp.contract.memory import explains_memory_errors, format_bytes
from kmeans_xp.contract.precision import (compute_dtype, half_storage,
                                          resolve as resolve_precision)
from kmeans_xp.contract.namespaces import array_namespace, device, dtype_name, to_numpy
from kmeans_xp.estimators.predicting import Predicting
from kmeans_xp.algorithms.progress import Clock, logger, verbose_logging
from kmeans_xp.contract.selection import select_backend
from kmeans_xp.estimators.routing import MetadataRouting
from kmeans_xp.contract.results import user_labels
from kmeans_xp.contract.scaling import scaled_mean
from kmeans_xp.estimators.validation import check_balance, check_random_state

if TYPE_CHECKING:
    from kmeans_xp.contract.backend import Array, KMeansBackend, Namespace


class ConvergenceWarning(UserWarning):
    """Fewer distinct clusters than asked for (duplicate points, too few distinct values)."""


@functools.lru_cache(maxsize=4)
def _with_sklearn_warning(sklearn_warning: type[Warning]) -> type[Any]:
    return type("ConvergenceWarning", (ConvergenceWarning, sklearn_warning),
                {"__module__": __name__, "__doc__": ConvergenceWarning.__doc__})


def _convergence_warning() -> type[Any]:
    """Our ConvergenceWarning, also sklearn's once the caller has imported scikit-learn, so
    filters on `sklearn.exceptions.ConvergenceWarning` apply (sklearn is never imported)."""
    sk = sys.modules.get("sklearn.exceptions")
    return ConvergenceWarning if sk is None else _with_sklearn_warning(sk.ConvergenceWarning)


class KMeans(Fitting, Predicting, SklearnInterop, MetadataRouting):
    """K-Means clustering (Lloyd's algorithm) on pluggable array backends.

    scikit-learn's `sklearn.cluster.KMeans` API and semantics (tol, strict convergence,
    empty-cluster relocation, ``labels_ == predict(X)``), computed by a backend chosen at run
    time: NumPy on the CPU, CuPy kernels on a GPU, Dask across machines. Every backend gives
    the same partition from the same initial centers, within a memory bound.

    Parameters
    ----------
    n_clusters : int, default=8
        The number of clusters, and of centers.
    init : {"k-means++", "k-means||", "random", "hierarchical"}, callable or array-like, \
default="k-means++"
        How the initial centers are chosen: greedy k-means++ (sklearn's), k-means|| (a few
        passes over X in all: for large n and for Dask), random rows, "hierarchical" (for
        large k: a coarse fit at sqrt(k) clusters, each split; then ``max_iter`` flat
        iterations, a few are enough: docs/large_k.md), a callable
        ``init(X, n_clusters, random_state=rs)`` returning an (n_clusters, n_features)
        array, or that array itself.
    n_init : "auto" or int, default="auto"
        Runs with different initial centers; the one with the lowest inertia is kept.
        "auto": 1 for "k-means++" and "k-means||", 10 for "random" and a callable.
    max_iter : int, default=300
        Lloyd iterations of one run at most.
    tol : float, default=1e-4
        Convergence when the squared center shift is at most ``tol`` times the mean
        feature variance of X (sklearn's rule); ``tol=0`` runs to strict convergence.
    verbose : int, default=0
        Above 0, the fit logs per iteration (logger "kmeans_xp", shown on stdout) and shows
        progress bars (tqdm.auto, when installed).
    random_state : int, numpy.random.RandomState, numpy.random.Generator or None, \
default=None
        Seeds the initialisation.
    copy_x : bool, default=True
        False: no centered copy of X is made; the fit computes on X as given, which it
        never writes (a memmap neither).
    algorithm : {"lloyd", "elkan"}, default="lloyd"
        Both give Lloyd's answer (the same labels, centers and ``n_iter_``). "elkan" prunes
        distance computations with exact triangle-inequality bounds (Hamerly, Elkan or
        Yinyang, by k and d) where they pay, and runs Lloyd's kernels elsewhere: a GPU, k * d
        tiny, and the numpy and numba backends, whose plain pass was faster than every
        bounded run measured on them; with one cluster it warns and runs "lloyd", as
        scikit-learn does. docs/bounds.md says which method when, and the measurements.
    backend : str, default="auto"
        "auto" (chosen from the input's namespace and size; see ``backend_reason_``),
        "numpy", "array-api", "cupy-kernels", "cupy-chunked", "cupy-fused", "dask" or a
        plugin's name; `kmeans_xp.list_backends` says which are installed.
    backend_options : dict or None, default=None
        Options of the backend, checked by name (e.g. ``{"stream": True}``).
    max_memory : "auto", int or str, default="auto"
        Bound on everything the fit allocates beyond X (the backend's buffers and the
        driver's arrays: centered copy, labels, init): bytes or a string such as "2GB";
        "auto" is a share of the memory free where the backend computes.
    balance : None, float or dict, default=None
        Bounds cluster sizes (docs/large_k.md): a float ``f >= 1`` or ``{"max_size": f}``
        caps every cluster at ``ceil(f * n_samples / n_clusters)`` rows (an int
        ``max_size``: that many rows; sample weights weigh the cost, not the cap);
        ``{"penalty": lam}`` adds a size penalty to the distances instead (soft);
        ``"candidates"``: nearest centers each row may take (default 8). ``labels_``
        holds the cap; ``predict`` gives the nearest center.
    precision : {"exact", "tf32", "fp16", "bf16"}, default="exact"
        Arithmetic of the distances: "exact" in X's dtype; "tf32", "fp16", "bf16" round X
        and the centers to that format before the distance product (tensor cores on a GPU,
        float32 accumulation; emulated by the numpy backend). Centers, sums and inertia stay
        float32. Float16/bfloat16 X computes at its own format. Labels near ties may differ
        from the exact fit's: docs/precision.md gives the bound, and which backends take
        which precision (a backend that does not is refused, and "auto" passes it over).

    Attributes
    ----------
    cluster_centers_ : array of shape (n_clusters, n_features)
        The centers, in the input's namespace and on its device.
    labels_ : array of shape (n_samples,)
        The cluster of each training sample (``predict(X)`` of the training data).
    inertia_ : float
        Sum of the (weighted) squared distances of the samples to their centers.
    n_iter_ : int
        Lloyd iterations of the best run.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Column names of a DataFrame X, when they are all strings.
    backend_ : str
        The backend that ran the fit.
    backend_reason_ : str
        Why that backend: named by the user, or what "auto" looked at.
    history_ : list of dict
        Per iteration of the best run: inertia and center shift.
    timings_ : dict
        Seconds spent in "transfer", "init", "lloyd", per iteration and in total.
    memory_report_ : dict
        Peak bytes per stage, measured where the backend measures (the CuPy pool).

    See Also
    --------
    kmeans_xp.estimate_memory : The memory a fit needs, before it runs.
    kmeans_xp.SphericalKMeans : The same on the unit sphere: clusters by cosine similarity.
    sklearn.cluster.KMeans : The estimator whose API and semantics this one follows.

    Examples
    --------
    >>> import numpy as np
    >>> from kmeans_xp import KMeans
    >>> X = np.array([[1.0, 2.0], [1.0, 4.0], [1.0, 0.0],
    ...               [10.0, 2.0], [10.0, 4.0], [10.0, 0.0]])
    >>> km = KMeans(n_clusters=2, random_state=0, backend="numpy").fit(X)
    >>> sorted(km.cluster_centers_.tolist())
    [[1.0, 2.0], [10.0, 2.0]]
    >>> km.predict(np.array([[0.0, 0.0], [12.0, 3.0]])).tolist() == [
    ...     km.labels_[0], km.labels_[3]]
    True
    >>> km.backend_
    'numpy'
    """

    #: float16 X at precision="fp16" stays float16 where the backend reads it so
    _keeps_half = True

    _estimator_type = "clusterer"
    #: SphericalKMeans (kmeans_xp.estimators.spherical): unit rows, centers on the unit sphere
    _spherical = False

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means++",
                 n_init: str | int = "auto", max_iter: int = 300, tol: float = 1e-4,
                 verbose: int = 0, random_state: Any = None, copy_x: bool = True,
                 algorithm: str = "lloyd", backend: str = "auto",
                 backend_options: dict[str, Any] | None = None,
                 max_memory: str | int = "auto", balance: Any = None,
                 precision: str = "exact") -> None:
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.copy_x = copy_x
        self.algorithm = algorithm
        self.backend = backend
        self.backend_options = backend_options
        self.max_memory = max_memory
        self.balance = balance
        self.precision = precision

    # -- fitting ------------------------------------------------------------------------------
    def _bounds(self, backend: KMeansBackend, Xc: Array) -> Any:
        """The triangle-inequality bounds of the fit's assignments ("hamerly", "elkan",
        "yinyang") or None for Lloyd's kernels (`contract.bounds.bound_path`'s table)."""
        algorithm = self.algorithm
        if algorithm == "elkan" and self.n_clusters == 1:
            warnings.warn("algorithm='elkan' doesn't make sense for a single cluster. Using "
                          "'lloyd' instead.", RuntimeWarning, stacklevel=4)
            algorithm = "lloyd"
        n, d = Xc.shape
        k = self.n_clusters
        self._bounds_path = bound_path(
            algorithm, device=backend.device, n=n, d=d, k=k,
            room=lambda: bound_room(backend, n, d, k, getattr(Xc.dtype, "itemsize", 8)),
            asynchronous=backend.placement.asynchronous, engine=backend.name)
        if self.verbose:
            logger.info(f"assignment: {self._bounds_path[1]}")
        return self._bounds_path[0]

    def _balance_of(self, X: Any) -> Any:
        """The parsed `balance` (`contract.capacity.Balance`) of a fit of X, or None; an
        error before any work where its cap cannot hold X's rows."""
        spec = check_balance(getattr(self, "balance", None), type(self).__name__)
        if spec is not None and spec.max_size is not None:
            cluster_cap(spec, X.shape[0], self.n_clusters)
        return spec

    @explains_memory_errors
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Compute k-means clustering.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data: NumPy, CuPy, torch, array-api-strict, dask or nested lists; the
            fitted arrays come back in its namespace and on its device. A batch of
            independent problems, of shape (n_problems, n_samples, n_features) or a list
            of 2-D arrays, fits them all together (docs/batches.md).
        y : Ignored
            Not used, present for API consistency by convention.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sample (None: all 1); for a batch, one row (or array) per
            problem.

        Returns
        -------
        self : KMeans
            The fitted estimator.
        """
        with verbose_logging(self.verbose):
            if is_batch(X):
                fit_batch(self, X, sample_weight, _convergence_warning())
                return self
            self.__dict__.pop("_batch", None)
            return self._fit(X, sample_weight)

    def _fit(self, X: Any, sample_weight: Any) -> KMeans:
        clock = Clock()
        X_user = X
        # (from the dtype X came in: float16 X is float32 from here on, on the CPU; a list
        # becomes float64; the guard reads it: fp16's range)
        self._check_params()
        self._precision_fit = resolve_precision(self.precision,
                                                getattr(X_user, "dtype", "float64"))
        X, sw_host, init_array, guard = self._check_inputs(X, sample_weight)
        self._balance_of(X)
        self._n_init = n_init = self._resolved_n_init()
        rs = check_random_state(self.random_state)
        backend, why = select_backend(self.backend, X, n_clusters=self.n_clusters,
                                      sample_weight=sw_host,
                                      backend_options=self.backend_options,
                                      max_memory=self.max_memory, check_memory=True,
                                      copy_x=bool(self.copy_x), precision=self._precision_fit,
                                      iterations=int(self.max_iter))
        place = backend.placement
        X = self._half_for(X, backend)
        given = self._given_inits(X, init_array, n_init, rs)
        # after the last check (a callable init's centers): a fit refused starts nothing
        place.warm_up(X, self.n_clusters, seeding_dtype(self.init, X.dtype))
        clock.lap("validation")
        Xb = place.to_backend(X)
        xp = place.namespace(Xb)
        sw = None if sw_host is None else place.persist(xp.asarray(sw_host, device=device(Xb)))
        place.synchronize()
        clock.lap("transfer")
        Xc, X_mean, tol, scale = self._fit_data(backend, Xb, xp, guard,
                                                owned=converted_copy(X_user, X))
        X_mean = place.persist(X_mean)
        place.synchronize()
        clock.lap("stats")
        best, timings_runs = self._run(backend, Xc, X_mean, sw, rs, xp, n_init, tol,
                                       given, scale)
        clock.skip()  # init and lloyd, timed inside
        best = guard.result(best)
        self._scale = scale
        self._store(best, backend, why, X_mean, X_user, Xb)
        # drop the fit's device arrays, so that finish() can hand their memory back
        del X, Xb, Xc, sw, best, X_mean
        self._finish(place)
        clock.lap("copy_back")
        self.timings_ = {**clock.laps, **timings_runs, "total": clock.total()}
        if self.verbose:
            self._print_report()
        return self

    def _fit_data(self, backend: KMeansBackend, Xb: Array, xp: Namespace,
                  guard: Any, owned: bool = False) -> tuple[Array, Array, Any, float]:
        """(the data the driver computes on, X's mean, the absolute tol, the power of two X
        is scaled by): X centered (on a copy, unless copy_x=False, or in place where X is
        the fit's own: `owned`, validation's converted copy), rescaled by the fit's guard
        when its squared distances would leave its dtype."""
        place = backend.placement
        # lazy input (dask) has its max |X| measured by to_backend, with its NaN/inf check
        scale = guard.scale if guard.scale is not None else guard.measure(place.absmax)
        # the data in its half format where the backend computes on it so (read at half the
        # bytes; `KMeansBackend.half_data`), and only such a backend's placement is asked;
        # (a namespace without the format, as CuPy without ml_dtypes for bf16: as before)
        store = half_storage(backend, xp)
        half = {} if store is None else {"dtype": store}
        # on data to be rescaled, the variance of tol is taken after (it could overflow)
        tol: float
        if guard.mean_overflows(Xb.shape[0]):
            X_mean, tol = scaled_mean(Xb, scale, xp, backend.driver_rows(Xb)), 0
        else:
            X_mean, tol = place.feature_stats(Xb, self.tol if scale == 1 else 0, xp=xp)
        if not self.copy_x and scale == 1:
            # X is never written (a memmap neither): the fit computes on X as given
            return place.center(Xb, None, xp=xp), xp.zeros_like(X_mean), tol, scale
        if scale == 1:
            return (place.center(Xb, place.persist(X_mean), xp=xp, in_place=owned, **half),
                    X_mean, tol, scale)
        Xc = place.center_scaled(Xb, place.persist(X_mean), scale, xp=xp, **half)
        tol = tolerance(Xc, xp.zeros_like(X_mean), self.tol, xp, backend.driver_rows(Xc))
        return Xc, X_mean, tol, scale

    def _run(self, backend: KMeansBackend, Xc: Array, X_mean: Array, sw: Array | None, rs: Any,
             xp: Namespace, n_init: int, tol: Any, given: Any,
             scale: float) -> tuple[Any, dict[str, float]]:
        place = backend.placement
        best = None
        # (the bounds are exact distances: a reduced-precision fit runs Lloyd's kernels)
        bounds = self._bounds(backend, Xc) if self._precision_fit == "exact" else None
        t_init = t_lloyd = 0.0
        iterations = 0  # over all runs: runs stop after different numbers of iterations
        for run in range(n_init):
            t0 = time.perf_counter()
            with backend.memory.stage("init"):
                centers = self._initial_centers(Xc, X_mean, sw, rs, xp,
                                                None if given is None else given[run],
                                                backend, scale)
                centers = xp.astype(centers, compute_dtype(Xc.dtype, xp))
            place.synchronize()
            if self.verbose:
                logger.info("Initialization complete")   # (scikit-learn's line)
            t1 = time.perf_counter()
            with backend.memory.stage("lloyd"):
                result = kmeans_single_lloyd(backend, Xc, sw, centers, xp=xp,
                                             max_iter=self.max_iter, tol=tol,
                                             verbose=self.verbose, spherical=self._spherical,
                                             bounds=bounds, balance=self._balance_of(Xc))
            place.synchronize()
            t_init += t1 - t0
            t_lloyd += time.perf_counter() - t1
            iterations += int(result.n_iter)
            if self.verbose:
                logger.info(f"Run {run}: inertia {result.inertia:.6g} after {result.n_iter} "
                      f"iterations.")
            if best is None or result.inertia < best.inertia:
                best = result
        return best, {"init": t_init, "lloyd": t_lloyd,
                      "per_iteration": t_lloyd / max(iterations, 1)}

    def _store(self, best: Any, backend: KMeansBackend, why: str, X_mean: Array, X_user: Any,
               Xb: Array) -> None:
        self._X_mean = self._in_input_namespace(backend.placement, X_mean, X_user)
        self._centers_fit = self._in_input_namespace(backend.placement, best.centers, X_user)
        self._backend_key = (backend.name, dict(self.backend_options or {}), self.max_memory,
                             self.backend == "auto")
        place = backend.placement
        self._record_feature_names(X_user)
        self.__dict__.pop("_moved_to_host", None)
        cxp = array_namespace(best.centers)  # the small namespace the driver ran in
        centers = best.centers + cxp.asarray(to_numpy(X_mean), device=device(best.centers))
        self.cluster_centers_ = place.from_backend(centers, like=X_user)
        self.labels_ = user_labels(place.from_backend(best.labels, like=X_user))
        self.inertia_ = float(best.inertia)
        self.n_iter_ = int(best.n_iter)
        self.n_features_in_ = int(Xb.shape[1])
        self.backend_ = backend.name
        self.backend_reason_ = why
        self.history_ = best.history
        self.memory_report_ = dict(backend.memory.report)
        # O(n) where the labels are (np.unique would sort all n labels: minutes at n = 1e9)
        distinct = int(np.count_nonzero(place.label_counts(best.labels, self.n_clusters)))
        if distinct < self.n_clusters:
            warnings.warn(f"Number of distinct clusters ({distinct}) found smaller than "
                          f"n_clusters ({self.n_clusters}). Possibly due to duplicate points "
                          f"in X.", _convergence_warning(), stacklevel=3)

    def _print_report(self) -> None:
        logger.info(f"backend: {self.backend_} ({self.backend_reason_})")
        logger.info("timings: " + ", ".join(f"{k} {v:.4f}s" for k, v in self.timings_.items()))
        if self.memory_report_:
            logger.info("memory (peak per stage): " + ", ".join(
                f"{k} {format_bytes(v)}" for k, v in self.memory_report_.items()))


def converted_copy(X_user: Any, X: Any) -> bool:
    """Whether validation handed the fit a new array of its own: X's dtype changed (float16
    or bfloat16 in float32, integers in float64), and a changed dtype is always a copy. The
    fit centers it in place, so a float16 X costs its float32 copy once, not twice."""
    given = getattr(X_user, "dtype", None)
    dense = getattr(X, "ndim", 0) == 2 and hasattr(X, "__dlpack__")
    return given is not None and dense and dtype_name(given) != dtype_name(X.dtype)
