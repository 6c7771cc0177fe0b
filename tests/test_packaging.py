"""What the wheel ships: one version, an SPDX license with its file, the py.typed marker;
`python -m build` makes an sdist and a wheel that `twine check` passes, and the wheel,
installed alone into a clean virtual environment, holds every file of the package and passes
the quick test tier (no editable install hides a missing file).

Set KMEANS_XP_WHEELHOUSE to a folder of wheels to install the clean environment's
dependencies from it, without a package index.
"""
import importlib.util
import json
import os
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


def _copy_sources(dest):
    """The sources a build reads, copied (the checkout gets no build/ or egg-info)."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("kmeans_xp", "backends"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The sdist and the wheel `python -m build` makes (no isolation: the build needs no
    network), and what it printed."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed (pip install -e '.[test]')")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    _copy_sources(src)
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist",
                            "--wheel", "-o", str(out), str(src)],
                           capture_output=True, text=True, check=False, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return {"sdist": next(out.glob("kmeans_xp-*.tar.gz")),
            "wheel": next(out.glob("kmeans_xp-*.whl")), "log": built.stdout + built.stderr}


def _package_files():
    """Every file the installed package must hold, by its installed path: the Python
    modules of kmeans_xp and of the backends (installed as kmeans_xp_backends), the CUDA
    sources the cupy backends compile at run time, and py.typed."""
    files = set()
    for top, name in (("kmeans_xp", "kmeans_xp"), ("backends", "kmeans_xp_backends")):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".py", ".cu", ".cuh", ".typed") and \
                    "__pycache__" not in path.parts:
                files.add(f"{name}/{path.relative_to(ROOT / top).as_posix()}")
    return files


def test_build_makes_an_sdist_and_a_wheel_without_warnings(dists):
    """setuptools warns when a folder the package uses is missing from `packages` (it will
    then be left out); the build log must have no such warning."""
    assert "SetuptoolsDeprecationWarning" not in dists["log"], dists["log"][-3000:]
    assert "would be ignored" not in dists["log"], dists["log"][-3000:]
    wheel_files = set(zipfile.ZipFile(dists["wheel"]).namelist())
    missing = _package_files() - wheel_files
    assert not missing, sorted(missing)
    import tarfile
    with tarfile.open(dists["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for name in ("pyproject.toml", "README.md", "LICENSE", "backends/cupy/cuda/common.cuh",
                 "kmeans_xp/py.typed"):
        assert name in names, name


def test_twine_check_passes(dists):
    if importlib.util.find_spec("twine") is None:
        pytest.skip("twine is not installed (pip install -e '.[test]')")
    run = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                          str(dists["sdist"]), str(dists["wheel"])],
                         capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_metadata_has_classifiers_and_project_urls(dists):
    meta_name = next(n for n in zipfile.ZipFile(dists["wheel"]).namelist()
                     if n.endswith(".dist-info/METADATA"))
    meta = zipfile.ZipFile(dists["wheel"]).read(meta_name).decode()
    for line in ("Classifier: Typing :: Typed", "Classifier: Programming Language :: Python :: 3",
                 "Requires-Python: >=3.10", "Provides-Extra: docs"):
        assert f"\n{line}\n" in meta, line
    urls = dict(line.split(": ", 1)[1].split(", ", 1)
                for line in meta.splitlines() if line.startswith("Project-URL: "))
    assert {"Documentation", "Source", "Issues", "Changelog"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values()), urls
    # one repository everywhere: the metadata, the README, the docs site's header
    repo = urls["Source"]
    assert all(u == repo or u.startswith(repo + "/") for u in urls.values()), urls
    assert repo in (ROOT / "README.md").read_text()
    assert repo in (ROOT / "docs" / "conf.py").read_text()


#: what the clean environment gets by pip beyond the wheel and its own dependencies: the
#: test runner (the other test dependencies are the running environment's, see below)
WHEEL_TEST_DEPS = ["pytest", "pytest-xdist"]
#: what the quick tier runs on beside the package: every file of the checkout but the
#: package's own sources (kmeans_xp/, backends/), so that only the wheel provides them
NOT_COPIED = ("kmeans_xp", "backends", ".git", ".pypath", ".ci-venv", "build", "dist")
#: tests of the checkout itself, not of the installed package: building from the sources,
#: the layout of the source folders, the packages pyproject lists for the wheel
NOT_ON_THE_WHEEL = ["tests/test_packaging.py", "tests/test_architecture.py",
                    "tests/test_bench.py::test_every_package_under_kmeans_xp_is_listed_for_the_wheel"]
_NO_INDEX = ("NewConnectionError", "Temporary failure in name resolution",
             "Network is unreachable", "ConnectTimeout", "ProxyError",
             "No matching distribution found")


def _outer_site_packages():
    """The running environment's site-packages (the test dependencies: scikit-learn, dask,
    hypothesis, ...), for the clean environment to find after its own."""
    import sysconfig
    return sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})


@pytest.mark.slow
def test_wheel_in_a_clean_venv_has_every_file_and_passes_the_quick_tier(dists, tmp_path):
    """The wheel and its declared dependencies are installed by pip into a venv without
    system site-packages; the test dependencies are not installed again (minutes of
    downloads): the running environment's site-packages follow the venv's own on sys.path, as
    a plain path (its .pth files, an editable install of the checkout among them, are not
    run), so kmeans_xp and its runtime dependencies come from the venv."""
    import venv
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    venv.create(tmp_path / "venv", with_pip=True, system_site_packages=False)
    py = str(tmp_path / "venv" / ("Scripts" if os.name == "nt" else "bin") / "python")
    source = ["--no-index", "--find-links", os.environ["KMEANS_XP_WHEELHOUSE"]] \
        if os.environ.get("KMEANS_XP_WHEELHOUSE") else []
    install = subprocess.run([py, "-m", "pip", "install", "-q", *source, str(dists["wheel"]),
                              *WHEEL_TEST_DEPS], capture_output=True, text=True,
                             check=False, timeout=900, env=env)
    if install.returncode and any(m in install.stderr for m in _NO_INDEX) and not source:
        pytest.skip("no package index reachable for the wheel's dependencies: set "
                    "KMEANS_XP_WHEELHOUSE to a folder of wheels")
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    # every file of the package is installed, and imports come from the venv
    listing = subprocess.run([py, "-c", """if True:
        import json, pathlib, kmeans_xp, kmeans_xp_backends
        out = {"where": [kmeans_xp.__file__, kmeans_xp_backends.__file__], "files": []}
        for mod in (kmeans_xp, kmeans_xp_backends):
            root = pathlib.Path(mod.__file__).parent
            out["files"] += [f"{root.name}/{p.relative_to(root).as_posix()}"
                             for p in root.rglob("*") if p.is_file()]
        print(json.dumps(out))"""], capture_output=True, text=True, check=False,
                             cwd=tmp_path, env=env, timeout=120)
    assert listing.returncode == 0, listing.stderr[-3000:]
    found = json.loads(listing.stdout)
    venv_root = str((tmp_path / "venv").resolve())
    assert all(str(Path(w).resolve()).startswith(venv_root) for w in found["where"]), found
    missing = _package_files() - set(found["files"])
    assert not missing, sorted(missing)

    # the test dependencies: the running environment's, after the venv's own
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()
    (Path(site) / "zz_test_dependencies.pth").write_text(
        "\n".join(_outer_site_packages()) + "\n")

    # the quick tier, from a copy of the checkout without the package's sources
    run_dir = tmp_path / "run"
    shutil.copytree(ROOT, run_dir, ignore=lambda d, names: [
        n for n in names if (Path(d) == ROOT and n in NOT_COPIED) or n == "__pycache__"])
    where = subprocess.run([py, "-c", "import kmeans_xp; print(kmeans_xp.__file__)"],
                           capture_output=True, text=True, check=True, cwd=run_dir, env=env)
    assert str(Path(where.stdout.strip()).resolve()).startswith(venv_root), where.stdout
    tests = subprocess.run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-n", "auto",
         *[f"--{'deselect' if '::' in t else 'ignore'}={t}" for t in NOT_ON_THE_WHEEL],
         "tests"],
        capture_output=True, text=True, check=False, cwd=run_dir, env=env, timeout=1500)
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-2000:]
    # pytest's last line: counts only (a skip's reason may say "failed")
    summary = tests.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary), tests.stdout[-2000:]
    assert not re.search(r"\d+ (failed|error)", summary), tests.stdout[-2000:]
