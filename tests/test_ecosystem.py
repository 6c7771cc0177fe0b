"""A good citizen: scikit-learn's parameters, logging instead of print, progress bars."""
import logging

import numpy as np
import pytest

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data

X = asymmetric_data(2000, 3, 5, seed=0)


def test_algorithm_lloyd_and_elkan_give_the_same_fit():
    km = KMeans(5, algorithm="lloyd", random_state=0, backend="numpy").fit(X)
    assert km.get_params()["algorithm"] == "lloyd"
    elkan = KMeans(5, algorithm="elkan", random_state=0, backend="numpy").fit(X)
    assert (elkan.labels_ == km.labels_).all() and elkan.n_iter_ == km.n_iter_
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


def test_verbose_shows_init_progress_at_a_terminal_only(capsys, monkeypatch):
    import io
    import sys
    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    KMeans(5, random_state=0, max_iter=2, verbose=1, backend="numpy").fit(X)
    assert "k-means++" not in capsys.readouterr().err  # a pipe, a log: lines, no bar
    monkeypatch.setattr(sys, "stderr", Terminal())
    KMeans(5, random_state=0, max_iter=2, verbose=1, backend="numpy").fit(X)
    assert "k-means++" in sys.stderr.getvalue()


def _frame():
    pd = pytest.importorskip("pandas")
    import numpy as np
    return pd, pd.DataFrame(np.asarray(X), columns=["x", "y", "z"])


def test_feature_names_in_and_out():
    pd, df = _frame()
    km = KMeans(5, random_state=0, backend="numpy").fit(df)
    assert list(km.feature_names_in_) == ["x", "y", "z"]
    assert list(km.get_feature_names_out()) == [f"kmeans{i}" for i in range(5)]
    with pytest.raises(ValueError, match="same order"):
        km.predict(df[["y", "x", "z"]])
    with pytest.raises(ValueError, match="unseen at fit time"):
        km.predict(df.rename(columns={"z": "w"}))
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        km.predict(X)
    plain = KMeans(5, random_state=0, backend="numpy").fit(X)
    assert not hasattr(plain, "feature_names_in_")
    with pytest.warns(UserWarning, match="fitted without feature names"):
        plain.predict(df)


def test_pipeline_set_output_pandas():
    pd, df = _frame()
    pipeline = pytest.importorskip("sklearn.pipeline")
    pre = pytest.importorskip("sklearn.preprocessing")
    pipe = pipeline.make_pipeline(pre.StandardScaler(), KMeans(5, random_state=0))
    out = pipe.set_output(transform="pandas").fit_transform(df)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == [f"kmeans{i}" for i in range(5)]
    assert out.index.equals(df.index)


def test_to_sklearn_predicts_the_same_and_exports_to_onnx():
    import numpy as np
    km = KMeans(5, random_state=0, backend="numpy").fit(X.astype(np.float32))
    sk = km.to_sklearn()
    np.testing.assert_array_equal(sk.predict(X.astype(np.float32)), km.labels_)
    skl2onnx = pytest.importorskip("skl2onnx")
    ort = pytest.importorskip("onnxruntime")
    from skl2onnx.common.data_types import FloatTensorType
    model = skl2onnx.convert_sklearn(sk, initial_types=[("X", FloatTensorType([None, 3]))])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    labels = sess.run(None, {"X": X.astype(np.float32)})[0]
    np.testing.assert_array_equal(labels, km.labels_)


def test_pickle_holds_host_copies_and_predicts_without_the_fit_backend(monkeypatch):
    """A model fitted on a device (here: a fake device namespace, array-api-strict) pickles
    NumPy copies; unpickled where the fit's backend is missing, predict picks one."""
    import pickle

    import array_api_strict as xps
    import numpy as np

    from kmeans_xp.contract import registry
    km = KMeans(5, random_state=0, backend="array-api").fit(xps.asarray(X))
    km2 = pickle.loads(pickle.dumps(km))
    assert type(km2.cluster_centers_) is np.ndarray and type(km2.labels_) is np.ndarray
    real = registry.get_backend_info
    monkeypatch.setattr("kmeans_xp.estimators.predicting.get_backend_info",
                        lambda name: (False, None) if name == "array-api" else real(name))
    np.testing.assert_array_equal(km2.predict(X), np.from_dlpack(km.labels_))


@pytest.mark.gpu
def test_model_fitted_on_the_gpu_unpickles_and_predicts_without_cupy(tmp_path):
    """Fitted by cupy-fused on CuPy input; unpickled in a process where CuPy cannot be
    imported, it predicts NumPy input with the fit's labels."""
    import pickle
    import subprocess
    import sys

    cp = pytest.importorskip("cupy")
    X = asymmetric_data(5003, 3, 9, dtype=np.float32, seed=12)
    km = KMeans(9, backend="cupy-fused", random_state=0).fit(cp.asarray(X))
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(km))
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "labels.npy", cp.asnumpy(km.labels_))
    code = (
        "import sys, pickle, numpy as np\n"
        "sys.modules['cupy'] = None  # import cupy fails, as where it is not installed\n"
        f"km = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        f"X = np.load({str(tmp_path / 'X.npy')!r})\n"
        "assert isinstance(km.cluster_centers_, np.ndarray)\n"
        "labels = km.predict(X)\n"
        f"assert (labels == np.load({str(tmp_path / 'labels.npy')!r})).all()\n"
        "print('ok', type(labels).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok ndarray" in out.stdout, out.stderr
