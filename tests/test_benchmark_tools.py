"""The maintained tools in benchmarks/ run, at a small size on the CPU, so they cannot rot.

They are scripts: each runs as a user runs it, in a subprocess (tests import nothing from
benchmarks/). The benchmark command writes into a temporary folder, never into the tracked
results.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_tool(*args, timeout=240):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_benchmark_command_rewrites_one_results_file_per_kind(tmp_path):
    results, raw = tmp_path / "results", tmp_path / "raw"
    args = ["benchmarks/run.py", "--size", "tiny", "--repeats", "2", "--kind", "test-kind",
            "--backends", "numpy,scikit-learn", "--results-dir", results, "--raw-dir", raw]
    out = run_tool(*args, "--label", "this-code")
    page = (results / "test-kind.md").read_text()
    assert "python benchmarks/run.py --size tiny --repeats 2 --kind test-kind" in page
    assert str(tmp_path) not in page                 # the command says no private folder
    assert "kmeans_xp commit: this-code" in page and "WARNING" not in out
    assert page.count("(commit this-code") == 2   # each section's stamp
    for name in ("T1", "T5"):
        assert f"## {name}: " in page
        assert json.loads((raw / "test-kind" / f"{name}.json").read_text())["rows"]
    assert "| numpy | cpu |" in page and "Versions: python" in page and "CPU: " in page
    assert "spread" in page
    # the compact table that ends the output: one line per row, both workloads
    tail = out.split("ms per iteration; whole fit", 1)[1]
    assert "T1 ms/iter" in tail and "T5 ms/iter" in tail
    assert any(line.startswith("numpy ") for line in tail.splitlines())
    # a run of one workload rewrites its section, stamped anew, and keeps the other's
    before = page.split("## T5: ", 1)[1]
    run_tool(*args[:-4], "--workloads", "T1", "--results-dir", results, "--raw-dir", raw)
    page = (results / "test-kind.md").read_text()
    assert page.count("## T1: ") == 1 and page.split("## T5: ", 1)[1] == before
    t1 = page.split("## T1: ", 1)[1].split("## T5: ", 1)[0]
    assert "--workloads T1" in t1 and "this-code" not in t1
    assert sorted(p.name for p in results.iterdir()) == ["test-kind.md"]


def test_benchmark_command_times_a_batched_workload(tmp_path):
    """F2s (F2's shape at CPU size): each backend's batched fit and its loop of single fits,
    the same partition from the same centers."""
    results, raw = tmp_path / "results", tmp_path / "raw"
    out = run_tool("benchmarks/run.py", "--workloads", "F2s", "--backends", "numpy",
                   "--repeats", "1", "--iters", "2", "--kind", "test-kind",
                   "--results-dir", results, "--raw-dir", raw)
    page = (results / "test-kind.md").read_text()
    assert "## F2s: 8 problems of n=4,099 d=32 k=64" in page, out
    rows = json.loads((raw / "test-kind" / "F2s.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["numpy batched", "numpy loop"]
    assert all(r["status"] == "ok" and r["agreement"] == 1.0 for r in rows), rows
    assert rows[0]["speedup"] > 0 and rows[0]["inertia"] == pytest.approx(rows[1]["inertia"])


def test_time_kernels_times_every_primitive(tmp_path):
    out = run_tool("benchmarks/time_kernels.py", "--backends", "numpy", "--n", "5000",
                   "--k", "8", "--repeats", "2", "--iters", "3", "--json", tmp_path / "k.json")
    row = json.loads((tmp_path / "k.json").read_text())["rows"][0]
    assert row["backend"] == "numpy" and "error" not in row, out
    for key in ("assign_ms", "reduce_ms", "lloyd_iter_ms", "driver_iteration_ms"):
        assert row[key] > 0


def test_profile_fit_reports_the_stages_and_first_use(tmp_path):
    # (the driver's function is about fifth by cumulative time: a top 5 lost it to the
    # fit's other stages on a busy machine)
    out = run_tool("benchmarks/profile_fit.py", "--n", "5000", "--k", "8", "--iters", "3",
                   "--repeats", "2", "--cprofile", "30", "--json", tmp_path / "p.json")
    figures = json.loads((tmp_path / "p.json").read_text())
    assert {"init", "lloyd", "per_iteration"} <= set(figures["stages_s"])
    assert figures["n_iter"] == 3 and "kmeans_single_lloyd" in out
    out = run_tool("benchmarks/profile_fit.py", "--n", "5000", "--k", "8", "--first-use")
    assert "first use costs" in out


def test_profile_fit_profiles_a_batch_of_problems(tmp_path):
    """--problems fits a (B, n, d) batch from (B, k, d) centers (the F2 workload's form)."""
    out = run_tool("benchmarks/profile_fit.py", "--n", "3000", "--d", "5", "--k", "7",
                   "--problems", "3", "--iters", "2", "--repeats", "1", "--cprofile", "40",
                   "--json", tmp_path / "b.json")
    figures = json.loads((tmp_path / "b.json").read_text())
    assert figures["problems"] == 3 and figures["n_iter"] == 2
    assert "3 problems of n=3,000" in out and "kmeans_batch_lloyd" in out


def test_dask_multi_gpu_runs_its_protocol_on_cpu_workers(tmp_path):
    pytest.importorskip("distributed")
    path = tmp_path / "dask.json"
    run_tool("benchmarks/dask_multi_gpu.py", path, "--cpu", "--n", "20000", "--k", "16",
             "--iters", "2", "--warmup", "1", "--workers", "1", "2", "--fit")
    case = json.loads(path.read_text())["cases"]["20000"]
    assert not case["errors"], case["errors"]
    for key in ("single_gpu", "dask_2_workers", "dask_2_workers_actors"):
        assert case[key]["per_iteration_s"] > 0
    # the same work: every case ends at the single-device centers
    assert case["dask_2_workers_actors"]["max_abs_center_diff_vs_single_gpu"] < 1e-3


def test_minibatch_step_timer_runs(tmp_path):
    """benchmarks/minibatch_step.py (the per-step comparison with scikit-learn that the GPU
    target is measured with) at a small size on the numpy backend, its figures written as
    the results file's `minibatch` section, a blank line between it and the section after."""
    (tmp_path / "test-kind.md").write_text("# Benchmark results\n\n## sparse: kept\n\nrow\n")
    out = run_tool("benchmarks/minibatch_step.py", "--n", "20000", "--k", "20", "--batch",
                   "1024", "--backend", "numpy", "--repeats", "1", "--results", tmp_path,
                   "--kind", "test-kind")
    assert "ms per step" in out and "x scikit-learn per step" in out
    page = (tmp_path / "test-kind.md").read_text()
    assert "## minibatch: n=20,000 d=3 k=20 batch 1024" in page
    assert "| kmeans_xp numpy |" in page and "| scikit-learn (host) |" in page
    assert "per step.\n\n## sparse: kept\n\nrow\n" in page


def test_bounds_fit_compares_bounds_with_lloyd_and_sklearn(tmp_path):
    out = run_tool("benchmarks/bounds_fit.py", "--n", "3000", "--d", "8", "--k", "12",
                   "--repeats", "1", "--max-iter", "30", "--backends", "numpy",
                   "--json", tmp_path / "b.json")
    rows = {r["row"]: r for r in json.loads((tmp_path / "b.json").read_text())["rows"]}
    for method in ("lloyd", "hamerly", "elkan", "yinyang"):
        row = rows[f"kmeans_xp numpy {method}"]
        assert row["same_labels"] and row["same_n_iter"] and row["seconds"] > 0, out
    assert any(name.startswith("KMeans(algorithm='elkan'") for name in rows)
    if "scikit-learn elkan" not in rows:
        pytest.importorskip("sklearn")
    assert rows["scikit-learn elkan"]["seconds"] > 0
    grid = run_tool("benchmarks/bounds_fit.py", "--grid", "--n", "2000", "--grid-d", "8",
                    "--grid-k", "12", "--repeats", "1", "--max-iter", "10",
                    "--backends", "numpy")
    assert "numpy d=8 k=12 elkan" in grid and "x lloyd" in grid


def test_sparse_tfidf_runs_against_sklearn(tmp_path):
    pytest.importorskip("sklearn")
    out_json = tmp_path / "sparse.json"
    out = run_tool("benchmarks/sparse_tfidf.py", "--small", "--rows", "scipy-sparse",
                   "sklearn", "--threads", "1", "--json", out_json, "--results", tmp_path,
                   "--kind", "test-kind")
    assert "| scipy-sparse |" in out and "| sklearn |" in out
    page = (tmp_path / "test-kind.md").read_text()   # beside the other tools' sections
    assert "## sparse: n=3,000 d=20,000" in page and "| sklearn |" in page
    rows = {r["row"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert rows["scipy-sparse"]["agreement"] > 0.99   # the same fit from the same init
    assert rows["scipy-sparse"]["inertia"] == pytest.approx(rows["sklearn"]["inertia"],
                                                             rel=1e-4)


def test_memory_peak_tool_writes_its_section(tmp_path):
    """benchmarks/memory_peak.py (the committed max_memory figures) on the numpy backend:
    the measured peak within max_memory and the estimate, written as its section."""
    out = run_tool("benchmarks/memory_peak.py", "--backends", "numpy", "--sizes",
                   "30011:16", "--results", tmp_path, "--kind", "test-kind")
    assert "| numpy | 30,011 | 16 |" in out and "| yes |" in out
    page = (tmp_path / "test-kind.md").read_text()
    assert "## max_memory:" in page and "| numpy | 30,011 | 16 |" in page


def test_large_k_compares_flat_hierarchical_balanced_and_subsampled(tmp_path):
    out = run_tool("benchmarks/large_k.py", "--n", "3000", "--d", "4", "--k", "16",
                   "--backend", "numpy", "--max-iter", "5", "--refine", "2",
                   "--per-center", "64", "--json", tmp_path / "k.json")
    rows = {r["row"]: r for r in json.loads((tmp_path / "k.json").read_text())["rows"]}
    for name in ("flat", "hierarchical", "balanced", "balanced-hierarchical", "subsampled"):
        assert rows[name]["seconds"] > 0 and rows[name]["inertia"] > 0, out
    assert rows["balanced"]["spread"] <= 1.1 + 16 / 3000
    assert rows["flat"]["over_flat"] == 1.0


def test_surface_sweep_writes_its_section_table_and_heat_map(tmp_path):
    """benchmarks/surface.py (the (d, k) x threads x mode grid of issues 40 and 41) on a tiny
    grid: every point's rows ran from one init, the section has a table per mode with the
    auto row's choice and the ratios, and a second run of part of the grid merges into it."""
    results, raw = tmp_path / "results", tmp_path / "raw"
    common = ["--subset", "tiny", "--kind", "t", "--results-dir", results, "--raw-dir", raw,
              "--rows", "kmeans_xp-auto,numpy,scikit-learn,scikit-learn-elkan"]
    out = run_tool("benchmarks/surface.py", *common, "--modes", "fixed,converge", "--fresh")
    assert "[4/4] converge threads=1 d=16 k=8" in out, out
    points = json.loads((raw / "t" / "surface-cpu.json").read_text())
    assert len(points) == 4 and {p["mode"] for p in points} == {"fixed", "converge"}
    for p in points:
        assert p["threads"] == 1 and p["n"] >= 8 * p["k"]
        rows = {r["name"]: r for r in p["rows"]}
        assert all(r["status"] == "ok" and r["time_s"] > 0 for r in rows.values()), rows
        assert rows["kmeans_xp-auto"]["engine"] in ("numpy", "numba")
        # each row's share of its whole fit outside the iterations (the GPU table's column)
        assert all(0 <= r["outside"] < 1 for r in rows.values()), rows
        assert rows["scikit-learn-elkan"]["agreement"] > 0.99
        if p["mode"] == "converge":   # the same tol rule: the same iterations as sklearn
            assert rows["numpy"]["n_iter"] == rows["scikit-learn"]["n_iter"] < 100
    page = (results / "t.md").read_text()
    section = page.split("## surface-cpu: ", 1)[1]
    assert "### fixed: ms per iteration" in section and "### converge: whole fit" in section
    assert "| kmeans_xp-auto | numpy |" in section and "ours / best peer" in section
    assert "python benchmarks/surface.py --subset tiny" in section
    if (results / "t-surface-cpu.png").exists():
        assert "![ours over the best peer](t-surface-cpu.png)" in section
    else:
        pytest.importorskip("matplotlib")
        raise AssertionError("matplotlib is installed, but no heat map was drawn")
    # a run of one point merges into the earlier ones (unless --fresh)
    run_tool("benchmarks/surface.py", *common, "--modes", "fixed", "--d", "3")
    assert len(json.loads((raw / "t" / "surface-cpu.json").read_text())) == 4
    assert "## surface-cpu: 4 points" in (results / "t.md").read_text()
