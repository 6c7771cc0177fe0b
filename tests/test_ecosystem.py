"""A good citizen: scikit-learn's parameters, logging instead of print, progress bars."""
import logging

import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data

X = asymmetric_data(2000, 3, 5, seed=0)


def test_algorithm_lloyd_accepted_elkan_says_not_implemented():
    km = KMeans(5, algorithm="lloyd", random_state=0, backend="numpy").fit(X)
    assert km.get_params()["algorithm"] == "lloyd"
    with pytest.raises(ValueError, match="'elkan' is not implemented.*algorithm='lloyd'"):
        KMeans(5, algorithm="elkan").fit(X)
    with pytest.raises(ValueError, match="algorithm"):
        KMeans(5, algorithm="full").fit(X)


def test_verbose_goes_through_the_kmeans_xp_logger(capsys, caplog):
    with caplog.at_level(logging.INFO, logger="kmeans_xp"):
        KMeans(5, random_state=0, max_iter=3, verbose=1, backend="numpy").fit(X)
    messages = [r.getMessage() for r in caplog.records if r.name == "kmeans_xp"]
    assert any(m.startswith("Iteration 0, inertia") for m in messages)
    assert any(m.startswith("Run 0: inertia") for m in messages)
    assert "Iteration 0, inertia" in capsys.readouterr().out  # verbose's own handler
    assert not logging.getLogger("kmeans_xp").handlers        # and it is gone after


def test_quiet_fit_prints_nothing(capsys):
    KMeans(5, random_state=0, max_iter=3, backend="numpy").fit(X)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_no_print_in_library_code():
    import ast
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1]
    offenders = []
    for folder in ("kmeans_xp", "backends"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "cli.py":   # the command line prints its tables
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders


def test_verbose_shows_init_progress(capsys):
    pytest.importorskip("tqdm")
    KMeans(5, random_state=0, max_iter=2, verbose=1, backend="numpy").fit(X)
    assert "k-means++" in capsys.readouterr().err
