"""scikit-learn's own KMeans test file (`sklearn/cluster/tests/test_k_means.py`, from the
installed scikit-learn) against kmeans_xp's KMeans and MiniBatchKMeans: the estimators'
import swapped, sklearn-private helpers' tests left out and pending features deselected, each
with its reason (tests/sklearn_suite.py). `python tests/sklearn_suite.py [seed]` lists the
failures; `SKLEARN_TESTS_GLOBAL_RANDOM_SEED=all` runs every seed."""
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("scipy")

from tests.sklearn_suite import LEFT_OUT, PENDING, run_suite  # noqa: E402

#: items of the generated file that pass, at least: all of it, elkan included
MIN_PASSED = 267


@pytest.mark.slow
def test_sklearns_kmeans_tests_pass_on_our_estimators():
    results = run_suite()
    passed = [n for n, (st, _) in results.items() if st == "passed"]
    failed = {n: msg for n, (st, msg) in results.items() if st == "failed"}
    skipped = {n: msg for n, (st, msg) in results.items() if st == "skipped"}
    assert not skipped, skipped  # (a skipped item would hide a failure)
    assert len(passed) >= MIN_PASSED, (len(passed), len(results), failed)


def test_left_out_items_say_why():
    assert all(why for why in {**LEFT_OUT, **PENDING}.values())


@pytest.mark.slow
def test_dense_items_pass_at_other_seeds():
    """The dense items (`-k "not sparse"`) at seeds other than sklearn's default 42: two here
    (the suite's time); `SKLEARN_TESTS_GLOBAL_RANDOM_SEED=all` in the environment runs all
    100, as scikit-learn's own CI does (6479 items, about 10 minutes on one core)."""
    import os
    seed = os.environ.get("SKLEARN_TESTS_GLOBAL_RANDOM_SEED") or "0-1"
    results = run_suite(seed=seed, extra=["-k", "not sparse"], timeout=3600)
    failed = {n: msg for n, (st, msg) in results.items() if st != "passed"}
    assert not failed, failed
    assert len(results) > 100
