"""`SphericalKMeans`: k-means by cosine similarity, on every backend, through THE driver.

A KMeans whose fit runs on a unit-row copy of X (`Placement.unit_rows`) and whose driver
projects every center onto the unit sphere (`kmeans_xp.contract.sphere`, `lloyd.new_centers`): the
backends' squared-Euclidean assignment on unit rows is the cosine assignment, so no backend
has a loop or a kernel of its own for it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from kmeans_xp.estimators.kmeans import KMeans
from kmeans_xp.contract.sparse import cosine_distances as sparse_cosine_distances
from kmeans_xp.contract.sparse import is_sparse
from kmeans_xp.contract.sphere import ZeroNormError, check_unit_rows, cosine_distances

if TYPE_CHECKING:
    from kmeans_xp.contract.backend import Array, KMeansBackend, Namespace, Placement


def _refuse_zero_rows(C: Any, what: str) -> None:
    zero = np.flatnonzero(~np.any(np.asarray(C) != 0, axis=1))
    if zero.size:
        raise ZeroNormError(f"{what} has rows of norm 0 (rows {zero[:5].tolist()}): a center "
                            f"of a spherical fit is a direction. Give nonzero rows.")


class SphericalKMeans(KMeans):
    """Spherical k-means: clusters by cosine similarity, with centers on the unit sphere.

    Each sample is scaled to unit L2 norm (on a copy: X is never modified), assigned to the
    center of largest cosine similarity, and each center is the normalised (weighted) sum of
    its samples: Dhillon and Modha's spherical k-means, the same partition as faiss's
    ``Kmeans(spherical=True)`` on unit rows from the same initial centers. On unit rows the
    squared Euclidean distance is ``2 - 2 cos``, so the fit is `KMeans`'s Lloyd loop, on every
    backend, with the centers projected onto the sphere after each update; the parameters,
    attributes and backends are `KMeans`'s, with the differences below.

    Parameters
    ----------
    n_clusters : int, default=8
        The number of clusters, and of centers.
    init : {"k-means++", "k-means||", "random"}, callable or array-like, default="k-means++"
        As `KMeans`'s, on the unit rows (k-means++ then draws by squared chord distance,
        ``2 - 2 cos``). Given centers (an array, or a callable's, which is given X as
        passed) are scaled to unit norm; a row of norm 0 raises.
    n_init : "auto" or int, default="auto"
        Runs with different initial centers; the one with the lowest inertia is kept.
    max_iter : int, default=300
        Lloyd iterations of one run at most.
    tol : float, default=1e-4
        Convergence when the squared center shift is at most ``tol`` times the mean
        feature variance of the unit rows; ``tol=0`` runs to strict convergence.
    verbose : int, default=0
        Above 0, the fit logs per iteration and shows progress bars.
    random_state : int, numpy.random.RandomState, numpy.random.Generator or None, \
default=None
        Seeds the initialisation.
    copy_x : bool, default=True
        True: the fit computes on a unit-row copy of X. False: X's rows must have unit L2
        norm already (checked: within 1e-4), and the fit computes on X as given, without
        a copy (it never writes X).
    algorithm : {"lloyd", "elkan"}, default="lloyd"
        As `KMeans`: "elkan" gives Lloyd's answer with triangle-inequality bounds (the
        Euclidean distances of unit rows order centers as the cosines do).
    backend : str, default="auto"
        As `KMeans`'s: "auto", "numpy", "array-api", "cupy-kernels", "cupy-chunked",
        "cupy-fused", "dask" or a plugin's name.
    backend_options : dict or None, default=None
        Options of the backend, checked by name.
    max_memory : "auto", int or str, default="auto"
        Bound on everything the fit allocates beyond X (docs/memory.md).
    balance : None, float or dict, default=None
        Bounds cluster sizes, as in `KMeans` (docs/large_k.md): a hard cap such as 1.1
        (rows per cluster at most 1.1 n / k) or ``{"penalty": lam}``.
    precision : {"exact", "tf32", "fp16", "bf16"}, default="exact"
        Arithmetic of the distances, as KMeans's (docs/precision.md).

    Attributes
    ----------
    cluster_centers_ : array of shape (n_clusters, n_features)
        The centers, of unit L2 norm, in the input's namespace and on its device.
    labels_ : array of shape (n_samples,)
        The cluster of each training sample (``predict(X)`` of the training data).
    inertia_ : float
        Sum over the samples of ``w * (1 - cos(x, center))``, the (weighted) cosine
        distances to their centers: half the squared Euclidean distance between the unit
        row and its center. scikit-learn has no spherical k-means; this is the value
        ``transform`` gives and ``score`` negates.
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
    history_ : dict
        Per iteration of the best run: "inertia" (as ``inertia_``) and "center_shift"
        (squared, between unit centers).
    timings_ : dict
        Seconds spent in "transfer", "init", "lloyd", per iteration and in total.
    memory_report_ : dict
        Peak bytes per stage, measured where the backend measures (the CuPy pool).

    See Also
    --------
    KMeans : Euclidean k-means, whose API and backends this estimator shares.

    Notes
    -----
    Rows of norm 0 have no direction: `fit`, `predict`, `transform` and `score` raise
    `kmeans_xp.contract.sphere.ZeroNormError` (a ValueError) naming them; drop them first. A center
    whose samples sum to exactly 0 keeps its previous direction. faiss's
    ``Kmeans(spherical=True)`` does not normalise its input: on rows of other norms it
    weighs each sample by its norm, where this estimator weighs them alike (normalise X's
    rows before faiss for the same partition). `to_sklearn` refuses: scikit-learn's KMeans
    predicts by Euclidean distance.

    Examples
    --------
    >>> import numpy as np
    >>> from kmeans_xp import SphericalKMeans
    >>> X = np.array([[1.0, 0.1], [20.0, 3.0], [3.0, 0.2],
    ...               [0.1, 1.0], [0.2, 30.0], [0.1, 2.0]])
    >>> skm = SphericalKMeans(n_clusters=2, random_state=0, backend="numpy").fit(X)
    >>> skm.labels_.tolist() in ([0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0])
    True
    >>> np.linalg.norm(skm.cluster_centers_, axis=1).round(6).tolist()
    [1.0, 1.0]
    >>> skm.predict(np.array([[5.0, 0.5], [0.0, 0.01]])).tolist() == [
    ...     skm.labels_[0], skm.labels_[3]]
    True
    """

    #: unit rows are made from float32 data: a float16 X is converted (`Fitting._half_for`)
    _keeps_half = False

    _spherical = True

    def _check_inputs(self, X: Any, sample_weight: Any,
                      measure: bool = False) -> tuple[Any, Any, Any, Any]:
        # (the base's helpers are not annotated; mypy does not exempt calls through super())
        X, sw, init_array, guard = super()._check_inputs(X, sample_weight, measure)  # type: ignore[no-untyped-call]
        if init_array is not None:
            _refuse_zero_rows(init_array, "init")
        return X, sw, init_array, guard

    def _given_inits(self, X: Any, init_array: Any, n_init: int, rs: Any) -> Any:
        given = super()._given_inits(X, init_array, n_init, rs)  # type: ignore[no-untyped-call]
        if callable(self.init):
            for C in given:
                _refuse_zero_rows(C, "The centers init returned")
        return given

    def _fit_data(self, backend: KMeansBackend, Xb: Array, xp: Namespace,
                  guard: Any, owned: bool = False) -> tuple[Array, Array, Any, float]:
        """(unit rows, a zero mean, the absolute tol, 1): no centering (the sphere is about
        the origin) and no rescaling of X (unit rows are inside every dtype's range; the
        guard still scales the weights). `owned` is not used: the placement decides where
        the unit rows are made."""
        place = backend.placement
        guard.scale = 1.0
        if self.copy_x:
            Xu = place.unit_rows(Xb, xp=xp)
        else:
            # (sparse X: seen through its placement, dense rows a chunk at a time)
            check_unit_rows(place.center(Xb, None, xp=xp) if is_sparse(Xb) else Xb, xp,
                            backend.driver_rows(Xb))
            Xu = Xb
        mean, tol = place.feature_stats(Xu, self.tol, xp=xp)
        return place.center(Xu, None, xp=xp), xp.zeros_like(mean), tol, 1.0

    def _store(self, best: Any, backend: KMeansBackend, why: str, X_mean: Array, X_user: Any,
               Xb: Array) -> None:
        super()._store(best, backend, why, X_mean, X_user, Xb)
        self.inertia_ = self._objective(self.inertia_)
        self.history_ = {**best.history,
                         "inertia": [self._objective(v) for v in best.history["inertia"]]}

    def _as_fitted(self, place: Placement, X: Array, mean: Array, xp: Namespace) -> Array:
        return place.unit_rows(X, xp=xp)

    def _objective(self, sq_dist: float) -> float:
        # unit x and c: ||x - c||^2 = 2 (1 - cos)
        return sq_dist / 2

    def transform(self, X: Any) -> Any:
        """Transform X to the cluster-distance space: cosine distances to the centers.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            New data (rows of any nonzero norm).

        Returns
        -------
        distances : array of shape (n_samples, n_clusters)
            ``1 - cos(x, center)``, in [0, 2], for each sample and center, in X's
            namespace (or a DataFrame after ``set_output(transform="pandas")``).
        """
        return super().transform(X)

    def _distances(self, X: Array, centers: Array, mean: Array, xp: Namespace,
                   rows: int) -> Array:
        return cosine_distances(X, centers, xp, rows)

    def _sparse_distances(self, X: Any, centers: Array, rows: int) -> Array:
        return sparse_cosine_distances(X, centers, rows)

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Compute the clustering and transform X to cosine distances to the centers.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency by convention.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sample (None: all 1).

        Returns
        -------
        distances : array of shape (n_samples, n_clusters)
            ``1 - cos(x, center)`` for each sample and fitted center.
        """
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the value of X on the spherical k-means objective.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            New data.
        y : Ignored
            Not used, present for API consistency by convention.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sample (None: all 1).

        Returns
        -------
        score : float
            Minus the (weighted) sum of the cosine distances of X to the closest centers
            (``-inertia_`` on the training data).
        """
        return super().score(X, y, sample_weight)

    def to_sklearn(self) -> NoReturn:
        """Refused: scikit-learn has no spherical k-means.

        A `sklearn.cluster.KMeans` with these centers would predict by Euclidean distance to
        unnormalised rows, which is not this model. For its predictions in scikit-learn, put
        ``sklearn.preprocessing.Normalizer()`` before a KMeans with these centers: on unit
        rows and unit centers the nearest center is the one of largest cosine.

        Returns
        -------
        None
            Never returns.

        Raises
        ------
        TypeError
            Always.
        """
        raise TypeError(
            "A SphericalKMeans is not a scikit-learn KMeans: scikit-learn has no spherical "
            "k-means, and its KMeans predicts by Euclidean distance to unnormalised rows. For "
            "this model's labels in scikit-learn, put sklearn.preprocessing.Normalizer() "
            "before a KMeans whose cluster_centers_ are this model's (its transform and score "
            "then give Euclidean values, not cosine distances).")
