"""The placement of a backend: where X lives and how arrays get there and back (the
`Placement` base class a backend names in `KMeansBackend.placement_class`). Its defaults keep
X where it is; device placements (CuPy, dask) override them for copies, streams and speed."""
from __future__ import annotations

from typing import Any, Callable, ClassVar, cast

from kmeans_xp.contract.chunks import feature_mean, tolerance
from kmeans_xp.contract.fitplan import FitPlan
from kmeans_xp.contract.memory import host_available_memory
from kmeans_xp.contract.namespaces import (Array, Namespace, array_namespace, as_like,
                                           label_counts, to_numpy)
from kmeans_xp.contract.results import user_labels
from kmeans_xp.contract.scaling import rescaled
from kmeans_xp.contract.sphere import unit_rows


class Placement:
    """Where X lives and how arrays get there and back. Default: X stays where it is, in its
    own namespace, and everything is synchronous. A device plugin overrides five members:
    converts_from, to_backend, from_backend, synchronize and free_memory (docs/plugins.md);
    the others are defaults that work on a device, which first-party placements override
    for speed (asynchronous and fetch, warm_up, small, centering, finish)."""

    #: True when work is queued (a GPU stream): the driver then issues the next iteration
    #: before it reads the last one's statistics, so the device never waits on the host
    asynchronous: ClassVar[bool] = False
    #: max(abs(X)) measured by the last `to_backend` (None: not measured): input validated
    #: lazily (dask) is measured there, fused with its NaN/inf check, for the fit's rescale
    absmax: float | None = None

    # (backend: the KMeansBackend it serves; not imported here: contract/backend.py imports
    # this module)
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def converts_from(self, namespace: str, X: Array = None) -> bool:
        """Whether input of this namespace is brought in (copied, or shared through DLPack)
        by `to_backend`; X, the input itself, for namespaces whose arrays differ by device
        (a torch tensor on the CPU or on a GPU)."""
        return False

    def warm_up(self, X: Array, n_clusters: int, seeding: str | None) -> None:
        """Before X moves: start, in the background, what a fit of X with these parameters
        will need (a GPU placement compiles its kernels). `seeding`: the dtype name the
        backend's k-means++ steps (`KMeansBackend.seeding`) will run in during init, or None
        where the init does not use them. Default: nothing."""

    def to_backend(self, X: Array) -> Array:
        """X (validated, floating) in the backend's namespace; default: as given."""
        return X

    def from_backend(self, arr: Array, like: Array) -> Array:
        """arr in the namespace and device of `like` (the user's input); default: as given,
        or as a torch tensor on `like`'s device when `like` is one (`namespaces.as_like`).
        Compact (unsigned) labels widen to int32 (`user_labels`)."""
        return as_like(user_labels(arr), like)

    def namespace(self, X: Array) -> Namespace:
        """The namespace the driver computes with on X (the output of `to_backend`)."""
        return array_namespace(X)

    def small(self, x: Array, plan: FitPlan | None = None) -> Array:
        """A k-sized array (centers) where the driver's center math runs: X's namespace.
        `plan` (a `FitPlan`, None where the caller has none): the fit those centers serve,
        for a placement that decides by its size."""
        return x

    def persist(self, x: Array) -> Array:
        """Make a lazily evaluated array concrete (dask); default: x."""
        return x

    def synchronize(self) -> None:
        """Wait for the device, so a clock read after it measures finished work."""

    def free_memory(self) -> int | None:
        """Bytes free where the backend computes: what max_memory="auto" takes a share of
        (`memory.AUTO_FRACTION`). Default: the host's available memory (then "auto" is also
        capped at `memory.HOST_AUTO_CAP`; None where the host does not say); a device
        placement reports its device's."""
        return cast("int | None", host_available_memory())

    def fetch(self, values: Array) -> Callable[[], Any]:
        """Start copying a small 1-d array to the host; returns a function that waits for it
        and gives a NumPy array. Default: copied now."""
        host = to_numpy(values)
        return lambda: host

    def label_counts(self, labels: Array, n_clusters: int) -> Any:
        """Points per cluster (NumPy, length n_clusters), counted where the labels live."""
        return label_counts(labels, n_clusters)

    def feature_stats(self, X: Array, tol: float, *, xp: Namespace) -> tuple[Array, Any]:
        """(per-feature mean, absolute tol) of X (`chunks.feature_mean`, `chunks.tolerance`)."""
        mean = feature_mean(X, xp)
        return mean, tolerance(X, mean, tol, xp, self.backend.driver_rows(X))

    def batch_feature_stats(self, problems: list[Array], tol: float, *,
                            xp: Namespace) -> list[tuple[Array, Any]]:
        """`feature_stats` of each problem of a batch; a device placement reads them back
        together."""
        return [self.feature_stats(p, tol, xp=xp) for p in problems]

    def center(self, X: Array, mean: Array | None, *, xp: Namespace,
               in_place: bool = False, dtype: Any = None) -> Array:
        """X - mean, the data the driver and the backend compute on (in place when asked: the
        estimator adds the mean back). mean None (copy_x=False): X itself, computed on as
        given and never written. dtype: the data's, where the backend computes on float16
        data (`KMeansBackend.half_data`): X - mean rounded once to it, on a new array."""
        if mean is None:
            return X
        if dtype is not None and dtype != X.dtype:
            return xp.astype(X - mean, dtype)
        if in_place:
            X -= mean
            return X
        return X - mean

    def center_scaled(self, X: Array, mean: Array | None, scale: float, *,
                      xp: Namespace, dtype: Any = None) -> Array:
        """(X - mean) * scale, scale a power of two (exact): the data of a fit that rescales
        X so its squared distances stay inside its dtype (`kmeans_xp.contract.scaling`);
        dtype as `center`'s."""
        Xc = rescaled(self.center(X, mean, xp=xp), scale, xp)
        return Xc if dtype is None or dtype == Xc.dtype else xp.astype(Xc, dtype)

    def unit_rows(self, X: Array, *, xp: Namespace) -> Array:
        """X's rows scaled to unit L2 norm, the data of a spherical fit (`SphericalKMeans`),
        on an array the fit owns, never X itself (`sphere.unit_rows`, chunk by chunk); a row
        of norm 0 raises `sphere.ZeroNormError`."""
        return unit_rows(X, xp, self.backend.driver_rows(X))

    def finish(self, kept: dict[str, Array] | None = None) -> dict[str, Array] | None:
        """The fit has ended and dropped its arrays: release per-fit buffers. `kept`, the
        arrays the estimator keeps (a dict), comes back, moved where the placement wants them
        (a GPU placement handing its memory back re-allocates them exactly, in the same dict
        so that the caller holds no old copy)."""
        return kept
