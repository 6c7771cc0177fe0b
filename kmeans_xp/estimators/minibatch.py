"""`MiniBatchKMeans`: scikit-learn's mini-batch k-means API and semantics on every backend.

The estimator checks parameters and input as KMeans does (`fitting.Fitting`), draws its
random numbers in scikit-learn's order, and runs the steps through the mini-batch driver
(`kmeans_xp.algorithms.minibatch_steps`), whose per-step work is the backend's `lloyd_iter` on the
batch. X is never copied or centered whole: rows are gathered batch by batch where X lives.
"""
from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from kmeans_xp.estimators.fitting import Fitting
from kmeans_xp.estimators.interop import SklearnInterop
from kmeans_xp.contract.memory import explains_memory_errors
from kmeans_xp.algorithms.minibatch_steps import (
    BatchDraws,
    BatchRows,
    StepState,
    labels_and_inertia,
    on_backend,
    run_steps,
    shift_point,
    step,
    tolerance_of,
)
from kmeans_xp.contract.namespaces import array_namespace, device, namespace_name, to_numpy
from kmeans_xp.estimators.predicting import Predicting
from kmeans_xp.algorithms.progress import Clock, verbose_logging
from kmeans_xp.contract.precision import resolve as resolve_precision
from kmeans_xp.contract.selection import select_backend
from kmeans_xp.estimators.routing import MetadataRouting
from kmeans_xp.contract.results import user_labels
from kmeans_xp.contract.return_checks import assigned_labels
from kmeans_xp.contract.scaling import host_dtype_of
from kmeans_xp.estimators.validation import check_init_array, check_random_state

if TYPE_CHECKING:
    from kmeans_xp.contract.backend import Array, KMeansBackend, Namespace


class MiniBatchKMeans(Fitting, Predicting, SklearnInterop, MetadataRouting):
    """Mini-Batch K-Means clustering on pluggable array backends.

    scikit-learn's `sklearn.cluster.MiniBatchKMeans` API and semantics (batches drawn with
    probability proportional to the sample weight, per-center counts as learning rates,
    random reassignment of low-count centers, early stopping on the smoothed batch inertia
    or on ``tol``, ``partial_fit``), with the random numbers drawn in scikit-learn's order:
    the same ``random_state`` and initial centers give scikit-learn's steps. Each step's
    assignment and per-cluster sums are the backend's; rows are gathered batch by batch
    where X lives (a memmap, a GPU, a dask array), so X is never copied whole.

    Parameters
    ----------
    n_clusters : int, default=8
        The number of clusters, and of centers.
    init : {"k-means++", "k-means||", "random"}, callable or array-like, default="k-means++"
        How the initial centers are chosen, on a random subset of ``init_size`` rows:
        greedy k-means++ (sklearn's), k-means||, random rows, a callable
        ``init(X_subset, n_clusters, random_state=rs)`` returning an (n_clusters,
        n_features) array, or that array itself.
    max_iter : int, default=100
        Passes over X at most: the fit runs at most ``max_iter * n_samples // batch_size``
        steps (fewer when it stops early).
    batch_size : int, default=1024
        Rows per mini-batch.
    verbose : int, default=0
        Above 0, the fit logs each step (logger "kmeans_xp", shown on stdout).
    compute_labels : bool, default=True
        Whether ``labels_`` and ``inertia_`` are computed on all of X once the steps end (on
        the batch for ``partial_fit``).
    random_state : int, numpy.random.RandomState, numpy.random.Generator or None, \
default=None
        Seeds the initialisation, the batches and the reassignments.
    tol : float, default=0.0
        Stop when the squared change of the centers in a step is at most ``tol`` times the
        mean feature variance of X (0: never on this rule).
    max_no_improvement : int or None, default=10
        Stop after this many steps without improvement of the smoothed batch inertia
        (None: never on this rule).
    init_size : int or None, default=None
        Rows drawn for the initialisation (and as many for choosing the best of ``n_init``);
        None: ``3 * batch_size``, or ``3 * n_clusters`` when that is smaller than n_clusters.
    n_init : "auto" or int, default="auto"
        Initialisations tried; the one with the lowest inertia on the validation rows is
        kept. "auto": 1 for "k-means++" and "k-means||", 3 for "random" and a callable.
    reassignment_ratio : float, default=0.01
        Centers whose count is below this fraction of the largest are moved to random rows
        of the batch (every ``10 * n_clusters`` rows seen); 0 never moves them.
    backend : str, default="auto"
        "auto", "numpy", "array-api", "cupy-kernels", "cupy-chunked", "cupy-fused", "dask"
        or a plugin's name. With "dask", batches are gathered from the dask array on the
        client and computed there by the backend of its blocks.
    backend_options : dict or None, default=None
        Options of the backend, checked by name.
    max_memory : "auto", int or str, default="auto"
        Bound on the backend's working memory for a batch and for the final labels.
    precision : {"exact", "tf32", "fp16", "bf16"}, default="exact"
        Arithmetic of the distances, as KMeans's (docs/precision.md); the batch steps and the
        final labels compute at it on backends that declare it.

    Attributes
    ----------
    cluster_centers_ : array of shape (n_clusters, n_features)
        The centers, in the input's namespace and on its device.
    labels_ : array of shape (n_samples,)
        The cluster of each training sample (with ``compute_labels``).
    inertia_ : float
        Sum of the (weighted) squared distances of the samples to their centers (with
        ``compute_labels``, else the smoothed batch inertia times the total weight).
    n_iter_ : int
        Passes over X the steps made (rounded up).
    n_steps_ : int
        Mini-batch steps run (by fit, or in all by partial_fit).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Column names of a DataFrame X, when they are all strings.
    backend_ : str
        The backend that ran the fit.
    backend_reason_ : str
        Why that backend.
    history_ : dict
        Per step of the last fit: "batch_inertia" (per row) and "ewa_inertia".
    timings_ : dict
        Seconds spent in "validation", "init", "steps", "labels" and in total.
    memory_report_ : dict
        Peak bytes per stage, measured where the backend measures (the CuPy pool).

    See Also
    --------
    KMeans : Lloyd's algorithm on all of X at every iteration.
    sklearn.cluster.MiniBatchKMeans : The estimator whose API and semantics this one follows.

    Examples
    --------
    >>> import numpy as np
    >>> from kmeans_xp import MiniBatchKMeans
    >>> X = np.array([[1, 2], [1, 4], [1, 0], [4, 2], [4, 0], [4, 4],
    ...               [4, 5], [0, 1], [2, 2], [3, 2], [5, 5], [1, -1]], dtype=float)
    >>> km = MiniBatchKMeans(n_clusters=2, random_state=0, batch_size=6, max_iter=10,
    ...                      n_init="auto", backend="numpy").fit(X)
    >>> km.cluster_centers_.round(4)
    array([[3.2097, 3.5645],
           [1.3276, 0.7759]])
    >>> km.predict(np.array([[0.0, 0.0], [4.0, 4.0]])).tolist()
    [1, 0]
    """

    _estimator_type = "clusterer"
    _default_n_init = 3
    _KEPT = Fitting._KEPT + ("_counts",)
    _HOST_ON_PICKLE = SklearnInterop._HOST_ON_PICKLE + ("_counts",)
    _SKLEARN_STATE = ("_counts", "_n_since_last_reassign", "_batch_size", "_init_size",
                      "n_steps_", "n_iter_")

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means++", max_iter: int = 100,
                 batch_size: int = 1024, verbose: int = 0, compute_labels: bool = True,
                 random_state: Any = None, tol: float = 0.0,
                 max_no_improvement: int | None = 10, init_size: int | None = None,
                 n_init: str | int = "auto", reassignment_ratio: float = 0.01,
                 backend: str = "auto", backend_options: dict[str, Any] | None = None,
                 max_memory: str | int = "auto", precision: str = "exact") -> None:
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.verbose = verbose
        self.compute_labels = compute_labels
        self.random_state = random_state
        self.tol = tol
        self.max_no_improvement = max_no_improvement
        self.init_size = init_size
        self.n_init = n_init
        self.reassignment_ratio = reassignment_ratio
        self.backend = backend
        self.backend_options = backend_options
        self.max_memory = max_memory
        self.precision = precision

    # -- set up -------------------------------------------------------------------------------
    def _sizes(self, n: int) -> tuple[int, int]:
        """sklearn's batch and init sizes for n rows."""
        k = self.n_clusters
        batch = min(self.batch_size, n)
        init_size = self.init_size
        if init_size is None:
            init_size = 3 * batch
            if init_size < k:
                init_size = 3 * k
        elif init_size < k:
            warnings.warn(f"init_size={init_size} should be larger than n_clusters={k}. "
                          f"Setting it to min(3*n_clusters, n_samples)", RuntimeWarning,
                          stacklevel=4)
            init_size = 3 * k
        return batch, min(init_size, n)

    def _backends(self, X: Any) -> Any:
        """(the backend named or chosen for X, why, the backend computing its batches),
        kept between partial_fit calls on the same kind of input."""
        key = (self.backend, repr(self.backend_options), str(self.max_memory),
               namespace_name(X), _device_name(X), self.precision)
        cached = self.__dict__.get("_backend_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        backend, why = select_backend(self.backend, X, n_clusters=self.n_clusters,
                                      backend_options=self.backend_options,
                                      max_memory=self.max_memory,
                                      precision=self._precision_fit)
        steps = backend.batch_backend(X)
        if steps is not backend:
            steps.use_precision(self._precision_fit)
            why = f"{why}; batches computed by {steps.name!r} where they are gathered"
        self.__dict__["_backend_cache"] = (key, (backend, why, steps))
        return backend, why, steps

    def _init_rows(self, rows: Any, sw: Any, rs: Any,
                   n: int) -> tuple[Any, Array, Namespace, Array | None]:
        """sklearn's `_init_centroids` subset: init_size rows drawn with replacement (none
        when init_size covers X). Returns (their indices or None, centered rows, xp, their
        weights on the device or None)."""
        idx = rs.randint(0, n, self._init_size) if self._init_size < n else None
        Xi, xp = rows.batch(np.arange(n) if idx is None else idx)
        wi = None if sw is None else xp.asarray(sw if idx is None else sw[idx],
                                                device=device(Xi))
        return idx, Xi, xp, wi

    def _one_init(self, rows: Any, backend: KMeansBackend, sw: Any, rs: Any, n: int,
                  init_array: Any) -> tuple[Array, Namespace]:
        """One initialisation, as sklearn draws it: (centered centers, fit's units; xp)."""
        idx, Xi, xp, wi = self._init_rows(rows, sw, rs, n)
        given = init_array
        if given is None and callable(self.init):
            raw = rows.raw(np.arange(n) if idx is None else idx)
            given = check_init_array(self.init(raw, self.n_clusters, random_state=rs),
                                     self.n_clusters, Xi.shape[1])
        shift = xp.asarray(rows.shift, device=device(Xi))
        centers = self._initial_centers(Xi, shift, wi, rs, xp, given, backend, rows.scale)
        return backend.placement.small(xp.astype(centers, Xi.dtype)), xp

    # -- fit ------------------------------------------------------------------------------------
    @explains_memory_errors
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> MiniBatchKMeans:
        """Compute the centroids on X by chunking it into mini-batches.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data: NumPy (a memmap is read batch by batch), CuPy, torch, dask or
            nested lists; the fitted arrays come back in its namespace and on its device.
        y : Ignored
            Not used, present for API consistency by convention.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sample: batches are drawn with probability proportional to it.

        Returns
        -------
        self : MiniBatchKMeans
            The fitted estimator.
        """
        with verbose_logging(self.verbose):
            return self._fit(X, sample_weight)

    def _resolve_precision(self, X_user: Any) -> None:
        """The fit's precision from the dtype X came in (half X computes at its format),
        before the guard that reads it (fp16's range) and the backends."""
        self._check_params()
        self._precision_fit = resolve_precision(self.precision,
                                                getattr(X_user, "dtype", "float64"))

    def _fit(self, X: Any, sample_weight: Any) -> MiniBatchKMeans:
        clock = Clock()
        X_user = X
        self._resolve_precision(X_user)
        X, sw, init_array, guard = self._check_inputs(X, sample_weight, measure=True)
        n = X.shape[0]
        k = self.n_clusters
        self._batch_size, self._init_size = self._sizes(n)
        self._n_init = n_init = self._resolved_n_init()
        rs = check_random_state(self.random_state)
        backend, why, steps = self._backends(X)
        place = steps.placement
        # sklearn's order of draws: the validation rows, then per init its rows and method
        valid = rs.randint(0, n, self._init_size)
        rows = BatchRows(X, steps, scale=guard.scale)
        rows.shift = shift_point(rows.raw(valid), X.dtype, guard.scale)
        self._tol = tolerance_of(X, rows.shift, self.tol, steps, guard.scale)
        clock.lap("validation")
        Xv, xp = rows.batch(valid)
        wv = None if sw is None else xp.asarray(sw[valid], device=device(Xv))
        best: Any = None
        best_inertia: Any = None
        for _ in range(n_init):
            with steps.memory.stage("init"):
                centers, _ = self._one_init(rows, steps, sw, rs, n, init_array)
                labels = assigned_labels(steps, Xv, centers, xp)
                inertia = float(to_numpy(steps.inertia(Xv, wv, centers, labels, xp=xp)))
            if best is None or inertia < best_inertia:
                best, best_inertia = centers, inertia
        del Xv, wv, labels
        place.synchronize()
        clock.lap("init")
        cxp = place.namespace(best)
        state = StepState(best, cxp.zeros(k, dtype=best.dtype, device=device(best)))
        draws = BatchDraws(sw, n, X.dtype, rows.index_xp, rows.index_device)
        n_steps = (self.max_iter * n) // self._batch_size
        with steps.memory.stage("steps"):
            done = run_steps(steps, rows, draws, state, rs, n_steps=n_steps,
                             batch_size=self._batch_size, tol=self._tol,
                             max_no_improvement=self.max_no_improvement,
                             reassignment_ratio=self.reassignment_ratio, verbose=self.verbose)
        del draws
        place.synchronize()
        clock.lap("steps")
        self.n_steps_ = done
        self.n_iter_ = int(math.ceil(done * self._batch_size / n))
        self._store_state(state, guard)
        self._store(backend, why, steps, rows.shift, self._centers_fit, X_user, X)
        self._state_like_input(place, X_user)
        self._record_feature_names(X_user)
        if self.compute_labels:
            self._labels(rows, steps, sw, X_user, sample_weight, state.centers, guard)
        else:
            total = float(n if sw is None else np.sum(sw))
            self.inertia_ = guard.objective(float(
                state.ewa_inertia if state.ewa_inertia is not None
                else state.history["batch_inertia"][-1]) * total)
        self.history_ = guard.history(state.history)
        self.memory_report_ = dict(steps.memory.report)
        self._finish(place)
        clock.lap("labels")
        self.timings_ = {**clock.laps, "total": clock.total()}
        return self

    def _labels(self, rows: Any, steps: KMeansBackend, sw: Any, X_user: Any,
                sample_weight: Any, centers: Any, guard: Any) -> None:
        """labels_ and inertia_ of all of X against `centers` (the fit's units), in chunks (a
        dask X through its own backend, as predict does: labels stay a dask array)."""
        if namespace_name(rows.X) == "dask.array":
            self.labels_ = self.predict(X_user)
            self.inertia_ = -self.score(X_user, sample_weight=sample_weight)
            return
        centers = steps.placement.small(centers)
        labels, inertia = labels_and_inertia(rows, steps, centers, sw,
                                             steps.driver_rows(rows.X))
        self.inertia_ = guard.objective(inertia)
        self.labels_ = user_labels(steps.placement.from_backend(labels, like=X_user))

    def _store_state(self, state: Any, guard: Any) -> None:
        """What partial_fit goes on from, in X's (centered) and the weights' units."""
        self._centers_fit = guard.centers_out(state.centers, array_namespace(state.centers))
        self._counts = guard.counts_out(state.counts, array_namespace(state.counts))
        self._scale = guard.scale
        self._n_since_last_reassign = state.n_since_last_reassign
        self._ewa_inertia, self._no_improvement = state.ewa_inertia, state.no_improvement
        self._ewa_inertia_min = state.ewa_inertia_min

    def _state_like_input(self, place: Any, X_user: Any) -> None:
        """partial_fit's state in the namespace of input shared through DLPack (a CPU torch
        tensor), as scikit-learn keeps it."""
        self._centers_fit = self._in_input_namespace(place, self._centers_fit, X_user)
        self._counts = self._in_input_namespace(place, self._counts, X_user)

    def _store(self, backend: KMeansBackend, why: str, steps: KMeansBackend, shift: Any,
               centers: Array, X_user: Any, X: Any) -> None:
        """The fitted attributes; `centers` centered, in X's units."""
        place = steps.placement
        cxp = place.namespace(centers)
        mean = cxp.asarray(shift, device=device(centers))
        self._X_mean = self._in_input_namespace(place, mean, X_user)
        self._backend_key = (backend.name, dict(self.backend_options or {}), self.max_memory,
                             self.backend == "auto")
        self.cluster_centers_ = place.from_backend(centers + mean, like=X_user)
        self.n_features_in_ = int(X.shape[1])
        self._n_features_out = self.n_clusters
        self.backend_ = backend.name
        self.backend_reason_ = why

    # -- partial_fit ----------------------------------------------------------------------------
    @explains_memory_errors
    def partial_fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> MiniBatchKMeans:
        """Update the centers with one mini-batch: X.

        The first call initialises the centers on X (``init`` on up to ``init_size`` of its
        rows); every call is one step with X as the batch. A dask array is taken block by
        block of rows, one step per block in order (what dask-ml's ``Incremental`` does
        without shuffling).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            One batch of training data.
        y : Ignored
            Not used, present for API consistency by convention.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sample of the batch.

        Returns
        -------
        self : MiniBatchKMeans
            The updated estimator.
        """
        with verbose_logging(self.verbose):
            if namespace_name(X) != "dask.array":
                return self._partial_fit(X, sample_weight)
            X = self._checked_X(X, absmax=False)  # unknown chunk sizes: say what to do
            start = 0
            for rows in X.chunks[0]:
                sl = slice(start, start + rows)
                start += rows
                w = None if sample_weight is None else to_numpy(sample_weight[sl])
                if rows:
                    self._partial_fit(to_numpy(X[sl]), w)
            return self

    def _partial_fit(self, X: Any, sample_weight: Any) -> MiniBatchKMeans:
        clock = Clock()
        fitted = hasattr(self, "cluster_centers_")
        X_user = X
        self._resolve_precision(X_user)
        X, absmax = self._checked_X(X)
        n, d = X.shape
        if fitted and d != self.n_features_in_:
            raise ValueError(f"X has {d} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input.")
        if fitted:
            self._check_feature_names(X_user)
        if fitted:  # the centers so far must stay inside the fit's numbers too
            absmax = max(absmax, float(np.max(np.abs(to_numpy(self.cluster_centers_)))))
        guard, sw = self._guard(X, self._checked_weights(sample_weight, X, positive=False),
                                absmax)
        if "_random_state" not in self.__dict__:
            self._random_state = check_random_state(self.random_state)
        rs = self._random_state
        self.n_steps_ = getattr(self, "n_steps_", 0)
        backend, why, steps = self._backends(X)
        place = steps.placement
        k = self.n_clusters
        if not fitted:
            self._check_n_samples(n)
            self._batch_size, self._init_size = self._sizes(n)
            rows = BatchRows(X, steps, scale=guard.scale)
            rows.shift = shift_point(X, X.dtype, guard.scale)
            centers, _ = self._one_init(rows, steps, sw, rs, n, self._init_array(d))
            cxp = place.namespace(centers)
            state = StepState(centers, cxp.zeros(k, dtype=centers.dtype,
                                                 device=device(centers)))
            self._record_feature_names(X_user)
        else:
            rows = BatchRows(X, steps, np.asarray(to_numpy(self._X_mean)).astype(
                host_dtype_of(X.dtype)), guard.scale)
            centers = place.small(on_backend(self._centers_fit, X, steps))
            centers = guard.centers_in(centers, place.namespace(centers))
            # the counts where the centers are: cupy-fused keeps small centers on the host
            counts = self._counts
            counts = (np.asarray(to_numpy(counts)) if isinstance(centers, np.ndarray) else
                      place.namespace(centers).asarray(on_backend(counts, X, steps),
                                                       device=device(centers)))
            counts = guard.counts_in(counts, array_namespace(counts), centers.dtype)
            state = StepState(centers, counts,
                              n_since_last_reassign=self._n_since_last_reassign)
        (_, Xb, xp), = rows.slices(n)
        w = None if sw is None else xp.asarray(sw, device=device(Xb))
        reassign = state.random_reassign(self._batch_size, k)
        step(steps, Xb, xp, w, state, rs, reassign=reassign,
             reassignment_ratio=self.reassignment_ratio, verbose=self.verbose)
        self._store_state(state, guard)
        self._store(backend, why, steps, rows.shift, self._centers_fit, X_user, X)
        self._state_like_input(place, X_user)
        if self.compute_labels:
            labels = assigned_labels(steps, Xb, state.centers, xp)
            self.inertia_ = guard.objective(max(float(to_numpy(
                steps.inertia(Xb, w, state.centers, labels, xp=xp))), 0.0))
            self.labels_ = user_labels(place.from_backend(labels, like=X_user))
        self.n_steps_ += 1
        self.memory_report_ = dict(steps.memory.report)
        del Xb, w, state
        self._finish(place)   # the step's buffers go: the model holds only its state
        self.timings_ = {"partial_fit": clock.total()}
        return self


def _device_name(X: Any) -> str:
    """X's device as a cache key; "" where it has none or will not say (cupyx.scipy.sparse
    matrices raise NotImplementedError from `device`)."""
    try:
        return str(getattr(X, "device", ""))
    except Exception:  # noqa: BLE001 - any failure: no device to tell apart
        return ""
