"""PNG plots for `kmeans-xp`: time per iteration with speed-ups, memory, scaling curves, and
the seed's picture of points and centers made readable for k up to 1000.

matplotlib is imported only here and only when a plot is asked for; it draws through
`matplotlib.figure.Figure` (no pyplot), so no global backend or window is touched.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.memory import format_bytes

GOLDEN = 0.6180339887498949
GIB = float(2**30)


class PlotUnavailable(ImportError):
    """matplotlib is missing; the message says what to install."""


def require_matplotlib():
    """matplotlib's Figure class; PlotUnavailable (saying what to install) without it. A
    command calls it before the work its picture shows."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable("matplotlib is not installed, so no PNG plots: "
                              "pip install 'kmeans_xp[plot]' (or matplotlib)") from exc
    return Figure


def _figure(**kw):
    return require_matplotlib()(**kw)


def _save(fig, path):
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return str(path)


def _title(result, varied=None):
    i, m = result["inputs"], result["machine"]
    gpu = ", ".join(g.get("name", "?") for g in m.get("gpus", [])) or "no GPU"
    size = "  ".join(f"{key}={i[key]:,}" for key in ("n", "d", "k") if key != varied)
    return (f"{size}  {i['dtype']}  {i['iters']} iterations, "
            f"median of {i['repeats']}\n{m['cpu']['model']} ({m['cpu']['usable_cores']} "
            f"cores) | {gpu} | {m['date'][:10]}")


_STATUS_TEXT = {"oom": "OOM", "unavailable": "not\ninstalled", "error": "error"}


def _bar_colors(rows):
    # GPU rows green, CPU rows blue; reference rows (seed, torch, scikit-learn, faiss) lighter
    out = []
    for r in rows:
        ref = r.get("library", "kmeans_xp") != "kmeans_xp" or r["name"].startswith(
            ("seed-reference", "torch-gemm"))  # results of schema 1 have no "library"
        base = "#2a9d4b" if r["device"] == "gpu" else "#3a6ea5"
        out.append(base + ("80" if ref else ""))
    return out


#: the time chart is linear while its slowest bar is at most this many times its fastest (a
#: 1.3x gap is then seen as one); beyond, log, each bar labelled with its ratio
LINEAR_MAX_RATIO = 30


def time_scale(heights) -> str:
    """"linear" or "log" for the time chart's bars (`LINEAR_MAX_RATIO`)."""
    drawn = [h for h in heights if h > 0]
    if not drawn or max(drawn) <= LINEAR_MAX_RATIO * min(drawn):
        return "linear"
    return "log"


def time_figure(result):
    """The time chart as a matplotlib Figure: time per Lloyd iteration per row, each bar
    labelled with its time and its ratio to the baseline (the fastest CPU row); a linear
    axis from 0 unless the bars span more than LINEAR_MAX_RATIO (then log)."""
    rows = result["rows"]
    fig = _figure(figsize=(max(6, 1.1 * len(rows) + 2), 4.8))
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    ok = [r["status"] == "ok" for r in rows]
    heights = [1e3 * r["time_per_iter_s"] if o else 0 for r, o in zip(rows, ok)]
    ax.bar(x, [h if h > 0 else np.nan for h in heights], color=_bar_colors(rows))
    scale = time_scale(heights)
    top = max([h for h in heights if h > 0], default=1.0)
    low = min([h for h in heights if h > 0], default=1.0)
    if scale == "log":
        ax.set_yscale("log")
        ax.set_ylim(low / 4, top * 6)
        failed_y = low / 3
    else:
        ax.set_ylim(0, top * 1.25)
        failed_y = top * 0.02
    for xi, r, h in zip(x, rows, heights):
        if h > 0:
            speed = f"\n{_speedup(r['speedup'])}" if r.get("speedup") else ""
            y = h * 1.08 if scale == "log" else h + top * 0.02
            ax.text(xi, y, f"{_ms(h)}{speed}", ha="center", va="bottom", fontsize=8)
        else:
            ax.text(xi, failed_y, _STATUS_TEXT.get(r["status"], r["status"]), ha="center",
                    va="bottom", fontsize=8, color="#b00020")
    ax.set_xticks(x, [r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time per Lloyd iteration (ms" + (", log" if scale == "log" else "") + ")")
    ax.set_title(_title(result) + "\n" + _speedup_caption(result), fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    return fig


def plot_time(result, path):
    """The time chart (`time_figure`) as a PNG at `path`."""
    return _save(time_figure(result), path)


def _speedup_caption(result):
    """What the numbers on the bars are over: the fastest CPU row (schema 1: the slowest)."""
    base = result.get("baseline")
    if base:
        return (f"speed-up: x vs {base['name']}, the fastest CPU row "
                f"({_ms(1e3 * base['time_per_iter_s'])}/iteration)")
    if str(result.get("schema", "")).endswith("/1"):
        return "speed-up over the slowest CPU row (a result of schema 1)"
    return "no CPU row ran: no speed-up"


def _speedup(x):
    """A bar's ratio to the baseline: "1.30x" (two decimals below 10x, where they matter)."""
    return f"{x:.2f}x" if x < 10 else f"{x:.0f}x"


def _ms(ms):
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1e3:.3g} s"


def plot_memory(result, path):
    """Peak working memory per row (log scale); estimates hatched; an OOM row shows what it
    would have needed; the device's memory and the cap drawn as lines."""
    rows = result["rows"]
    fig = _figure(figsize=(max(6, 1.1 * len(rows) + 2), 4.8))
    ax = fig.add_subplot()
    vals, hatches, colors, notes = [], [], [], []
    for r in rows:
        v = r["peak_memory_bytes"] if r["status"] == "ok" else (
            r["memory_estimate_bytes"] if r["status"] == "oom" else None)
        vals.append(v / GIB if v else np.nan)
        est = r["status"] != "ok" or r["memory_source"].startswith("estimate")
        hatches.append("//" if est else "")
        colors.append("#b00020" if r["status"] == "oom" else _bar_colors([r])[0])
        notes.append(_mem_note(r, v))
    x = np.arange(len(rows))
    for xi, v, h, c in zip(x, vals, hatches, colors):
        ax.bar(xi, v, color=c, hatch=h, edgecolor="white" if not h else "black", linewidth=0.5)
    finite = [v for v in vals if np.isfinite(v) and v > 0]
    ax.set_yscale("log")
    _memory_lines(ax, result)
    if finite:
        ax.set_ylim(min(finite) / 4, max(max(finite), ax.get_ylim()[1]) * 6)
    for xi, v, note in zip(x, vals, notes):
        y = v * 1.08 if np.isfinite(v) else (min(finite) / 3 if finite else 1)
        ax.text(xi, y, note, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("peak memory (GiB, log); hatched = estimate")
    ax.set_title(_title(result), fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    return _save(fig, path)


def _mem_note(r, v):
    if r["status"] == "oom":
        return "OOM" + (f"\nneeds {format_bytes(v)}" if v else "")
    if r["status"] != "ok":
        return _STATUS_TEXT.get(r["status"], r["status"])
    return format_bytes(v) if v else "n/a"


def _memory_lines(ax, result):
    gpus = result["machine"].get("gpus") or []
    if gpus and gpus[0].get("memory_bytes"):
        ax.axhline(gpus[0]["memory_bytes"] / GIB, color="#2a9d4b", ls="--", lw=1,
                   label=f"{gpus[0]['name']} memory")
    cap = result["inputs"].get("max_memory", "auto")
    if cap not in ("auto", None):
        from kmeans_xp.contract.memory import parse_memory
        ax.axhline(parse_memory(cap) / GIB, color="#b00020", ls=":", lw=1,
                   label=f"max_memory {cap}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left")


def plot_sweep(result, path):
    """Scaling curves from `sweep`: time per iteration and point-center pairs per second
    against the varied parameter, one line per row name (log-log)."""
    vary = result["vary"]
    fig = _figure(figsize=(11, 4.5))
    ax_t, ax_p = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name in dict.fromkeys(r["name"] for r in result["rows"]):
        pts = [r for r in result["rows"] if r["name"] == name]
        good = [r for r in pts if r["status"] == "ok"]
        failed = [r["value"] for r in pts if r["status"] == "oom"]
        label = name + (f" (OOM at {vary}>={min(failed):,})" if failed else "")
        if not good:
            continue
        xs = [r["value"] for r in good]
        ax_t.plot(xs, [1e3 * r["time_per_iter_s"] for r in good], "o-", label=label)
        ax_p.plot(xs, [r["pairs_per_s"] for r in good], "o-", label=label)
    for ax, ylabel in ((ax_t, "time per iteration (ms)"),
                       (ax_p, "point-center pairs per second")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(vary)
        ax.set_ylabel(ylabel)
        ax.grid(which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(f"sweep over {vary}: " + _title(result, vary).replace("\n", " | "),
                 fontsize=8)
    return _save(fig, path)


def distinct_colors(k, seed_offset=0.0):
    """k RGB colors that neighbours can tell apart: hues stepped by the golden ratio (so any
    run of consecutive labels is spread around the wheel), saturation and value cycled."""
    i = np.arange(k)
    hue = (seed_offset + i * GOLDEN) % 1.0
    sat = np.array([0.95, 0.65, 0.8])[i % 3]
    val = np.array([0.92, 0.7])[(i // 3) % 2]
    try:
        from matplotlib.colors import hsv_to_rgb
    except ImportError as exc:
        raise PlotUnavailable("matplotlib is not installed: pip install 'kmeans_xp[plot]'") \
            from exc
    return hsv_to_rgb(np.stack([hue, sat, val], axis=1))


def plot_clusters(X, labels, centers, path, *, max_points=60_000, features=(0, 1),
                  random_state=0, title=None):
    """The seed's scatter of points colored by cluster with the centers marked, readable for
    large k: a uniform subsample of the points, distinct colors, centers as black-edged
    squares in their cluster's color, sizes scaled to the number of points and clusters."""
    X, labels, centers = np.asarray(X), np.asarray(labels), np.asarray(centers)
    n, k = len(X), len(centers)
    fi, fj = features
    rng = np.random.default_rng(random_state)
    idx = rng.choice(n, max_points, replace=False) if n > max_points else np.arange(n)
    colors = distinct_colors(k)
    px, py = _coords(X[idx], fi, fj, rng)
    cx, cy = _coords(centers, fi, fj, None)
    fig = _figure(figsize=(8, 8))
    ax = fig.add_subplot()
    ax.scatter(px, py, c=colors[labels[idx]], s=float(np.clip(4e4 / len(idx), 0.3, 6)),
               linewidths=0, alpha=0.7, rasterized=True)
    ax.scatter(cx, cy, c=colors, marker="s", s=float(np.clip(4e3 / k, 6, 120)),
               edgecolors="black", linewidths=0.6)
    ax.set_xlabel(f"feature {fi}")
    ax.set_ylabel(f"feature {fj}" if X.shape[1] > 1 else "(jitter)")
    shown = f"{len(idx):,} of {n:,} points" if len(idx) < n else f"{n:,} points"
    ax.set_title(title or f"k={k} clusters, {shown}, centers as squares", fontsize=9)
    ax.set_aspect("equal", adjustable="datalim")
    return _save(fig, path)


def _coords(A, fi, fj, rng):
    # d=1 data has no second feature: spread the points vertically so they can be seen
    if A.shape[1] > max(fi, fj):
        return A[:, fi], A[:, fj]
    y = rng.uniform(-0.5, 0.5, len(A)) if rng is not None else np.zeros(len(A))
    return A[:, 0], y


def load_clusters(path):
    """(X, labels, centers) from an .npz saved by `kmeans-xp plot-clusters --save`; OSError
    when the file is missing, unreadable or lacks one of the arrays."""
    import zipfile
    try:
        f = np.load(path)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise OSError(f"{path}: not a readable .npz ({exc})") from None
    if not hasattr(f, "files"):  # a .npy: one array
        raise OSError(f"{path}: one array, not an .npz of X, labels and centers")
    with f:
        missing = {"X", "labels", "centers"} - set(f.files)
        if missing:
            raise OSError(f"{path}: missing arrays {sorted(missing)} (need X, labels, "
                          f"centers)")
        return f["X"], f["labels"], f["centers"]


def parse_features(text, d):
    """'0,1' -> (0, 1): the two features on the axes, each below d (d=1: (0, 0) is jittered)."""
    try:
        features = tuple(int(v) for v in str(text).split(","))
    except ValueError:
        features = ()
    if len(features) != 2 or min(features) < 0 or (d > 1 and max(features) >= d):
        raise ValueError(f"--features {text!r}: give two indices below d={d}, e.g. 0,1")
    return features


def charts_for(kind):
    """The (suffix, draw(result, path)) charts of a "compare" or "sweep" result."""
    return {"compare": [("time", plot_time), ("memory", plot_memory)],
            "sweep": [("scaling", plot_sweep)]}.get(kind, [])


def redraw(path, out=None) -> list:
    """The charts of a saved compare/sweep JSON again, into `out` (default: beside it), named
    <stem>-<suffix>.png; OSError when the file is not such a result."""
    import json
    from pathlib import Path
    path = Path(path)
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise OSError(f"{path}: not JSON ({exc})") from None
    kind = result.get("kind") if isinstance(result, dict) else None
    if not charts_for(kind):
        raise OSError(f"{path}: not a kmeans-xp compare or sweep result (kind={kind!r})")
    out = Path(out) if out is not None else path.parent
    out.mkdir(parents=True, exist_ok=True)
    return [draw(result, out / f"{path.stem}-{suffix}.png") for suffix, draw in charts_for(kind)]
