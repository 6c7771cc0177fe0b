"""The README's test command is the one CI runs, the Python blocks of the README and of
docs/*.md run as pasted, and so do the gallery's scripts (examples/*.py: plot_* on a CPU,
gpu_* in the GPU suite). The shell lines are checked without running them: every
`kmeans-xp ...` command goes through the CLI's argument parsing, every `pip install ".[x]"`
names an extra of pyproject.toml.

A block runs unless the line before its fence says otherwise: `<!-- needs: gpu -->` (or a
block that imports cupy or dask_cuda) runs only in the GPU suite; `<!-- not run: REASON -->`
(a cluster, several GPUs) is only compiled. A page's blocks run in order in one fresh
interpreter, in an empty folder, so a later block may use an earlier one's names.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_test_command():
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- test-command -->", 1)[1]
    return re.search(r"```\n(.+?)\n```", block, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_test_command() in ci


def test_readme_is_a_front_page():
    """Under 350 lines, the test command in its first 60; every relative link of the README
    and of docs/ leads to a file that exists."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 350
    assert lines.index(_readme_test_command()) < 60
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}"


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


_BLOCK = re.compile(r"(?:^(<!--[^\n]*-->)[ \t]*\n)?^```python\n(.*?)^```", re.S | re.M)
_GPU_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:cupy|dask_cuda)\b", re.M)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_blocks(page):
    """(kind, code) per Python block of a page: kind "cpu", "gpu" or "not run"."""
    out = []
    for comment, code in _BLOCK.findall(page.read_text()):
        comment = comment or ""
        if "quick-example" in comment:     # run on its own, with its time limit, above
            continue
        if "not run:" in comment:
            out.append(("not run", code))
        elif "needs: gpu" in comment or _GPU_IMPORT.search(code):
            out.append(("gpu", code))
        else:
            out.append(("cpu", code))
    return out


def run_blocks(page, kinds, tmp_path):
    code = "\n".join(c for kind, c in doc_blocks(page) if kind in kinds)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=False, timeout=600)
    assert run.returncode == 0, f"{page.name}:\n{run.stderr[-3000:]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_doc_blocks_compile(page):
    for _, code in doc_blocks(page):
        compile(code, str(page), "exec")


#: pages whose blocks a test of their own runs (with more checks than "it runs")
OWN_TEST = {"plugins.md": "tests/test_plugin_guide.py"}


def _pages_with(kind):
    return [p for p in PAGES if p.name not in OWN_TEST and
            any(k == kind for k, _ in doc_blocks(p))]


@pytest.mark.parametrize("page", _pages_with("cpu"), ids=lambda p: p.name)
def test_doc_blocks_run_as_pasted(page, tmp_path):
    run_blocks(page, ("cpu",), tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("page", _pages_with("gpu"), ids=lambda p: p.name)
def test_doc_gpu_blocks_run_as_pasted(page, tmp_path):
    run_blocks(page, ("cpu", "gpu"), tmp_path)


EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def run_example(script, tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, check=False, timeout=600, env=env)
    assert run.returncode == 0, f"{script.name}:\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), f"{script.name} printed nothing"


@pytest.mark.parametrize("script", [p for p in EXAMPLES if p.name.startswith("plot_")],
                         ids=lambda p: p.name)
def test_gallery_examples_run_as_pasted(script, tmp_path):
    run_example(script, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("script", [p for p in EXAMPLES if p.name.startswith("gpu_")],
                         ids=lambda p: p.name)
def test_gallery_gpu_examples_run_as_pasted(script, tmp_path):
    run_example(script, tmp_path)


def test_every_example_is_a_cpu_or_gpu_example():
    """docs/conf.py runs plot_* (and gpu_* with a GPU): any other name would never run."""
    assert EXAMPLES
    for script in EXAMPLES:
        assert script.name.startswith(("plot_", "gpu_")), script.name
        compile(script.read_text(), str(script), "exec")


# -- the shell commands of the pages: every kmeans-xp command line parses, every extra exists --
SHELL_PAGES = [*PAGES, ROOT / "CONTRIBUTING.md"]
_CLI_SPAN = re.compile(r"`((?:kmeans-xp|python -m kmeans_xp)\b[^`]*)`")
_EXTRAS = re.compile(r"(?:kmeans_xp|\.)\[([\w,\-|]+)\]")


def _shell_lines(page):
    """The lines of a page's fenced blocks other than Python (commands, outputs, TOML)."""
    lines, fence = [], None
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence is not None and fence != "python":
            lines.append(line)
    return lines


def _commands(page):
    """kmeans-xp command lines of a page: in its shell blocks and in its inline code."""
    found = []
    for line in _shell_lines(page):
        for part in line.split("#")[0].split("&&"):
            found.append(part.strip())
    found += [" ".join(span.split()) for span in _CLI_SPAN.findall(page.read_text())]
    return sorted({c.split("|")[0].strip() for c in found
                   if c.startswith(("kmeans-xp", "python -m kmeans_xp"))
                   and not c.startswith("kmeans-xp:")})


class _Parsed(BaseException):
    """Raised instead of running the command: main() parsed it."""


@pytest.mark.parametrize("page", SHELL_PAGES, ids=lambda p: p.name)
def test_pages_kmeans_xp_commands_parse(page, monkeypatch):
    """Each `kmeans-xp ...` line goes through the CLI's own argument handling (main, up to
    the parse), so a renamed option or subcommand fails here, not for a reader."""
    import shlex

    from kmeans_xp.tools import cli

    real = cli.build_parser

    def parsing_only():
        parser = real()

        def parse_args(argv):  # the real parse (a usage error exits 2), then stop
            raise _Parsed(type(parser).parse_args(parser, argv))
        parser.parse_args = parse_args
        return parser

    monkeypatch.setattr(cli, "build_parser", parsing_only)
    for command in _commands(page):
        words = shlex.split(command)
        argv = words[1:] if words[0] == "kmeans-xp" else words[3:]
        try:
            status = cli.main(argv)
        except _Parsed:
            continue
        assert status == 0, f"{page.name}: `{command}` does not parse (status {status})"


@pytest.mark.parametrize("page", SHELL_PAGES, ids=lambda p: p.name)
def test_pages_pip_extras_exist(page):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])
    text = "\n".join(_shell_lines(page)) + "\n" + " ".join(
        re.findall(r"`([^`]*pip install[^`]*)`", page.read_text()))
    for group in _EXTRAS.findall(text):
        for name in re.split(r"[,|]", group):
            assert name in extras, f"{page.name}: extra {name!r} is not in pyproject.toml"
