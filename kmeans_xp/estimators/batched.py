"""`KMeans` on a batch of problems: X of shape (B, n, d), or a ragged list of B arrays of
shape (n_b, d) (same d). The checks, the per-problem centering, n_init's best run per
problem and the fitted attributes with a leading batch axis; the iterations are the
driver's batched mode (`kmeans_xp.algorithms.batches`). docs/batches.md is the user's page.

    attribute          dense (B, n, d)       ragged list of B arrays
    cluster_centers_   (B, k, d)             (B, k, d)
    labels_            (B, n)                a list of B arrays (n_b,)
    inertia_, n_iter_  (B,) NumPy            (B,) NumPy
    history_           a list of B dicts     a list of B dicts
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from kmeans_xp.algorithms.batch_init import batch_initial_centers
from kmeans_xp.algorithms.batches import kmeans_batch_lloyd
from kmeans_xp.algorithms.progress import Clock
from kmeans_xp.contract.precision import (compute_dtype, half_storage,
                                          resolve as resolve_precision)
from kmeans_xp.contract.batching import BatchArray
from kmeans_xp.contract.finite import problems_absmax
from kmeans_xp.contract.namespaces import (
    array_namespace,
    device,
    is_array_api_obj,
    namespace_name,
    to_numpy,
)
from kmeans_xp.contract.selection import select_backend
from kmeans_xp.contract.results import user_labels
from kmeans_xp.contract.return_checks import assigned_labels
from kmeans_xp.contract.scaling import NumericGuard, host_dtype_of
from kmeans_xp.estimators.validation import (
    check_array,
    check_init_array,
    check_random_state,
    check_sample_weight,
)


def is_batch(X) -> bool:
    """Whether X is a batch of problems: an array of 3 or more dimensions (more is refused
    by `check_batch`), or a list or tuple of 2-D arrays."""
    if is_array_api_obj(X) and not isinstance(X, (list, tuple)):
        return len(getattr(X, "shape", ())) >= 3
    return (isinstance(X, (list, tuple)) and len(X) > 0
            and all(is_array_api_obj(x) and len(getattr(x, "shape", ())) == 2 for x in X))


class Batch:
    """A checked batch: the problems (2-D arrays in one namespace and dtype), whether it
    came as one (B, n, d) array (`dense`: then `array` is it), and the user's input."""

    def __init__(self, problems, array, user):
        self.problems, self.array, self.user = problems, array, user
        self.dense = array is not None
        self.B, self.d = len(problems), problems[0].shape[1]
        self.sizes = [p.shape[0] for p in problems]

    @property
    def like(self):
        """An array of the user's namespace and device, for `from_backend`."""
        return self.user if self.dense else self.user[0]


def check_batch(X, owner="KMeans", n_clusters=None) -> Batch:
    """X as a `Batch`, or an error saying what was given and what to give."""
    if not isinstance(X, (list, tuple)):
        shape = tuple(X.shape)
        if len(shape) != 3:
            raise ValueError(f"X of shape {shape} has {len(shape)} dimensions: {owner} takes "
                             f"one problem of shape (n_samples, n_features) or a batch of "
                             f"shape (n_problems, n_samples, n_features).")
        if 0 in shape:
            raise ValueError(f"X of shape {shape} is an empty batch: each of its dimensions "
                             f"(n_problems, n_samples, n_features) must be at least 1.")
        xp = array_namespace(X)
        flat = check_array(xp.reshape(X, (shape[0] * shape[1], shape[2])), owner=owner)
        array = xp.reshape(flat, shape)
        batch = Batch([array[b, ...] for b in range(shape[0])], array, X)
    else:
        problems = [check_array(x, name=f"X[{b}]", owner=owner) for b, x in enumerate(X)]
        names = {namespace_name(p) for p in problems}
        if len(names) > 1:
            raise ValueError(f"The problems of a batch are arrays of one library; got "
                             f"{sorted(names)}.")
        d = problems[0].shape[1]
        for b, p in enumerate(problems):
            if p.shape[1] != d:
                raise ValueError(f"X[{b}] has {p.shape[1]} features but X[0] has {d}: the "
                                 f"problems of a batch share n_features.")
        dtypes = {str(p.dtype) for p in problems}
        if len(dtypes) > 1:   # one dtype for the batch: the widest
            xp = array_namespace(problems[0])
            problems = [xp.astype(p, xp.float64) for p in problems]
        batch = Batch(problems, None, X)
    if n_clusters is not None:
        for b, n in enumerate(batch.sizes):
            if n < n_clusters:
                raise ValueError(f"Problem {b} of the batch has n_samples={n}, fewer than "
                                 f"n_clusters={n_clusters}: ask for at most {min(batch.sizes)}"
                                 f" clusters or give each problem more samples.")
    return batch


def check_batch_weights(est, sample_weight, batch):
    """Host float64 weights per problem (None: unit weights), each checked as a single fit
    checks its own (`Fitting._checked_weights`)."""
    if sample_weight is None:
        return None
    if is_array_api_obj(sample_weight) and not isinstance(sample_weight, (list, tuple)):
        sw = to_numpy(sample_weight)
        if sw.ndim != 2 or (batch.dense and sw.shape != (batch.B, batch.sizes[0])):
            want = (f"({batch.B}, {batch.sizes[0]})" if batch.dense
                    else f"a list of {batch.B} arrays")
            raise ValueError(f"sample_weight of shape {sw.shape} does not match the batch: "
                             f"give one weight per sample, of shape {want}.")
        sample_weight = list(sw)
    if len(sample_weight) != batch.B:
        raise ValueError(f"sample_weight has {len(sample_weight)} entries for a batch of "
                         f"{batch.B} problems: give one (n_b,) array per problem.")
    out = []
    for b, (w, p) in enumerate(zip(sample_weight, batch.problems)):
        try:
            out.append(est._checked_weights(w, p))
        except ValueError as exc:
            raise ValueError(f"sample_weight[{b}] (problem {b}): {exc}") from exc
    return out


def check_batch_init(init, n_clusters, batch):
    """An explicit init: (B, k, d) centers as a float64 NumPy array."""
    arr = to_numpy(init) if is_array_api_obj(init) else np.asarray(init)
    want = (batch.B, n_clusters, batch.d)
    if arr.shape != want:
        raise ValueError(f"The initial centers of a batch have shape {arr.shape}; expected "
                         f"{want}: (n_problems, n_clusters, n_features), one set of centers "
                         f"per problem.")
    return np.stack([check_init_array(arr[b], n_clusters, batch.d) for b in range(batch.B)])


def _guard_free(batch, weights, precision="exact"):
    """A batched fit computes in X's units: a problem whose squared distances (or weights)
    would leave its dtype (or, at fp16, whose values leave float16's range), which a single
    fit rescales, is refused."""
    tops = problems_absmax(batch.problems, batch.array)
    for b, p in enumerate(batch.problems):
        top = float(tops[b])
        guard, _ = NumericGuard.of(p.dtype, batch.d, p.shape[0],
                                   None if weights is None else weights[b], top, precision)
        if guard.scale != 1 or guard.w_scale != 1:
            raise ValueError(f"Problem {b} of the batch has values (max |x| = {top:.3g}) or "
                             f"weights whose squared distances leave {p.dtype} (or, at "
                             f"precision='fp16', float16's range): fit it alone "
                             f"(KMeans rescales a single problem), or rescale it first.")


def fit_batch(est, X, sample_weight, warning=UserWarning):
    """KMeans.fit on a batch of problems: sets the batched attributes on `est`; `warning`,
    the class of the fewer-distinct-clusters warning."""
    clock = Clock()
    est._check_params()
    if est._spherical:
        raise ValueError(f"{type(est).__name__} does not fit batches of problems; fit each "
                         f"problem alone.")
    batch = check_batch(X, type(est).__name__, est.n_clusters)
    # (as a single fit: from the dtype the problems came in; half X computes at its format)
    first = X[0] if isinstance(X, (list, tuple)) and len(X) else X
    precision = resolve_precision(getattr(est, "precision", "exact") or "exact",
                                  getattr(X, "dtype", getattr(first, "dtype", None)))
    weights = check_batch_weights(est, sample_weight, batch)
    given = None
    if not isinstance(est.init, str) and not callable(est.init):
        given = check_batch_init(est.init, est.n_clusters, batch)
    _guard_free(batch, weights, precision)
    n_init = est._resolved_n_init()
    rs = check_random_state(est.random_state)
    big = int(np.argmax(batch.sizes))   # the backend is chosen for the largest problem
    backend, why = select_backend(
        est.backend, batch.problems[big], n_clusters=est.n_clusters,
        sample_weight=None if weights is None else weights[big],
        backend_options=est.backend_options, max_memory=est.max_memory, check_memory=True,
        copy_x=bool(est.copy_x), precision=precision)
    if callable(est.init):   # (called per run and problem, before X is centered)
        given = [np.stack([check_init_array(est.init(p, est.n_clusters, random_state=rs),
                                            est.n_clusters, batch.d)
                           for p in batch.problems]) for _ in range(n_init)]
    elif given is not None:
        given = [given] * n_init
    clock.lap("validation")
    place = backend.placement
    Xb = _to_backend(place, batch)
    xp = place.namespace(Xb[0])
    dtype = Xb[0].dtype
    sw = None if weights is None else [
        xp.asarray(w.astype(host_dtype_of(dtype)), device=device(Xb[0])) for w in weights]
    if sw is not None and batch.dense:   # (one (B, n) array: a backend's batched kernels)
        sw = BatchArray(xp.stack(sw))
    place.synchronize()
    clock.lap("transfer")
    Xc, means, tol = _centered(est, place, batch, Xb, xp)
    clock.lap("stats")
    best, laps = _runs(est, backend, Xc, means, sw, xp, rs, n_init, tol, given)
    _store(est, batch, backend, why, best, means, warning)
    del Xb, Xc, sw, best
    est._finish(place)   # (the fit's buffers go back; device attributes may be moved)
    clock.skip()
    est.timings_ = {**clock.laps, **laps, "total": clock.total()}
    return est


def _to_backend(place, batch):
    """The problems on the backend: a (B, n, d) batch moves as one (n_problems * n, d) array
    (one transfer), seen as B views (`BatchArray`); a ragged one problem by problem. A
    batch is never streamed from the host (a placement that would stream it refuses)."""
    streams = getattr(place, "streams", None)
    for p in ([batch.array] if batch.dense else batch.problems):
        host = p if not batch.dense else np.reshape(p, (-1, batch.d)) if isinstance(
            p, np.ndarray) else None
        if streams is not None and isinstance(host, np.ndarray) and streams(host):
            raise ValueError("This batch does not fit on the device beside the fit, and "
                             "batched fits are not streamed from the host: give a smaller "
                             "batch (or max_memory), or fit its problems one by one.")
    if not batch.dense:
        return [place.to_backend(p) for p in batch.problems]
    B, n, d = batch.array.shape
    xp = array_namespace(batch.array)
    flat = place.to_backend(xp.reshape(batch.array, (B * n, d)))
    return BatchArray(place.namespace(flat).reshape(flat, (B, n, d)))


def _centered(est, place, batch, Xb, xp):
    """(the problems centered, each on its own mean, as the single fit centers; (B, d)
    means; (B,) absolute tols, each problem's own)."""
    stats = place.batch_feature_stats([Xb[b] for b in range(batch.B)], est.tol, xp=xp)
    tol = np.array([float(t) for _, t in stats])
    means = xp.stack([xp.astype(m, compute_dtype(Xb[0].dtype, xp)) for m, _ in stats])
    if not est.copy_x:   # computed on X as given, never written (as a single fit)
        return Xb, xp.zeros_like(means), tol
    # (as a single fit: into the half format where the backend computes on data so)
    store = half_storage(place.backend, xp)
    half = {} if store is None else {"dtype": store}
    if batch.dense:
        centered = (Xb.array - means[:, None, :] if store is None else
                    place.center(Xb.array, means[:, None, :], xp=xp, dtype=store))
        return BatchArray(centered), means, tol
    return [place.center(Xb[b], means[b, ...], xp=xp, **half) for b in range(batch.B)], \
        means, tol


def _runs(est, backend, Xc, means, sw, xp, rs, n_init, tol, given):
    """n_init batched runs (`given`: each run's (B, k, d) host centers, or None for the
    init method); per problem, the run of lowest inertia."""
    best = None
    t_init = t_lloyd = 0.0
    iterations = 0
    for run in range(n_init):
        t0 = time.perf_counter()
        with backend.memory.stage("init"):
            if given is not None:
                centers = xp.asarray(given[run].astype(host_dtype_of(Xc[0].dtype)),
                                     device=device(Xc[0])) - means[:, None, :]
            else:
                centers = batch_initial_centers(est.init, Xc, est.n_clusters, sw, rs, xp=xp,
                                                backend=backend, verbose=est.verbose)
        t1 = time.perf_counter()
        with backend.memory.stage("lloyd"):
            # (in the compute dtype: float32 for data in a half format, as a single fit's)
            result = kmeans_batch_lloyd(backend, Xc, sw,
                                        xp.astype(centers, compute_dtype(Xc[0].dtype, xp)),
                                        xp=xp, max_iter=est.max_iter, tol=tol,
                                        verbose=est.verbose)
        backend.placement.synchronize()
        t_init, t_lloyd = t_init + t1 - t0, t_lloyd + time.perf_counter() - t1
        best = result if best is None else _better(best, result, xp)
        iterations += int(result.n_iter.max())   # (the batch's: its slowest problem's)
    return best, {"init": t_init, "lloyd": t_lloyd,
                  "per_iteration": t_lloyd / max(iterations, 1)}


def _better(best, new, xp):
    """Per problem, the run of lower inertia (the earlier one on a tie, as n_init does)."""
    take = new.inertia < best.inertia
    if not take.any():
        return best
    pick = xp.asarray(take, device=device(best.centers))[:, None, None]
    return type(best)([n if t else o for o, n, t in zip(best.labels, new.labels, take)],
                      np.where(take, new.inertia, best.inertia),
                      xp.where(pick, new.centers, best.centers),
                      np.where(take, new.n_iter, best.n_iter),
                      [n if t else o for o, n, t in zip(best.history, new.history, take)])


def _store(est, batch, backend, why, best, means, warning):
    place = backend.placement
    like = batch.like
    labels = [user_labels(place.from_backend(lab, like=like)) for lab in best.labels]
    if batch.dense:
        lxp = array_namespace(labels[0])
        labels = lxp.stack(labels)
    est._batch = (batch.B, batch.dense)
    est._X_mean = means
    est._centers_fit = best.centers
    est._backend_key = (backend.name, dict(est.backend_options or {}), est.max_memory,
                        est.backend == "auto")
    est._scale = 1.0
    est.__dict__.pop("_moved_to_host", None)
    est.__dict__.pop("feature_names_in_", None)
    est.cluster_centers_ = place.from_backend(best.centers + means[:, None, :], like=like)
    est.labels_ = labels
    est.inertia_ = best.inertia
    est.n_iter_ = best.n_iter
    est.n_features_in_ = batch.d
    est.backend_, est.backend_reason_ = backend.name, why
    est.history_ = best.history
    est.memory_report_ = dict(backend.memory.report)
    for b, distinct in enumerate(_distinct_clusters(place, best.labels, labels, batch,
                                                    est.n_clusters)):
        if distinct < est.n_clusters:
            warnings.warn(f"Number of distinct clusters ({distinct}) found smaller than "
                          f"n_clusters ({est.n_clusters}) in problem {b} of the batch. "
                          f"Possibly due to duplicate points in X[{b}].",
                          warning, stacklevel=5)


def _distinct_clusters(place, labels, stacked, batch, k):
    """Each problem's number of non-empty clusters; a dense batch's counted once over its
    (B, n) labels, problem b's offset by b * k (one count and one read, not B)."""
    if not batch.dense:
        return [int(np.count_nonzero(place.label_counts(lab, k))) for lab in labels]
    xp = array_namespace(stacked)
    offsets = xp.reshape(xp.arange(0, batch.B * k, k, dtype=stacked.dtype,
                                   device=device(stacked)), (batch.B, 1))   # (no host operand)
    counts = place.label_counts(xp.reshape(stacked + offsets, (-1,)), batch.B * k)
    return np.count_nonzero(np.reshape(to_numpy(counts), (batch.B, k)), axis=1).tolist()


# -- a fitted batch on new data ---------------------------------------------------------------
def _batch_model(est, X, method):
    """The checked batch X for `method` of a model fitted on a batch, or an error."""
    est._check_fitted()
    fitted = getattr(est, "_batch", None)
    if fitted is None:
        raise ValueError(f"{type(est).__name__} was fitted on one problem; {method} takes X of "
                         f"shape (n_samples, {est.n_features_in_}), not a batch.")
    batch = check_batch(X, type(est).__name__)
    if batch.B != fitted[0]:
        raise ValueError(f"X is a batch of {batch.B} problems, but {type(est).__name__} was "
                         f"fitted on {fitted[0]}: give one array per fitted problem.")
    if batch.d != est.n_features_in_:
        raise ValueError(f"X has {batch.d} features, but {type(est).__name__} is expecting "
                         f"{est.n_features_in_} features as input.")
    return batch


def _problem_backend(est, batch):
    big = int(np.argmax(batch.sizes))
    backend = est._predict_backend(batch.problems[big])
    place = backend.placement
    problems = [place.to_backend(p) for p in batch.problems]
    return backend, place, problems, place.namespace(problems[0])


def _fitted(est, xp, like, b):
    """Problem b's fitted (centers, mean) in xp, on like's device, in like's dtype."""
    centers = xp.asarray(to_numpy(est._centers_fit[b, ...]), device=device(like))
    mean = xp.asarray(to_numpy(est._X_mean[b, ...]), device=device(like))
    return xp.astype(centers, like.dtype), xp.astype(mean, like.dtype)


def _gathered(batch, parts, xp):
    return xp.stack(parts) if batch.dense else list(parts)


def predict_batch(est, X):
    """Each problem's labels against its own fitted centers: (B, n), or a list (ragged)."""
    batch = _batch_model(est, X, "predict")
    backend, place, problems, xp = _problem_backend(est, batch)
    out = []
    for b, Xb in enumerate(problems):
        centers, mean = _fitted(est, xp, Xb, b)
        labels = assigned_labels(backend, place.center(Xb, mean, xp=xp), centers, xp)
        out.append(user_labels(place.from_backend(labels, like=batch.like)))
    return _gathered(batch, out, array_namespace(out[0]))


def transform_batch(est, X, distances):
    """Each problem's (n_b, k) distances to its own centers: (B, n, k), or a list;
    `distances(X, centers, mean, xp, rows)`, transform's of one problem."""
    batch = _batch_model(est, X, "transform")
    backend, place, problems, xp = _problem_backend(est, batch)
    out = []
    for b, Xb in enumerate(problems):
        centers = xp.asarray(to_numpy(est.cluster_centers_[b, ...]), device=device(Xb))
        _, mean = _fitted(est, xp, Xb, b)
        dist = distances(Xb, centers, mean, xp, backend.driver_rows(Xb))
        out.append(place.from_backend(dist, like=batch.like))
    return _gathered(batch, out, array_namespace(out[0]))


def score_batch(est, X, sample_weight=None):
    """(B,) NumPy: each problem's minus inertia against its own centers."""
    batch = _batch_model(est, X, "score")
    weights = check_batch_weights(est, sample_weight, batch)
    backend, place, problems, xp = _problem_backend(est, batch)
    out = np.zeros(batch.B)
    for b, Xb in enumerate(problems):
        centers, mean = _fitted(est, xp, Xb, b)
        sw = None if weights is None else xp.asarray(
            check_sample_weight(weights[b], Xb.shape[0], host_dtype_of(Xb.dtype)),
            device=device(Xb))
        _, total = backend.labels_inertia(place.center(Xb, mean, xp=xp), sw, centers, xp=xp)
        out[b] = -float(to_numpy(total))
    return out
