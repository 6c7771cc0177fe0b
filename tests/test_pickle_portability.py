"""A pickled model holds its backend's name only (R7): fitted with numba, named or picked by
"auto", it loads and predicts where numba is not installed, with NumPy."""
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kmeans_xp import KMeans, MiniBatchKMeans, SphericalKMeans

pytest.importorskip("numba")

#: run in a fresh interpreter where `import numba` fails, as on a machine without it
WITHOUT_NUMBA = textwrap.dedent("""
    import pickle, sys, warnings
    import numpy as np
    sys.modules["numba"] = None   # import numba raises ImportError
    model, X = pickle.load(sys.stdin.buffer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        labels = model.predict(X)
        score = model.score(X)
        distances = model.transform(X)
    assert "numba" not in sys.modules or sys.modules["numba"] is None
    pickle.dump((labels, score, distances, [str(w.message) for w in caught]),
                sys.stdout.buffer)
""")


def _X():
    rng = np.random.default_rng(5)
    return rng.normal(size=(301, 3)) * [1, 2, 3] + [0, 5, -5]


@pytest.mark.parametrize("how", ["named", "auto"])
@pytest.mark.parametrize("cls", [KMeans, MiniBatchKMeans, SphericalKMeans],
                         ids=lambda c: c.__name__)
def test_numba_model_predicts_without_numba(cls, how, monkeypatch):
    import kmeans_xp.contract.cpu_engines as cpu_engines
    monkeypatch.setattr(cpu_engines, "AUTO_NUMBA_MIN_WORK", 0)   # "auto" picks numba here
    X = _X()
    model = cls(3, random_state=0, backend="numba" if how == "named" else "auto").fit(X)
    assert model.backend_ == "numba"
    blob = pickle.dumps((model, X))
    assert b"kmeans_xp_backends" not in blob and b"NumbaBackend" not in blob
    out = subprocess.run([sys.executable, "-c", WITHOUT_NUMBA], input=blob,
                         capture_output=True, check=False)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    labels, score, distances, warned = pickle.loads(out.stdout)
    np.testing.assert_array_equal(labels, model.labels_)
    assert score == pytest.approx(model.score(X), rel=1e-9)
    np.testing.assert_allclose(distances, model.transform(X), rtol=1e-9, atol=1e-12)
    named = [w for w in warned if "not available here" in w]
    assert len(named) == (1 if how == "named" else 0), warned
