"""docs/plugins.md, the plugin guide, stays true: its contract table lists at most 12 names,
its CPU example passes `check_backend` and fits under the name the guide shows, and its GPU
example passes `check_backend` on a GPU (marker gpu). The examples are run from the page
itself, so the page cannot rot."""
import pathlib
import re

import numpy as np
import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def _example(name):
    """The code of the python block after `<!-- example: name -->` in the guide."""
    text = GUIDE.read_text()
    found = re.search(rf"<!-- example: {re.escape(name)} -->\n```python\n(.+?)```", text, re.S)
    assert found, f"docs/plugins.md has no example {name!r}"
    return found.group(1)


def _run(*names):
    ns = {"__name__": "plugin_guide_example"}
    for name in names:
        exec(compile(_example(name), f"docs/plugins.md:{name}", "exec"), ns)
    return ns


def test_the_contract_table_lists_at_most_12_names():
    table = GUIDE.read_text().split("## The contract", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    names = [re.match(r"\| `(\w+)", row).group(1) for row in rows]
    assert 4 <= len(names) <= 12, names
    from kmeans_xp import KMeansBackend
    assert all(hasattr(KMeansBackend, n) or n == "memory" for n in names), names


def test_cpu_example_passes_check_backend_under_its_documented_name():
    from kmeans_xp import KMeans
    from kmeans_xp.contract.registry import registered
    from kmeans_xp.testing import asymmetric_data, check_backend

    cls = _run("example-cpu")["ExampleBackend"]
    assert cls.name == "example-cpu"
    toml = re.search(r"```toml\n(.+?)```", GUIDE.read_text(), re.S).group(1)
    assert 'example-cpu = "' in toml, "the entry point must declare the name the class has"
    assert check_backend(cls) > 0
    X = asymmetric_data(3001, 3, 5, seed=1)
    with registered(cls):
        got = KMeans(5, random_state=0, n_init=1, backend="example-cpu").fit(X)
    ref = KMeans(5, random_state=0, n_init=1, backend="numpy").fit(X)
    assert got.backend_ == "example-cpu"
    assert np.array_equal(got.labels_, ref.labels_)


def test_gpu_example_compiles():
    compile(_example("example-gpu"), "docs/plugins.md:example-gpu", "exec")


@pytest.mark.gpu
def test_gpu_example_passes_check_backend():
    from kmeans_xp.testing import check_backend

    cls = _run("example-cpu", "example-gpu")["ExampleGPUBackend"]
    assert cls.name == "example-gpu" and cls.device == "gpu"
    assert check_backend(cls) > 0
