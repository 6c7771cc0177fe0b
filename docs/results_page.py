"""The results page: every file under benchmarks/results/ included as it is, and a chart of
its ms/iter column per workload, so a new machine kind's file appears without editing a page.

The page docs/results.md holds the marker below; on Sphinx's source-read event the marker
becomes one MyST include and one plot per file (sorted by name).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = "<!-- results-files -->"


def read_tables(path: str | Path) -> dict[str, dict[str, float]]:
    """{workload heading: {row: ms/iter}} from one results file's Markdown tables."""
    out: dict[str, dict[str, float]] = {}
    workload = None
    columns: list[str] = []
    for line in Path(path).read_text().splitlines():
        if line.startswith("## "):
            workload, columns = line[3:].strip(), []
        elif line.startswith("|") and workload is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not columns:
                columns = cells
            elif "row" in columns and "ms/iter" in columns and not set(cells[0]) <= set("-: "):
                value = re.match(r"[\d.]+", cells[columns.index("ms/iter")])
                if value:
                    out.setdefault(workload, {})[cells[columns.index("row")]] = float(
                        value.group())
        elif not line.startswith("|"):
            columns = []
    return out


def plot_results(path: str | Path) -> None:
    """One panel per workload: ms per Lloyd iteration of each row, on a linear axis (a log
    axis hides a 1.3x difference)."""
    import matplotlib.pyplot as plt

    tables = read_tables(path)
    fig, axes = plt.subplots(1, max(len(tables), 1), figsize=(4.2 * max(len(tables), 1), 2.8),
                             squeeze=False)
    for ax, (workload, rows) in zip(axes[0], tables.items()):
        names = list(rows)
        ax.barh(names, [rows[r] for r in names], color="tab:blue")
        ax.invert_yaxis()
        ax.set_title(workload, fontsize=9)
        ax.set_xlabel("ms per iteration (lower is faster)", fontsize=8)
        ax.tick_params(labelsize=8)
    fig.tight_layout()


def _expand(app: Any, docname: str, source: list[str], results: Path) -> None:
    if docname != "results" or MARKER not in source[0]:
        return
    blocks = []
    for path in sorted(results.glob("*.md")):
        rel = Path("..") / path.relative_to(results.parents[1])
        blocks.append(
            f"```{{eval-rst}}\n.. plot::\n\n   from results_page import plot_results\n"
            f"   plot_results({str(rel)!r})\n```\n\n"
            f"```{{include}} {rel.as_posix()}\n:heading-offset: 1\n:relative-images:\n```\n")
    source[0] = source[0].replace(MARKER, "\n".join(blocks) or "No results yet.")


def setup(app: Any, results: Path) -> None:
    app.connect("source-read", lambda app, docname, source: _expand(app, docname, source,
                                                                     results))
