"""scikit-learn's own `sklearn/cluster/tests/test_k_means.py`, run against kmeans_xp.

The file is read from the installed scikit-learn at test time, its import of the estimators
(`from sklearn.cluster import KMeans, MiniBatchKMeans, k_means, kmeans_plusplus`) is pointed
at kmeans_xp, and the tests of scikit-learn's private helpers are dropped (LEFT_OUT): they
test sklearn's Cython, not an estimator. Items of a feature still to come are deselected
(PENDING), each with its reason. The rest runs in a pytest subprocess with sklearn's conftest
as a plugin (its `global_random_seed` fixture: `SKLEARN_TESTS_GLOBAL_RANDOM_SEED` picks the
seeds), and `run_suite()` returns every item's outcome.

    python tests/sklearn_suite.py            # the counts and the failures, on this machine
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

#: the names the generated file imports from kmeans_xp instead of sklearn.cluster
OURS = ("KMeans", "MiniBatchKMeans", "k_means", "kmeans_plusplus")

#: whole test functions left out of the generated file, and why
LEFT_OUT = {
    "test_relocate_empty_clusters": "sklearn-private helpers _relocate_empty_clusters_*",
    "test_minibatch_update_consistency": "sklearn-private helpers _mini_batch_step and "
                                         "_labels_inertia",
    "test_minibatch_reassign": "sklearn-private helpers _mini_batch_step and _labels_inertia "
                               "(no estimator of ours runs in it)",
    "test_euclidean_distance": "sklearn-private helpers _euclidean_*_dense_wrapper",
    "test_inertia": "sklearn-private helpers _inertia_dense and _inertia_sparse",
    "test_is_same_clustering": "sklearn-private helper _is_same_clustering",
}

#: items deselected until their feature lands: a test name (all its items) or a parameter
#: value (every item parametrized with it), each with the reason
PENDING = {}

SOURCE = "sklearn/cluster/tests/test_k_means.py"

_CONFTEST = '''
import pytest

PENDING = {pending!r}


def _pending(item):
    if item.originalname in PENDING:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {{}})
    return any(isinstance(v, str) and "param:" + v in PENDING for v in params.values())


def pytest_collection_modifyitems(config, items):
    keep = [i for i in items if not _pending(i)]
    gone = [i for i in items if _pending(i)]
    if gone:
        config.hook.pytest_deselected(items=gone)
    items[:] = keep
'''


def sklearn_test_source() -> str:
    import sklearn
    return (Path(sklearn.__file__).parent / "cluster" / "tests" / "test_k_means.py").read_text()


def generate(source: str) -> str:
    """The test file with the estimators imported from kmeans_xp and LEFT_OUT removed; line
    numbers are kept (removed lines become blank) so tracebacks point at sklearn's file."""
    lines = source.splitlines()
    tree = ast.parse(source)
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "sklearn.cluster":
            names = [a.name for a in node.names]
            missing = set(names) - set(OURS)
            if missing:
                raise RuntimeError(f"{SOURCE} imports {sorted(missing)} from sklearn.cluster: "
                                   f"say in tests/sklearn_suite.py whether kmeans_xp has them")
            _replace(lines, node, f"from kmeans_xp import {', '.join(names)}")
        elif isinstance(node, ast.FunctionDef) and node.name in LEFT_OUT:
            found.add(node.name)
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            _replace(lines, node, "", first=first)
    if found != set(LEFT_OUT):
        raise RuntimeError(f"{SOURCE} no longer has {sorted(set(LEFT_OUT) - found)}: update "
                           f"LEFT_OUT in tests/sklearn_suite.py")
    return "\n".join(lines) + "\n"


def _replace(lines, node, text, first=None):
    first = node.lineno if first is None else first
    for i in range(first - 1, node.end_lineno):
        lines[i] = ""
    lines[first - 1] = text


def run_suite(*, seed: str | None = None, timeout: float = 1800, extra=()) -> dict:
    """{test id: "passed" | "failed" | "skipped"} of every in-scope item, from a pytest
    subprocess on the generated file; `seed` sets SKLEARN_TESTS_GLOBAL_RANDOM_SEED."""
    with tempfile.TemporaryDirectory(prefix="kmeans_xp_sklearn_suite_") as tmp:
        tmp = Path(tmp)
        (tmp / "test_k_means.py").write_text(generate(sklearn_test_source()))
        (tmp / "conftest.py").write_text(_CONFTEST.format(pending=PENDING))
        (tmp / "pytest.ini").write_text("[pytest]\n")
        # float32 items too (sklearn runs them only when asked)
        env = {**os.environ, "SKLEARN_RUN_FLOAT32_TESTS": "1"}
        if seed is not None:
            env["SKLEARN_TESTS_GLOBAL_RANDOM_SEED"] = seed
        report = tmp / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-c", str(tmp / "pytest.ini"), "--rootdir",
               str(tmp), "-p", "sklearn.conftest", "-p", "no:cacheprovider", "-q",
               "-o", "addopts=", f"--junitxml={report}", "-W", "ignore::DeprecationWarning",
               str(tmp / "test_k_means.py"), *extra]
        if _has_xdist():
            cmd[3:3] = ["-p", "no:xdist"]
        run = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                             timeout=timeout, check=False)
        if not report.exists():
            raise RuntimeError(f"pytest did not run:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        return _outcomes(report)


def _has_xdist():
    import importlib.util
    return importlib.util.find_spec("xdist") is not None


def _outcomes(report: Path) -> dict:
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        tags = {child.tag: child for child in case}
        if "failure" in tags or "error" in tags:
            msg = (tags.get("failure") if "failure" in tags else tags["error"]).get("message")
            out[name] = ("failed", (msg or "")[:300])
        elif "skipped" in tags:
            out[name] = ("skipped", (tags["skipped"].get("message") or "")[:300])
        else:
            out[name] = ("passed", "")
    return out


if __name__ == "__main__":
    results = run_suite(seed=sys.argv[1] if len(sys.argv) > 1 else None)
    for name, (status, msg) in sorted(results.items()):
        if status != "passed":
            print(f"{status:8s} {name}  {msg}")
    counts = {s: sum(v[0] == s for v in results.values()) for s in ("passed", "failed",
                                                                     "skipped")}
    print(counts, "of", len(results))
