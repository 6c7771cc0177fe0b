"""`import kmeans_xp` and a NumPy fit import no CuPy, Dask, torch, matplotlib or sklearn; numba
only when a fit runs on the numba backend, and estimating its memory imports none of it."""
import json
import os
import subprocess
import sys
import textwrap

from tests._helpers import AUTO_CPU

HEAVY = ["cupy", "dask", "torch", "matplotlib", "sklearn", "jax"]

FIT = """
import json, sys
import numpy as np
import kmeans_xp
loaded = {"import": sorted(m for m in HEAVY + ["numba"] if m in sys.modules)}
kmeans_xp.estimate_memory(10**6, 3, 200, dtype="float32", backend="numba")
loaded["estimate"] = sorted(m for m in HEAVY + ["numba"] if m in sys.modules)
X = np.random.default_rng(0).normal(size=(503, 3)).astype(np.float32)
km = kmeans_xp.KMeans(3, random_state=0).fit(X)
km.predict(X); km.transform(X); km.score(X)
kmeans_xp.KMeans(3, backend="numpy", random_state=0).fit(X.tolist())
kmeans_xp.KMeans(3, backend="array-api", random_state=0).fit(X)
kmeans_xp.estimate_memory(10**6, 3, 200, dtype="float32", backend="numpy")
loaded["fit"] = sorted(m for m in HEAVY if m in sys.modules)
loaded["backend"] = km.backend_
"""


def _run(code, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    out = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + code],
                         capture_output=True, text=True, env=env, check=False, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_and_numpy_fit_stay_light():
    loaded = _run(FIT + "print(json.dumps(loaded))")
    assert loaded["backend"] == AUTO_CPU  # numba where installed, else numpy
    assert loaded["import"] == [] and loaded["estimate"] == [], loaded
    assert loaded["fit"] == [], loaded


def test_stays_light_even_where_heavy_libraries_and_gpu_backends_are_installed(tmp_path):
    """Fake heavy packages on the path, and GPU built-ins that look installed: a NumPy fit
    must still import none of them (no GPU probe, no plugin-free import of dask/sklearn)."""
    for mod in HEAVY:
        pkg = tmp_path / mod
        pkg.mkdir()
        # array classes too, since array_api_compat looks them up once a module is loaded
        (pkg / "__init__.py").write_text("class ndarray: pass\nclass Tensor: pass\n"
                                         "class Array: pass\n")
    with open(tmp_path / "cupy" / "__init__.py", "a") as f:
        f.write("from . import cuda\n")
    (tmp_path / "cupy" / "cuda.py").write_text(textwrap.dedent("""
        class runtime:
            @staticmethod
            def getDeviceCount():
                return 1
    """))
    code = textwrap.dedent("""
        from kmeans_xp.contract import registry
        # GPU built-ins whose modules exist: only their GPU probe (importing cupy) stands
        # between them and being available
        for name in ("cupy-kernels", "cupy-chunked", "cupy-fused"):
            spec = registry.BUILTIN_BACKENDS[name]
            registry.BUILTIN_BACKENDS[name] = spec._replace(
                target="kmeans_xp_backends.numpy.backend:NumpyBackend")
    """) + FIT + textwrap.dedent("""
        infos = kmeans_xp.list_backends()
        loaded["listed"] = sorted(m for m in HEAVY if m in sys.modules)
        loaded["cupy_fused_available"] = infos["cupy-fused"].available
        print(json.dumps(loaded))
    """)
    loaded = _run(code, {"PYTHONPATH": str(tmp_path)})
    assert loaded["import"] == [] and loaded["fit"] == [], loaded
    # the fakes work: listing every backend does probe the GPU, importing (fake) cupy
    assert loaded["listed"] == ["cupy"] and loaded["cupy_fused_available"] is True
