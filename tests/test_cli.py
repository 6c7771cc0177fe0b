"""The `kmeans-xp` command end to end on the CPU, tiny sizes: JSON parsed, PNGs opened."""
import json
import subprocess
import sys

import pytest

from kmeans_xp import bench, cli, plot

TINY = ["--n", "2000", "--k", "6", "--iters", "3", "--repeats", "1", "--warmup-iters", "1"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_png(path):
    """The image as an array (proves matplotlib can open what we wrote)."""
    mpimg = pytest.importorskip("matplotlib.image")
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    return img


def rows_by_name(result):
    return {r["name"]: r for r in result["rows"]}


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
    np = pytest.importorskip("numpy")
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
                   "--seed-device", "cpu", "--max-memory", "100KB", "--out", str(tmp_path),
                   "--name", "capped", "--quiet"])
    assert rc == 0
    rows = rows_by_name(json.loads((tmp_path / "capped.json").read_text()))
    seed = rows["seed-reference[numpy]"]
    assert seed["status"] == "oom" and "Out of memory" in seed["message"]
    assert rows["numpy"]["status"] == "ok"
    read_png(tmp_path / "capped-memory.png")


def test_sweep_one_row_per_value(tmp_path, capsys):
    rc = cli.main(["sweep", "--vary", "n", "--values", "1000,2k", *TINY[2:],
                   "--backends", "numpy", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert [(r["name"], r["value"]) for r in result["rows"]] == [("numpy", 1000),
                                                                ("numpy", 2000)]
    read_png(tmp_path / "sweep-scaling.png")


def test_plot_clusters_from_a_fit_and_from_the_saved_result(tmp_path):
    png, npz = tmp_path / "fit.png", tmp_path / "fit.npz"
    assert cli.main(["plot-clusters", "--n", "3000", "--k", "40", "--iters", "3",
                     "--backend", "numpy", "--max-points", "1000", "--out", str(png),
                     "--save", str(npz)]) == 0
    read_png(png)
    again = tmp_path / "again.png"
    assert cli.main(["plot-clusters", "--from", str(npz), "--out", str(again)]) == 0
    read_png(again)


def test_distinct_colors_for_many_clusters():
    np = pytest.importorskip("numpy")
    colors = plot.distinct_colors(1000)
    assert colors.shape == (1000, 3)
    # neighbouring labels must not look alike: hues of consecutive clusters are far apart
    gaps = np.abs(np.diff(colors, axis=0)).sum(axis=1)
    assert gaps.min() > 0.1


def test_no_arguments_runs_compare_with_machine_defaults(monkeypatch, capsys):
    monkeypatch.setattr(bench, "cupy_gpu", lambda: False)
    monkeypatch.setattr(cli, "CPU_DEFAULTS", dict(n=1500, d=3, k=4, backends="numpy"))
    monkeypatch.setattr(sys, "argv", ["kmeans-xp"])
    assert cli.main() == 0
    out = capsys.readouterr().out
    assert "n=1,500" in out and "numpy" in out


def test_python_dash_m_with_options_only_and_no_progress_when_piped():
    proc = subprocess.run([sys.executable, "-m", "kmeans_xp", *TINY, "--backends", "numpy"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ms/iter" in proc.stdout
    assert "\r" not in proc.stdout + proc.stderr  # tqdm stays silent off a terminal


def test_plots_skipped_with_a_message_without_matplotlib(tmp_path, monkeypatch, capsys):
    def missing(**kw):
        raise plot.PlotUnavailable("matplotlib is not installed")
    monkeypatch.setattr(plot, "_figure", missing)
    assert cli.main(["compare", *TINY, "--backends", "numpy", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "compare.json").exists()
    assert not (tmp_path / "compare-time.png").exists()
    assert "matplotlib" in capsys.readouterr().err


def test_all_rows_failing_is_a_failed_command(capsys):
    assert cli.main(["compare", *TINY, "--backends", "no-such-backend", "--quiet"]) == 1


def test_run_and_backends_still_work(capsys):
    assert cli.main(["backends"]) == 0
    assert "numpy" in capsys.readouterr().out
    assert cli.main(["run", "--n", "2000", "--k", "5", "--iters", "2",
                     "--backend", "numpy"]) == 0
    assert "ms/iteration" in capsys.readouterr().out
