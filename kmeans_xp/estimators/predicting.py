"""What a fitted KMeans does with new data: predict, transform, score (and the fit_*
shortcuts), on the fit's backend when it takes the input, else on the one "auto" picks.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

from kmeans_xp.contract.chunks import row_chunks
from kmeans_xp.estimators.batched import is_batch, predict_batch, score_batch, transform_batch
from kmeans_xp.contract.memory import explains_memory_errors
from kmeans_xp.contract.namespaces import device, namespace_name, to_numpy
from kmeans_xp.contract.registry import get_backend, get_backend_info
from kmeans_xp.contract.selection import select_backend
from kmeans_xp.contract.results import user_labels
from kmeans_xp.contract.return_checks import assigned_labels
from kmeans_xp.contract.scaling import host_dtype_of, ldexp_or_inf
from kmeans_xp.contract.sparse import NEAR_ULPS, dense_module, is_sparse
from kmeans_xp.contract.sparse import distances as sparse_distances
from kmeans_xp.estimators.validation import (
    check_array,
    check_sample_weight,
    known_shape,
    not_fitted_error,
    unknown_shape_error,
)


class Predicting:
    """Mixed into KMeans: the methods of a fitted model."""

    # -- using the fit ------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "cluster_centers_"):
            raise not_fitted_error(f"This {type(self).__name__} instance is not fitted yet. Call "
                                 f"'fit' with appropriate arguments before using this "
                                 f"estimator.")

    def _predict_backend(self, X):
        """The fit's backend when it takes X. Otherwise, after an "auto" fit, the backend
        "auto" picks for X; a backend the user named raises, listing those that would take
        X (as fit does): never a silent fallback."""
        name, options, max_memory, auto = self._backend_key
        k = self._centers_fit.shape[0]
        auto = auto or getattr(self, "_moved_to_host", False)
        if not (get_backend_info(name) or (False,))[0]:
            # unpickled where the fit's backend is missing (numba not installed, no GPU):
            # a pickle holds its name only, and the centers predict the same on any backend
            if not auto and not self.__dict__.get("_fallback_warned"):  # named, not "auto"
                self.__dict__["_fallback_warned"] = True
                warnings.warn(f"This {type(self).__name__} was fitted with backend {name!r}, "
                              f"which is not available here; predicting with the backend "
                              f"'auto' picks (the same labels).", UserWarning, stacklevel=4)
            return select_backend("auto", X, n_clusters=k, max_memory=max_memory)[0]
        backend = get_backend(name)(max_memory=max_memory, **options)
        # the fit's precision, so that labels_ == predict(X) holds at it too
        backend.use_precision(self.__dict__.get("_precision_fit", "exact"))
        if backend.accepts(X, n_clusters=k):
            return backend
        return select_backend("auto" if auto else name, X, n_clusters=k,
                              backend_options=options, max_memory=max_memory)[0]

    def _prepare(self, X, method, center=True):
        """(backend, X centered in the backend's namespace, xp, validated X, centers) for
        `method` (predict etc.); with center=False, X uncentered and the mean in place of the
        centers."""
        self._check_fitted()
        if getattr(self, "_batch", None) is not None:
            raise ValueError(f"{type(self).__name__} was fitted on a batch of "
                             f"{self._batch[0]} problems; {method} takes a batch too: X of "
                             f"shape ({self._batch[0]}, n_samples, n_features) or a list "
                             f"of {self._batch[0]} arrays.")
        self._check_same_namespace(X, method)
        self._check_feature_names(X)
        X = check_array(X, owner=type(self).__name__)
        require_known_shape(X, "auto" if self._backend_key[3] else self._backend_key[0],
                            self._centers_fit.shape[0])
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is "
                             f"expecting {self.n_features_in_} features as input.")
        backend = self._predict_backend(X)
        place = backend.placement
        Xb = place.to_backend(X)
        xp = place.namespace(Xb)
        mean = xp.asarray(self._X_mean, device=device(Xb)) if namespace_name(
            self._X_mean) == namespace_name(Xb) else xp.asarray(to_numpy(self._X_mean),
                                                                  device=device(Xb))
        if not center:
            return backend, Xb, xp, X, mean
        centers = xp.asarray(self._centers_fit, device=device(Xb)) if namespace_name(
            self._centers_fit) == namespace_name(Xb) else xp.asarray(
                to_numpy(self._centers_fit), device=device(Xb))
        Xs = (Xb if Xb.dtype == centers.dtype else Xb.astype(centers.dtype)) if is_sparse(
            Xb) else xp.astype(Xb, centers.dtype, copy=False)   # (cupyx's astype: no copy=)
        mean = xp.astype(mean, centers.dtype)
        scale = getattr(self, "_scale", 1.0)
        return (backend, self._as_fitted(place, Xs, mean, xp), xp, X,
                centers if scale == 1 else centers * scale)

    def _as_fitted(self, place, X, mean, xp):
        """X as the fit computed on it: centered and, where the fit rescaled, rescaled (as
        the fit: on a copy the placement owns, never X itself nor a chunkwise view)."""
        scale = getattr(self, "_scale", 1.0)
        if scale == 1:
            return place.center(X, mean, xp=xp)
        return place.center_scaled(X, mean, scale, xp=xp)

    @explains_memory_errors
    def predict(self, X: Any) -> Any:
        """Predict the closest cluster each sample in X belongs to.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            New data, in any namespace a backend takes (not only the fit's).

        Returns
        -------
        labels : array of shape (n_samples,)
            Index of the closest center, in X's namespace.
        """
        if is_batch(X):
            return predict_batch(self, X)
        backend, Xc, xp, X, centers = self._prepare(X, "predict")
        return user_labels(backend.placement.from_backend(
            assigned_labels(backend, Xc, centers, xp), like=X))

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Compute the clustering and return each sample's cluster (``fit(X).labels_``).

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
        labels : array of shape (n_samples,)
            Index of the cluster of each sample.
        """
        return self.fit(X, sample_weight=sample_weight).labels_

    @explains_memory_errors
    def transform(self, X: Any) -> Any:
        """Transform X to the cluster-distance space.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            New data.

        Returns
        -------
        distances : array of shape (n_samples, n_clusters)
            Euclidean distance of each sample to each center, in X's namespace (or a
            DataFrame after ``set_output(transform="pandas")``).
        """
        if is_batch(X):
            return transform_batch(self, X, _distances)
        X_user = X
        backend, Xb, xp, X, mean = self._prepare(X, "transform", center=False)
        if is_sparse(Xb):  # never densified: the expansion on the CSR's rows
            centers = dense_module(Xb).asarray(to_numpy(self.cluster_centers_))
            out = self._sparse_distances(Xb, centers, backend.driver_rows(Xb))
            return self._wrap_output(backend.placement.from_backend(out, like=X), X_user)
        Xb = xp.asarray(Xb)  # an array even where the backend streams rows
        centers = xp.asarray(to_numpy(self.cluster_centers_), device=device(Xb))
        out = backend.placement.from_backend(
            self._distances(Xb, centers, mean, xp, backend.driver_rows(Xb)), like=X)
        return self._wrap_output(out, X_user)

    def _distances(self, X, centers, mean, xp, rows):
        """transform's (n, k) distances of X (as given) to the fitted centers."""
        return _distances(X, centers, mean, xp, rows)

    def _sparse_distances(self, X, centers, rows):
        """The same for sparse X (`contract.sparse`)."""
        return sparse_distances(X, centers, rows)

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Compute the clustering and transform X to the cluster-distance space.

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
            Euclidean distance of each sample to each fitted center.
        """
        return self.fit(X, sample_weight=sample_weight).transform(X)

    @explains_memory_errors
    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the value of X on the K-means objective.

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
            Minus the (weighted) sum of squared distances of X to the closest centers.
        """
        if is_batch(X):
            return score_batch(self, X, sample_weight)
        backend, Xc, xp, X, centers = self._prepare(X, "score")
        sw = None if sample_weight is None else xp.asarray(check_sample_weight(
            sample_weight, Xc.shape[0], host_dtype_of(Xc.dtype)), device=device(Xc))
        # where the driver's inertia takes them
        centers = backend.placement.small(centers, backend.plan(Xc, centers.shape[0]))
        _, total = backend.labels_inertia(Xc, sw, centers, xp=xp)
        return -self._objective(float(to_numpy(total)))

    def _objective(self, sq_dist):
        """inertia_'s units from a sum of squared distances computed as the fit computed
        them: X's squared units (the fit's power-of-two rescaling undone)."""
        return ldexp_or_inf(sq_dist, -2 * (math.frexp(getattr(self, "_scale", 1.0))[1] - 1))


def _distances(X, centers, mean, xp, rows):
    """(n, k) Euclidean distances in X's dtype: X and the fitted centers are centered and
    expanded in float64, chunk by chunk (the expansion in float32 of centered copies gave
    2.8e-3 for a point on its center). Where the expansion is within its own rounding of 0
    (NEAR_ULPS), the distance is taken by differences: a point on a center gets exactly 0,
    whatever the offset the fit centered by (MiniBatchKMeans computes about 0)."""
    m64 = xp.astype(mean, xp.float64)
    c64 = xp.astype(centers, xp.float64) - m64
    c_sq = xp.sum(c64 * c64, axis=1)[None, :]
    eps = NEAR_ULPS * float(xp.finfo(xp.float64).eps)
    parts = []
    for sl in row_chunks(X.shape[0], max(1, rows // max(1, centers.shape[0] // 64))):
        x64 = xp.astype(X[sl, ...], xp.float64) - m64
        x_sq = xp.sum(x64 * x64, axis=1)[:, None]
        d2 = x_sq - 2 * (x64 @ c64.T) + c_sq
        d2 = _near_by_differences(d2, d2 <= eps * (x_sq + c_sq), x64, c64, xp)
        parts.append(xp.astype(xp.sqrt(xp.where(d2 < 0, xp.zeros_like(d2), d2)), X.dtype))
    return parts[0] if len(parts) == 1 else xp.concat(parts)


def _near_by_differences(d2, near, x64, c64, xp):
    """d2 with the `near` entries computed as sum((x - c)^2) (a few pairs: points on or
    next to a center). A namespace without integer-array assignment keeps the expansion."""
    if not bool(xp.any(near)):
        return d2
    i, j = xp.nonzero(near)
    diff = xp.take(x64, i, axis=0) - xp.take(c64, j, axis=0)
    try:
        d2[i, j] = xp.sum(diff * diff, axis=1)
    except (TypeError, IndexError, ValueError, NotImplementedError):
        pass
    return d2


def require_known_shape(X, backend, n_clusters):
    """Before anything is computed: X whose row count is unknown (a dask array after a
    boolean filter) gets the backend's own reason and what to do, else the generic one."""
    if not known_shape(X):
        select_backend(backend, X, n_clusters=n_clusters)  # raises the backend's reason
        raise unknown_shape_error(X)
