"""How much a row's timed repeats spread, the rule that says the machine was busy, and each
row's one-time warm-up cost.

A row's time per iteration is the median of its repeats; `min` and `max` go beside it. When
the slowest repeat of a row takes more than BUSY_SPREAD times its fastest, something else
ran on the machine during the comparison (or the device changed clocks): the figures are
reported with a warning naming the rows, and the remedy (an idle machine, more --repeats).
One repeat has no spread and gets no verdict.

The warm-up fit runs before the timed ones, so JIT compilation (numba's, or loading its
cache), CuPy's kernel compilation and the first allocations stay out of the timings. Its
one-time cost is what the warm-up took beyond a warm fit of as many iterations (from the
timed fits' medians), reported on a line of its own.
"""
from __future__ import annotations

import statistics

from kmeans_xp.tools.bench.summary import fmt_time, ok_rows

#: slowest / fastest repeat above which a row's timings say the machine was busy: quiet
#: machines repeat within a few percent, a busy one (another job on the cores) by 1.5-2x
BUSY_SPREAD = 1.5


def spread(values) -> dict:
    """{"min", "median", "max", "ratio"} of a row's repeats (ratio None for one repeat)."""
    values = [float(v) for v in values]
    lo, hi = min(values), max(values)
    ratio = hi / lo if len(values) > 1 and lo > 0 else None
    return {"min": lo, "median": float(statistics.median(values)), "max": hi, "ratio": ratio}


def is_busy(row) -> bool:
    return (row.get("status") == "ok" and row.get("spread") is not None
            and row["spread"] > BUSY_SPREAD)


def spread_warning(result) -> str:
    """A warning naming the rows whose repeats spread beyond BUSY_SPREAD, or ""."""
    busy = [r for r in result["rows"] if is_busy(r)]
    if not busy:
        return ""
    where = ", ".join(f"{r['name']}" + (f" ({result.get('vary')}={r['value']:,})"
                                        if "value" in r else "") + f" {r['spread']:.2f}x"
                      for r in busy)
    return (f"Warning: the machine was busy: repeats of {where} differ by more than "
            f"{BUSY_SPREAD}x (slowest/fastest), so these timings are not reliable; rerun on "
            f"an idle machine or with more --repeats.")


def one_time_cost(warmup_s, warmup_iters, timed) -> float:
    """Seconds the warm-up took beyond a warm fit of `warmup_iters` iterations, estimated
    from the timed fits' medians: {"end_to_end_s", "time_per_iter_s", "n_iter"}."""
    per_iter, e2e = timed["time_per_iter_s"], timed["end_to_end_s"]
    warm_fit = e2e - per_iter * timed["n_iter"] + per_iter * warmup_iters
    return max(0.0, warmup_s - warm_fit)


def warmup_text(result) -> str:
    """The one-time warm-up costs of the rows that ran, on one line."""
    rows = ok_rows(result["rows"])
    if not rows:
        return ""
    if not result.get("inputs", {}).get("warmup_iters"):
        return ("No warm-up fit (--warmup-iters 0): one-time costs (JIT compilation, first "
                "allocations) are inside the first timed fit of each row.")
    seen, costs = set(), []
    for r in rows:  # a sweep: each row's largest cost over the values
        if r["name"] in seen or r.get("one_time_s") is None:
            continue
        seen.add(r["name"])
        cost = max(x.get("one_time_s") or 0.0 for x in rows if x["name"] == r["name"])
        costs.append(f"{r['name']} {fmt_time(cost)}")
    if not costs:
        return ""
    return ("One-time warm-up, before and outside the timings (JIT compile or cache load, "
            "first allocations): " + ", ".join(costs) + ".")
