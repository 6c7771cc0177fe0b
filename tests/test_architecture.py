"""The layers hold: import-linter's contracts (pyproject.toml [tool.importlinter]) pass, and no
module uses a private name (leading underscore) of another package or subpackage."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: import name -> folder, as pyproject.toml's package-dir installs them
PACKAGES = {"kmeans_xp": ROOT / "kmeans_xp", "kmeans_xp_backends": ROOT / "backends"}


def test_import_linter_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "broken" in out.stdout and " 0 broken" in out.stdout, out.stdout[-4000:]


def _modules():
    """module name -> (path, is a package)"""
    mods = {}
    for name, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = [p for p in f.relative_to(folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([name, *parts])] = (f, f.name == "__init__.py")
    return mods


MODULES = _modules()
SUBPACKAGES = {m for m, (_, is_pkg) in MODULES.items() if is_pkg}


def _home(module):
    """The package or subpackage a module belongs to (a package is its own home)."""
    if module in SUBPACKAGES:
        return module
    head = module.rpartition(".")[0]
    while head and head not in SUBPACKAGES:
        head = head.rpartition(".")[0]
    return head or module


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_ours(module):
    return module.split(".")[0] in PACKAGES


def _reach_ins(module, path, is_pkg):
    """'line: what' for each private name of another home this module imports or reads."""
    tree = ast.parse(path.read_text(), filename=str(path))
    home = _home(module)
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found = []
    aliases = {}  # a local name bound to one of our modules -> that module

    def check(target, line, what):
        if not _is_ours(target):
            return
        private_part = next((p for p in target.split(".") if _private(p)), None)
        if private_part and _home(target) != home and not _home(target).startswith(home + "."):
            found.append(f"{line}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                check(a.name, node.lineno, f"import {a.name}")
                if a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                head = ".".join(base[: len(base) - node.level + 1])
                target = f"{head}.{node.module}" if node.module else head
            else:
                target = node.module or ""
            for a in node.names:
                full = f"{target}.{a.name}"
                if full in MODULES:
                    check(full, node.lineno, f"from {target} import {a.name}")
                    aliases[a.asname or a.name] = full
                elif _private(a.name) and _is_ours(target) and _home(target) != home:
                    found.append(f"{node.lineno}: from {target} import {a.name}")
                else:
                    check(target, node.lineno, f"from {target} import {a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _private(node.attr)):
            target = aliases[node.value.id]
            if _home(target) != home:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr} ({target})")
    return found


def test_home_of_a_module():
    assert _home("kmeans_xp.contract.registry") == "kmeans_xp.contract"
    assert _home("kmeans_xp.contract") == "kmeans_xp.contract"
    assert _home("kmeans_xp_backends.numpy.backend") == "kmeans_xp_backends.numpy"


def test_no_module_uses_a_private_name_of_another_package():
    offenders = {m: hits for m, (path, is_pkg) in sorted(MODULES.items())
                 if (hits := _reach_ins(m, path, is_pkg))}
    assert not offenders, "\n".join(f"{m} {h}" for m, hits in offenders.items() for h in hits)


def test_the_check_sees_a_reach_in(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("from kmeans_xp.contract.registry import _load\n"
                    "from ..contract import registry as r\nr._cache\n"
                    "from .lloyd import _private_ok\n")
    hits = _reach_ins("kmeans_xp.algorithms.probe", path, False)
    assert [h.split(":")[0] for h in hits] == ["1", "3"], hits
