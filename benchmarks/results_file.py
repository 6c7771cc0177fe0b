"""The results file of a machine kind (`benchmarks/results/<kind>.md`): what every benchmark
tool of this folder writes its figures into, one section per workload or tool.

A tool calls `record(sections, script=..., argv=...)`: the sections it measured replace those
of the same name, each stamped with the date, the command and the commit; the others stay as
they were. The header names the machine and the versions of the latest run. History is git's.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
#: sections after the comparison's own workloads, in this order (the rest by name)
EXTRA_ORDER = ("S1", "S3", "S5", "T1", "T5", "F1", "F2", "surface-cpu", "surface-gpu",
               "minibatch", "sparse", "max_memory")


def bench_module():
    """`kmeans_xp.tools.bench`, or `kmeans_xp.bench` in versions before the layer packages
    (so the same script times the old code)."""
    import importlib

    import kmeans_xp
    # asked by folder, not by trying the import: an editable install's finder would hand
    # the old package the new `tools` subpackage
    layered = (Path(kmeans_xp.__file__).parent / "tools" / "bench").is_dir()
    return importlib.import_module("kmeans_xp.tools.bench" if layered else "kmeans_xp.bench")


def machine():
    """The comparison's machine record, with the commit and the peers' versions."""
    bench = bench_module()
    info = bench.machine_info()
    info["kmeans_xp_commit"] = code_commit() or info.get("kmeans_xp_commit")
    info["versions"].update(more_versions())
    return info


def add_arguments(parser):
    """A tool's --results [DIR] and --kind: where `record_if_asked` writes its section."""
    parser.add_argument("--results", nargs="?", const="", metavar="DIR",
                        help="write the figures into DIR/<machine kind>.md "
                             "(DIR: benchmarks/results)")
    parser.add_argument("--kind", default=None, help="with --results: the results file's name")


def record_if_asked(args, sections, *, script, argv, wall_s):
    """`record` the sections where the tool was asked to (--results), printing the path."""
    if args.results is None:
        return None
    path = record(sections, script=script, argv=argv, wall_s=wall_s, kind=args.kind,
                  results_dir=args.results or None)
    print("wrote", path)
    return path


def record(sections, *, script, argv, wall_s, kind=None, results_dir=None, label=None,
           info=None):
    """Write `sections` (lists of markdown lines, each starting "## NAME: ...") into the
    results file of this machine's kind (or `kind`); returns its path."""
    info = info or machine()
    kind = kind or machine_kind(info)
    folder = Path(results_dir or RESULTS_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.md"
    if label:
        commit = info.get("kmeans_xp_commit")
        info["kmeans_xp_commit"] = f"{label} ({commit})" if commit else label
    path.write_text(results_markdown(kind, the_command(argv, script), sections, info, wall_s,
                                     path))
    return path

def machine_kind(machine) -> str:
    """`h100`, `h200`, `a100`, ... from the first GPU's name; `cpu-<cores>core` without one."""
    gpus = [g for g in machine.get("gpus", []) if g.get("name")]
    if gpus:
        name = gpus[0]["name"].lower().replace("nvidia", "")
        m = re.search(r"\b([a-z]+\d+[a-z]*)\b", name)
        return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    return f"cpu-{machine['cpu']['usable_cores']}core"

def busy_spread():
    """The comparison's own rule (`kmeans_xp.tools.bench.spread.BUSY_SPREAD`: slowest over
    fastest repeat), or its value where the code timed predates it."""
    try:
        from kmeans_xp.tools.bench.spread import BUSY_SPREAD
    except ImportError:
        return 1.5
    return BUSY_SPREAD

def versions_line(machine):
    v = machine.get("versions", {})
    return ", ".join(f"{k} {val}" for k, val in v.items())

def machine_lines(machine):
    cpu = machine["cpu"]
    blas = ", ".join(f"{b.get('internal_api')} {b.get('version')} ({b.get('num_threads')} "
                     f"threads)" for b in machine.get("blas", []) if b.get("user_api") == "blas")
    gpus = "; ".join(f"{g.get('name')} ({g.get('memory_bytes', 0) / 2**30:.0f} GiB, "
                     f"compute {g.get('compute_capability')}, CUDA runtime "
                     f"{g.get('cuda_runtime')})" for g in machine.get("gpus", []))
    mem = machine.get("host_memory_bytes") or 0
    return [f"- CPU: {cpu['model']}, {cpu['usable_cores']} usable of {cpu['logical_cores']} "
            f"logical cores; host memory {mem / 2**30:.0f} GiB; BLAS: {blas or 'unknown'}",
            f"- GPU: {gpus or 'none'}",
            f"- Platform: {machine.get('platform')}",
            f"- Versions: {versions_line(machine)}",
            f"- kmeans_xp commit: {machine.get('kmeans_xp_commit') or 'unknown'}"]

def results_markdown(kind, command, sections, machine, wall_s, path=None):
    """The results file: the header (how to read it, the machine, the versions) and one
    section per workload. Sections of workloads this run did not time stay as they were in
    the file at `path`, each with its own stamp (when, by which command), so a run of one
    workload updates its section and leaves the others' figures."""
    stamp = (f"Measured {machine['date']} in {wall_s / 60:.1f} min by `{command}` "
             f"(commit {machine.get('kmeans_xp_commit') or 'unknown'}).")
    fresh = {}
    for section in sections:
        name = section_name(section[0])
        body = section[:2] + [stamp, ""] + section[2:]
        while body and not body[-1].strip():
            body.pop()
        fresh[name] = body + [""]   # (one blank line after each, as read_sections keeps)
    kept = {name: lines for name, lines in read_sections(path).items() if name not in fresh}
    lines = [f"# Benchmark results: {kind}",
             "",
             "Rewritten by the benchmark command each time it runs on this kind of machine; "
             "earlier figures are in git's history. Every row of a workload starts from the "
             "same centers and runs the same iterations (`kmeans_xp.tools.bench.compare`). "
             "ms/iter: Lloyd time over iterations (median), the final labelling pass included; "
             "spread: fastest-slowest of the timed repeats (`busy?` where the slowest took "
             f"more than {busy_spread()}x the fastest); whole fit: the `fit` call on data in "
             "place; from host: copy in, fit, results back. Each section says when and by "
             "which command it was measured; the machine below is the latest run's.",
             "",
             "Each section's stamp is the command that reproduces it; the workloads (W1, "
             "W3, W5 and the CPU ones) all come from `python benchmarks/run.py --device all`.",
             ""] + machine_lines(machine) + [""]
    for name in sorted(set(fresh) | set(kept), key=section_order):
        lines += fresh.get(name) or kept[name]
    return "\n".join(lines).rstrip() + "\n"

def section_name(header):
    """"## W1: n=..." -> "W1"."""
    return header[3:].split(":", 1)[0].strip()

def section_order(name):
    """Workloads in their table's order, then the rest by name."""
    order = list(bench_module().WORKLOADS) if hasattr(bench_module(), "WORKLOADS") else []
    order += list(EXTRA_ORDER)
    return (order.index(name), "") if name in order else (len(order), name)

def read_sections(path):
    """{name: lines} of the "## NAME: ..." sections of an existing results file."""
    if path is None or not Path(path).exists():
        return {}
    out, name = {}, None
    for line in Path(path).read_text().splitlines():
        if line.startswith("## "):
            name = section_name(line)
            out[name] = []
        if name is not None:
            out[name].append(line)
    for lines in out.values():   # (one blank line after each: a rewrite adds none)
        while lines and not lines[-1].strip():
            lines.pop()
        lines.append("")
    return out

def code_commit():
    """The commit (and `+changes` for a dirty tree) of the checkout kmeans_xp is imported
    from, or None (an installed copy); KMEANS_XP_COMMIT names it for a copy of the tree
    without its git folder (the device machine's)."""
    import os
    import subprocess

    if os.environ.get("KMEANS_XP_COMMIT"):
        return os.environ["KMEANS_XP_COMMIT"]

    import kmeans_xp
    for folder in Path(kmeans_xp.__file__).resolve().parents:
        if (folder / ".git").exists():
            def git(*a, folder=folder):
                return subprocess.run(["git", "-C", str(folder), *a], capture_output=True,
                                      text=True, timeout=10, check=False).stdout.strip()
            head = git("rev-parse", "--short", "HEAD")
            dirty = git("status", "--porcelain", "--untracked-files=no", "--", "kmeans_xp",
                        "backends")
            return head + (" + uncommitted changes" if dirty else "") if head else None
    return None

def more_versions():
    """Versions of the peers' and backends' libraries that `machine_info` leaves out."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for dist in ("numba", "faiss-cpu", "faiss-gpu", "scipy", "dask-cuda", "cuvs"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out

def the_command(argv, script="benchmarks/run.py"):
    """The command line that reproduces this run of `script` (output folders left out)."""
    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--results-dir", "--raw-dir", "--label"):
            skip = True
            continue
        if a.startswith(("--results-dir=", "--raw-dir=", "--label=")):
            continue
        keep.append(a)
    return " ".join([f"python {script}", *map(shlex.quote, keep)])
