"""A comparison's result on disk and in words: the results folder, the JSON and charts in it,
and the text a person reads (table, headline, what was not run).

Without a folder of its own a result goes to `RESULTS_ROOT/<YYYYmmdd-HHMMSS>/` (a suffix when
that exists), so a run never overwrites an earlier one. Chart functions are passed in
(`kmeans_xp.tools.plot`'s), so this module imports no plotting library.
"""
from __future__ import annotations

import json
import textwrap
from datetime import datetime
from pathlib import Path

from kmeans_xp.tools.bench.report import describe, format_table
from kmeans_xp.tools.bench.spread import spread_warning, warmup_text
from kmeans_xp.tools.bench.summary import headline, no_gpu_note, skipped_text

RESULTS_ROOT = Path("kmeans_xp_results")


def results_dir(out=None, root=None) -> Path:
    """`out` when given, else a new timestamped folder under `root` (RESULTS_ROOT)."""
    if out is not None:
        return Path(out)
    root = Path(root or RESULTS_ROOT)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path, i = root / stamp, 1
    while path.exists():
        i += 1
        path = root / f"{stamp}-{i}"
    return path


def to_json(result) -> str:
    return json.dumps(result, indent=1, default=str) + "\n"


def save_result(result, folder, stem, plots=()):
    """`stem`.json and `stem`-<suffix>.png for each (suffix, draw(result, path)) in `plots`
    into `folder` (created). Returns (names written, why the charts were skipped or None):
    a chart function raising ImportError (matplotlib missing) skips the charts only."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(to_json(result))
    written = [f"{stem}.json"]
    try:
        for suffix, draw in plots:
            written.append(Path(draw(result, folder / f"{stem}-{suffix}.png")).name)
    except ImportError as exc:
        return written, str(exc)
    return written, None


def wrap(text, width=100) -> str:
    """Each line wrapped to `width`, continuation lines indented."""
    return "\n".join(textwrap.fill(line, width, subsequent_indent="    ",
                                   break_on_hyphens=False)
                     for line in text.splitlines())


def report_text(result, *, header=True) -> str:
    """What a person reads: the machine line (header), the table, for a comparison the
    headline, then the warm-up costs, the busy-machine warning, the no-GPU note and the rows
    not run."""
    parts = [describe(result)] if header and result.get("kind") == "compare" else []
    parts.append(format_table(result))
    notes = [warmup_text(result), spread_warning(result), no_gpu_note(result),
             skipped_text(result)]
    if result.get("kind") == "compare":
        notes.insert(0, headline(result))
    parts += [wrap(text) for text in notes if text]
    return "\n".join(parts)
