"""What a comparison says in words: its baseline, the speed-ups over it, the headline, and the
rows it left out.

The baseline is the FASTEST CPU row that ran (scikit-learn or faiss-cpu where installed and
faster, else the numpy backend, or whichever CPU row was fastest): a GPU speed-up over slow CPU
code would say nothing. Everything here works on the result's dicts, so a saved JSON gives the
same text again.
"""
from __future__ import annotations


def ok_rows(rows):
    return [r for r in rows if r["status"] == "ok" and r.get("time_per_iter_s")]


def choose_baseline(rows) -> dict | None:
    """The fastest CPU row that ran, as {"name", "library", "time_per_iter_s", "end_to_end_s",
    "rule"}; None when no CPU row ran."""
    cpu = [r for r in ok_rows(rows) if r["device"] == "cpu"]
    if not cpu:
        return None
    best = min(cpu, key=lambda r: r["time_per_iter_s"])
    return {"name": best["name"], "library": best.get("library", ""),
            "time_per_iter_s": best["time_per_iter_s"], "end_to_end_s": best["end_to_end_s"],
            "rule": "the fastest CPU row that ran (lowest time_per_iter_s)"}


def add_speedups(rows) -> dict | None:
    """Set each row's `speedup` (over the baseline) and `speedup_vs_numpy`; return the
    baseline."""
    base = choose_baseline(rows)
    numpy_row = next((r for r in ok_rows(rows) if r["name"] == "numpy"), None)
    for r in ok_rows(rows):
        if base is not None:
            r["speedup"] = base["time_per_iter_s"] / r["time_per_iter_s"]
        if numpy_row is not None:
            r["speedup_vs_numpy"] = numpy_row["time_per_iter_s"] / r["time_per_iter_s"]
    return base


def fmt_speedup(x) -> str:
    return f"{x:.2f}x" if x < 10 else (f"{x:.1f}x" if x < 100 else f"{x:.0f}x")


def baseline_names(result) -> list:
    """The baselines' names: a compare's one, or those of a sweep's values (in order, once)."""
    bases = [run.get("baseline") for run in result.get("runs", [])] or [result.get("baseline")]
    return list(dict.fromkeys(b["name"] for b in bases if b))


def speedup_label(result) -> str:
    """The speed-up column's header: "x vs scikit-learn" (or "x vs best CPU" when a sweep's
    runs had different baselines, "x vs -" with none)."""
    names = set(baseline_names(result))
    return f"x vs {names.pop()}" if len(names) == 1 else (
        "x vs best CPU" if names else "x vs -")


def fmt_time(seconds) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def headline(result) -> str:
    """One or two sentences: kmeans_xp's fastest row against the fastest CPU row."""
    rows = ok_rows(result["rows"])
    ours = [r for r in rows if r.get("library", "kmeans_xp") == "kmeans_xp"]
    base = result.get("baseline")
    if not rows:
        return "No row ran: nothing to compare (the table says why)."
    best = min(ours or rows, key=lambda r: r["time_per_iter_s"])
    text = f"{best['name']} ({best['device']}): {fmt_time(best['time_per_iter_s'])}/iteration"
    if base is None:
        return text + "; no CPU row ran, so no speed-up is claimed."
    if best["name"] == base["name"]:
        text += ", the fastest CPU row: every speed-up in the table is over it"
        runner = sorted((r for r in rows if r["device"] == "cpu" and r is not best),
                        key=lambda r: r["time_per_iter_s"])
        if runner:
            text += (f" (next: {runner[0]['name']}, "
                     f"{runner[0]['time_per_iter_s'] / best['time_per_iter_s']:.2f}x slower)")
        return text + "."
    text += (f", {fmt_speedup(best['speedup'])} vs {base['name']} (the fastest CPU row, "
             f"{fmt_time(base['time_per_iter_s'])}/iteration)")
    if best.get("end_to_end_s") and base.get("end_to_end_s"):
        text += (f"; a whole fit from host data {best['end_to_end_s']:.3g} s vs "
                 f"{base['end_to_end_s']:.3g} s "
                 f"({fmt_speedup(base['end_to_end_s'] / best['end_to_end_s'])})")
    if best.get("agreement") is not None and best["name"] != "numpy":
        text += f"; labels agree {best['agreement']:.4f} with the numpy backend"
    return text + "."


def no_gpu_note(result) -> str:
    """Said when no GPU row ran: which were skipped, how to get them, what speed-ups mean."""
    if any(r["device"] == "gpu" for r in ok_rows(result["rows"])):
        return ""
    names = baseline_names(result)
    gpu = [s for s in result.get("skipped", []) if s.get("gpu")]
    gpu_rows = [r for r in result["rows"] if r["device"] == "gpu"]
    text = "No GPU row ran"
    if gpu or gpu_rows:
        text += " (" + "; ".join(
            [f"{s['name']}: {s['reason']}" + (f"; to add: {s['how']}" if s["how"] else "")
             for s in _grouped(gpu)]
            + [f"{r['name']}: {r['status']}" for r in gpu_rows]) + ")"
    if not names:
        return text + ", nor any CPU row: no speed-up."
    if result.get("kind") == "sweep":
        return text + (f". Every speed-up here is CPU against CPU, over the fastest CPU row "
                       f"at each {result.get('vary', 'value')} ({', '.join(names)}).")
    return text + (f". Every speed-up here is CPU against CPU, over {names[0]}, the "
                   f"fastest CPU row.")


def skipped_text(result) -> str:
    """The rows the default set left out, grouped by reason, each with how to add it."""
    skipped = [s for s in result.get("skipped", []) if not s.get("gpu")
               or any(r["device"] == "gpu" for r in ok_rows(result["rows"]))]
    lines = [f"  {s['name']}: {s['reason']}" + (f"; to add: {s['how']}" if s["how"] else "")
             for s in _grouped(skipped)]
    return "Not run:\n" + "\n".join(lines) if lines else ""


def _grouped(skipped):
    """Skipped rows with the same reason and remedy as one entry, names joined."""
    groups = {}
    for s in skipped:
        groups.setdefault((s["reason"], s["how"]), []).append(s["name"])
    return [{"name": ", ".join(names), "reason": reason, "how": how}
            for (reason, how), names in groups.items()]
