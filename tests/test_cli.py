"""The `kmeans-xp` command end to end on the CPU, tiny sizes: JSON parsed, PNGs opened, errors
as one line with their exit status, sizes parsed alike everywhere, --json, the results folder,
and the main job's headline."""
import argparse
import importlib.metadata
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

import kmeans_xp
from kmeans_xp.tools import bench, cli, plot
from kmeans_xp.contract.registry import list_backends, register_backend

TINY = ["--n", "2000", "--k", "6", "--iters", "3", "--repeats", "1", "--warmup-iters", "1"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NO_GPU = not any(i.available and i.gpu for i in list_backends().values())


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Every test runs in its own directory: the default results folder lands there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def read_png(path):
    """The image as an array (proves matplotlib can open what we wrote)."""
    mpimg = pytest.importorskip("matplotlib.image")
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    return img


def rows_by_name(result):
    return {r["name"]: r for r in result["rows"]}


def saved_results(root):
    return sorted((root / "kmeans_xp_results").glob("*/compare.json"))


def test_compare_writes_json_and_plots(tmp_path, capsys):
    rc = cli.main(["compare", *TINY, "--backends", "numpy,array-api,cupy-fused",
                   "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "ms/iter" in out
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["inputs"]["n"] == 2000 and result["inputs"]["k"] == 6
    assert {"cpu", "blas", "gpus", "versions", "date"} <= set(result["machine"])
    rows = rows_by_name(result)
    assert rows["numpy"]["status"] == "ok" and rows["numpy"]["agreement"] == 1.0
    assert rows["array-api"]["agreement"] == pytest.approx(1.0)
    if not bench.cupy_gpu():
        assert rows["cupy-fused"]["status"] == "unavailable"
        assert "UNAVAILABLE" in out
    read_png(tmp_path / "compare-time.png")
    read_png(tmp_path / "compare-memory.png")


def test_compare_on_data_from_a_npy_file(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(1500, 2)))
    assert cli.main(["compare", "--data", str(tmp_path / "x.npy"), "--k", "4", "--iters", "2",
                     "--repeats", "1", "--backends", "numpy", "--out", str(tmp_path),
                     "--quiet"]) == 0
    inputs = json.loads((tmp_path / "compare.json").read_text())["inputs"]
    assert (inputs["n"], inputs["d"]) == (1500, 2)


def test_plot_redraws_a_saved_result(tmp_path):
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--out", str(tmp_path),
                     "--name", "W0", "--quiet"]) == 0
    redraw = tmp_path / "again"
    assert cli.main(["plot", str(tmp_path / "W0.json"), "--out", str(redraw)]) == 0
    read_png(redraw / "W0-time.png")
    read_png(redraw / "W0-memory.png")


def test_include_seed_with_a_tiny_cap_reports_its_oom(tmp_path):
    rc = cli.main(["compare", *TINY, "--backends", "numpy", "--include-seed",
                   "--seed-device", "cpu", "--max-memory", "600KB", "--out", str(tmp_path),
                   "--name", "capped", "--quiet"])
    assert rc == 0
    rows = rows_by_name(json.loads((tmp_path / "capped.json").read_text()))
    seed = rows["seed-reference[numpy]"]
    assert seed["status"] == "oom" and "Out of memory" in seed["message"]
    assert rows["numpy"]["status"] == "ok"
    read_png(tmp_path / "capped-memory.png")


def test_sweep_one_row_per_value(tmp_path):
    rc = cli.main(["sweep", "--vary", "n", "--values", "1000,2k", *TINY[2:],
                   "--backends", "numpy", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert [(r["name"], r["value"]) for r in result["rows"]] == [("numpy", 1000),
                                                                ("numpy", 2000)]
    read_png(tmp_path / "sweep-scaling.png")


def test_plot_clusters_from_a_fit_and_from_the_saved_result(tmp_path):
    png, npz = tmp_path / "fit.png", tmp_path / "fit.npz"
    assert cli.main(["plot-clusters", "--n", "3k", "--k", "40", "--iters", "3",
                     "--backend", "numpy", "--max-points", "1000", "--out", str(png),
                     "--save", str(npz)]) == 0
    read_png(png)
    again = tmp_path / "again.png"
    assert cli.main(["plot-clusters", "--from", str(npz), "--out", str(again)]) == 0
    read_png(again)


def test_distinct_colors_for_many_clusters():
    colors = plot.distinct_colors(1000)
    assert colors.shape == (1000, 3)
    # neighbouring labels must not look alike: hues of consecutive clusters are far apart
    gaps = np.abs(np.diff(colors, axis=0)).sum(axis=1)
    assert gaps.min() > 0.1


def test_plots_skipped_with_a_message_without_matplotlib(tmp_path, monkeypatch, capsys):
    def missing(**kw):
        raise plot.PlotUnavailable("matplotlib is not installed")
    monkeypatch.setattr(plot, "_figure", missing)
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "compare.json").exists()
    assert not (tmp_path / "compare-time.png").exists()
    assert "matplotlib" in capsys.readouterr().err


def test_run_and_backends_still_work(capsys):
    assert cli.main(["backends"]) == 0
    assert "numpy" in capsys.readouterr().out
    assert cli.main(["run", "--n", "2000", "--k", "5", "--iters", "2",
                     "--backend", "numpy"]) == 0
    assert "ms/iteration" in capsys.readouterr().out


# -- the main job -----------------------------------------------------------------------------


@pytest.fixture
def tiny_main_job(monkeypatch):
    """`python -m kmeans_xp` as on a CPU-only machine, at a size of milliseconds."""
    monkeypatch.setattr(bench, "cupy_gpu", lambda: False)
    monkeypatch.setattr(cli, "CPU_DEFAULTS", dict(n=1500, d=3, k=4))
    monkeypatch.setattr(sys, "argv", ["kmeans-xp", "--repeats", "1"])


def test_main_job_saves_its_results_and_names_the_best_cpu_row(tiny_main_job, in_tmp, capsys):
    assert cli.main() == 0
    out = capsys.readouterr().out
    (path,) = saved_results(in_tmp)
    result = json.loads(path.read_text())
    assert (path.parent / "compare-time.png").exists()
    assert f"results: {path.parent.relative_to(in_tmp)}" in out.splitlines()[-1]
    assert "n=1,500" in out
    cpu = [r for r in result["rows"] if r["status"] == "ok" and r["device"] == "cpu"]
    best = min(cpu, key=lambda r: r["time_per_iter_s"])
    assert result["baseline"]["name"] == best["name"]
    assert f"x vs {best['name']}" in out                       # the table's column
    headline = next(line for line in out.splitlines() if "ms/iteration" in line
                    or "us/iteration" in line)
    assert best["name"] in headline and "fastest CPU row" in headline
    rows = rows_by_name(result)
    assert "array-api" not in rows and "dask" not in rows    # generic rows: not by default
    assert "array-api: " in out and "--backends default,array-api" in out
    if importlib.util.find_spec("sklearn"):
        assert rows["scikit-learn"]["status"] == "ok"
    if NO_GPU:
        assert "No GPU row ran" in out and "cupy-fused" in out
        assert list_backends()["cupy-fused"].install.split(" or ")[0] in out.replace("\n    ",
                                                                                     " ")
        assert f"over {best['name']}, the fastest CPU row" in out.replace("\n    ", " ")


def test_each_run_gets_its_own_results_folder(tiny_main_job, in_tmp):
    assert cli.main() == 0 and cli.main() == 0
    assert len(saved_results(in_tmp)) == 2


def test_no_save_writes_nothing(in_tmp):
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--no-save", "--quiet"]) == 0
    assert not (in_tmp / "kmeans_xp_results").exists()


def test_python_dash_m_with_options_only_and_no_progress_when_piped(in_tmp):
    proc = subprocess.run([sys.executable, "-m", "kmeans_xp", *TINY, "--backends", "numpy"],
                          capture_output=True, text=True, timeout=120, cwd=in_tmp)
    assert proc.returncode == 0, proc.stderr
    assert "ms/iter" in proc.stdout
    assert "\r" not in proc.stdout + proc.stderr  # tqdm stays silent off a terminal
    assert len(saved_results(in_tmp)) == 1


# -- --json -----------------------------------------------------------------------------------


def test_json_goes_to_stdout_and_the_rest_to_stderr(capsys):
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--json", "--no-save"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)                    # nothing but the JSON on stdout
    assert result["kind"] == "compare" and result["rows"][0]["name"] == "numpy"
    assert "ms/iter" in captured.err and "kmeans-xp" in captured.err


def test_run_and_backends_json(capsys):
    assert cli.main(["run", "--n", "2k", "--k", "5", "--iters", "2", "--backend", "numpy",
                     "--json"]) == 0
    captured = capsys.readouterr()
    fit = json.loads(captured.out)
    assert (fit["n"], fit["backend"], fit["version"]) == (2000, "numpy", kmeans_xp.__version__)
    assert "ms/iteration" in captured.err
    assert cli.main(["backends", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["numpy"]["available"] is True


# -- sizes and --version ----------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [("200k", 200_000), ("2M", 2_000_000),
                                         ("1e6", 1_000_000), ("2_000_000", 2_000_000),
                                         ("1.5k", 1500), ("7", 7), (" 3K ", 3000),
                                         ("999999999999999999", 999999999999999999)])
def test_sizes(text, value):
    assert cli.parse_size(text) == value


@pytest.mark.parametrize("text", ["12x", "2.5", "0", "-3", "", "k", "nan", "inf", "1e1.5"])
def test_bad_sizes(text):
    with pytest.raises(argparse.ArgumentTypeError, match="200k"):
        cli.parse_size(text)


@pytest.mark.parametrize("argv", [["compare"], ["sweep", "--vary", "k", "--values", "4,1M"],
                                  ["run"], ["plot-clusters"]])
def test_every_subcommand_parses_sizes_alike(argv):
    args = cli.build_parser().parse_args([*argv, "--n", "200k", "--k", "1e3"])
    assert (args.n, args.k) == (200_000, 1000)


def test_run_takes_200k(capsys):
    assert cli.main(["run", "--n", "2k", "--k", "1e1", "--iters", "2", "--backend",
                     "numpy"]) == 0
    assert "n=2,000" in capsys.readouterr().out


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kmeans-xp {kmeans_xp.__version__}"
    # one version: what the package says is what was installed
    assert importlib.metadata.version("kmeans_xp") == kmeans_xp.__version__


# -- errors: one line, exit status 2 (usage) or 1 (failure) -----------------------------------


def one_line_error(capsys):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kmeans-xp: error: "), err
    return lines[0]


@pytest.mark.parametrize("argv, status, says", [
    (["compare", "--max-memory", "12XB"], 2, "12XB"),
    (["run", "--max-memory", "12XB"], 2, "12XB"),
    (["compare", "--dtype", "float16"], 2, "float16"),
    (["run", "--dtype", "float16"], 2, "float16"),
    (["compare", "--n", "12x"], 2, "12x"),
    (["run", "--n", "200q"], 2, "200q"),
    (["compare", "--data", "points.csv"], 2, "points.csv"),
    (["compare", "--n", "5", "--k", "10"], 2, "at most 5 clusters"),
    (["run", "--n", "5", "--k", "10"], 2, "5 points"),
    (["run", "--backend", "no-such-backend", "--n", "100", "--k", "2"], 2, "no-such-backend"),
    (["compare", "--backends", "numpy,no-such-backend"], 2, "no-such-backend"),
    (["frobnicate"], 2, "frobnicate"),
    (["sweep", "--vary", "k"], 2, "--values"),
    (["compare", "--data", "missing.npy"], 1, "no such file"),
    (["plot", "missing.json"], 1, "missing.json"),
])
def test_ordinary_mistakes_are_one_line(argv, status, says, capsys):
    assert cli.main(argv) == status
    assert says in one_line_error(capsys)
    assert capsys.readouterr().out == ""  # nothing ran: no header, no table


def test_one_dimensional_data_is_a_failure(in_tmp, capsys):
    np.save(in_tmp / "flat.npy", np.arange(100.0))
    assert cli.main(["compare", "--data", "flat.npy", "--k", "3"]) == 1
    assert "shape (100,)" in one_line_error(capsys)


def test_a_backend_that_is_not_installed_is_a_failure(capsys):
    missing = [n for n, i in list_backends().items() if not i.available]
    if not missing:
        pytest.skip("every backend is installed here")
    assert cli.main(["run", "--backend", missing[0], "--n", "100", "--k", "2"]) == 1
    line = one_line_error(capsys)
    assert "not available" in line and missing[0] in line


def test_the_real_command_prints_no_traceback(in_tmp):
    proc = subprocess.run([sys.executable, "-m", "kmeans_xp", "run", "--n", "5", "--k", "10"],
                          capture_output=True, text=True, timeout=120, cwd=in_tmp)
    assert proc.returncode == 2
    assert proc.stderr.startswith("kmeans-xp: error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


class Failing(NumpyBackend):
    name = "toy-failing-cli"

    def lloyd_iter(self, *args, **kwargs):
        raise RuntimeError("kernel launch failed")


def test_all_rows_failing_is_a_failed_command(capsys):
    from kmeans_xp.contract import registry
    register_backend(Failing)
    try:
        assert cli.main(["compare", *TINY, "--backends", Failing.name, "--quiet",
                         "--no-save"]) == 1
    finally:
        registry._runtime.pop(Failing.name, None)
        list_backends.cache_clear()
    captured = capsys.readouterr()
    assert "ERROR: RuntimeError: kernel launch failed" in captured.out
    assert one_line_error_text(captured.err) == "kmeans-xp: error: no row ran (the table says why)"


def one_line_error_text(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
