"""Which backends exist, which are installed, and which one a fit uses.

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
import sys
import warnings
from importlib.metadata import entry_points
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from typing import Any, NamedTuple

from kmeans_xp.contract.backend import KMeansBackend
from kmeans_xp.contract.memory import (
    KMeansMemoryError,
)

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

#: what "auto" tries on the CPU, in order: the compiled numba backend where numba is installed
AUTO_CPU = ("numba", "numpy")
#: what "auto" tries, in order, for each input namespace
AUTO_PREFERENCE = {
    "numpy": AUTO_CPU,
    "cupy": ("cupy-fused", "cupy-chunked", "cupy-kernels", "array-api"),
    "dask.array": ("dask",),
    "scipy.sparse": ("scipy-sparse",),
    "cupyx.scipy.sparse": ("cupy-sparse",),
}
#: a dense backend named for sparse X computes it on its family's sparse path (docs/sparse.md)
SPARSE_PATH = {**dict.fromkeys(("numpy", "numba", "array-api"), "scipy-sparse"),
               **dict.fromkeys(("cupy-kernels", "cupy-chunked", "cupy-fused"), "cupy-sparse")}
#: torch and JAX input under "auto", by the array's device type (shared with the backend
#: through DLPack); other devices (mps, xpu, tpu) get the array-api backend
AUTO_DLPACK_PREFERENCE = {
    "cuda": (*AUTO_PREFERENCE["cupy"],),
    "cpu": (*AUTO_CPU, "array-api"),
}
#: NumPy input at least this large (n * k * d) goes to a GPU backend under "auto" when one works
AUTO_GPU_MIN_WORK = 2 * 10**8
#: scipy.sparse input with at least this many stored values times k goes to the GPU's sparse
#: path under "auto" where one works (the dense rule's AUTO_GPU_MIN_WORK, on stored values)
AUTO_GPU_SPARSE_MIN_WORK = AUTO_GPU_MIN_WORK
AUTO_GPU_FOR_HOST = ("cupy-fused", "cupy-chunked", "cupy-kernels")
#: X with at most this many features goes to cupy-kernels before cupy-chunked (when cupy-fused
#: does not take it): direct distances beat a cuBLAS GEMM of K = d there, and at d=128 the
#: GEMM wins (figures: W1, W3, W5 rows of benchmarks/results/<kind>.md); 16 is where
#: cupy-fused's direct small-d path ends, the crossover between is not measured.
AUTO_KERNELS_MAX_D = 16


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


def _narrow_first(candidates: list[str], X: Any) -> list[str]:
    """cupy-kernels ahead of cupy-chunked for X of at most AUTO_KERNELS_MAX_D features."""
    shape = getattr(X, "shape", None)
    d = shape[1] if shape is not None and len(shape) == 2 else None
    if d is None or d > AUTO_KERNELS_MAX_D or not {"cupy-kernels", "cupy-chunked"} <= set(
            candidates):
        return candidates
    i, j = candidates.index("cupy-chunked"), candidates.index("cupy-kernels")
    if j > i:
        candidates[i], candidates[j] = candidates[j], candidates[i]
    return candidates


def select_backend(backend: str, X: Any, *, n_clusters: int, sample_weight: Any = None,
                   backend_options: dict[str, Any] | None = None,
                   max_memory: int | str = "auto", check_memory: bool = False,
                    copy_x: bool = True, precision: str = "exact",
                    iterations: int = 1) -> tuple[KMeansBackend, str]:
    """(backend instance, why it was chosen) for this input; never a silent fallback. With
    check_memory (a fit), the chosen backend's `check_memory` passed too, given the fit's
    plan: "auto" passes over a backend the fit would not fit in, a named one raises its
    KMeansMemoryError. copy_x: whether the fit centers a copy of X (the plan carries it to
    the check, which counts it). precision: the fit's compute precision (resolved,
    `contract.precision.resolve`); a backend that does not declare it does not take X."""
    from kmeans_xp.contract.namespaces import DLPACK_FOREIGN, foreign_device_type, namespace_name

    options = dict(backend_options or {})
    named = None
    if namespace_name(X) in ("scipy.sparse", "cupyx.scipy.sparse") and backend in SPARSE_PATH:
        # (its options are the dense kernels'; the sparse path takes none of them)
        named, backend, options = backend, SPARSE_PATH[backend], {}
    if backend != "auto":
        cls = get_backend(backend)
        inst = cls(max_memory=max_memory, **options)
        reason = _precise_reject_reason(inst, X, n_clusters, sample_weight, precision)
        if reason is not None:
            takers = [n for n in available_backends() if n != backend and _takes(
                n, X, n_clusters, sample_weight, precision)]
            raise ValueError(f"backend {backend!r} cannot take this input: {reason}. Backends "
                             f"that would: {takers or 'none installed'}.")
        if check_memory:
            inst = _checked_for_fit(inst, X, n_clusters, copy_x, sample_weight, options)
            inst.use_precision(precision)   # (a backend sized anew is a new instance)
        if named is not None:
            return inst, f"named by the user: {named!r}, whose sparse X goes to {backend!r}"
        return inst, "named by the user"

    ns = namespace_name(X)
    candidates = list(AUTO_PREFERENCE.get(ns, ("array-api",)))
    why = f"{ns} input"
    if ns in DLPACK_FOREIGN:
        dev = foreign_device_type(X)
        candidates = list(AUTO_DLPACK_PREFERENCE.get(dev, ("array-api",)))
        why = f"{ns} input on {dev}"
    if ns == "scipy.sparse" and X.nnz * n_clusters >= AUTO_GPU_SPARSE_MIN_WORK:
        candidates = ["cupy-sparse", "scipy-sparse"]
        why = f"scipy.sparse input with nnz*k = {X.nnz * n_clusters:.2g}"
    if ns in ("numpy", "list"):
        n, d = (len(X), len(X[0]) if len(X) else 0) if ns == "list" else X.shape[:2]
        if n * n_clusters * max(d, 1) >= AUTO_GPU_MIN_WORK:
            candidates = [*AUTO_GPU_FOR_HOST, *AUTO_CPU]
            why = f"NumPy input with n*k*d = {n * n_clusters * d:.2g} >= {AUTO_GPU_MIN_WORK:.0e}"
        else:
            candidates = list(AUTO_CPU)
    candidates, engine_why = _cpu_engines(candidates, X, ns, n_clusters, iterations,
                                          options.get("n_threads"))
    candidates = _narrow_first(candidates, X)
    if engine_why:
        why = f"{why}; {engine_why}"
    reasons, short_of_memory = [], None
    for name in candidates:  # only these are looked at: a NumPy fit never probes a GPU
        reason = _reject_reason(name, X, n_clusters, sample_weight, precision)
        if reason is None:
            inst = get_backend(name)(max_memory=max_memory, **options)
            inst.use_precision(precision)
            try:  # a backend the fit would not fit in is passed over, as one that refuses
                if check_memory:
                    inst = _checked_for_fit(inst, X, n_clusters, copy_x, sample_weight,
                                            options)
                    inst.use_precision(precision)
            except KMeansMemoryError as exc:
                reasons.append(f"{name}: {exc}")
                short_of_memory = exc
                continue
            return inst, f"auto: {why}; first of {candidates} installed that takes it"
        reasons.append(f"{name}: {reason}")
    if short_of_memory is not None:
        if len(reasons) == 1:
            raise short_of_memory
        raise KMeansMemoryError(f"no installed backend has room for this fit: "
                                f"{'; '.join(reasons)}") from short_of_memory
    raise ValueError(f"no installed backend takes this {ns} input ({'; '.join(reasons)}). "
                     f"Installed: {available_backends()}.")


def _checked_for_fit(inst: KMeansBackend, X: Any, n_clusters: int, copy_x: bool,
                     sample_weight: Any, options: Any) -> KMeansBackend:
    """The backend for a fit of X: sized to its share of max_memory beside the driver's arrays
    (`fitmemory.sized_for_fit`; a lazy X is left to its backend), then its own memory check
    passed; raises KMeansMemoryError."""
    from kmeans_xp.contract.fitmemory import sized_for_fit
    from kmeans_xp.contract.namespaces import namespace_name
    from kmeans_xp.contract.rows import is_memmap

    # (a memmap on the host is centered block by block as it is read: no centered copy)
    copy_x = copy_x and not (inst.device == "cpu" and is_memmap(X))
    plan = inst.plan(X, n_clusters, copy_x=copy_x, weighted=sample_weight is not None)
    if namespace_name(X) != "dask.array":
        inst = sized_for_fit(inst, plan, options)
    inst.check_memory(X, plan, options)
    return inst


#: the numba backend's compiled-kernel module: once imported, numba's first use is paid
NUMBA_KERNELS = "kmeans_xp_backends.numba.kernels"


def numba_loaded() -> bool:
    """Whether numba's kernels are loaded in this process (a name looked up, not imported):
    `auto` then takes numba for any fit (`cpu_engines`' first row)."""
    return NUMBA_KERNELS in sys.modules


def _cpu_engines(candidates: list[str], X: Any, ns: str, n_clusters: int, iterations: int,
                 threads: Any) -> tuple[list[str], str]:
    """The CPU engines among the candidates in `cpu_engines.CPU_ENGINES`' order for X's
    shape, and the row's reason ("" where X has no 2-D shape)."""
    from kmeans_xp.contract import cpu_engines
    from kmeans_xp.contract.chunks import usable_cores

    if not {"numba", "numpy"} & set(candidates):
        return candidates, ""
    if ns == "list":
        n, d = len(X), len(X[0]) if len(X) and hasattr(X[0], "__len__") else 1
    else:
        shape = tuple(getattr(X, "shape", ()))
        if len(shape) != 2:
            return candidates, ""
        n, d = shape
    loaded = numba_loaded()
    return cpu_engines.arrange(candidates, n, d, n_clusters, iterations=iterations,
                               threads=threads or usable_cores(),
                               numba_loaded=loaded)


def _reject_reason(name: str, X: Any, n_clusters: int, sample_weight: Any,
                   precision: str = "exact") -> str | None:
    """None when backend `name` is installed and takes X at `precision`, else why not (a
    sentence)."""
    info = _info(name)
    if info is None or not info.available:
        return "not installed" if info is None else info.reason
    try:
        return _precise_reject_reason(get_backend(name)(), X, n_clusters, sample_weight,
                                      precision)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot even start does not take X
        return f"it failed to start ({type(exc).__name__}: {exc})"


def _precise_reject_reason(inst: KMeansBackend, X: Any, n_clusters: int, sample_weight: Any,
                           precision: str) -> str | None:
    """The backend's reject_reason once set to compute at `precision` (its kernels may not
    run that precision on this device), or why it takes no fit at that precision."""
    from kmeans_xp.contract.precision import unsupported_reason

    reason = unsupported_reason(type(inst), precision)
    if reason is not None:
        return reason
    inst.use_precision(precision)
    return inst.reject_reason(X, n_clusters=n_clusters, sample_weight=sample_weight)


def _takes(name: str, X: Any, n_clusters: int, sample_weight: Any,
           precision: str = "exact") -> bool:
    return _reject_reason(name, X, n_clusters, sample_weight, precision) is None
