"""The performance surface: our rows against the peers over a (d, k) grid, per thread count, for
fixed-iteration fits and fits to convergence, written into the results file of the machine.

    python benchmarks/surface.py --device cpu                  # the whole CPU grid
    python benchmarks/surface.py --device cpu --subset quick   # minutes on 2 cores
    python benchmarks/surface.py --device gpu --subset gpu-a   # one 9-minute device call

Every point is one `kmeans_xp.tools.bench.compare` (the benchmark suite's protocol: the same
data and ONE shared init for every row, a warm-up fit, the median of repeats, the spread
beside it), so this tool only chooses the points and writes what they measured.

- CPU rows: kmeans_xp-auto (KMeans' own choice, named in its cell), our engines numpy and
  numba, scikit-learn lloyd and elkan, faiss-cpu; every row held to the point's threads
  (threadpoolctl, and our backends' `n_threads`). CUDA is hidden from a CPU sweep, so `auto`
  chooses among the CPU engines even on a GPU machine.
- GPU rows: each installed cupy backend exact, cupy-fused also in each reduced precision its
  tensor-core kernels run (tf32, fp16, bf16: `paths.PRECISIONS`; cupy-chunked's reduced
  precisions emulate the semantics, not the speed), cupy-fused's kernel path named
  (`kmeans_xp_backends.cupy.paths`), and flash-kmeans fp32/fp16 and torch-gemm where installed.
- Modes: `fixed` (ms per iteration of FIXED_ITERS iterations, tol=0) and `converge` (the
  whole fit in seconds, max_iter=CONVERGE_MAX_ITER, tol=CONVERGE_TOL; faiss has no tol and
  runs them all).
- n per point (`points`): as many rows as keep n * k * d at --budget, within [--n-min,
  --n-max], X (float32) within the grid's x_max_bytes (2 GiB CPU, 8 GiB GPU) and at least
  MIN_PER_CLUSTER rows a cluster; a point where even that floor needs
  more than OVER_BUDGET times the budget is listed as beyond it, not run.

It REWRITES the section `surface-<device>` of `<results-dir>/<kind>.md` (kind: `cpu-<cores>core`
for --device cpu, the GPU's name for gpu) with one table per mode and a heat map (our time over
the best peer's, per (d, k), a panel per mode and thread count; matplotlib, if installed) in
`<results-dir>/<kind>-surface-<device>.png`. Points of earlier runs kept in the raw JSON
(`<raw-dir>/<kind>/surface-<device>.json`, ignored by git) are merged in unless --fresh, so
subsets run in several calls add up to one table. --max-minutes stops starting points after
that long and writes what it has.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from kmeans_xp.contract.chunks import usable_cores

ROOT = Path(__file__).resolve().parents[1]

FIXED_ITERS, GPU_FIXED_ITERS = 5, 10
CONVERGE_MAX_ITER, CONVERGE_TOL = 100, 1e-4
#: a cluster gets at least this many rows (fewer says little about a real fit)
MIN_PER_CLUSTER = 8
#: a GPU fit on device X may spend at most this share of its time outside its iterations
OUTSIDE_BOUND = 0.10
#: a point whose floor of n needs more than this many budgets is listed, not run
OVER_BUDGET = 4
GRIDS = {
    "cpu": dict(d=[2, 3, 8, 16, 32, 64, 128, 384, 768, 1536],
                k=[8, 64, 256, 1024, 4096, 16384], threads=["1", "2", "4", "all"],
                modes=["fixed", "converge"], budget=2e8, n_min=10_000, n_max=1_000_000,
                x_max_bytes=2 << 30),
    "gpu": dict(d=[2, 3, 8, 16, 32, 64, 128, 256, 512, 1024, 2048],
                k=[8, 64, 256, 1024, 4096, 16384, 65536, 262144], threads=["all"],
                modes=["fixed"], budget=5e11, n_min=10_000, n_max=20_000_000,
                x_max_bytes=8 << 30),
}
#: named subsets (the grid's other settings stay): each fits its stated time
SUBSETS = {
    "tiny": dict(d=[3, 16], k=[8], threads=["1"], budget=3e5, n_min=2_000, repeats=2),
    # about 3 minutes on 2 busy cores
    "quick": dict(d=[3, 64], k=[64, 1024], threads=["all"], budget=1e8),
    # about 20 minutes on 2 shared cores
    "cpu-2core": dict(d=[2, 8, 32, 128, 768], k=[8, 256, 1024], threads=["1", "all"],
                      budget=1.2e8, n_max=100_000),
    # one 9-minute call on 16 cores each, with --max-minutes 7 (run a then b on the same
    # warm machine: the raw JSON merges them)
    "cpu16-a": dict(d=[3, 16, 64, 128, 768], k=[64, 256, 1024], threads=["all"],
                    budget=1e9),
    "cpu16-b": dict(d=[2, 8, 32, 384, 1536], k=[8, 256, 4096], threads=["1", "4"],
                    modes=["fixed"], budget=1e9),
    # one 9-minute device call each, with --max-minutes 6.5
    "gpu-a": dict(d=[16, 64, 128, 256], k=[256, 4096, 16384, 65536]),
    "gpu-b": dict(d=[2, 3, 512, 1024, 2048], k=[8, 1024, 16384, 262144]),
}


def points(settings):
    """[(d, k, n or None, why)] of the grid: n by the budget rule, None where beyond it."""
    out = []
    for d in settings["d"]:
        for k in settings["k"]:
            floor = max(settings["n_min"], MIN_PER_CLUSTER * k)
            cap = min(settings["n_max"], settings["x_max_bytes"] // (4 * d))
            n = int(min(cap, max(floor, settings["budget"] // (k * d))))
            if floor * k * d > OVER_BUDGET * settings["budget"]:
                out.append((d, k, None, f"n >= {floor:,} needs n*k*d = {floor * k * d:.2g} > "
                                        f"{OVER_BUDGET} x --budget {settings['budget']:.2g}"))
            else:
                out.append((d, k, n, ""))
    return out


def thread_counts(names):
    """"1", "4", "all" -> [1, 4, cores]; counts beyond the cores left out (said why)."""
    out, dropped = [], []
    for name in names:
        t = usable_cores() if name == "all" else int(name)
        (dropped if t > usable_cores() else out).append(t)
    return sorted(set(out)), dropped


# -- rows -------------------------------------------------------------------------------------


def cpu_rows(bench):
    return [bench.AUTO, "numpy", "numba", bench.SKLEARN_ROW, bench.SKLEARN_ELKAN_ROW,
            bench.FAISS_ROW]


def gpu_rows(bench):
    """Each installed cupy backend exact, cupy-fused in its kernels' reduced precisions too,
    then the GPU peers."""
    from kmeans_xp.contract.registry import list_backends
    from kmeans_xp.contract.selection import SPARSE_PATH
    specs = []
    for name, info in list_backends().items():
        if not (info.gpu and info.available) or name in set(SPARSE_PATH.values()):
            continue
        specs.append(name)
        if name == "cupy-fused":
            from kmeans_xp_backends.cupy import paths
            specs += [f"{name}[precision={p}]" for p in paths.PRECISIONS if p != "exact"]
    return specs + [bench.FLASH_FP32_ROW, bench.FLASH_FP16_ROW, bench.TORCH_ROW]


def ours(row):
    return row.get("library") == "kmeans_xp"


def kernel_path(spec, d, k):
    """cupy-fused's kernel path for the point (`paths.explain`), or ""."""
    if not spec.startswith("cupy-fused"):
        return ""
    try:
        from kmeans_xp_backends.cupy import fused_plan, paths
        from kmeans_xp.tools.bench.entries import split_options
        options = split_options(spec)[1]
        precision = options.get("precision", "exact")
        row = paths.choose(d, k, "float32", paths.PRECISIONS.get(precision, precision),
                           fused_plan.device_facts(0))
        return row.path
    except Exception as exc:  # no device or an older table: the cell says so
        return f"path? ({type(exc).__name__})"


# -- measuring --------------------------------------------------------------------------------


def measure_point(bench, specs, d, k, n, threads, mode, args):
    fixed = mode == "fixed"
    iters = (GPU_FIXED_ITERS if args.device == "gpu" else FIXED_ITERS) if fixed \
        else CONVERGE_MAX_ITER
    w = bench.Workload(n=n, d=d, k=k, iters=iters, tol=0.0 if fixed else CONVERGE_TOL,
                       threads=threads, repeats=args.repeats,   # (one fit: one noise draw)
                       agreement=args.device == "cpu",   # (a host fit per GPU point)
                       seed=args.seed, warmup_iters=1 if args.subset == "tiny" else 2)
    result = bench.compare(specs, w)
    rows = []
    for r in result["rows"]:
        engine = r.get("engine") or ""
        path = kernel_path(r["name"], d, k) if args.device == "gpu" else ""
        rows.append({"name": r["name"], "library": r.get("library"), "status": r["status"],
                     "message": " ".join(str(r.get("message", "")).split())[:120],
                     "engine": f"{engine} {path}".strip(),
                     "time_s": (r.get("time_per_iter_s") if fixed else r.get("fit_s")),
                     "n_iter": r.get("n_iter"), "spread": r.get("spread"),
                     "busy": bool(r.get("spread") and r["spread"] > bench_busy()),
                     "agreement": r.get("agreement"), "inertia": r.get("inertia"),
                     "outside": outside_share(r)})
    return {"d": d, "k": k, "n": n, "threads": threads, "mode": mode, "iters": iters,
            "tol": w.tol, "init": result["inputs"]["init_sha256_16"], "rows": rows}


def outside_share(r):
    """The share of a row's whole fit spent outside its Lloyd iterations (validation,
    statistics, centering, init, results): 1 - (time per iteration x iterations) / fit; None
    where either is missing."""
    t, iters, fit = r.get("time_per_iter_s"), r.get("n_iter"), r.get("fit_s")
    if not (t and iters and fit):
        return None
    return max(0.0, 1.0 - t * iters / fit)


def bench_busy():
    from kmeans_xp.tools.bench.spread import BUSY_SPREAD
    return BUSY_SPREAD


def key(p):
    return (p["mode"], p["threads"], p["d"], p["k"])


# -- writing ------------------------------------------------------------------------------------


def ratio(point):
    """(our fastest time / the fastest peer's, ours-best-engine ratio): CPU ours is the auto
    row; each None where a side did not run."""
    ok = [r for r in point["rows"] if r["status"] == "ok" and r["time_s"]]
    auto = next((r for r in ok if r["name"].endswith("-auto")), None)
    mine = [r for r in ok if r.get("library") == "kmeans_xp"]
    peers = [r for r in ok if r.get("library") != "kmeans_xp"]
    head = auto or (min(mine, key=lambda r: r["time_s"]) if mine else None)
    vs_peer = head["time_s"] / min(r["time_s"] for r in peers) if head and peers else None
    engines = [r for r in mine if r is not auto]
    vs_own = (auto["time_s"] / min(r["time_s"] for r in engines)
              if auto and engines else None)
    return vs_peer, vs_own


def ours_outside(point):
    """The outside-Lloyd share of our fastest row at a point, or None."""
    mine = [r for r in point["rows"] if r["status"] == "ok" and r["time_s"]
            and r.get("library") == "kmeans_xp" and r.get("outside") is not None]
    return min(mine, key=lambda r: r["time_s"])["outside"] if mine else None


def cell(row, mode):
    if row is None:
        return ""
    if row["status"] != "ok":
        return row["status"]
    t = row["time_s"]
    text = f"{t * 1e3:.3g}" if mode == "fixed" else f"{t:.3g}"
    if mode == "converge" and row.get("n_iter"):
        text += f" ({row['n_iter']})"
    if row["name"].endswith("-auto") or row["engine"] and row["engine"] != row["name"]:
        engine = row["engine"] if row["name"].endswith("-auto") else row["engine"].split()[-1]
        text += f" {engine}"
    return text + (" busy?" if row["busy"] else "")


def mode_table(mode, pts, device):
    rows = [r for p in pts for r in p["rows"]]
    names = sorted(dict.fromkeys(r["name"] for r in rows), key=lambda n: (
        not n.endswith("-auto"), next(r.get("library") for r in rows if r["name"] == n)
        != "kmeans_xp"))
    unit = "ms per iteration" if mode == "fixed" else "whole fit, s (iterations)"
    # (GPU fixed fits: the bound on the time a fit spends outside its iterations)
    outside = device == "gpu" and mode == "fixed"
    lines = [f"### {mode}: {unit}", "",
             "| d | k | n | threads | " + " | ".join(names) + " | ours / best peer "
             "| auto / best own |" + (" outside Lloyd |" if outside else ""),
             "| ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in names)
             + " | ---: | ---: |" + (" ---: |" if outside else "")]
    for p in sorted(pts, key=lambda p: (p["threads"] or 0, p["d"], p["k"])):
        by = {r["name"]: r for r in p["rows"]}
        vs_peer, vs_own = ratio(p)
        mark = lambda x, bad: "-" if x is None else f"{x:.2f}" + (" !" if x > bad else "")  # noqa: E731
        lines.append(f"| {p['d']} | {p['k']} | {p['n']:,} | {p['threads'] or 'all'} | "
                     + " | ".join(cell(by.get(n), mode) for n in names)
                     + f" | {mark(vs_peer, 1.0)} | {mark(vs_own, 1.1)} |"
                     + (f" {pct(ours_outside(p))} |" if outside else ""))
    return lines + [""]


def pct(share):
    """An outside-Lloyd share as a percentage, `!` above OUTSIDE_BOUND."""
    if share is None:
        return "-"
    return f"{100 * share:.0f}%" + (" !" if share > OUTSIDE_BOUND else "")


def heat_map(pts, path, title):
    """PNG: ours over the best peer per (d, k), a panel per (mode, threads); False without
    matplotlib or points."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
        from matplotlib.colors import LogNorm
    except ImportError:
        return False
    panels = sorted({(p["mode"], p["threads"] or 0) for p in pts})
    if not panels:
        return False
    ds = sorted({p["d"] for p in pts})
    ks = sorted({p["k"] for p in pts})
    fig, axes = plt.subplots(1, len(panels), figsize=(1.2 + 0.55 * len(ks) * len(panels),
                                                      1.2 + 0.35 * len(ds)), squeeze=False)
    for ax, (mode, threads) in zip(axes[0], panels):
        grid = np.full((len(ds), len(ks)), np.nan)
        for p in pts:
            if (p["mode"], p["threads"] or 0) == (mode, threads):
                grid[ds.index(p["d"]), ks.index(p["k"])] = ratio(p)[0] or np.nan
        im = ax.imshow(grid, cmap="RdYlGn_r", norm=LogNorm(0.25, 4), aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=6)
        ax.set_xticks(range(len(ks)), [str(k) for k in ks], fontsize=6, rotation=90)
        ax.set_yticks(range(len(ds)), [str(d) for d in ds], fontsize=6)
        ax.set_title(f"{mode}, {threads or 'all'} thr", fontsize=7)
        ax.set_xlabel("k", fontsize=6)
    axes[0][0].set_ylabel("d", fontsize=6)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8).ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=7)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def section(device, pts, beyond, dropped, png, args, wall_s):
    busy = sum(any(r["busy"] for r in p["rows"]) for p in pts)
    lines = [f"## surface-{device}: {len(pts)} points of the (d, k) grid",
             "",
             "Each point is one `kmeans_xp.tools.bench.compare`: the same data (the seed's "
             "float32 workload) and ONE shared init for every row, a warm-up fit, the median "
             f"of {args.repeats} timed fits (`fixed`: {FIXED_ITERS if device == 'cpu' else GPU_FIXED_ITERS} "
             f"iterations, tol=0; `converge`: max_iter={CONVERGE_MAX_ITER}, "
             f"tol={CONVERGE_TOL}; faiss has no tol). n per point: n * k * d at "
             f"{args.budget:.2g} within [{args.n_min:,}, {args.n_max:,}], at least "
             f"{MIN_PER_CLUSTER} rows a cluster (`benchmarks/surface.py`). Rows held to the "
             "point's threads. Cells: time, then what ran where the row chose (auto's "
             "backend and bounds, a kernel path); `busy?` where the repeats spread past "
             f"{bench_busy()}x. ours / best peer: "
             + ("the kmeans_xp-auto row" if device == "cpu" else "our fastest row")
             + " over the fastest peer (`!` above 1); auto / best own: auto over our fastest "
             "engine (`!` above 1.1)."
             + ("" if device == "cpu" else " outside Lloyd: the share of our fastest row's "
                "whole fit on device X spent outside its iterations (validation, statistics, "
                f"centering, results; `!` above {OUTSIDE_BOUND:.0%})."),
             ""]
    if args.shared_note:
        lines += [f"Machine: {args.shared_note}", ""]
    if busy:
        lines += [f"{busy} of {len(pts)} points had a row whose repeats spread past "
                  f"{bench_busy()}x (marked `busy?`): their ratios are not reliable.", ""]
    if png:
        lines += [f"![ours over the best peer]({png.name})", ""]
    for mode in ("fixed", "converge"):
        mpts = [p for p in pts if p["mode"] == mode]
        if mpts:
            lines += mode_table(mode, mpts, device)
    if beyond:
        lines += ["Not run (beyond the budget; raise --budget): "
                  + "; ".join(f"d={d} k={k}: {why}" for d, k, why in beyond) + ".", ""]
    if dropped:
        lines += [f"Thread counts beyond this machine's {usable_cores()} cores left out: "
                  f"{', '.join(map(str, dropped))}.", ""]
    return lines


# -- the command --------------------------------------------------------------------------------


def parse(argv):
    ap = argparse.ArgumentParser(prog="python benchmarks/surface.py",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--subset", choices=sorted(SUBSETS), help="a named part of the grid")
    lst = lambda kind: lambda s: [kind(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--d", type=lst(int), help="features, comma-separated")
    ap.add_argument("--k", type=lst(int), help="clusters, comma-separated")
    ap.add_argument("--threads", type=lst(str), help="thread counts, e.g. 1,2,all (CPU)")
    ap.add_argument("--modes", type=lst(str), help="fixed,converge")
    ap.add_argument("--budget", type=float, help="n * k * d of a point")
    ap.add_argument("--n-min", type=int)
    ap.add_argument("--n-max", type=int)
    ap.add_argument("--rows", help="row specs instead of the device's set (comma-separated)")
    ap.add_argument("--repeats", type=int, help="timed fits of a fixed point (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="start no point after this long; write what was measured")
    ap.add_argument("--fresh", action="store_true", help="forget earlier runs' points")
    ap.add_argument("--shared-note", default="",
                    help="a line about the machine's state (e.g. shared with other jobs)")
    ap.add_argument("--kind", help="the results file's name")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--raw-dir", type=Path, default=ROOT / "benchmarks" / "raw")
    args = ap.parse_args(argv)
    settings = {**GRIDS[args.device], "repeats": 3, **SUBSETS.get(args.subset, {})}
    for name in ("d", "k", "threads", "modes", "budget", "n_min", "n_max", "repeats"):
        if getattr(args, name, None) is not None:
            settings[name] = getattr(args, name)
    bad = [m for m in settings["modes"] if m not in ("fixed", "converge")]
    if bad:
        ap.error(f"--modes: {bad} unknown; use fixed, converge")
    for name in ("budget", "n_min", "n_max", "repeats"):
        setattr(args, name, settings[name])
    return args, settings


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args, settings = parse(argv)
    if args.device == "cpu":  # auto must choose among the CPU engines, even beside a GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results_file import bench_module, machine, machine_kind, record
    bench = bench_module()
    info = machine()
    kind = args.kind or (f"cpu-{usable_cores()}core" if args.device == "cpu" else machine_kind(info))
    specs = args.rows.split(",") if args.rows else (
        cpu_rows(bench) if args.device == "cpu" else gpu_rows(bench))
    threads, dropped = thread_counts(settings["threads"]) if args.device == "cpu" \
        else ([None], [])
    grid = points(settings)
    raw = args.raw_dir / kind
    raw.mkdir(parents=True, exist_ok=True)
    store = raw / f"surface-{args.device}.json"
    done = {} if args.fresh or not store.exists() else {
        key(p): p for p in json.loads(store.read_text())}
    # (d, k) outermost: a run stopped by --max-minutes has whole points of the grid
    todo = [(mode, t, d, k, n) for d, k, n, _ in grid if n is not None
            for t in threads for mode in settings["modes"]]
    print(f"kind {kind}; {len(todo)} points; rows {', '.join(specs)}", flush=True)
    t0 = time.perf_counter()
    for i, (mode, t, d, k, n) in enumerate(todo):
        if args.max_minutes and time.perf_counter() - t0 > 60 * args.max_minutes:
            print(f"--max-minutes {args.max_minutes}: {len(todo) - i} points not started")
            break
        p = measure_point(bench, specs, d, k, n, t, mode, args)
        done[key(p)] = p
        store.write_text(json.dumps(list(done.values()), indent=1) + "\n")
        vs_peer, vs_own = ratio(p)
        print(f"[{i + 1}/{len(todo)}] {mode} threads={t or 'all'} d={d} k={k} n={n:,}: "
              + ", ".join(f"{r['name']} {cell(r, mode)}" for r in p["rows"])
              + f" | ours/peer {vs_peer and round(vs_peer, 2)} auto/own "
                f"{vs_own and round(vs_own, 2)}", flush=True)
    pts = list(done.values())
    png = args.results_dir / f"{kind}-surface-{args.device}.png"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    drew = heat_map(pts, png, f"{kind}: ours / best peer (below 1: ours faster)")
    beyond = [(d, k, why) for d, k, n, why in grid if n is None]
    lines = section(args.device, pts, beyond, dropped, png if drew else None, args,
                    time.perf_counter() - t0)
    path = record([lines], script="benchmarks/surface.py", argv=argv,
                  wall_s=time.perf_counter() - t0, kind=kind, results_dir=args.results_dir,
                  info=info)
    print(f"wrote {path}" + (f" and {png}" if drew else "") + f"; raw JSON {store}")
    return 0 if any(r["status"] == "ok" for p in pts for r in p["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
