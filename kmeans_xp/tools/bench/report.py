"""A comparison's result as JSON-ready rows and as a terminal table.

`compare` and `sweep` return a dict tagged with `SCHEMA`; its rows are `row_dict(Row)`, plain
JSON. `format_table` and `describe` turn such a dict (or one read back from its file) into text.
"""
from __future__ import annotations

import dataclasses

from kmeans_xp.contract.memory import format_bytes
from kmeans_xp.tools.bench.protocol import Row
from kmeans_xp.tools.bench.spread import is_busy
from kmeans_xp.tools.bench.summary import fmt_speedup, speedup_label

#: /2: "speedup" is over the fastest CPU row (top-level "baseline"), no longer the slowest;
#: rows carry "library" and "timed"; the result carries "skipped".
#: /3: rows carry the repeats' min, max and "spread", and the warm-up's "warmup_s" and
#: "one_time_s"; a sweep carries "baselines" (value -> its run's baseline)
#: /4: rows carry "engine" (what ran where the row chose) and "threads"; inputs carry "tol"
#: and "threads"
SCHEMA = "kmeans_xp.bench/4"


def row_dict(row: Row) -> dict:
    d = dataclasses.asdict(row)
    d.pop("labels", None)
    return d


_COLUMNS = ("backend", "device", "ms/iter", "min-max", "pairs/s", "e2e s", "copy s", "peak memory",
            "inertia", "agree")


def _fmt_row(r: dict) -> list:
    if r["status"] != "ok":
        return [r["name"], r["device"], f"{r['status'].upper()}: {_short(r['message'])}"]
    mem = "-"
    if r["peak_memory_bytes"] is not None:
        mem = format_bytes(r["peak_memory_bytes"]) + (
            " (est)" if r["memory_source"].startswith("estimate") else "")
    agree = "-" if r["agreement"] is None else f"{r['agreement']:.4f}"
    speed = "-" if r["speedup"] is None else fmt_speedup(r["speedup"])
    return [r["name"], r["device"], f"{1e3 * r['time_per_iter_s']:.3f}", _range(r),
            f"{r['pairs_per_s']:.3g}", f"{r['end_to_end_s']:.3f}", f"{r['transfer_s']:.3f}",
            mem, f"{r['inertia']:.6g}", agree, speed]


def _range(r) -> str:
    """The repeats' fastest-slowest in ms, "!" after it when they say the machine was busy
    (`spread.BUSY_SPREAD`); "-" for one repeat (or a result of schema 2)."""
    if r.get("spread") is None:
        return "-"
    return (f"{1e3 * r['time_per_iter_min_s']:.3f}-{1e3 * r['time_per_iter_max_s']:.3f}"
            + (" !" if is_busy(r) else ""))


def _short(text, width=100):
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(result: dict) -> str:
    """The rows as an aligned text table (failed rows: status and message)."""
    rows = result["rows"]
    sweep_col = result.get("kind") == "sweep"
    header = ([result.get("vary", "value")] if sweep_col else []) + list(_COLUMNS) + [
        speedup_label(result)]
    body = [([str(r["value"])] if sweep_col else []) + _fmt_row(r) for r in rows]
    ncol = len(header)
    # a failed row's message spans the columns after its device: it sets no width
    widths = [max(len(line[i]) for line in [header] + body
                  if i < len(line) and (len(line) == ncol or i < len(line) - 1))
              for i in range(ncol)]
    out = []
    for line in [header] + body:
        if len(line) < ncol:  # failed row: the message spans the rest
            cells = [c.ljust(widths[i]) for i, c in enumerate(line[:-1])] + [line[-1]]
        else:
            cells = [c.ljust(widths[i]) if i < 2 + sweep_col else c.rjust(widths[i])
                     for i, c in enumerate(line)]
        out.append("  ".join(cells).rstrip())
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


def describe(result: dict) -> str:
    """A header line: the workload and where it ran."""
    i, m = result["inputs"], result["machine"]
    gpu = ", ".join(g.get("name", "?") for g in m["gpus"]) or "no GPU"
    return (f"n={i['n']:,} d={i['d']} k={i['k']} iters={i['iters']} {i['dtype']} "
            f"data={i['data']} init={i['init']} repeats={i['repeats']} | "
            f"{m['cpu']['model']} ({m['cpu']['usable_cores']} cores), {gpu}")
