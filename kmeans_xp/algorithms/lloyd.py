"""The driver: THE Lloyd loop, written once, for every backend.

Mirrors scikit-learn's `_kmeans_single_lloyd`: stop on strict convergence (no label changed)
or when the squared center shift is <= tol; relocate empty clusters to the points farthest
from their centers (sklearn's rules, and its guard: when every point sits on its center
nothing moves); finish with an assignment against the final centers so `labels_ ==
predict(X)`; inertia from direct squared differences. X arrives mean-centered, or, for a
spherical fit (`spherical=True`), as unit rows: then every center the loop makes (initial,
updated, relocated, filled from the heaviest cluster) is projected onto the unit sphere in
`new_centers`, the one place centers are made (`kmeans_xp.contract.sphere`).

The backend computes an iteration's statistics where the data lives (`lloyd_iter`); the
driver updates the k centers in xp code and reads one small array per iteration (shift,
inertia, changed labels, filled clusters). On an asynchronous device the next iteration is
issued before that array is read, so the device never waits for the host; it is dropped when
the read says a cluster was empty (the centers change) or the run converged strictly. A
backend with `ahead_gate` gets that condition as a device flag and leaves a dropped
iteration's work out, so the driver issues every next iteration ahead; for the others a
dropped one is a whole pass lost, and the driver issues ahead only while that is unlikely and
cheap (`AHEAD_MAX_ITERATION_S`).
"""
from __future__ import annotations

import time

import numpy as np

from kmeans_xp.contract import return_checks as returned
from kmeans_xp.algorithms.bounded import bounded_step
from kmeans_xp.contract.results import LloydResult
from kmeans_xp.contract.namespaces import device, to_numpy
from kmeans_xp.algorithms.balance import balanced_step
from kmeans_xp.algorithms.progress import bar, logger
from kmeans_xp.algorithms.relocation import relocate_empty
from kmeans_xp.contract.sphere import unit_centers

#: positions in the array the driver reads each iteration
SHIFT, INERTIA, CHANGED, FILLED = range(4)
#: a pass issued ahead saves the host's turn-around (a fraction of a millisecond) and is lost
#: whenever the iteration relocates; past this many seconds an iteration is worth far more
#: than the turn-around, and the driver reads its statistics before issuing the next one
AHEAD_MAX_ITERATION_S = 0.01


def new_centers(sums, weights, centers_old, xp, *, fill_empty=True, filled=None,
                spherical=False):
    """Weighted means in centers_old's dtype. A cluster still empty after relocation takes
    the center of the heaviest cluster, as scikit-learn's `_average_centers` does. Without
    fill_empty an empty cluster's row is 0: the driver relocates before such centers are
    used, and leaving the fill out saves a device program's worth of launches per iteration.
    `filled` (weights > 0), when the caller has it already. `spherical`: the means projected
    onto the unit sphere (in float64, before the rounding to centers_old's dtype); a mean of
    norm 0 keeps its old center."""
    w = weights[..., None]   # ((k,) or a batch's (A, k))
    filled = (weights > 0 if filled is None else filled)[..., None]
    means = sums / xp.where(filled, w, 1.0)
    if fill_empty:   # (each problem's own heaviest cluster: one take for a whole batch)
        k, d = weights.shape[-1], means.shape[-1]
        top = xp.argmax(xp.reshape(weights, (-1, k)), axis=1)
        # (each problem's offset p * k by arange's step: `* k`, an operator with a host
        # scalar, would go through NumPy's ufunc dispatch on CuPy)
        top = top + xp.arange(0, top.shape[0] * k, k, dtype=top.dtype, device=device(top))
        heaviest = xp.take(xp.reshape(means, (-1, d)), top, axis=0)
        means = xp.where(filled, means, xp.reshape(heaviest, (*weights.shape[:-1], 1, d)))
    if spherical:
        means = unit_centers(means, centers_old, xp)
    return xp.astype(means, centers_old.dtype, copy=False)


def _update(backend, X, sample_weight, centers, centers64, it, *, xp, cxp, relocate,
            spherical, zero):
    """(new centers, the same in float64, the small array to read) from one iteration's
    statistics. Each xp call here is a device launch on a GPU, where an iteration's pass can
    be shorter than a dozen of them: hence no copies (the statistics are float64 by
    contract), the previous centers kept in float64, and the heaviest-cluster fill only
    after a relocation (without one, an empty cluster sends the driver there)."""
    sums, weights = it.weighted_sums, it.weight_in_clusters
    if relocate:
        sums, weights = relocate_empty(backend, X, sample_weight, centers, it.labels, sums,
                                       weights, xp)
    filled = weights > zero   # (a 0-d float64 operand on the centers' device, made once)
    c_new = new_centers(sums, weights, centers, cxp, fill_empty=relocate, filled=filled,
                        spherical=spherical)
    c64 = cxp.astype(c_new, cxp.float64, copy=False)
    diff = c64 - centers64
    n_filled = cxp.sum(cxp.astype(filled, cxp.float64))
    small = cxp.stack([cxp.sum(diff * diff), _f64(it.inertia, cxp), _f64(it.n_changed, cxp),
                       n_filled])
    return c_new, c64, small


def _f64(a, xp):
    return a if a.dtype == xp.float64 else xp.astype(a, xp.float64)


def _log(verbose, text, *args):
    if verbose:  # (formatted only then: the loop runs every 0.2 ms on a GPU)
        logger.info(text.format(*args))


def kmeans_single_lloyd(backend, X, sample_weight, centers, *, xp, max_iter, tol,
                        verbose=0, spherical=False, plan=None,
                        backend_loop=True, bounds=None, balance=None) -> LloydResult:
    """One Lloyd run from `centers` (X's dtype) on any backend. `spherical`: X has unit
    rows, and the centers are projected onto the unit sphere, the initial ones too (a row
    of norm 0 stays 0: the estimator refuses such an init). `plan`: the fit's `FitPlan`
    (default: X's and the centers' shapes), which the placement places the centers by.
    A backend that runs the whole loop itself (`KMeansBackend.lloyd`, proved equal to this
    one by `check_backend`) does, unless `backend_loop` is False. `bounds`: a method of
    `kmeans_xp.contract.bounds` ("hamerly", "elkan", "yinyang") whose triangle-inequality
    bounds the assignments use (`backend.assign_bounded`), the same run with most distances
    left out; None (or input they do not take, `bounded_step`): Lloyd's kernels.
    `balance`: a `kmeans_xp.contract.capacity.Balance`, whose capacity-aware assignment
    (`algorithms.balance`) replaces the backend's (bounds are then not used)."""
    step = (bounded_step(backend, X, centers.shape[0], bounds) if balance is None
            else balanced_step(backend, X, centers.shape[0], balance))
    if backend_loop and step is None:
        own = backend.lloyd(X, sample_weight, centers, xp=xp, max_iter=max_iter, tol=tol,
                            spherical=spherical)
        if own is not None:
            return returned.check_run(backend, own, X.shape[0], centers.shape[0], X.shape[1])
    run = SingleRun(backend, X, sample_weight, centers, xp=xp, spherical=spherical,
                    plan=plan, step=step)
    return drive(run, max_iter=max_iter, tol=tol, verbose=verbose)


def drive(run, *, max_iter, tol, verbose=0):
    """THE Lloyd loop, for one problem (`SingleRun`) or a batch of them (`kmeans_xp.
    algorithms.batches.BatchRun`): each iteration the run updates its centers and reads one
    small (4, active problems) array (`run.advance`); here, per problem, the history, the
    convergence test (strict: no label changed since the last iteration; else the squared
    center shift <= tol, a scalar or one per problem) and max_iter; a problem that stopped
    leaves the run (`run.retire`), which issues the next iteration for the others
    (`run.next`) until none is left. `run.finish()` is the run's result."""
    progress = bar(max_iter, "Lloyd", verbose)
    tol = (tol.astype(np.float64) if isinstance(tol, np.ndarray)
           else np.float64(float(tol)))  # (a float, or one per problem)
    for i in range(max_iter):
        progress.update(1)
        values = np.reshape(run.advance(), (4, -1))
        active = run.active
        for j, history in enumerate(run.histories()):
            returned.check_read(run.backend, values[SHIFT, j], values[INERTIA, j])
            history["inertia"].append(float(values[INERTIA, j]))
            history["center_shift"].append(float(values[SHIFT, j]))
        strict = values[CHANGED] == 0 if i > 0 else np.zeros(len(active), dtype=bool)
        within = values[SHIFT] <= (tol if tol.ndim == 0 else tol[list(active)])
        if verbose:
            _log_iteration(run, values, i, strict, within, tol)
        run.retire(strict | within | (i + 1 == max_iter), strict, i + 1)
        if not run.active:
            break
        run.next()
    progress.close()
    return run.finish()


def _log_iteration(run, values, i, strict, within, tol):
    for j, b in enumerate(run.active):
        who = f"Problem {b}: " if run.batched else ""
        _log(True, "{}Iteration {}, inertia {:.6g}, center shift {:.3g}", who, i,
             values[INERTIA, j], values[SHIFT, j])
        if strict[j]:
            _log(True, "{}Converged at iteration {}: strict convergence.", who, i)
        elif within[j]:
            _log(True, "{}Converged at iteration {}: center shift {:.3g} within tolerance "
                       "{:.3g}.", who, i, values[SHIFT, j],
                 float(tol if tol.ndim == 0 else tol[b]))


class SingleRun:
    """One problem's run for `drive`: X (n, d), its centers (k, d), and the device pipeline
    (the next iteration issued ahead of the read: see the module's docstring)."""

    batched = False

    def __init__(self, backend, X, sample_weight, centers, *, xp, spherical, plan, step):
        self.backend, self.X, self.sw, self.xp = backend, X, sample_weight, xp
        self.spherical, self.step = spherical, step
        self.iterate = backend.lloyd_iter if step is None else step
        place = self.place = backend.placement
        if plan is None:
            plan = backend.plan(X, centers.shape[0], weighted=sample_weight is not None)
        centers = place.small(centers, plan)
        cxp = self.cxp = place.namespace(centers)
        if spherical:
            centers = cxp.astype(unit_centers(centers, centers, cxp), centers.dtype)
        self.centers = centers
        self.centers64 = cxp.astype(centers, cxp.float64, copy=False)
        self.zero = cxp.zeros((), dtype=cxp.float64, device=device(self.centers64))
        self.k = centers.shape[0]
        self.history = {"inertia": [], "center_shift": []}
        self.active = (0,)
        self.strict, self.n_iter = False, 0
        self.labels_old = None
        self.ahead = None  # the next iteration, issued before this one's statistics are read
        self.relocated = False
        self.iteration_s = 0.0  # wall time between two reads: the device's time per iteration
        self.gated = (place.asynchronous and backend.ahead_gate
                      and device(centers) == device(X) and step is None)
        self.t_read = time.perf_counter()
        self.it = self.iterate(X, sample_weight, centers, None, xp=xp)
        # (its data checks are copied behind it and read with its statistics, in advance: a
        # read of their own would wait for the device before the next pass is issued)
        self.first_check = returned.iteration_check(backend, self.it, X.shape[0], self.k,
                                                    X.shape[1], fetch=place.fetch)

    def histories(self):
        return (self.history,)

    def _update(self, relocate):
        return _update(self.backend, self.X, self.sw, self.centers, self.centers64, self.it,
                       xp=self.xp, cxp=self.cxp, relocate=relocate,
                       spherical=self.spherical, zero=self.zero)

    def advance(self):
        """Update the centers from the last iteration's statistics and read them."""
        X, sw, xp, it, k, place = self.X, self.sw, self.xp, self.it, self.k, self.place
        c_new, c64, small = self._update(False)
        pending = place.fetch(small)
        if self.gated:  # (left out on the device when a cluster came out empty: see below)
            self.ahead = self.iterate(X, sw, c_new, it.labels, xp=xp,
                                      skip=small[FILLED:] < k)  # (an array, not a scalar)
        elif (place.asynchronous and not self.relocated
              and self.iteration_s < AHEAD_MAX_ITERATION_S):
            # (after a relocation, empty clusters tend to come again: the pass issued ahead
            # would be dropped, a whole assignment lost)
            self.ahead = self.iterate(X, sw, c_new, it.labels, xp=xp)
        values = pending()
        self.iteration_s, self.t_read = time.perf_counter() - self.t_read, time.perf_counter()
        if self.first_check is not None:   # (before relocation reads the labels)
            self.first_check, verify = None, self.first_check
            verify()
        self.relocated = values[FILLED] < k
        if self.relocated:
            # (the iteration issued ahead was left out, or is dropped here: relocation changes
            # the centers. These are final: with ahead_gate the next goes ahead of the read)
            c_new, c64, small = self._update(True)
            pending = place.fetch(small)
            self.ahead = self.iterate(X, sw, c_new, it.labels, xp=xp) if self.gated else None
            values = pending()
        self.centers, self.centers64 = place.persist(c_new), place.persist(c64)
        return values

    def retire(self, stop, strict, n_iter):
        self.n_iter = n_iter
        if stop[0]:
            self.strict, self.active = bool(strict[0]), ()

    def next(self):
        self.labels_old = self.it.labels
        self.it = self.ahead if self.ahead is not None else self.iterate(
            self.X, self.sw, self.centers, self.labels_old, xp=self.xp)
        self.ahead = None

    def finish(self) -> LloydResult:
        X, sw, centers, backend, xp = self.X, self.sw, self.centers, self.backend, self.xp
        labels = (self.it.labels if self.strict
                  else None if self.ahead is None else self.ahead.labels)
        # (the last iterations' labels go before the final assignment: n values each)
        self.it = self.ahead = self.labels_old = None
        if labels is None:  # a final assignment, so that labels_ == predict(X)
            final = backend.labels_inertia if self.step is None else self.step.final
            labels, inertia = final(X, sw, centers, xp=xp)
            returned.check_labels(backend, "labels_inertia", labels, X.shape[0], self.k)
        else:
            inertia = backend.inertia(X, sw, centers, labels, xp=xp)
        inertia = returned.check_statistic(backend, "inertia", "inertia", to_numpy(inertia))
        return LloydResult(labels, max(inertia, 0.0), centers, self.n_iter, self.history)
