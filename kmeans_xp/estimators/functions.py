"""scikit-learn's function API: `k_means` and `kmeans_plusplus`, with its signatures and
return values, on kmeans_xp's estimators and init."""
from __future__ import annotations

from typing import Any

import numpy as np

from kmeans_xp.algorithms.init import kmeans_plusplus as _plusplus
from kmeans_xp.contract.scaling import host_dtype_of
from kmeans_xp.estimators.kmeans import KMeans
from kmeans_xp.estimators.validation import (
    check_array,
    check_random_state,
    check_sample_weight,
    validate_params,
)


def k_means(X: Any, n_clusters: int, *, sample_weight: Any = None, init: Any = "k-means++",
            n_init: str | int = "auto", max_iter: int = 300, verbose: bool = False,
            tol: float = 1e-4, random_state: Any = None, copy_x: bool = True,
            algorithm: str = "lloyd", return_n_iter: bool = False, **kmeans_xp_params):
    """Perform K-means clustering algorithm (scikit-learn's `sklearn.cluster.k_means`).

    Parameters
    ----------
    X : array-like or sparse matrix of shape (n_samples, n_features)
        The observations to cluster.
    n_clusters : int
        The number of clusters to form as well as the number of centroids to generate.
    sample_weight : array-like of shape (n_samples,), default=None
        The weights for each observation in `X` (None: all 1).
    init, n_init, max_iter, verbose, tol, random_state, copy_x, algorithm
        As `KMeans`'s parameters of the same names.
    return_n_iter : bool, default=False
        Whether or not to return the number of iterations.
    **kmeans_xp_params
        kmeans_xp's own `KMeans` parameters: ``backend``, ``backend_options``,
        ``max_memory``.

    Returns
    -------
    centroid : ndarray of shape (n_clusters, n_features)
        Centroids found at the last iteration of k-means.
    label : ndarray of shape (n_samples,)
        The `label[i]` is the code or index of the centroid the i'th observation is closest
        to.
    inertia : float
        The final value of the inertia criterion (sum of squared distances to the closest
        centroid for all observations in the training set).
    best_n_iter : int
        Number of iterations corresponding to the best results. Returned only if
        `return_n_iter` is set to True.
    """
    est = KMeans(n_clusters=n_clusters, init=init, n_init=n_init, max_iter=max_iter,
                 verbose=verbose, tol=tol, random_state=random_state, copy_x=copy_x,
                 algorithm=algorithm, **kmeans_xp_params).fit(X, sample_weight=sample_weight)
    if return_n_iter:
        return est.cluster_centers_, est.labels_, est.inertia_, est.n_iter_
    return est.cluster_centers_, est.labels_, est.inertia_


def kmeans_plusplus(X: Any, n_clusters: int, *, sample_weight: Any = None,
                    x_squared_norms: Any = None, random_state: Any = None,
                    n_local_trials: int | None = None):
    """Init n_clusters seeds according to k-means++ (scikit-learn's
    `sklearn.cluster.kmeans_plusplus`: the same draws from the same `random_state`).

    Parameters
    ----------
    X : array-like or sparse matrix of shape (n_samples, n_features)
        The data to pick seeds from.
    n_clusters : int
        The number of centroids to initialize.
    sample_weight : array-like of shape (n_samples,), default=None
        The weights for each observation in `X` (None: all 1).
    x_squared_norms : array-like of shape (n_samples,), default=None
        Squared Euclidean norm of each data point; checked for its length only (the
        distances are computed by differences or from the rows themselves).
    random_state : int, RandomState instance or None, default=None
        Determines random number generation for centroid initialization.
    n_local_trials : int, default=None
        The number of seeding trials for each center (except the first), of which the one
        reducing inertia the most is greedily chosen; None: ``2 + int(log(n_clusters))``.

    Returns
    -------
    centers : ndarray of shape (n_clusters, n_features)
        The initial centers for k-means.
    indices : ndarray of shape (n_clusters,)
        The index location of the chosen centers in the data array X. For a given index
        and center, X[index] = center.
    """
    validate_params({"n_clusters": n_clusters, "random_state": random_state},
                    "kmeans_plusplus")
    if n_local_trials is not None and not (isinstance(n_local_trials, (int, np.integer))
                                           and n_local_trials >= 1):
        raise ValueError(f"n_local_trials must be an int >= 1 or None, got {n_local_trials!r}")
    X = check_array(X, owner="kmeans_plusplus")
    n = X.shape[0]
    if n < n_clusters:
        raise ValueError(f"n_samples={n} should be >= n_clusters={n_clusters}.")
    if x_squared_norms is not None and len(x_squared_norms) != n:
        raise ValueError(f"The length of x_squared_norms {len(x_squared_norms)} should be "
                         f"equal to the length of n_samples {n}.")
    sw = None if sample_weight is None else check_sample_weight(sample_weight, n, np.float64)
    rs = check_random_state(random_state)
    from kmeans_xp.contract.selection import select_backend
    backend = select_backend("auto", X, n_clusters=n_clusters, sample_weight=sw)[0]
    place = backend.placement
    Xb = place.to_backend(X)
    Xc = place.center(Xb, None, xp=place.namespace(Xb))   # as given: k-means++ as sklearn's
    xp = place.namespace(Xb)
    w = None if sw is None else xp.asarray(sw.astype(host_dtype_of(Xb.dtype)))
    seeding = backend.seeding(Xc, w, n_local_trials or _local(n_clusters), xp=xp)
    centers, indices = _plusplus(Xc, n_clusters, sample_weight=w, random_state=rs, xp=xp,
                                 rows=backend.driver_rows(Xc), n_local_trials=n_local_trials,
                                 seeding=seeding)
    centers = place.from_backend(centers, like=X)
    return centers, np.asarray(indices)


def _local(k):
    from kmeans_xp.contract.seeding import local_trials
    return local_trials(k)
