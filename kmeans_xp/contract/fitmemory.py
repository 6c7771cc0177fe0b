"""A fit's memory inside `max_memory`, part by part: the backend's buffers AND the driver's own
arrays (the centered copy of X, the labels, init's O(n) arrays and chunks, the weights, the
centers), everything the fit allocates beyond X itself.

`max_memory` given in bytes is split before anything runs: the driver's parts come first, and
the backend is sized to what is left (its chunks shrink to fit), so that the sum of all the
parts stays within it; where even the smallest chunks do not fit, `KMeansMemoryError` says
what was asked, what the fit needs at least, and what to change. `max_memory="auto"` keeps
each backend's own reading of what is free (a share of it), the driver's parts beside it.
"""
from __future__ import annotations

from kmeans_xp.contract.memory import (
    KMeansMemoryError,
    MemoryEstimate,
    accepted_options,
    driver_bytes,
    driver_chunk_rows,
    format_bytes,
    parse_memory,
)

#: the backend's share is found to within 1 / 2**_PRECISION_BITS of itself (a bisection:
#: about 30 plans, well under a millisecond each)
_PRECISION_BITS = 10


def beyond_x(estimate) -> int:
    """The bytes of a backend's estimate that max_memory bounds: all but X on the device
    (`data`, X itself in the backend's memory)."""
    return estimate.total - estimate.parts.get("data", 0)


def _backend_estimate(cls, n, d, k, itemsize, budget, options):
    fn = cls.estimate_memory
    return fn(n, d, k, itemsize=itemsize, max_memory=budget, **accepted_options(fn, options))


def _seeding_bytes(cls, n, d, k, itemsize, options):
    fn = cls.seeding_bytes
    return fn(n, d, k, itemsize, **accepted_options(fn, options))


def _driver(cls, n, d, k, itemsize, budget, weighted, copy_x, options):
    """The driver's parts when the backend works within `budget` (its xp passes, init's
    among them, take chunks of `driver_chunk_rows` of it). A backend that computes on X as
    given (``centered_copy = False``: the sparse ones) makes no centered copy."""
    copy_x = copy_x and getattr(cls, "centered_copy", True)
    rows = None if budget == "auto" else driver_chunk_rows(n, d, itemsize, budget)
    return driver_bytes(n, d, k, itemsize, weighted=weighted, copy_x=copy_x, rows=rows,
                        seeding=_seeding_bytes(cls, n, d, k, itemsize, options))


def _combined(est, driver):
    parts = dict(est.parts)
    parts.update({f"driver_{p}": v for p, v in driver.items()})
    return MemoryEstimate(parts, sum(parts.values()), est.chunk_rows)


def fit_memory(cls, n, d, k, itemsize, max_memory="auto", *, weighted=False, copy_x=True,
               options=None):
    """(the budget the backend class `cls` is made with for this fit: bytes, or "auto";
    the `MemoryEstimate` of the whole fit, the driver's parts named ``driver_*``). With
    max_memory in bytes, the parts beyond X sum to at most it, else `KMeansMemoryError`.
    A backend without an estimate gets max_memory as it is."""
    options = options or {}
    limit = parse_memory(max_memory)
    if limit == "auto" or options.get("stream") is True:
        # ("auto": each backend's share of what is free; a fit streamed from the host keeps
        # the driver's arrays on the host, its device holds the backend's buffers alone)
        est = _backend_estimate(cls, n, d, k, itemsize, limit, options)
        return limit, _combined(est, _driver(cls, n, d, k, itemsize, "auto", weighted,
                                             copy_x, options))
    least = _least_budget(cls, n, d, k, itemsize, options)

    def planned(budget):
        est = _backend_estimate(cls, n, d, k, itemsize, budget, options)
        driver = _driver(cls, n, d, k, itemsize, budget, weighted, copy_x, options)
        return beyond_x(est) + sum(driver.values()) <= limit, est, driver

    # the largest share that fits: the parts grow with it (the backend's chunks, the
    # driver's chunks a quarter of it), so bisect between the least and max_memory itself
    fits, est, driver = planned(max(limit, least))
    if fits:
        return max(limit, least), _combined(est, driver)
    fits, est, driver = planned(least)
    if not fits:
        raise _too_small(cls, n, d, k, itemsize, limit, least, weighted, copy_x, options)
    lo, hi, best = least, max(limit, least), (est, driver)
    while hi - lo > max(1, lo >> _PRECISION_BITS):
        mid = (lo + hi) // 2
        fits, est, driver = planned(mid)
        if fits:
            lo, best = mid, (est, driver)
        else:
            hi = mid
    return lo, _combined(*best)


def least_max_memory(cls, n, d, k, itemsize, *, weighted=False, copy_x=True, options=None):
    """The least max_memory (bytes) a fit of this shape is planned in on backend class `cls`:
    the driver's arrays with the smallest chunks and the backend at its least budget."""
    options = options or {}
    least = _least_budget(cls, n, d, k, itemsize, options)
    return (beyond_x(_backend_estimate(cls, n, d, k, itemsize, least, options)) +
            sum(_driver(cls, n, d, k, itemsize, least, weighted, copy_x, options).values()))


def _least_budget(cls, n, d, k, itemsize, options):
    """The least budget the backend plans this fit in (its chunks at their floor)."""
    try:
        _backend_estimate(cls, n, d, k, itemsize, 1, options)
        return 1
    except KMeansMemoryError as exc:
        return max(1, int(exc.needed or 1))


def _too_small(cls, n, d, k, itemsize, limit, least, weighted, copy_x, options):
    """The error of a fit that max_memory cannot hold: what it needs at least, part by part
    (the driver's arrays with the smallest chunks, the backend's least), and what to change."""
    backend = beyond_x(_backend_estimate(cls, n, d, k, itemsize, least, options))
    driver = _driver(cls, n, d, k, itemsize, least, weighted, copy_x, options)
    needed = sum(driver.values()) + backend   # (least_max_memory, its parts kept)
    parts = ", ".join(f"{p.replace('_', ' ')} {format_bytes(v)}" for p, v in driver.items())
    hints = ["Raise max_memory to at least " + format_bytes(needed)]
    if itemsize == 8:
        hints.append("use float32 (half the bytes)")
    if copy_x and getattr(cls, "centered_copy", True):
        hints.append(f"pass copy_x=False (no centered copy: {format_bytes(n * d * itemsize)} "
                     f"less; X is then computed on as given)")
    hints.append("use MiniBatchKMeans (its memory follows batch_size, not n)")
    return KMeansMemoryError(
        f"max_memory={format_bytes(limit)} cannot hold a fit of n={n}, d={d}, k={k} "
        f"({'float32' if itemsize == 4 else 'float64'}) on {cls.name!r}: everything it "
        f"allocates beyond X counts, and it needs at least {format_bytes(needed)} ({parts}, "
        f"the backend's buffers at least {format_bytes(backend)}). "
        f"{'; or '.join(hints)}.", needed=needed, allowed=limit)


def sized_for_fit(inst, plan, options=None):
    """The backend `inst` chosen for the fit `plan` (a `FitPlan`), or a new one of its class
    and options made with its share of plan.max_memory (`fit_memory`); raises
    KMeansMemoryError where the fit cannot fit."""
    if plan.max_memory == "auto" or plan.n != plan.n:   # (auto; a lazy X of unknown n)
        return inst
    cls = type(inst)
    try:
        budget, _ = fit_memory(cls, int(plan.n), plan.d, plan.k, plan.itemsize,
                               plan.max_memory, weighted=plan.weighted, copy_x=plan.copy_x,
                               options=options)
    except NotImplementedError:   # a backend that gives no estimate is not sized
        return inst
    if budget == plan.max_memory:
        return inst
    return cls(max_memory=budget, **(options or {}))
