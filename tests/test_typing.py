"""The public API is typed: `mypy --strict` passes on the public modules (pyproject.toml's
[tool.mypy]), and code written against kmeans_xp sees real types, not Any (py.typed ships).

Skipped where mypy is not installed (it is in the `test` extra).
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One mypy cache for the module's runs (kept out of the checkout)."""
    return tmp_path_factory.mktemp("mypy_cache")


def _mypy(*args, cache):
    run = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache),
                          "--no-error-summary", "--hide-error-context", *args],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
    return run.returncode, run.stdout + run.stderr


def test_public_modules_pass_mypy_strict(cache):
    code, out = _mypy(cache=cache)
    assert code == 0, out[-5000:]


USER_CODE = '''
import numpy as np
from kmeans_xp import (KMeans, KMeansBackend, MiniBatchKMeans, SphericalKMeans,
                       estimate_memory, get_backend, list_backends)
from kmeans_xp.testing import check_backend

X = np.zeros((10, 2))
reveal_type(KMeans(3, backend="numpy").fit(X))
reveal_type(MiniBatchKMeans(3).partial_fit(X))
reveal_type(SphericalKMeans(3).score(X))
reveal_type(estimate_memory(10, 2, 3, backend="numpy").total)
reveal_type(list_backends())
reveal_type(get_backend("numpy"))
reveal_type(check_backend(get_backend("numpy")))
reveal_type(KMeansBackend.assign)
'''


def test_user_code_sees_the_public_types(tmp_path, cache):
    (tmp_path / "user_code.py").write_text(USER_CODE)
    code, out = _mypy("--strict", str(tmp_path / "user_code.py"), cache=cache)
    assert code == 0, out
    revealed = re.findall(r'Revealed type is "(.*)"', out)
    expected = ["kmeans_xp.estimators.kmeans.KMeans",
                "kmeans_xp.estimators.minibatch.MiniBatchKMeans", "float", "int",
                "kmeans_xp.contract.registry.BackendInfo]]",
                "type[kmeans_xp.contract.backend.KMeansBackend]", "int",
                "kmeans_xp.contract.results.AssignResult]"]
    assert len(revealed) == len(expected), out
    for got, want in zip(revealed, expected):
        # mypy 1 writes builtins.float, mypy 2 float
        assert got.removeprefix("builtins.").endswith(want), (got, want)


def test_wrong_arguments_are_caught(tmp_path, cache):
    (tmp_path / "wrong.py").write_text(
        "from kmeans_xp import KMeans, estimate_memory\n"
        "KMeans(n_clusters='8')\n"
        "estimate_memory(10, 2, 3, backend=4)\n")
    code, out = _mypy("--strict", str(tmp_path / "wrong.py"), cache=cache)
    assert code == 1, out
    assert 'Argument "n_clusters" to "KMeans"' in out and 'Argument "backend"' in out, out
