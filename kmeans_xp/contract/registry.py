"""Which backends exist and which are installed (which one a fit uses:
`kmeans_xp.contract.selection`).

First-party backends are data (name -> module they need, "import.path:Class", pip extra), so
`import kmeans_xp` imports no CuPy or Dask. Third parties add backends through the entry-point
group ``kmeans_xp.backends``, each imported only when it is named or listed; a plugin that
fails to load warns and is skipped by `list_backends()`, and naming it says why it failed.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.util
import warnings
from importlib.metadata import entry_points
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from typing import Any, NamedTuple

from kmeans_xp.contract.backend import KMeansBackend

ENTRY_POINT_GROUP = "kmeans_xp.backends"
CUDA_EXTRA = "cuda12|cuda13"  # alternatives: one per CUDA major version


class BuiltinSpec(NamedTuple):
    requires: str   # module that must import for the backend to work
    target: str     # "module:Class"
    extra: str      # pip extra that installs `requires`, "a|b" for alternatives ("" if none)
    gpu: bool       # needs a CUDA device


BUILTIN_BACKENDS = {
    "numpy": BuiltinSpec("numpy", "kmeans_xp_backends.numpy.backend:NumpyBackend", "", False),
    "numba": BuiltinSpec("numba", "kmeans_xp_backends.numba.backend:NumbaBackend", "numba", False),
    "array-api": BuiltinSpec("array_api_compat", "kmeans_xp_backends.array_api.backend:ArrayAPIBackend",
                             "", False),
    "cupy-kernels": BuiltinSpec("cupy", "kmeans_xp_backends.cupy.kernels:CupyKernelsBackend",
                                CUDA_EXTRA, True),
    "cupy-chunked": BuiltinSpec("cupy", "kmeans_xp_backends.cupy.chunked:CupyChunkedBackend",
                                CUDA_EXTRA, True),
    "cupy-fused": BuiltinSpec("cupy", "kmeans_xp_backends.cupy.fused:CupyFusedBackend",
                              CUDA_EXTRA, True),
    "dask": BuiltinSpec("dask.array", "kmeans_xp_backends.dask.backend:DaskBackend", "dask", False),
    "scipy-sparse": BuiltinSpec("scipy", "kmeans_xp_backends.numpy.sparse:ScipySparseBackend",
                                "sparse", False),
    "cupy-sparse": BuiltinSpec("cupyx.scipy.sparse",
                               "kmeans_xp_backends.cupy.sparse:CupySparseBackend", CUDA_EXTRA,
                               True),
}

class BackendInfo(NamedTuple):
    name: str
    available: bool
    reason: str        # why not available ("" when it is)
    target: str
    provider: str      # distribution that provides it
    install: str       # what to pip-install to get it ("" when nothing)
    gpu: bool


class BackendNotAvailableError(ImportError):
    """A known backend whose library (or device) is missing."""


_runtime: dict[str, type[KMeansBackend]] = {}


def register_backend(cls: type[KMeansBackend], *,
                     replace: bool = False) -> type[KMeansBackend]:
    """Register a backend class at run time (entry points are the packaged way)."""
    if not (isinstance(cls, type) and issubclass(cls, KMeansBackend)) or not cls.name:
        raise TypeError(f"{cls!r} is not a KMeansBackend subclass with a name")
    if cls.name in BUILTIN_BACKENDS and not replace:
        raise ValueError(f"backend name {cls.name!r} is a built-in; choose another name")
    _runtime[cls.name] = cls
    _cache_clear()
    return cls


@contextlib.contextmanager
def registered(cls: type[KMeansBackend]) -> Iterator[type[KMeansBackend]]:
    """`cls` is what its name resolves to inside the block, then the registry is as it was:
    the class is used even when an installed backend (a built-in, a plugin, an older version
    of it) has the same name."""
    previous = _runtime.get(cls.name)
    _runtime[cls.name] = cls
    _cache_clear()
    try:
        yield cls
    finally:
        if previous is None:
            _runtime.pop(cls.name, None)
        else:
            _runtime[cls.name] = previous
        _cache_clear()


def _gpu_present() -> tuple[bool, str]:
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device, broken install: unusable
        return False, f"no usable CUDA device ({type(exc).__name__}: {exc})"
    return (n > 0, "" if n > 0 else "no CUDA device found")


def _install_hint(extra: str) -> str:
    """A command a user can paste: "pip install 'kmeans_xp[cuda12]'" (or one per alternative)."""
    if not extra:
        return ""
    return " or ".join(f"pip install 'kmeans_xp[{e}]'" for e in extra.split("|"))


def _builtin_info(name: str, spec: BuiltinSpec) -> BackendInfo:
    install = _install_hint(spec.extra)
    module = spec.target.split(":")[0]
    if importlib.util.find_spec(spec.requires.split(".")[0]) is None:
        reason = f"{spec.requires} is not installed"
    elif importlib.util.find_spec(module) is None:
        reason, install = "not built into this version of kmeans_xp", ""
    elif spec.gpu:
        ok, reason = _gpu_present()
        if not ok:  # the library is there: installing it again would not help
            reason = f"{spec.requires} is installed, but there is {reason}"
            install = ("check the NVIDIA driver (nvidia-smi) and that the CuPy wheel matches "
                       "its CUDA version, or use a CPU backend (numpy)")
        else:
            reason = ""
    else:
        reason = ""
    return BackendInfo(name, not reason, reason, spec.target, "kmeans_xp", install, spec.gpu)


def _runtime_info(name: str) -> BackendInfo:
    cls = _runtime[name]
    return BackendInfo(name, True, "", f"{cls.__module__}:{cls.__qualname__}", "runtime", "",
                       cls.device == "gpu")


def _info(name: str) -> BackendInfo | None:
    """BackendInfo of one backend, or None if unknown. A built-in is looked at alone, so that
    using the numpy backend never probes for a GPU (which would import CuPy); a plugin too,
    so that using one plugin never imports the others."""
    if name in _runtime:
        return _runtime_info(name)
    if name in BUILTIN_BACKENDS:
        # not cached apart from list_backends: its cache_clear() must re-read built-ins too
        # (tests fake a GPU that way); the look-up is a couple of find_spec calls
        return _builtin_info(name, BUILTIN_BACKENDS[name])
    ep = _entry_point(name)
    return None if ep is None else _plugin(ep).info


_entry_points: dict[str, EntryPoint | None] = {}  # name -> its entry point or None: a scan of every distribution is ~10 ms


def _entry_point(name: str) -> EntryPoint | None:
    """The plugin entry point called `name` (the first one), or None; cached by name."""
    if name not in _entry_points:
        _entry_points[name] = next(iter(entry_points(group=ENTRY_POINT_GROUP, name=name)), None)
    return _entry_points[name]


class _Plugin(NamedTuple):
    info: BackendInfo
    cls: type[KMeansBackend] | None  # None when it failed to load
    error: BaseException | None


_plugins: dict[tuple[str, str, str], _Plugin] = {}  # (name, "module:Class", provider) -> _Plugin: each plugin imported once


def _plugin(ep: EntryPoint) -> _Plugin:
    """Load one entry point (once). Any failure short of KeyboardInterrupt, SystemExit from
    a module's import included, is kept as the plugin's reason: a broken plugin must break
    neither `list_backends()` nor a fit on another backend (xarray's plugins do the same)."""
    provider = getattr(getattr(ep, "dist", None), "name", "?")
    key = (ep.name, ep.value, provider)
    got = _plugins.get(key)
    if got is not None:
        return got
    try:
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, KMeansBackend)):
            raise TypeError(f"{ep.value} is not a KMeansBackend subclass")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit on import too (see above)
        reason = (f"its plugin ({ep.value}, from {provider}) failed to load: "
                  f"{type(exc).__name__}: {exc}")
        got = _Plugin(BackendInfo(ep.name, False, reason, ep.value, provider,
                                  f"fix or reinstall {provider}", False), None, exc)
    else:
        got = _Plugin(BackendInfo(ep.name, True, "", ep.value, provider, "",
                                  getattr(cls, "device", "cpu") == "gpu"), cls, None)
    _plugins[key] = got
    return got


@functools.lru_cache(maxsize=1)
def _all_backends() -> dict[str, BackendInfo]:
    infos = {name: _builtin_info(name, spec) for name, spec in BUILTIN_BACKENDS.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        provider = getattr(getattr(ep, "dist", None), "name", "?")
        if ep.name in infos:
            warnings.warn(f"kmeans_xp: plugin backend {ep.name!r} from {provider} clashes with "
                          f"a backend of the same name and is skipped", RuntimeWarning, 3)
            continue
        info = _plugin(ep).info
        if not info.available:
            warnings.warn(f"kmeans_xp: plugin backend {ep.name!r} is skipped: {info.reason}",
                          RuntimeWarning, 3)
            continue
        infos[ep.name] = info
    for name in _runtime:
        infos[name] = _runtime_info(name)
    return infos


def list_backends() -> dict[str, BackendInfo]:
    """name -> BackendInfo for built-in, plugin and runtime-registered backends (cached;
    `list_backends.cache_clear()` looks again). Every plugin is imported here; a broken one
    warns and is skipped."""
    return _all_backends()


def _cache_clear() -> None:
    _plugins.clear()
    _entry_points.clear()
    _all_backends.cache_clear()


list_backends.cache_clear = _cache_clear  # type: ignore[attr-defined]


def load_target(target: str) -> Any:
    """The object an "import.path:Name" target names (imported now)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_backend_info(name: object) -> tuple[bool, BackendInfo] | None:
    """(available, BackendInfo) of a backend name, or None when the name is unknown."""
    info = _info(name) if isinstance(name, str) else None
    return None if info is None else (info.available, info)


def available_backends() -> list[str]:
    return [name for name, info in list_backends().items() if info.available]


def get_backend(name: str) -> type[KMeansBackend]:
    """The backend class registered as `name`; errors say what is installed and what to do."""
    info = _info(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(_unknown_message(name))
    if not info.available:
        todo = f" Install it with: {info.install}." if info.install.startswith("pip") else (
            f" To do: {info.install}." if info.install else "")
        failed = _failed_plugin(name)
        raise BackendNotAvailableError(
            f"backend {name!r} is not available: {info.reason}.{todo} Installed backends: "
            f"{available_backends()}.") from failed
    if name in _runtime:
        return _runtime[name]
    if info.provider == "kmeans_xp":
        return load_target(info.target)  # type: ignore[no-any-return]
    ep = _entry_point(name)
    if ep is not None:  # available: it loaded, so its class is there
        return _plugin(ep).cls  # type: ignore[return-value]
    raise ValueError(f"backend {name!r} vanished from the entry points; reinstall its package")


def _failed_plugin(name: str) -> BaseException | None:
    """The exception a plugin's import raised, or None (chained to the error naming it)."""
    ep = _entry_point(name)
    return None if ep is None else _plugin(ep).error


def _unknown_message(name: object) -> str:
    """What an unknown name gets: the close names (case aside, from the names alone), what is
    installed, and where plugins come from."""
    known = sorted({*BUILTIN_BACKENDS, *_runtime,
                    *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
    close = []
    if isinstance(name, str):
        lowered = {k.lower(): k for k in known}
        close = [lowered[m] for m in difflib.get_close_matches(name.lower(), lowered, n=3,
                                                                cutoff=0.6)]
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return (f"unknown backend {name!r}.{hint} Installed backends: {available_backends()}; all "
            f"known: {known}. Third-party backends register under the entry-point group "
            f"{ENTRY_POINT_GROUP!r}.")


