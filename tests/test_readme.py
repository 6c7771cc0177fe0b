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
