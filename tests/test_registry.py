"""The backend registry: built-ins as data, entry-point plugins, errors, and "auto"."""
import importlib.util
import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint

import array_api_strict as xps
import numpy as np
import pytest
from kmeans_xp_backends.numpy.backend import NumpyBackend

import kmeans_xp
from kmeans_xp import KMeans, KMeansBackend
from kmeans_xp.contract import registry, selection
from kmeans_xp.testing import asymmetric_data
from tests._helpers import AUTO_CPU

BUILTINS = ["numpy", "numba", "array-api", "cupy-kernels", "cupy-chunked", "cupy-fused", "dask"]
X = asymmetric_data(301, 3, 4, seed=3)


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test sees the registry as the environment makes it, and leaves it so."""
    registry.list_backends.cache_clear()
    yield
    registry._runtime.clear()
    registry.list_backends.cache_clear()


def _has(module):
    return importlib.util.find_spec(module) is not None


def test_list_backends_has_every_builtin():
    infos = kmeans_xp.list_backends()
    assert set(BUILTINS) <= set(infos)
    for name in BUILTINS:
        info = infos[name]
        assert info.name == name and info.provider == "kmeans_xp"
        assert info.target.startswith("kmeans_xp_backends.")
    assert infos["numpy"].available and infos["array-api"].available
    assert infos["numpy"].reason == "" and infos["numpy"].install == ""
    assert {"numpy", "array-api"} <= set(kmeans_xp.available_backends())


@pytest.mark.parametrize("name", ["cupy-kernels", "cupy-chunked", "cupy-fused"])
def test_cupy_backends_listed_unavailable_without_cupy(name):
    if _has("cupy"):
        pytest.skip("checks how a missing CuPy is listed; CuPy is installed here")
    info = kmeans_xp.list_backends()[name]
    assert not info.available and info.gpu
    assert info.reason == "cupy is not installed"
    assert info.install == "pip install 'kmeans_xp[cuda12]' or pip install 'kmeans_xp[cuda13]'"
    assert name not in kmeans_xp.available_backends()


def test_dask_listed_unavailable_without_dask():
    if _has("dask"):
        pytest.skip("checks how a missing dask is listed; dask is installed here")
    info = kmeans_xp.list_backends()["dask"]
    assert not info.available and not info.gpu
    assert "dask" in info.reason and info.install == "pip install 'kmeans_xp[dask]'"


def test_numba_listed_unavailable_without_numba():
    if _has("numba"):
        pytest.skip("checks how a missing numba is listed; numba is installed here")
    info = kmeans_xp.list_backends()["numba"]
    assert not info.available and not info.gpu
    assert info.reason == "numba is not installed"
    assert info.install == "pip install 'kmeans_xp[numba]'"


def test_list_backends_is_cached():
    assert kmeans_xp.list_backends() is kmeans_xp.list_backends()


def test_get_backend_returns_classes():
    from kmeans_xp_backends.array_api.backend import ArrayAPIBackend
    assert kmeans_xp.get_backend("numpy") is NumpyBackend
    assert kmeans_xp.get_backend("array-api") is ArrayAPIBackend
    assert issubclass(NumpyBackend, KMeansBackend)


@pytest.mark.parametrize("bad", ["nope", "NumPy", "", None, 3])
def test_get_backend_unknown(bad):
    with pytest.raises(ValueError) as info:
        kmeans_xp.get_backend(bad)
    msg = str(info.value)
    assert repr(bad) in msg and "Installed backends" in msg and "'numpy'" in msg
    assert "kmeans_xp.backends" in msg  # where plugins come from


def test_get_backend_unavailable_says_what_to_install():
    if _has("cupy"):
        pytest.skip("cupy is installed here")
    with pytest.raises(kmeans_xp.BackendNotAvailableError) as info:
        kmeans_xp.get_backend("cupy-chunked")
    assert "pip install 'kmeans_xp[cuda12]'" in str(info.value)
    assert "Installed backends" in str(info.value)


# -- entry points --------------------------------------------------------------------------
class PluginBackend(NumpyBackend):
    name = "plugin-ok"


class NotABackend:
    name = "plugin-bad-class"


def _fake_entry_points(monkeypatch, *eps):
    eps = list(eps)

    def fake(group=None, name=None):
        assert group == registry.ENTRY_POINT_GROUP
        return [ep for ep in eps if name is None or ep.name == name]

    monkeypatch.setattr(registry, "entry_points", fake)


def _ep(name, value):
    return EntryPoint(name, value, registry.ENTRY_POINT_GROUP)


def test_broken_plugins_warn_and_are_skipped(monkeypatch):
    here = __name__
    _fake_entry_points(
        monkeypatch,
        _ep("plugin-missing", "no_such_module_for_kmeans_xp:Backend"),
        _ep("plugin-bad-attr", f"{here}:DoesNotExist"),
        _ep("plugin-bad-class", f"{here}:NotABackend"),
        _ep("numpy", f"{here}:PluginBackend"),  # clashes with a built-in
        _ep("plugin-ok", f"{here}:PluginBackend"),
    )
    with pytest.warns(RuntimeWarning) as record:
        infos = kmeans_xp.list_backends()
    messages = "\n".join(str(w.message) for w in record)
    for name in ("plugin-missing", "plugin-bad-attr", "plugin-bad-class"):
        assert name not in infos
        assert f"plugin backend {name!r}" in messages
    assert "ModuleNotFoundError" in messages and "not a KMeansBackend subclass" in messages
    assert "clashes" in messages
    assert infos["numpy"].provider == "kmeans_xp"  # the built-in wins
    assert infos["plugin-ok"].available
    assert kmeans_xp.get_backend("plugin-ok") is PluginBackend
    km = KMeans(3, init=X[:3], backend="plugin-ok").fit(X)
    ref = KMeans(3, init=X[:3], backend="numpy").fit(X)
    assert km.backend_ == "plugin-ok"
    np.testing.assert_array_equal(km.labels_, ref.labels_)


PLUGIN_SOURCES = {
    "kxp_exit_plugin": "raise SystemExit(3)\n",
    "kxp_base_plugin": "class Stop(BaseException):\n    pass\nraise Stop('no GPU here')\n",
    "kxp_plugin_a": "from kmeans_xp_backends.numpy.backend import NumpyBackend\n"
                    "class A(NumpyBackend):\n    name = 'plugin-a'\n",
    "kxp_plugin_b": "from kmeans_xp_backends.numpy.backend import NumpyBackend\n"
                    "class B(NumpyBackend):\n    name = 'plugin-b'\n",
}


@pytest.fixture
def plugin_modules(tmp_path, monkeypatch):
    """Importable plugin modules written to tmp_path, dropped from sys.modules afterwards."""
    for module, source in PLUGIN_SOURCES.items():
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for module in PLUGIN_SOURCES:
        sys.modules.pop(module, None)


def _plugin_eps(monkeypatch):
    _fake_entry_points(monkeypatch, _ep("plugin-exit", "kxp_exit_plugin:Backend"),
                       _ep("plugin-base", "kxp_base_plugin:Backend"),
                       _ep("plugin-a", "kxp_plugin_a:A"), _ep("plugin-b", "kxp_plugin_b:B"))


def test_plugin_raising_systemexit_or_baseexception_on_import_is_skipped(
        monkeypatch, plugin_modules):
    _plugin_eps(monkeypatch)
    with pytest.warns(RuntimeWarning) as record:
        infos = kmeans_xp.list_backends()
    messages = "\n".join(str(w.message) for w in record)
    assert "plugin-exit" not in infos and "plugin-base" not in infos
    assert "SystemExit: 3" in messages and "Stop: no GPU here" in messages
    assert infos["plugin-a"].available and infos["numpy"].available


def test_keyboard_interrupt_in_a_plugin_is_not_swallowed(tmp_path, monkeypatch):
    (tmp_path / "kxp_ctrl_c_plugin.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake_entry_points(monkeypatch, _ep("plugin-ctrl-c", "kxp_ctrl_c_plugin:Backend"))
    with pytest.raises(KeyboardInterrupt):
        kmeans_xp.list_backends()
    sys.modules.pop("kxp_ctrl_c_plugin", None)


@pytest.mark.parametrize("name, why", [("plugin-exit", "SystemExit: 3"),
                                       ("plugin-base", "Stop: no GPU here"),
                                       ("plugin-missing", "ModuleNotFoundError")])
def test_naming_a_broken_plugin_says_why_it_failed(monkeypatch, plugin_modules, name, why):
    _plugin_eps(monkeypatch)
    monkeypatch.setattr(registry, "entry_points", _with(
        registry.entry_points, _ep("plugin-missing", "kxp_no_such_module:Backend")))
    with pytest.raises(kmeans_xp.BackendNotAvailableError) as info:
        KMeans(3, backend=name).fit(X)
    msg = str(info.value)
    assert "unknown" not in msg and why in msg and "failed to load" in msg
    assert f"backend {name!r} is not available" in msg
    assert info.value.__cause__ is not None   # the import's own exception, chained


def _with(fake, *more):
    def entry_points(group=None, name=None):
        extra = [ep for ep in more if name is None or ep.name == name]
        return [*fake(group=group, name=name), *extra]
    return entry_points


def test_using_one_plugin_imports_no_other(monkeypatch, plugin_modules):
    _plugin_eps(monkeypatch)
    km = KMeans(3, init=X[:3], backend="plugin-a").fit(X)
    assert km.backend_ == "plugin-a"
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    assert registry.get_backend_info("plugin-a")[0]
    for other in ("kxp_plugin_b", "kxp_exit_plugin", "kxp_base_plugin"):
        assert other not in sys.modules


@pytest.mark.parametrize("typo, meant", [("nunpy", "numpy"), ("NumPy", "numpy"),
                                         ("cupy-fuse", "cupy-fused"), ("Dask", "dask"),
                                         ("plugin-aa", "plugin-a")])
def test_unknown_name_suggests_the_close_ones(monkeypatch, plugin_modules, typo, meant):
    _plugin_eps(monkeypatch)
    with pytest.warns(RuntimeWarning):   # the broken plugins, listed under "Installed"
        with pytest.raises(ValueError) as info:
            kmeans_xp.get_backend(typo)
    msg = str(info.value)
    assert f"unknown backend {typo!r}" in msg and f"Did you mean {meant!r}" in msg
    assert "Installed backends" in msg and "'plugin-a'" in msg


def test_register_backend_at_run_time():
    class Runtime(NumpyBackend):
        name = "runtime-numpy"

    assert kmeans_xp.register_backend(Runtime) is Runtime
    assert kmeans_xp.list_backends()["runtime-numpy"].provider == "runtime"
    km = KMeans(3, init=X[:3], backend="runtime-numpy").fit(X)
    assert km.backend_ == "runtime-numpy"
    np.testing.assert_array_equal(km.predict(X), km.labels_)


def test_register_backend_errors():
    class Clash(NumpyBackend):
        name = "numpy"

    class Nameless(NumpyBackend):
        name = ""

    with pytest.raises(ValueError, match="built-in"):
        kmeans_xp.register_backend(Clash)
    with pytest.raises(TypeError, match="KMeansBackend"):
        kmeans_xp.register_backend(Nameless)
    with pytest.raises(TypeError, match="KMeansBackend"):
        kmeans_xp.register_backend(NotABackend)


# -- choosing a backend ----------------------------------------------------------------------
def test_named_backend_that_cannot_take_input_lists_those_that_would():
    with pytest.raises(ValueError) as info:
        KMeans(3, backend="numpy").fit(xps.asarray(X))
    msg = str(info.value)
    assert "backend 'numpy' cannot take this input" in msg
    assert "array_api_strict" in msg and "Backends that would: ['array-api']" in msg


def test_lists_become_numpy_before_a_backend_is_chosen():
    km = KMeans(3, init=X[:3], backend="array-api").fit(X.tolist())
    assert isinstance(km.labels_, np.ndarray) and km.backend_ == "array-api"
    ref = KMeans(3, init=X[:3], backend="numpy").fit(X)
    np.testing.assert_array_equal(km.labels_, ref.labels_)


def test_auto_records_why():
    km = KMeans(3, random_state=0).fit(X)
    assert km.backend_ == AUTO_CPU  # numba where installed, else numpy
    assert km.backend_reason_.startswith("auto: numpy input")
    km = KMeans(3, random_state=0).fit(xps.asarray(X))
    assert km.backend_ == "array-api"
    assert km.backend_reason_.startswith("auto: array_api_strict input")
    km = KMeans(3, random_state=0).fit(X.tolist())
    assert km.backend_ == AUTO_CPU and "auto:" in km.backend_reason_


def test_auto_for_big_host_input_without_gpu_says_so():
    if kmeans_xp.list_backends()["cupy-fused"].available:
        pytest.skip("a GPU backend is available here")
    big = np.broadcast_to(np.zeros(1, np.float32), (10**6, 3))  # shape only, no memory
    backend, why = selection.select_backend("auto", big, n_clusters=100)
    assert backend.name == ("numba" if importlib.util.find_spec("numba") else "numpy")
    assert "n*k*d" in why and "cupy-fused" in why and "numpy" in why


def test_named_backend_reason():
    km = KMeans(3, random_state=0, backend="array-api").fit(X)
    assert km.backend_ == "array-api" and km.backend_reason_ == "named by the user"


# -- a real plugin distribution, installed with pip ---------------------------------------
PLUGIN_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "kmeans-xp-myplugin"
version = "0.0.1"

[project.entry-points."kmeans_xp.backends"]
my-backend = "myplugin:MyBackend"

[tool.setuptools]
py-modules = ["myplugin"]
"""

PLUGIN_MODULE = """
from kmeans_xp_backends.numpy.backend import NumpyBackend


class MyBackend(NumpyBackend):
    '''The numpy backend under another name: a plugin as a third party would write it.'''
    name = "my-backend"
"""

PLUGIN_CHECK = """
import numpy as np
import kmeans_xp
from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data, check_backend

info = kmeans_xp.list_backends()["my-backend"]
assert info.available and info.provider == "kmeans-xp-myplugin", info
assert info.target == "myplugin:MyBackend", info
cls = kmeans_xp.get_backend("my-backend")
assert cls.__module__ == "myplugin" and cls.name == "my-backend"

X = asymmetric_data(1031, 3, 7, seed=4)
init = X[np.random.default_rng(0).choice(len(X), 7, replace=False)]
got = KMeans(7, init=init, backend="my-backend").fit(X)
ref = KMeans(7, init=init, backend="numpy").fit(X)
assert got.backend_ == "my-backend", got.backend_
assert np.array_equal(got.labels_, ref.labels_)
assert np.array_equal(got.cluster_centers_, ref.cluster_centers_)
assert got.inertia_ == ref.inertia_ and got.n_iter_ == ref.n_iter_
assert np.array_equal(got.predict(X), ref.predict(X))
print("CHECKS", check_backend(cls))
"""


def _can_build_without_isolation():
    """--no-build-isolation builds with this environment's setuptools: it needs bdist_wheel,
    built into setuptools >= 70.1, or the `wheel` package for older ones."""
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or _has("wheel")


def test_plugin_distribution_installed_with_pip(tmp_path):
    assert _can_build_without_isolation(), (
        "this test builds a plugin with pip --no-build-isolation: install setuptools>=70.1 "
        "(or wheel) in the test environment")
    src, site = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    (src / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (src / "myplugin.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "-q", "--target", str(site), str(src)],
        capture_output=True, text=True, check=False, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    assert list(site.glob("kmeans_xp_myplugin-*.dist-info"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run([sys.executable, "-c", PLUGIN_CHECK], capture_output=True, text=True,
                         env=env, cwd=tmp_path, check=False, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert int(run.stdout.split("CHECKS")[-1]) > 10
    # without the plugin on the path the name is unknown, and says so
    bare = subprocess.run(
        [sys.executable, "-c", "import kmeans_xp; kmeans_xp.get_backend('my-backend')"],
        capture_output=True, text=True, cwd=tmp_path, check=False, timeout=120)
    assert bare.returncode != 0 and "unknown backend 'my-backend'" in bare.stderr


def test_cache_clear_rereads_builtins(monkeypatch):
    """Tests (and users who install a library mid-session) refresh with cache_clear()."""
    kmeans_xp.list_backends()
    if importlib.util.find_spec("dask") is None:
        with pytest.raises(kmeans_xp.BackendNotAvailableError):
            kmeans_xp.get_backend("dask")
    monkeypatch.setitem(registry.BUILTIN_BACKENDS, "dask", registry.BuiltinSpec(
        "numpy", "kmeans_xp_backends.numpy.backend:NumpyBackend", "dask", False))
    registry.list_backends.cache_clear()
    assert kmeans_xp.list_backends()["dask"].available
    assert kmeans_xp.get_backend("dask") is NumpyBackend


def test_auto_passes_over_a_backend_the_fit_would_not_fit_in(monkeypatch):
    """backend="auto" treats a backend whose memory check fails (a GPU whose free memory
    cannot hold X and the driver's arrays) like one that refuses the input: the next
    candidate runs the fit; the memory errors are reported when none has room."""
    from kmeans_xp_backends.numpy.backend import NumpyBackend

    from kmeans_xp import KMeans, KMeansMemoryError
    from kmeans_xp.testing import asymmetric_data

    def no_room(self, X, plan, options=None):
        raise KMeansMemoryError("X (9 GB) does not fit on the GPU")

    class Cramped(NumpyBackend):
        name = "cramped"
        check_memory = no_room

    kmeans_xp.register_backend(Cramped)
    monkeypatch.setattr(selection, "AUTO_GPU_FOR_HOST", ("cramped",))
    monkeypatch.setattr(selection, "AUTO_GPU_MIN_WORK", 1)
    monkeypatch.setattr(selection, "AUTO_CPU", ("numpy",))  # (numba would have room too)
    X = asymmetric_data(2001, 3, 5, seed=1)
    km = KMeans(5, random_state=0).fit(X)
    assert km.backend_ == "numpy"
    monkeypatch.setattr(NumpyBackend, "check_memory", no_room)
    with pytest.raises(KMeansMemoryError, match=r"no installed backend has room.*cramped"):
        KMeans(5, random_state=0).fit(X)


def test_a_gpu_backend_without_a_usable_device_says_what_to_check(monkeypatch):
    """CuPy installed, no usable driver or device: the message says so and points at the
    driver, not at pip-installing CuPy again."""
    import types
    monkeypatch.setitem(__import__("sys").modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(registry, "_gpu_present",
                        lambda: (False, "no usable CUDA device (CUDARuntimeError: no driver)"))
    spec = registry.BUILTIN_BACKENDS["cupy-fused"]
    info = registry._builtin_info("cupy-fused", spec)
    assert not info.available
    assert info.reason.startswith("cupy is installed, but there is no usable CUDA device")
    assert "pip install" not in info.install and "driver" in info.install


def test_a_plugin_placement_with_the_one_argument_converts_from_still_works():
    """Placements written before converts_from was given the input (namespace alone) keep
    working: the base class passes X only to those that take it."""
    from kmeans_xp_backends.numpy.backend import NumpyBackend

    from kmeans_xp.contract.backend import Placement

    class OldPlacement(Placement):
        def converts_from(self, namespace):
            return namespace == "list"

    class OldStyle(NumpyBackend):
        name = "old-style"
        placement_class = OldPlacement

    b = OldStyle()
    assert b.reject_reason([[0.0, 1.0]] * 4, n_clusters=2) is None
    assert "not array_api_strict" in (b.reject_reason(
        pytest.importorskip("array_api_strict").asarray([[0.0, 1.0]] * 4), n_clusters=2) or "")


@pytest.mark.parametrize("d,expected", [(3, "cupy-kernels"), (16, "cupy-kernels"),
                                        (64, "cupy-chunked")])
def test_auto_tries_cupy_kernels_before_chunked_for_narrow_x(fake_cupy, monkeypatch, d,
                                                             expected):
    """When cupy-fused does not take X, "auto" goes to cupy-kernels for X of at most 16
    features (direct distances beat a GEMM of K = d there), else to cupy-chunked; host X
    large enough for the GPU too."""
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend

    from kmeans_xp.testing import asymmetric_data
    monkeypatch.setattr(CupyFusedBackend, "reject_reason",
                        lambda self, X, **kw: "refused for this test")
    X = asymmetric_data(4001, d, 5, seed=2)
    for Xin in (fake_cupy.asarray(X), X):
        monkeypatch.setattr(selection, "AUTO_GPU_MIN_WORK", 1)
        inst, why = selection.select_backend("auto", Xin, n_clusters=5)
        assert inst.name == expected, why


def test_auto_takes_numba_once_its_kernels_are_loaded(monkeypatch):
    """In a process where numba's kernels are loaded its first use is paid: `auto` takes it
    for a fit the table would give numpy in a fresh process."""
    if "numba" not in kmeans_xp.available_backends():
        pytest.skip("numba is not installed")
    X = np.zeros((50_000, 64), np.float32)
    assert selection.select_backend("auto", X, n_clusters=8, iterations=5)[0].name == "numpy"
    monkeypatch.setattr(selection, "numba_loaded", lambda: True)
    be, why = selection.select_backend("auto", X, n_clusters=8, iterations=5)
    assert be.name == "numba" and "kernels are loaded" in why


def test_auto_takes_numba_once_the_processs_numpy_fits_would_have_repaid_it():
    """Small fits, each too small to repay numba's first use, go to numpy until their work
    together reaches the table's threshold (the fit's own work counted with it); then
    numba. Only fits count (predict's passes do not), and only those auto gave numpy."""
    from kmeans_xp.contract import cpu_engines
    X = np.zeros((1_000_000, 2), np.float32)
    fit_work = X.shape[0] * 8 * 2 * 5                     # 8e7 a fit, 5 iterations
    assert fit_work < cpu_engines.NARROW_NUMBA_MIN_FIT_WORK <= 4 * fit_work
    assert cpu_engines.choose(*X.shape, 8, iterations=5).order == ("numpy",)
    assert cpu_engines.choose(*X.shape, 8, iterations=5,
                              process_work=3 * fit_work).order == ("numba", "numpy")
    for _ in range(5):   # a predict-like selection (no fit) adds nothing
        assert selection.select_backend("auto", X, n_clusters=8, iterations=5)[0].name == \
            "numpy"
    assert selection.NUMPY_FIT_WORK.total == 0
    got = [selection.select_backend("auto", X, n_clusters=8, iterations=5,
                                    check_memory=True)[0].name for _ in range(4)]
    numba = "numba" in kmeans_xp.available_backends()
    assert got == ["numpy"] * 3 + ["numba" if numba else "numpy"]
    assert selection.NUMPY_FIT_WORK.total == (3 + (not numba)) * fit_work


def test_auto_orders_the_cpu_engines_by_the_table(monkeypatch):
    """numba's narrow kernel (d <= 4) where the whole fit's work repays its first use in a
    process; the numpy backend alone for little work; numba first otherwise, and wherever
    numba's kernels are loaded already (its first use paid)."""
    from kmeans_xp.contract import cpu_engines
    from kmeans_xp.contract.selection import select_backend
    assert cpu_engines.choose(50_000, 64, 8, iterations=5,
                              numba_loaded=True).order == ("numba", "numpy")
    assert cpu_engines.choose(50_000, 3, 8, iterations=300).order == ("numba", "numpy")
    assert cpu_engines.choose(50_000, 3, 8, iterations=5).order == ("numpy",)
    assert cpu_engines.choose(50_000, 64, 8, iterations=300).order == ("numba", "numpy")
    assert cpu_engines.choose(50_000, 64, 8, iterations=5).order == ("numpy",)
    assert cpu_engines.choose(20_000, 64, 32, iterations=300).order == ("numpy",)
    assert cpu_engines.choose(50_000, 64, 64, iterations=1).order == ("numba", "numpy")
    X = np.zeros((50_000, 3), np.float32)
    numba = "numba" in kmeans_xp.available_backends()
    be, why = select_backend("auto", X, n_clusters=8, iterations=300)
    assert be.name == ("numba" if numba else "numpy") and "narrow kernel" in why
    assert why.startswith("auto: numpy input")
    be, why = select_backend("auto", X, n_clusters=8, iterations=5)
    assert be.name == "numpy" and "first use" in why
    # the GPU backends stay ahead of the CPU engines where the work sends X there
    out, _ = cpu_engines.arrange(["cupy-fused", "numba", "numpy"], 50_000, 3, 8, iterations=5)
    assert out == ["cupy-fused", "numpy"]
