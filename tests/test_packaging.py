"""What the wheel ships: one version, an SPDX license with its file, the py.typed marker."""
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kmeans_xp

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_written_once():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "kmeans_xp.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", kmeans_xp.__version__)
    # no second copy of the number anywhere in the package's sources
    written = [p for p in (ROOT / "kmeans_xp").rglob("*.py")
               if kmeans_xp.__version__ in p.read_text() and p.name != "__init__.py"]
    assert not written, written


def test_license_is_an_spdx_expression_with_its_file():
    project = PYPROJECT["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    assert "BSD 3-Clause License" in (ROOT / "LICENSE").read_text()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the sources (the checkout gets no build/ folder)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("kmeans_xp", "backends"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, check=False, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    return zipfile.ZipFile(next(out.glob("kmeans_xp-*.whl")))


def test_wheel_metadata_and_files(wheel):
    names = wheel.namelist()
    assert "kmeans_xp/py.typed" in names
    assert "kmeans_xp_backends/cupy/cuda/common.cuh" in names
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = wheel.read(meta_name).decode()
    assert f"\nVersion: {kmeans_xp.__version__}\n" in meta
    assert "\nLicense-Expression: BSD-3-Clause\n" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
