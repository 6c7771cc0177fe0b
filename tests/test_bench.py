"""kmeans_xp.tools.bench: the protocol (one init, fixed iterations, computed agreement, speed-ups) and
failures as rows. Tiny sizes: CPU only, well under a second each."""
import contextlib
import importlib
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

from kmeans_xp.tools import bench, plot
from kmeans_xp.contract.backend import KMeansBackend
from kmeans_xp.tools.bench import comparison
from kmeans_xp.contract.memory import KMeansMemoryError
from kmeans_xp.contract.registry import list_backends, register_backend

TINY = dict(n=3000, d=3, k=8, iters=4, repeats=2, warmup_iters=1)


class SwappedFeatures(NumpyBackend):
    """The seed's `fit_custom` bugs on purpose: 2 of 3 features, centers' x and y swapped."""
    name = "toy-swapped"

    def assign(self, X, centers, *, xp=None):
        return super().assign(np.ascontiguousarray(X[:, :2]),
                              np.ascontiguousarray(centers[:, [1, 0]]))

    def lloyd_iter(self, X, sample_weight, centers, labels_old, *, xp=None):
        return KMeansBackend.lloyd_iter(self, X, sample_weight, centers, labels_old, xp=xp)


class Exploding(NumpyBackend):
    """Fails inside the fit with whatever `error` is set to."""
    name = "toy-exploding"
    error = RuntimeError("kernel launch failed")

    def lloyd_iter(self, *args, **kwargs):
        raise type(self).error


@pytest.fixture
def toy_backends():
    from kmeans_xp.contract import registry
    for cls in (SwappedFeatures, Exploding):
        register_backend(cls)
    yield
    for cls in (SwappedFeatures, Exploding):
        registry._runtime.pop(cls.name, None)
    list_backends.cache_clear()


def rows_by_name(result):
    return {r["name"]: r for r in result["rows"]}


def test_compare_measures_every_row_with_the_protocol():
    res = bench.compare("numpy,array-api", **TINY)
    rows = rows_by_name(res)
    assert res["schema"] == bench.SCHEMA and res["kind"] == "compare"
    for name in ("numpy", "array-api"):
        r = rows[name]
        assert r["status"] == "ok", r["message"]
        assert 1 <= r["n_iter"] <= TINY["iters"]
        assert len(r["times_per_iter_s"]) == TINY["repeats"]
        assert r["time_per_iter_s"] == pytest.approx(np.median(r["times_per_iter_s"]))
        assert r["pairs_per_s"] == pytest.approx(TINY["n"] * TINY["k"] / r["time_per_iter_s"])
        assert r["end_to_end_s"] >= r["fit_s"] > 0
        assert r["memory_source"].startswith("estimate")
        assert r["agreement"] == pytest.approx(1.0)
    fastest = min(res["rows"], key=lambda r: r["time_per_iter_s"])  # both are CPU rows
    assert res["baseline"]["name"] == fastest["name"]
    assert max(r["speedup"] for r in res["rows"]) == pytest.approx(1.0)
    assert rows["numpy"]["speedup"] == pytest.approx(fastest["time_per_iter_s"]
                                                     / rows["numpy"]["time_per_iter_s"])
    assert {r["library"] for r in res["rows"]} == {"kmeans_xp"}
    assert all(r["timed"] for r in res["rows"])
    assert rows["numpy"]["inertia"] == pytest.approx(rows["array-api"]["inertia"], rel=1e-5)
    json.dumps(res)  # everything in the result is JSON


def test_every_row_gets_the_same_single_init(monkeypatch):
    seen, calls = [], []
    real_init, real_fit = bench.shared_init, bench.BackendEntry.fit
    # compare() looks the init up where it is defined, kmeans_xp.tools.bench.comparison
    monkeypatch.setattr(comparison, "shared_init",
                        lambda X, w: calls.append(1) or real_init(X, w))
    monkeypatch.setattr(bench.BackendEntry, "fit",
                        lambda self, Xb, C, iters: seen.append(bench.fingerprint(C))
                        or real_fit(self, Xb, C, iters))
    res = bench.compare("numpy,array-api", **TINY)
    assert len(calls) == 1
    assert len(seen) == 2 * (1 + TINY["repeats"])  # warm-up + repeats, two rows
    assert set(seen) == {res["inputs"]["init_sha256_16"]}


def test_agreement_is_computed_not_assumed(toy_backends):
    res = bench.compare("numpy,toy-swapped", **TINY)
    rows = rows_by_name(res)
    assert rows["numpy"]["agreement"] == 1.0
    assert rows["toy-swapped"]["status"] == "ok"
    assert rows["toy-swapped"]["agreement"] < 0.9


def test_agreement_without_a_numpy_row_uses_an_untimed_reference(toy_backends):
    rows = rows_by_name(bench.compare("array-api,toy-swapped", **TINY))
    assert rows["array-api"]["agreement"] == pytest.approx(1.0)
    assert rows["toy-swapped"]["agreement"] < 0.9


def test_missing_and_unknown_backends_are_rows():
    missing = [n for n, i in list_backends().items() if not i.available][:1]
    res = bench.compare(",".join(["numpy", "no-such-backend", *missing]), **TINY)
    rows = rows_by_name(res)
    assert rows["numpy"]["status"] == "ok"
    assert rows["no-such-backend"]["status"] == "unavailable"
    assert "known" in rows["no-such-backend"]["message"]
    for name in missing:
        assert rows[name]["status"] == "unavailable" and rows[name]["message"]
    assert "UNAVAILABLE" in bench.format_table(res)


@pytest.mark.parametrize("error, status", [
    (RuntimeError("kernel launch failed"), "error"),
    (KMeansMemoryError("asked 3 GB, 1 GB free"), "oom"),
    (type("OutOfMemoryError", (Exception,), {})("cupy says no"), "oom"),
])
def test_a_failing_backend_is_a_row(toy_backends, monkeypatch, error, status):
    monkeypatch.setattr(Exploding, "error", error)
    rows = rows_by_name(bench.compare("numpy,toy-exploding", **TINY))
    assert rows["numpy"]["status"] == "ok"
    assert rows["toy-exploding"]["status"] == status
    assert str(error) in rows["toy-exploding"]["message"]
    assert rows["toy-exploding"]["speedup"] is None


def test_seed_reference_runs_float64_and_agrees():
    res = bench.compare("numpy", include_seed=True, seed_device="cpu", **TINY)
    seed = rows_by_name(res)["seed-reference[numpy]"]
    assert seed["status"] == "ok", seed["message"]
    assert seed["dtype"] == "float64"
    assert seed["agreement"] > 0.99
    assert seed["memory_estimate_bytes"] >= 2 * TINY["n"] * TINY["k"] * TINY["d"] * 8


def test_seed_reference_oom_under_a_memory_cap_is_a_row():
    res = bench.compare("numpy", include_seed=True, seed_device="cpu", max_memory="600KB",
                        **TINY)
    rows = rows_by_name(res)
    seed = rows["seed-reference[numpy]"]
    assert seed["status"] == "oom"
    assert "Out of memory" in seed["message"] and "(n, k, d)" in seed["message"]
    assert seed["memory_estimate_bytes"] > 600_000
    assert rows["numpy"]["status"] == "ok"  # the chunked backend fits in the same cap


def test_seed_fit_uses_every_feature():
    from kmeans_xp.tools.bench import seed as seed_reference
    from kmeans_xp.testing import asymmetric_data
    X = asymmetric_data(500, 3, 5, seed=3)
    C = X[:5].copy()
    centers, labels, n_iter = seed_reference.fit_xp(X, C, 10)
    d = ((X[:, None, :] - centers[None]) ** 2).sum(-1)
    assert np.array_equal(labels, d.argmin(1))
    assert 1 <= n_iter <= 10


def test_seed_peak_formula_matches_the_measured_h200_numbers():
    from kmeans_xp.tools.bench.seed import peak_bytes
    assert peak_bytes(2_000_000, 200, 3) / 2**30 == pytest.approx(20.9, rel=0.01)
    assert peak_bytes(2_000_000, 500, 3) / 2**30 == pytest.approx(52.2, rel=0.01)


def test_torch_row_runs_or_says_why():
    rows = rows_by_name(bench.compare("numpy", include_torch=True, **TINY))
    torch_row = next(r for n, r in rows.items() if n.startswith("torch-gemm"))
    if importlib.util.find_spec("torch") is None:
        assert torch_row["status"] == "unavailable"
        assert "torch is not installed" in torch_row["message"]
    else:
        assert torch_row["status"] == "ok", torch_row["message"]
        assert torch_row["agreement"] > 0.99


def test_cpu_rows_may_take_fewer_repeats():
    res = bench.compare("numpy", **{**TINY, "repeats": 3, "cpu_repeats": 1})
    assert len(res["rows"][0]["times_per_iter_s"]) == 1
    assert res["inputs"]["cpu_repeats"] == 1


def test_sweep_gives_one_row_per_value_and_backend():
    res = bench.sweep("k", [4, 8, 16], "numpy", **{**TINY, "repeats": 1})
    assert res["kind"] == "sweep" and res["values"] == [4, 8, 16]
    assert [r["value"] for r in res["rows"]] == [4, 8, 16]
    assert all(r["status"] == "ok" for r in res["rows"])
    assert len(res["runs"]) == 3


def test_data_from_a_npy_file(tmp_path):
    X = np.random.default_rng(0).normal(size=(500, 4))
    np.save(tmp_path / "x.npy", X)
    w = bench.Workload(n=300, k=3, data=str(tmp_path / "x.npy"))
    got = bench.make_data(w)
    assert got.shape == (300, 4) and got.dtype == np.float32 and (w.n, w.d) == (300, 4)
    with pytest.raises(FileNotFoundError, match="no such file"):
        bench.make_data(bench.Workload(data=str(tmp_path / "missing.npy")))
    with pytest.raises(ValueError, match=".npy"):
        bench.make_data(bench.Workload(data=str(tmp_path / "x.csv")))
    np.save(tmp_path / "flat.npy", np.arange(10.0))
    with pytest.raises(ValueError, match=r"shape \(10,\)"):
        bench.data_shape(bench.Workload(data=str(tmp_path / "flat.npy")))
    assert bench.data_shape(bench.Workload(n=0, data=str(tmp_path / "x.npy"))) == (500, 4)


def test_more_clusters_than_points_is_said_before_anything_runs():
    with pytest.raises(ValueError, match="at least k points"):
        bench.compare("numpy", **{**TINY, "n": 5, "k": 10})


def test_kmeans_plusplus_shared_init_is_deterministic():
    w = bench.Workload(n=2000, k=7, init="k-means++")
    X = bench.make_data(w)
    a, b = bench.shared_init(X, w), bench.shared_init(X, w)
    assert a.shape == (7, 3) and np.array_equal(a, b)


def test_machine_info_names_cpu_blas_versions_and_date():
    m = bench.machine_info()
    assert m["cpu"]["logical_cores"] >= 1 and m["cpu"]["model"]
    assert isinstance(m["blas"], list) and isinstance(m["gpus"], list)
    assert m["versions"]["numpy"] == np.__version__
    assert m["date"][:2] == "20"


def test_resolve_backends():
    assert bench.resolve_backends("numpy, array-api") == ["numpy", "array-api"]
    assert set(list_backends()) | set(bench.REFERENCES) <= set(bench.resolve_backends("all"))
    assert bench.resolve_backends("sklearn,faiss,torch") == ["scikit-learn", "faiss-cpu",
                                                             "torch-gemm"]
    assert bench.unknown_specs(["numpy", "array-api@cupy", "scikit-learn", "nope",
                                "numpy@nowhere"]) == ["nope", "numpy@nowhere"]
    with pytest.raises(ValueError):
        bench.resolve_backends(" , ")
    # options in brackets keep their commas: one row with two options
    assert bench.resolve_backends("numpy,cupy-fused[precision=fp16,half_kernel=registers]") \
        == ["numpy", "cupy-fused[precision=fp16,half_kernel=registers]"]


def test_the_default_set_leaves_generic_rows_out_and_says_how_to_add_them():
    from kmeans_xp.tools.bench.selection import NOT_DEFAULT
    chosen = bench.select("default")
    assert chosen.specs[0] == "numpy"
    assert not set(bench.GENERIC) & set(chosen.specs)
    skipped = {s["name"]: s for s in chosen.skipped}
    assert "--backends default,array-api" in skipped["array-api"]["how"]
    from kmeans_xp.contract.selection import SPARSE_PATH
    for name in set(SPARSE_PATH.values()):   # sparse-only rows: the workloads are dense
        assert name not in chosen.specs and "sparse" in skipped[name]["reason"]
    for name, info in list_backends().items():
        if name not in bench.GENERIC and name not in SPARSE_PATH.values():
            assert (name in chosen.specs) == info.available
            if not info.available:
                assert skipped[name]["reason"] == info.reason
                assert skipped[name]["gpu"] == info.gpu
                if info.install:
                    assert skipped[name]["how"] in (info.install,
                                                    "run on a machine with a CUDA GPU")
    for ref, (_, module, install) in bench.REFERENCES.items():
        installed = importlib.util.find_spec(module) is not None
        if ref in NOT_DEFAULT:   # (scikit-learn-elkan: for fits to convergence)
            assert ref not in chosen.specs and f"default,{ref}" in skipped[ref]["how"]
            continue
        assert (ref in chosen.specs) == installed
        assert installed or skipped[ref]["how"] == install
    added = bench.select("default,array-api")
    assert "array-api" in added.specs
    assert "array-api" not in {s["name"] for s in added.skipped}


def test_sklearn_row_does_the_same_work_and_agrees():
    pytest.importorskip("sklearn")
    res = bench.compare("numpy,scikit-learn", **TINY)
    row = rows_by_name(res)["scikit-learn"]
    assert row["status"] == "ok", row["message"]
    assert (row["library"], row["device"], row["dtype"]) == ("scikit-learn", "cpu", "float32")
    assert row["agreement"] == 1.0
    assert row["inertia"] == pytest.approx(rows_by_name(res)["numpy"]["inertia"], rel=1e-5)
    assert row["n_iter"] == rows_by_name(res)["numpy"]["n_iter"]
    assert len(row["times_per_iter_s"]) == TINY["repeats"]
    assert "scikit-learn" in bench.select("default").specs


def test_faiss_row_does_the_same_work_and_agrees():
    pytest.importorskip("faiss")
    res = bench.compare("numpy,faiss", **TINY)
    row = rows_by_name(res)["faiss-cpu"]
    assert row["status"] == "ok", row["message"]
    assert (row["library"], row["device"], row["dtype"]) == ("faiss", "cpu", "float32")
    assert row["agreement"] == 1.0
    assert row["inertia"] == pytest.approx(rows_by_name(res)["numpy"]["inertia"], rel=1e-5)
    assert "faiss-cpu" in bench.select("default").specs


def test_faiss_row_counts_the_iterations_it_ran():
    """faiss stops once its objective no longer changes: a fit to convergence reports the
    iterations it ran (before: niter, 100, at 14 run; its time per iteration 7x too low)."""
    pytest.importorskip("faiss")
    res = bench.compare("numpy,faiss", **{**TINY, "iters": 100, "tol": 1e-4})
    rows = rows_by_name(res)
    assert rows["faiss-cpu"]["status"] == "ok", rows["faiss-cpu"]["message"]
    # (the tiny workload converges: faiss stops when no label changes, a few iterations
    # after our tol stops)
    assert rows["numpy"]["n_iter"] < 100 and rows["faiss-cpu"]["n_iter"] < 100


@pytest.mark.parametrize("ref, module", [("scikit-learn", "sklearn"), ("faiss-cpu", "faiss")])
def test_a_missing_reference_library_is_a_row_that_says_how_to_install_it(ref, module,
                                                                           monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == module else real(name, *a))
    row = rows_by_name(bench.compare(f"numpy,{ref}", **TINY))[ref]
    assert row["status"] == "unavailable" and "pip install" in row["message"]
    assert ref not in bench.select("default").specs


# --------------------------------------------------------------------------------------------
# the reference rows ship in the package: an installed wheel runs them


BENCH_DIR = Path(bench.__file__).resolve().parent


@pytest.mark.parametrize("module, names", [
    ("kmeans_xp.tools.bench.seed", ["SeedEntry", "SEED_ROW", "fit_xp", "peak_bytes"]),
    ("kmeans_xp.tools.bench.torch_rows", ["TorchEntry", "TORCH_ROW", "fit_torch", "memory_estimate"]),
])
def test_reference_rows_are_modules_of_the_package(module, names):
    mod = importlib.import_module(module)
    assert Path(mod.__file__).resolve().parent == BENCH_DIR
    assert all(hasattr(mod, name) for name in names)


def test_no_bench_module_reaches_into_the_benchmarks_directory():
    # a wheel holds kmeans_xp/ only: code that loads benchmarks/*.py works from a checkout alone
    offenders = [f"{path.name}:{i}" for path in sorted(BENCH_DIR.rglob("*.py"))
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"\bbenchmarks\b", line)]
    assert offenders == []


def test_every_package_under_kmeans_xp_is_listed_for_the_wheel():
    tomllib = pytest.importorskip("tomllib")
    root = BENCH_DIR.parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join((package, *p.parent.relative_to(root / folder).parts))
             for package, folder in (("kmeans_xp", "kmeans_xp"), ("kmeans_xp_backends", "backends"))
             for p in (root / folder).rglob("__init__.py")}
    assert found <= listed


def test_seed_row_runs_end_to_end_on_numpy():
    from kmeans_xp.tools.bench import protocol, seed
    w = bench.Workload(**{**TINY, "repeats": 1})
    X = bench.make_data(w)
    C = bench.shared_init(X, w)
    row = protocol.measure(seed.SeedEntry("cpu", w), X, C, w)
    assert row.ok, row.message
    assert (row.name, row.device, row.dtype) == ("seed-reference[numpy]", "cpu", "float64")
    centers, labels, n_iter = seed.fit_xp(X.astype(np.float64), C.astype(np.float64), w.iters)
    assert row.n_iter == n_iter and np.array_equal(row.labels, labels)
    assert row.inertia == pytest.approx(protocol.host_inertia(X, centers, labels))



@pytest.mark.parametrize("warmup_iters", [1, 0])
def test_timed_runs_are_not_instrumented_and_the_peak_is_still_measured(warmup_iters):
    """A peak's instrumentation (CuPy's memory hook runs Python at every allocation) stays
    out of the timed fits; the row's peak comes from an untimed run: the warm-up, or one
    after the timed runs."""
    from kmeans_xp.tools.bench import entries, protocol

    class Peaked(entries.BackendEntry):
        def __init__(self, *args):
            super().__init__(*args)
            self.scopes = []

        def measures_peak(self):
            return True

        def memory_scope(self, peak=True):
            self.scopes.append(peak)
            out = {"peak": 123_456_789} if peak else {}
            return contextlib.nullcontext(out)

    w = bench.Workload(**{**TINY, "warmup_iters": warmup_iters})
    X = bench.make_data(w)
    C = bench.shared_init(X, w)
    entry = Peaked("numpy", w)
    row = protocol.measure(entry, X, C, w)
    assert row.ok, row.message
    assert entry.scopes.count(True) == 1 and entry.scopes.count(False) == w.repeats
    assert entry.scopes[0 if warmup_iters else -1] is True
    assert row.peak_memory_bytes == 123_456_789 and row.memory_source == entry.memory_measured
    assert row.memory_report["fit"] == 123_456_789


def test_without_a_warm_up_an_entry_that_measures_no_peak_runs_no_extra_fit(monkeypatch):
    from kmeans_xp.tools.bench import entries, protocol
    w = bench.Workload(**{**TINY, "warmup_iters": 0})
    X = bench.make_data(w)
    C = bench.shared_init(X, w)
    entry = entries.BackendEntry("numpy", w)
    calls = []
    monkeypatch.setattr(entry, "fit", lambda *a, f=entry.fit: calls.append(1) or f(*a))
    row = protocol.measure(entry, X, C, w)
    assert row.ok, row.message
    assert not entry.measures_peak() and len(calls) == w.repeats


# --------------------------------------------------------------------------------------------
# the baseline and the headline: over the FASTEST CPU row, never the slowest


def fake_result(*rows, skipped=()):
    base = dict(status="ok", library="kmeans_xp", agreement=1.0, speedup=None,
                speedup_vs_numpy=None)
    result = {"rows": [{**base, "name": n, "device": dev, "time_per_iter_s": t,
                        "end_to_end_s": 12 * t, **extra} for n, dev, t, extra in rows],
              "skipped": list(skipped)}
    result["baseline"] = bench.summary.add_speedups(result["rows"])
    return result


GPU_MACHINE = [("numpy", "cpu", 0.35, {}),
               ("array-api", "cpu", 7.0, {}),
               ("scikit-learn", "cpu", 0.20, {"library": "scikit-learn"}),
               ("faiss-cpu", "cpu", 0.25, {"library": "faiss"}),
               ("cupy-fused", "gpu", 0.002, {}),
               ("torch-gemm[cuda]", "gpu", 0.001, {"library": "torch"})]


def test_speedups_are_over_the_fastest_cpu_row():
    res = fake_result(*GPU_MACHINE)
    rows = rows_by_name(res)
    assert res["baseline"]["name"] == "scikit-learn"
    assert rows["cupy-fused"]["speedup"] == pytest.approx(100)      # not 3500 (array-api)
    assert rows["numpy"]["speedup"] == pytest.approx(0.2 / 0.35)
    assert rows["cupy-fused"]["speedup_vs_numpy"] == pytest.approx(175)
    assert bench.summary.speedup_label(res) == "x vs scikit-learn"


def test_headline_names_kmeans_xp_best_row_against_the_best_cpu_row():
    text = bench.headline(fake_result(*GPU_MACHINE))
    # kmeans_xp's best row, though torch's is faster: the headline is about this library
    assert text.startswith("cupy-fused (gpu): 2 ms/iteration, 100x vs scikit-learn")
    assert "the fastest CPU row, 200 ms/iteration" in text
    assert "whole fit from host data" in text and "agree 1.0000" in text
    assert "array-api" not in text
    assert bench.no_gpu_note(fake_result(*GPU_MACHINE)) == ""


def test_headline_and_note_on_a_cpu_only_machine():
    skipped = [{"name": n, "reason": "cupy is not installed", "gpu": True,
                "how": "pip install 'kmeans_xp[cuda12]'"} for n in ("cupy-fused", "cupy-chunked")]
    res = fake_result(*GPU_MACHINE[:4], skipped=skipped)
    text = bench.headline(res)
    assert text.startswith("numpy (cpu): 350 ms/iteration, 0.57x vs scikit-learn")
    note = bench.no_gpu_note(res)
    assert note.startswith("No GPU row ran (cupy-fused, cupy-chunked: cupy is not installed; "
                           "to add: pip install 'kmeans_xp[cuda12]')")
    assert note.endswith("CPU against CPU, over scikit-learn, the fastest CPU row.")
    assert "cupy-fused" not in bench.skipped_text(res)  # said once, in the note


def test_headline_when_kmeans_xp_is_the_fastest_cpu_row():
    res = fake_result(("numpy", "cpu", 0.1, {}), ("scikit-learn", "cpu", 0.2,
                                                  {"library": "scikit-learn"}))
    assert bench.headline(res) == ("numpy (cpu): 100 ms/iteration, the fastest CPU row: every "
                                   "speed-up in the table is over it (next: scikit-learn, "
                                   "2.00x slower).")


def test_no_cpu_row_no_speedup_claimed():
    res = fake_result(("cupy-fused", "gpu", 0.002, {}))
    assert res["baseline"] is None and res["rows"][0]["speedup"] is None
    assert "no speed-up is claimed" in bench.headline(res)
    assert bench.summary.speedup_label(res) == "x vs -"


def test_chart_title_says_what_the_speedups_are_over():
    res = fake_result(*GPU_MACHINE)
    assert plot._speedup_caption(res) == ("speed-up: x vs scikit-learn, the fastest CPU row "
                                          "(200 ms/iteration)")


def test_rows_take_backend_options_a_tol_and_threads():
    """Fits to convergence (Workload.tol) on rows held to one thread: kmeans_xp-auto names
    its choice, a backend row takes options in brackets, and the partition is sklearn's."""
    w = bench.Workload(n=3000, d=5, k=7, iters=60, tol=1e-4, threads=1, repeats=1,
                       warmup_iters=1)
    res = bench.compare(["kmeans_xp-auto", "numpy[n_threads=1]", "scikit-learn-elkan"], w)
    rows = {r["name"]: r for r in res["rows"]}
    assert all(r["status"] == "ok" and r["threads"] == 1 for r in rows.values()), rows
    assert rows["kmeans_xp-auto"]["engine"] in ("numpy", "numba")
    assert rows["numpy[n_threads=1]"]["engine"] == "numpy"
    iters = {r["n_iter"] for r in rows.values()}
    assert len(iters) == 1 and iters.pop() < 60          # the same tol rule, converged
    assert rows["scikit-learn-elkan"]["agreement"] == 1.0
    assert res["inputs"]["tol"] == 1e-4 and res["inputs"]["threads"] == 1
    with pytest.raises(ValueError, match="n_threads"):
        bench.check_specs(["numpy[n_threads]"])


def test_a_row_takes_its_input_in_float16_converted_once():
    """`name[input=float16]`: the row's X arrives in float16 (its values the float32 data's,
    rounded), converted once for all its timed fits; another input dtype is refused."""
    from kmeans_xp.tools.bench.entries import BackendEntry
    from kmeans_xp.tools.bench.workload import Workload
    w = Workload(n=100, d=4, k=3)
    entry = BackendEntry("numpy[input=float16]", w)
    entry.check()
    assert "input" not in entry.options   # not handed to the backend
    X = np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32)
    first, again = entry.to_input(X), entry.to_input(X)
    assert first.dtype == np.float16 and np.array_equal(first, X.astype(np.float16))
    assert again is first
    with pytest.raises(ValueError, match="float16, bfloat16"):
        BackendEntry("numpy[input=int8]", w)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    entry = BackendEntry("numpy[input=bfloat16]", w)
    entry.check()
    got = entry.to_input(X)
    assert got.dtype == ml_dtypes.bfloat16 and np.array_equal(got, X.astype(ml_dtypes.bfloat16))
