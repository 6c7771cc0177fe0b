"""The command's rough edges, each with its test: sweep's closing line, JSON and header; a
did-you-mean for a mistyped row; progress on a terminal or not and --no-progress; versions in
compare.json; plot-clusters without matplotlib; help text on every option; the time chart's
scale; sizes checked against the host's memory before anything is allocated."""
import argparse
import importlib.util
import json
import subprocess
import sys

import pytest

from kmeans_xp.contract.host_memory import HostMemory
from kmeans_xp.tools import cli, plot, preflight

TINY = ["--n", "2000", "--k", "6", "--iters", "3", "--repeats", "2", "--warmup-iters", "1"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def unwrapped(text):
    return text.replace("\n    ", " ")


# -- sweep ------------------------------------------------------------------------------------


def test_sweep_says_true_things_at_the_end_in_its_json_and_in_its_header(tmp_path, capsys):
    assert cli.main(["sweep", "--vary", "k", "--values", "3,5", *TINY, "--backends",
                     "numpy,scikit-learn", "--out", str(tmp_path), "--no-progress"]) == 0
    out = unwrapped(capsys.readouterr().out)
    header = out.splitlines()[0]
    assert "k=3,5" in header and "k=6" not in header    # the swept k, not the constant
    assert "no speed-up" not in out                      # CPU rows ran: speed-ups exist
    assert "over the fastest CPU row at each k" in out
    raw = (tmp_path / "sweep.json").read_text()
    result = json.loads(raw)
    assert '"baseline": null' not in raw
    assert set(result["baselines"]) == {"3", "5"}
    for value, base in result["baselines"].items():
        cpu = [r for r in result["rows"] if r["value"] == int(value) and r["status"] == "ok"]
        assert base["name"] == min(cpu, key=lambda r: r["time_per_iter_s"])["name"]
    assert result["inputs"]["k"] == [3, 5]


# -- did you mean -----------------------------------------------------------------------------


def test_a_mistyped_backend_gets_a_did_you_mean(capsys):
    assert cli.main(["compare", "--backends", "nmupy"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'numpy'?" in err
    assert cli.main(["run", "--backend", "nmupy"]) == 2
    assert "Did you mean 'numpy'?" in capsys.readouterr().err


# -- progress ---------------------------------------------------------------------------------


def test_compare_shows_plain_progress_lines_off_a_terminal(capsys):
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--no-save"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("kmeans-xp: [")]
    assert lines == ["kmeans-xp: [1/3] numpy: warm-up", "kmeans-xp: [2/3] numpy: run 1/2",
                     "kmeans-xp: [3/3] numpy: run 2/2"]
    assert "\r" not in err


def test_no_progress_silences_progress_and_keeps_the_table(capsys):
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--no-save",
                     "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "kmeans-xp: [" not in captured.err and "ms/iter" in captured.out


def test_run_verbose_prints_each_iteration_and_no_progress_drops_the_bar(capsys):
    assert cli.main(["run", "--n", "3k", "--k", "4", "--iters", "3", "--backend", "numpy",
                     "--verbose", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("Iteration ") == 3
    assert "Lloyd" not in captured.err and "it/s" not in captured.err


# -- versions ---------------------------------------------------------------------------------


def test_compare_json_names_the_versions_of_the_libraries_rows_ran_on(tmp_path):
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--out", str(tmp_path),
                     "--quiet"]) == 0
    versions = json.loads((tmp_path / "compare.json").read_text())["machine"]["versions"]
    for module, dist in [("numba", "numba"), ("faiss", "faiss-cpu"),
                         ("sklearn", "scikit-learn"), ("cupy", "cupy"), ("torch", "torch")]:
        if importlib.util.find_spec(module) is not None and dist != "cupy":
            assert dist in versions, dist
    assert versions["numpy"] and versions["kmeans_xp"]


# -- plot-clusters ----------------------------------------------------------------------------


def test_plot_clusters_without_matplotlib_fails_before_the_fit(monkeypatch, capsys):
    from kmeans_xp import KMeans
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)

    def no_fit(*args, **kwargs):
        raise AssertionError("the fit ran although nothing can be drawn")
    monkeypatch.setattr(KMeans, "fit", no_fit)
    assert cli.main(["plot-clusters", "--n", "3k", "--k", "5", "--backend", "numpy"]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "matplotlib is not installed" in err[0]
    assert "pip install" in err[0] and captured.out == ""


# -- help -------------------------------------------------------------------------------------


def parsers(parser, name="kmeans-xp"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


def test_every_option_of_every_command_has_help_text():
    missing = []
    seen = 0
    for name, parser in parsers(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            seen += 1
            text = action.help
            if not text or text == argparse.SUPPRESS or len(text.strip()) < 8:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert seen > 40
    assert not missing, missing


def test_the_main_job_lists_every_command_with_help(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for command in ("compare", "sweep", "plot", "plot-clusters", "run", "backends"):
        assert command in out


# -- the time chart ---------------------------------------------------------------------------


def chart_result(ms):
    rows = [{"name": f"row{i}", "status": "ok", "device": "cpu", "library": "kmeans_xp",
             "time_per_iter_s": t / 1e3, "speedup": ms[0] / t} for i, t in enumerate(ms)]
    return {"rows": rows, "baseline": {"name": "row0", "time_per_iter_s": ms[0] / 1e3},
            "inputs": {"n": 1000, "d": 3, "k": 5, "dtype": "float32", "iters": 3,
                       "repeats": 3},
            "machine": {"gpus": [], "cpu": {"model": "cpu", "usable_cores": 2},
                        "date": "2026-01-01"}}


def bar_heights(ax):
    return [p.get_height() for p in ax.patches]


def test_a_one_point_three_x_difference_shows_on_a_linear_axis_from_zero():
    pytest.importorskip("matplotlib")
    fig = plot.time_figure(chart_result([13.0, 10.0]))
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    h = bar_heights(ax)
    assert h[0] / h[1] == pytest.approx(1.3)   # drawn heights in proportion to the times
    labels = [t.get_text() for t in ax.texts]
    assert any("1.30x" in t for t in labels) and any("1.00x" in t for t in labels)


def test_a_spread_of_orders_of_magnitude_is_log_with_every_ratio_written():
    pytest.importorskip("matplotlib")
    fig = plot.time_figure(chart_result([100.0, 0.5, 77.0]))
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and "log" in ax.get_ylabel()
    labels = " ".join(t.get_text() for t in ax.texts)
    for ratio in ("1.00x", "200x", "1.30x"):
        assert ratio in labels


# -- sizes against memory (issue 37, R6) ------------------------------------------------------


def small_machine(monkeypatch, available=8 << 30, total=16 << 30):
    monkeypatch.setattr(preflight, "host_memory",
                        lambda: HostMemory(available, total, "psutil"))


@pytest.mark.parametrize("argv", [
    ["run", "--n", "1e10"],
    ["compare", "--n", "1e10"],
    ["sweep", "--vary", "n", "--values", "1k,1e10"],
    ["plot-clusters", "--n", "1e10", "--backend", "numpy"],
    ["run", "--n", "1e6", "--d", "4096", "--k", "10", "--dtype", "float64"],
])
def test_sizes_beyond_the_host_memory_are_one_line_and_status_2(argv, monkeypatch, capsys):
    small_machine(monkeypatch)
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kmeans-xp: error: "), captured.err
    assert "8.00 GiB is available of 16.00 GiB" in lines[0]
    assert "needs about" in lines[0] and "ask for at most about --n" in lines[0]
    assert captured.out == ""                            # nothing ran, nothing was made


def test_the_suggested_n_fits(monkeypatch):
    small_machine(monkeypatch)
    with pytest.raises(preflight.TooLarge) as err:
        preflight.check_host_memory("run", 10**10, 3, 200, "float32")
    fits = int(str(err.value).rsplit("--n ", 1)[1].replace(",", ""))
    assert 10**6 < fits < 10**10
    assert preflight.check_host_memory("run", fits, 3, 200, "float32") <= 8 << 30


def test_sizes_that_fit_run_and_unknown_memory_is_said_not_guessed(monkeypatch, capsys):
    small_machine(monkeypatch)
    assert cli.main(["run", "--n", "2k", "--k", "4", "--iters", "2", "--backend",
                     "numpy"]) == 0
    assert "not checked" not in capsys.readouterr().out
    monkeypatch.setattr(preflight, "host_memory", lambda: HostMemory(None, None, "unknown"))
    assert cli.main(["run", "--n", "2k", "--k", "4", "--iters", "2", "--backend",
                     "numpy"]) == 0
    assert "host memory unknown here (pip install psutil)" in capsys.readouterr().out


def test_the_real_command_refuses_a_huge_n_without_a_traceback(in_tmp):
    proc = subprocess.run([sys.executable, "-m", "kmeans_xp", "run", "--n", "1e13"],
                          capture_output=True, text=True, timeout=120, cwd=in_tmp)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "n=10,000,000,000,000" in proc.stderr and "available" in proc.stderr


def test_seed_data_is_made_in_its_dtype_with_the_same_values_and_a_known_peak():
    import numpy as np

    from kmeans_xp.tools.data import seed_data, seed_data_peak_bytes
    for n, dtype in [(1, np.float32), (7, np.float64), (10_001, np.float32)]:
        rng = np.random.default_rng(3)
        half = n // 2
        draws = rng.standard_normal((n - half, 3), dtype=np.float64)
        expected = np.concatenate([draws + 1, draws[:half] - 1]).astype(dtype)
        X = seed_data(n, 3, dtype=dtype, random_state=3)
        assert X.dtype == dtype and np.array_equal(X, expected)
    # the float64 draws of half the rows, and X: no float64 copy of the whole
    assert seed_data_peak_bytes(10**6, 3, np.float32) == 500_000 * 3 * 8 + 10**6 * 3 * 4
