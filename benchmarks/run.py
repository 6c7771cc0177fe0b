"""The benchmark command: the project's named workloads on every installed row, one results
file per machine kind.

    python benchmarks/run.py                       # this machine's kind and workloads
    python benchmarks/run.py --device gpu          # GPU rows only (W1, W3, W5 in minutes)
    python benchmarks/run.py --workloads W1 --backends cupy-fused,scikit-learn

Each workload runs through `kmeans_xp.tools.bench.compare` (one shared init, tol=0, a warm-up
fit, the device synchronised, the median of repeats) with the default rows: every installed
kmeans_xp backend but the generic ones, and scikit-learn, faiss-cpu and torch where installed.
With a CUDA GPU the workloads are W1, W3 and W5 (`kmeans_xp.tools.bench.WORKLOADS`; CPU rows
timed once); without one, small CPU workloads (`CPU_WORKLOADS`).

It REWRITES `<results-dir>/<kind>.md` (default `benchmarks/results/`; kind from the machine:
`h100`, `h200`, `cpu-16core`, or `--kind`): the figures, the machine, the versions and the
exact command. The raw JSON of each workload goes to `<raw-dir>/<kind>/` (ignored by git),
and a compact table (ms per iteration and whole fit, per row and workload) ends the output.

Run as a script, not with -m, so that PYTHONPATH chooses the code it times. To time two
versions on one machine (old main against new), install each aside and run the command once
per copy; the results file of the other copy goes elsewhere:

    git archive d20ee5b | (mkdir -p /tmp/old-src && tar -x -C /tmp/old-src)
    python -m pip install -q --no-deps --no-build-isolation --target /tmp/old /tmp/old-src
    python -m pip install -q --no-deps --no-build-isolation --target /tmp/new .
    PYTHONPATH=/tmp/old python benchmarks/run.py --device gpu --label d20ee5b \
        --results-dir /tmp/old-results
    PYTHONPATH=/tmp/new python benchmarks/run.py --device gpu --label new

Each run prints where kmeans_xp and kmeans_xp_backends came from, warns when a module came
from another copy, and ends with the compact table to set side by side.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from results_file import bench_module, busy_spread, machine, machine_kind, record

ROOT = Path(__file__).resolve().parents[1]

#: CPU-only machines: the W workloads scaled to a couple of minutes on 2 cores, all rows
CPU_WORKLOADS = {
    "S1": dict(n=200_000, d=3, k=100),      # the main job's CPU default
    "S3": dict(n=1_000_000, d=3, k=200),    # W1's shape at half its n
    "S5": dict(n=50_000, d=128, k=512),     # W5's d
}
#: --size tiny: seconds on any machine, for the test that keeps this script alive
TINY_WORKLOADS = {"T1": dict(n=3_000, d=3, k=8), "T5": dict(n=1_000, d=16, k=8)}




def gpu_specs(bench):
    """The installed GPU rows of the default set."""
    import kmeans_xp
    specs = [name for name, info in kmeans_xp.list_backends().items()
             if info.gpu and info.available and name not in bench.GENERIC]
    if bench.torch_cuda():
        specs.append(bench.TORCH_ROW)
    return specs


def cpu_specs(bench):
    """The installed CPU rows of the default set (torch's on the CPU where it sees no GPU)."""
    gpu = set(gpu_specs(bench))
    return [s for s in bench.select("default").specs if s not in gpu]


def batch_table(bench):
    """The batched workloads (F2, and F2s its CPU size) of code that has them."""
    return {**getattr(bench, "BATCH_WORKLOADS", {}), **getattr(bench, "SMALL_BATCH_WORKLOADS", {})}


def batch_backends(backends, has_gpu):
    """The kmeans_xp backends a batched workload runs on: those of --backends, else the
    GPU ones (with a GPU) or numpy."""
    import kmeans_xp
    infos = kmeans_xp.list_backends()
    from kmeans_xp.tools.bench.entries import split_options, split_specs
    if isinstance(backends, str) and backends != "default":
        backends = split_specs(backends)
    if isinstance(backends, list):   # (a row may name its precision: "name[precision=fp16]")
        return [b for b in backends if split_options(b)[0] in infos]
    return [name for name, info in infos.items() if info.available and info.gpu
            and name != "cupy-sparse"] if has_gpu else ["numpy"]


def plan(args, bench, has_gpu):
    """[(name, Workload)] for the arguments (a `BatchWorkload` for a batched one)."""
    batches = batch_table(bench)
    table = TINY_WORKLOADS if args.size == "tiny" else {**bench.WORKLOADS, **CPU_WORKLOADS}
    table = {**table, **batches}
    names = args.workloads or (["T1", "T5"] if args.size == "tiny" else
                               ["W1", "W3", "W5"] if has_gpu else list(CPU_WORKLOADS))
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"run.py: unknown workload(s) {unknown}; known: {sorted(table)}")
    out = []
    for name in names:
        if name in batches:
            out.append((name, bench.BatchWorkload(**batches[name], iters=args.iters,
                                                  repeats=args.repeats, seed=args.seed)))
            continue
        w = bench.Workload(**table[name], iters=args.iters, repeats=args.repeats,
                           cpu_repeats=args.cpu_repeats or (1 if has_gpu else None),
                           seed=args.seed)
        if args.size == "tiny":
            w.warmup_iters = 1
        out.append((name, w))
    return out




def spread_text(row):
    """The repeats' min-max per iteration (ms), marked `busy?` by the comparison's rule, or
    "-" with one repeat."""
    times = row.get("times_per_iter_s") or []
    if len(times) < 2:
        return "-"
    lo, hi = min(times), max(times)
    return f"{lo * 1e3:.2f}-{hi * 1e3:.2f}" + (" busy?" if hi > busy_spread() * lo else "")


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _s(seconds):
    return "-" if seconds is None else f"{seconds:.3f}"


def _peak(row):
    """The row's peak memory (measured, or `(est)` from the estimate), or -."""
    from kmeans_xp.contract.memory import format_bytes
    peak = row.get("peak_memory_bytes")
    if peak is None:
        return "-"
    est = str(row.get("memory_source", "")).startswith("estimate")
    return format_bytes(peak) + (" (est)" if est else "")


def row_line(row, memory=False):
    """A row of a section's table; memory: with its peak memory as the last cell."""
    if row["status"] != "ok":
        msg = " ".join(str(row["message"]).split())[:90].replace("|", "/")
        return (f"| {row['name']} | {row['device']} | {row['status']}: {msg} | | | | | | |" +
                (" |" if memory else ""))
    sp_txt = spread_text(row)
    agree = "-" if row.get("agreement") is None else f"{row['agreement']:.4f}"
    speed = "-" if row.get("speedup") is None else f"{row['speedup']:.2f}x"
    return (f"| {row['name']} | {row['device']} | {_ms(row['time_per_iter_s'])} | {sp_txt} | "
            f"{_s(row['fit_s'])} | {_s(row['end_to_end_s'])} | {row['n_iter']} | "
            f"{row['inertia']:.6g} | {agree} | {speed} |" + (f" {_peak(row)} |" if memory else ""))


def workload_section(name, result, bench):
    i = result["inputs"]
    base = result.get("baseline") or {}
    lines = [f"## {name}: n={i['n']:,} d={i['d']} k={i['k']}",
             "",
             f"{i['dtype']}, data={i['data']}, init={i['init']} (one shared init, "
             f"{i['init_sha256_16']}), {i['iters']} iterations with tol=0; median of "
             f"{i['repeats']} timed fits (CPU rows: {i.get('cpu_repeats') or i['repeats']}) "
             f"after a warm-up fit. Speed-up over "
             f"{base.get('name', 'no CPU row')}, the fastest CPU row. Peak memory: the "
             f"device pool's over the fit (X included) where measured, else `(est)`.",
             "",
             "| row | device | ms/iter | spread | whole fit s | from host s | iters | inertia "
             "| agree | speed-up | peak memory |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [row_line(r, memory=True) for r in result["rows"]]
    notes = [bench.headline(result), bench.no_gpu_note(result)]
    lines += [""] + [" ".join(n.split()) for n in notes if n] + [""]
    skipped = bench.skipped_text(result)
    if skipped:
        lines += ["```", skipped.strip(), "```", ""]
    return lines


def batch_section(name, result):
    """A batched workload's section: each backend's batched fit and its loop of single fits."""
    i = result["inputs"]
    lines = [f"## {name}: {i['batch']} problems of n={i['n']:,} d={i['d']} k={i['k']}",
             "",
             f"{i['dtype']}, blobs per problem, one shared init per problem, {i['iters']} "
             f"iterations with tol=0; median of {i['repeats']} timed fits after a warm-up "
             f"fit. ms/iter: the whole batch's Lloyd time per iteration; `loop`: a Python loop "
             f"of {i['batch']} single fits from the same centers; speed-up: loop over batched.",
             "",
             "| row | device | ms/iter | spread | whole fit s | from host s | iters | inertia "
             "| agree | speed-up |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    return lines + [row_line(r) for r in result["rows"]] + [""]


def compact_table(results):
    """Rows x workloads: ms per iteration, whole fit on data in place and from host data
    (seconds), for a quick side-by-side."""
    names = list(results)
    rows = list(dict.fromkeys(r["name"] for res in results.values() for r in res["rows"]))
    header = ["row"] + [f"{n} ms/iter   fit s  host s" for n in names]
    body = []
    for row in rows:
        cells = [row]
        for n in names:
            r = next((x for x in results[n]["rows"] if x["name"] == row), None)
            if r is None:
                cells.append("")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                cells.append(f"{r['time_per_iter_s'] * 1e3:9.3f} {r['fit_s']:7.3f} "
                             f"{r['end_to_end_s']:7.3f}")
        body.append(cells)
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    out = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                     for i, c in enumerate(line)) for line in [header] + body]
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)






def where_code_is():
    import kmeans_xp
    paths = [f"kmeans_xp {Path(kmeans_xp.__file__).parent}"]
    try:
        import kmeans_xp_backends
        paths.append(f"kmeans_xp_backends {Path(kmeans_xp_backends.__file__).parent}")
    except ImportError:
        pass
    return "; ".join(paths)


def mixed_modules():
    """kmeans_xp modules loaded from outside the roots of the kmeans_xp and
    kmeans_xp_backends packages that run (an editable install's finder can hand an older
    copy a module it lacks): such a run times a mix of two versions."""
    roots = []
    for pkg in ("kmeans_xp", "kmeans_xp_backends"):
        mod = sys.modules.get(pkg)
        if mod is not None and getattr(mod, "__file__", None):
            roots.append(str(Path(mod.__file__).resolve().parent))
    out = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if name.split(".")[0] in ("kmeans_xp", "kmeans_xp_backends") and path and not any(
                str(Path(path).resolve()).startswith(r) for r in roots):
            out.append(f"{name} ({path})")
    return out




def parse(argv):
    ap = argparse.ArgumentParser(prog="python benchmarks/run.py",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", help="the results file's name (default: from the machine, e.g. "
                                   "h100, h200, cpu-2core)")
    ap.add_argument("--workloads", type=lambda s: [w for w in s.split(",") if w],
                    help="comma-separated names (GPU: W1,W3,W5, also W2; CPU: S1,S3,S5; "
                         "batches of problems: F2, F2s its CPU size)")
    ap.add_argument("--device", choices=("all", "gpu", "cpu"), default="all",
                    help="which installed rows run (default all)")
    ap.add_argument("--backends", help="row specs instead of --device's set, as "
                                       "`kmeans-xp compare --backends`")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3, help="timed fits per row (median)")
    ap.add_argument("--cpu-repeats", type=int, default=None,
                    help="timed fits per CPU row (default: 1 with a GPU, else --repeats)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=("full", "tiny"), default="full",
                    help="tiny: seconds-long workloads T1, T5 (the test's)")
    ap.add_argument("--label", help="names the code timed (e.g. old-main, a commit) in the "
                                     "output and the results file")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--raw-dir", type=Path, default=ROOT / "benchmarks" / "raw")
    return ap.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    bench = bench_module()
    t0 = time.perf_counter()
    info = machine()
    has_gpu = bool(bench.gpu_info()) and bench.cupy_gpu()
    kind = args.kind or machine_kind(info)
    if args.backends:
        backends = args.backends
    elif args.device == "gpu":
        backends = gpu_specs(bench)
    elif args.device == "cpu":
        backends = cpu_specs(bench)
    else:
        backends = "default"
    if not backends:
        raise SystemExit(f"run.py: no {args.device} row is installed here")
    workloads = plan(args, bench, has_gpu)
    raw = args.raw_dir / kind
    raw.mkdir(parents=True, exist_ok=True)
    print(f"kind {kind}; workloads {', '.join(n for n, _ in workloads)}; rows {backends}; "
          f"code: {where_code_is()}", flush=True)
    results, sections = {}, []
    for name, w in workloads:
        if name in batch_table(bench):
            result = bench.compare_batched(batch_backends(backends, has_gpu), w)
            result["workload"] = name
            (raw / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
            results[name] = result
            sections.append(batch_section(name, result))
            print("\n".join(sections[-1]), flush=True)
            continue
        print(f"== {name}: n={w.n:,} d={w.d} k={w.k}", flush=True)
        result = bench.compare(backends, w)
        result["workload"] = name
        (raw / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(bench.format_table(result), flush=True)
        results[name] = result
        sections.append(workload_section(name, result, bench))
    wall = time.perf_counter() - t0
    path = record(sections, script="benchmarks/run.py", argv=argv, wall_s=wall, kind=kind,
                  results_dir=args.results_dir, label=args.label, info=info)
    label = f"{args.label}, " if args.label else ""
    print(f"\n{kind}: ms per iteration; whole fit (s) on data in place and from host data; "
          f"{label}{where_code_is()}")
    print(compact_table(results))
    mixed = mixed_modules()
    if mixed:
        print("WARNING: these modules came from another copy of the code than kmeans_xp: "
              + ", ".join(mixed), file=sys.stderr)
    print(f"wrote {path}; raw JSON in {raw}/")
    return 0 if any(r["status"] == "ok" for res in results.values() for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
