"""What KMeans and MiniBatchKMeans share before and after their algorithms run: parameter and
input checks, how many initialisations, the initial centers of one run, and handing the fit's
device arrays back to the placement. Each estimator keeps its own algorithm and attributes.
"""
from __future__ import annotations

import warnings

import numpy as np

from kmeans_xp.algorithms import init as _init
from kmeans_xp.contract.finite import check_finite
from kmeans_xp.contract.namespaces import (DLPACK_FOREIGN, array_namespace, device,
                                           namespace_name, operand)
from kmeans_xp.estimators.predicting import require_known_shape
from kmeans_xp.contract.selection import select_backend
from kmeans_xp.contract.precision import HALF_STORAGE, half_kind
from kmeans_xp.contract.scaling import NumericGuard, host_dtype_of
from kmeans_xp.estimators.validation import check_array, check_init_array, check_sample_weight, validate_params


class Fitting:
    """Mixed into the estimators: the steps every fit takes in the same way."""

    #: whether float16 X at precision="fp16" may stay float16 (`_half_for`): KMeans's fit
    _keeps_half = False

    #: n_init="auto" for "random" and a callable (sklearn: 10 for KMeans, 3 for MiniBatchKMeans)
    _default_n_init = 10

    def _resolved_n_init(self):
        method = _init.INIT_METHODS.get(self.init) if isinstance(self.init, str) else None
        if method is not None and method.runs_once:
            default = 1
        elif isinstance(self.init, str) or callable(self.init):
            default = self._default_n_init
        else:
            default = 1
        n_init = default if self.n_init == "auto" else self.n_init
        if not isinstance(self.init, str) and not callable(self.init) and n_init != 1:
            warnings.warn(f"Explicit initial center position passed: performing only one init "
                          f"in {type(self).__name__} instead of n_init={n_init}.",
                          RuntimeWarning, stacklevel=3)
            n_init = 1
        return n_init

    def _check_params(self) -> None:
        validate_params(self.get_params(), type(self).__name__)

    def _checked_X(self, X, *, absmax=True):
        """X validated (2-D, finite, float32/float64; float16 / bfloat16 kept for a fit at
        fp16 / bf16: `_half_for`) and, with absmax, (X, max |X|)."""
        precision = getattr(self, "_precision_fit", "exact")
        keep = precision if self._keeps_half and precision in HALF_STORAGE else None
        out = check_array(X, owner=type(self).__name__, absmax=absmax, keep_half=keep)
        require_known_shape(out[0] if absmax else out, self.backend, self.n_clusters)
        return out

    def _checked_weights(self, sample_weight, X, *, positive=True):
        """Validated host weights in float64 (None stays None; `_guard` puts them in X's
        dtype); never all zero (scikit-learn refuses them too); with positive, at least
        n_clusters of them must be > 0."""
        n = X.shape[0]
        sw = None if sample_weight is None else check_sample_weight(sample_weight, n,
                                                                    np.float64)
        if sw is not None and not np.any(sw):
            raise ValueError(f"Sample weights must contain at least one non-zero number: "
                             f"sample_weight is 0 for all {n} samples given to "
                             f"{type(self).__name__}, so no center can be computed. Give "
                             f"some sample a positive weight.")
        if positive:
            count = n if sw is None else int(np.count_nonzero(sw))
            if count < self.n_clusters:
                raise ValueError(f"sample_weight is zero for all but {count} samples, fewer "
                                 f"than n_clusters={self.n_clusters}: at least n_clusters "
                                 f"samples need a positive weight.")
        return sw

    def _check_n_samples(self, n):
        if n < self.n_clusters:
            raise ValueError(f"n_samples={n} should be >= n_clusters={self.n_clusters}: ask "
                             f"for at most {n} clusters or give more samples.")

    def _init_array(self, d):
        """The user's init centers (NumPy float64), or None for a method or a callable."""
        if isinstance(self.init, str) or callable(self.init):
            return None
        return check_init_array(self.init, self.n_clusters, d)

    def _guard(self, X, sw, absmax):
        """(the fit's `NumericGuard`, the weights in X's dtype, scaled by it): every fit
        and partial_fit makes its guard here, so no estimator computes without one."""
        return NumericGuard.of(X.dtype, X.shape[1], X.shape[0], sw, absmax,
                               getattr(self, "_precision_fit", "exact"))

    def _check_inputs(self, X, sample_weight, measure=False):
        """(X, weights in X's dtype or None, the init array or None, the fit's guard). X
        checked lazily (dask) is measured later, by the placement, unless `measure`: then
        here, in one pass with its NaN/inf check."""
        self._check_params()
        X, absmax = self._checked_X(X)
        if absmax is None and measure:
            absmax = check_finite(X, array_namespace(X))
        self._check_n_samples(X.shape[0])
        guard, sw = self._guard(X, self._checked_weights(sample_weight, X), absmax)
        return X, sw, self._init_array(X.shape[1]), guard

    def _half_for(self, X, backend):
        """X as the backend computes on it: half X (kept by validation for a fit at its own
        precision) stays as it is where the backend's kernels read it so
        (`KMeansBackend.half_data`), else float32 (its values, exactly)."""
        if half_kind(X.dtype) is None or self._precision_fit in backend.half_data:
            return X
        return array_namespace(X).astype(X, array_namespace(X).float32)

    def _given_inits(self, X, init_array, n_init, rs):
        """Host center arrays for each run when the user gives them (array or callable), else
        None. A callable is called here, before X may be centered in place (copy_x=False),
        so it always sees X as the user gave it; it draws from `rs` in run order as before."""
        if init_array is not None:
            return [init_array] * n_init
        if not callable(self.init):
            return None
        k, d = self.n_clusters, X.shape[1]
        return [check_init_array(self.init(X, k, random_state=rs), k, d) for _ in range(n_init)]

    def _initial_centers(self, Xb, X_mean, sw, rs, xp, given, backend, scale):
        """One run's initial centers on the centered (and scaled) Xb: `given` (host, in X's
        units) moved there, else the init method (`init.INIT_METHODS`) drawn from `rs`."""
        if given is not None:
            c = xp.asarray(given.astype(host_dtype_of(Xb.dtype)), device=device(Xb)) - X_mean
            return c if scale == 1 else c * operand(scale, c, xp)
        return _init.INIT_METHODS[self.init].run(
            Xb, self.n_clusters, sample_weight=sw, random_state=rs, xp=xp,
            rows=backend.driver_rows(Xb), backend=backend, persist=backend.placement.persist,
            verbose=self.verbose)

    def _init_centroids(self, X, x_squared_norms, init, random_state, sample_weight,
                        init_size=None, n_centroids=None):
        """scikit-learn's `_BaseKMeans._init_centroids` (its own tests call it): initial
        centers of X as given (a subset of init_size rows drawn first when smaller than n)
        by `init` (a method name, a callable or an array), weighted by sample_weight.
        x_squared_norms is accepted and not needed."""
        k = self.n_clusters if n_centroids is None else n_centroids
        X = check_array(X, owner=type(self).__name__)
        n = X.shape[0]
        sw = check_sample_weight(sample_weight, n, host_dtype_of(X.dtype))
        if init_size is not None and init_size < n:
            idx = random_state.randint(0, n, init_size)
            X, sw = X[idx], sw[idx]
        if not isinstance(init, str):
            given = init(X, k, random_state=random_state) if callable(init) else init
            return check_init_array(given, k, X.shape[1]).astype(host_dtype_of(X.dtype))
        backend = select_backend("auto", X, n_clusters=k)[0]
        place = backend.placement
        Xb = place.to_backend(X)
        xp = place.namespace(Xb)
        Xc = place.center(Xb, None, xp=xp)   # as given, as scikit-learn's
        centers = _init.INIT_METHODS[init].run(
            Xc, k, sample_weight=xp.asarray(sw, device=device(Xb)), random_state=random_state,
            xp=xp, rows=backend.driver_rows(Xc), backend=backend, persist=place.persist)
        return place.from_backend(centers, like=X)

    @staticmethod
    def _in_input_namespace(place, arr, X_user):
        """A kept array (centers, mean, counts) in the namespace of input the backend shares
        through DLPack (a torch tensor, a JAX array), as its fitted attributes are: the state
        an array API user (and sklearn's array API checks) sees is in the input's namespace.
        Other input keeps the backend's arrays (predict reads them from there)."""
        if (namespace_name(X_user) in DLPACK_FOREIGN
                and namespace_name(arr) != namespace_name(X_user)):
            return place.from_backend(arr, like=X_user)
        return arr

    #: what a fit keeps on its backend's device: handed to `Placement.finish`, which may move it
    _KEPT: tuple[str, ...] = ("labels_", "cluster_centers_", "_centers_fit", "_X_mean")

    def _finish(self, place):
        kept = {name: self.__dict__.pop(name) for name in self._KEPT if name in self.__dict__}
        kept = place.finish(kept)
        self.__dict__.update(kept)
