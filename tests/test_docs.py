"""The documentation site builds warning-free (`sphinx -W`), the gallery's CPU examples run
during the build, and the API reference, gallery and results pages come out.

The build runs on a copy of the sources in a temporary folder, so the checkout gets no
generated pages. Skipped where the `docs` packages are not installed (`pip install -e
".[docs]"`; the `test` extra has them).
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what `docs/conf.py` needs: the `docs` extra of pyproject.toml
DOCS_PACKAGES = ("sphinx", "pydata_sphinx_theme", "numpydoc", "sphinx_gallery", "myst_parser",
                 "matplotlib")


def _missing():
    return [name for name in DOCS_PACKAGES if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if _missing():
        pytest.skip(f"the docs packages are not installed ({', '.join(_missing())}): "
                    "pip install -e '.[docs]'")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("_build", "generated", "auto_examples", "__pycache__",
                                    "sg_execution_times.rst")
    for name in ("docs", "examples", "benchmarks/results"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("CONTRIBUTING.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, src / name)
    out = src / "html"
    env = {**os.environ, "MPLBACKEND": "Agg"}
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(src / "docs"), str(out)],
        capture_output=True, text=True, check=False, timeout=900, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    return out


def test_docs_build_without_warnings(site):
    for page in ("index", "getting_started", "user_guide", "plugins", "api", "results",
                 "deprecation", "contributing", "changelog", "auto_examples/index"):
        assert (site / f"{page}.html").exists(), page


def test_api_reference_is_generated_from_the_docstrings(site):
    page = (site / "generated" / "kmeans_xp.KMeans.html").read_text()
    for text in ("Parameters", "Attributes", "cluster_centers_", "max_memory", "fit_predict"):
        assert text in page, text
    for name in ("estimate_memory", "list_backends", "get_backend", "KMeansBackend",
                 "MiniBatchKMeans", "SphericalKMeans"):
        assert (site / "generated" / f"kmeans_xp.{name}.html").exists(), name
    assert (site / "generated" / "kmeans_xp.testing.check_backend.html").exists()


def test_gallery_ran_its_cpu_examples(site):
    """Each CPU example ran (its output and figures are on its page); a GPU example is shown
    and runs only where a GPU is."""
    from tests.conftest import gpu_available
    for script in sorted((ROOT / "examples").glob("*.py")):
        page = (site / "auto_examples" / f"{script.stem}.html").read_text()
        ran = "sphx-glr-script-out" in page
        if script.name.startswith("plot_") or gpu_available():
            assert ran, f"{script.name} did not run"
        else:
            assert not ran, f"{script.name} ran without a GPU"
    figures = list((site / "_images").glob("sphx_glr_plot_*.png"))
    assert len(figures) >= 3, figures


def test_results_page_includes_every_results_file(site):
    page = (site / "results.html").read_text()
    for path in (ROOT / "benchmarks" / "results").glob("*.md"):
        title = path.read_text().splitlines()[0].lstrip("# ").strip()
        assert title in page, path.name
    assert list((site / "_images").glob("results-*.png")), "no results chart"
