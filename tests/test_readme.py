"""The README's test command is the one CI runs, and its plugin example works."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_test_command():
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- test-command -->", 1)[1]
    return re.search(r"```\n(.+?)\n```", block, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_test_command() in ci


def test_readme_plugin_example_passes_the_contract_suite():
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(import numpy as np\nfrom kmeans_xp import [^\n]*KMeansBackend"
                     r".+?)```", text, re.S).group(1)
    ns = {}
    exec(code, ns)
    from kmeans_xp.testing import check_backend
    assert check_backend(ns["MyBackend"]) > 0


def test_readme_quick_example_runs_fast_and_shows_progress():
    """The Quick example as a new user runs it: under 30 s on a 2-core CPU, not silent."""
    import subprocess
    import sys
    import time
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- quick-example -->", 1)[1]
    code = re.search(r"```python\n(.+?)```", block, re.S).group(1)
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120)
    wall = time.perf_counter() - t0
    assert run.returncode == 0, run.stderr[-3000:]
    assert wall < 30, f"the Quick example took {wall:.1f} s"
    assert "Iteration 0, inertia" in run.stdout          # progress while it runs
    assert "Run 0: inertia" in run.stdout
    assert "data=" in run.stdout  # the cupy-fused plan printed on a machine without a GPU
