"""Which backend a fit uses: a named one, checked against its input (sparse X goes to its
family's sparse path), or `auto`'s choice, by the tables here, from the input's namespace,
size and device, then `cpu_engines`' table for the CPU engines; a backend that refuses the
input, or that the fit would not fit in, is passed over, and the reason says which was
chosen and why. The backends themselves (built-in, plugins, registered at run time) are
`kmeans_xp.contract.registry`'s.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

from kmeans_xp.contract.backend import KMeansBackend
from kmeans_xp.contract.memory import KMeansMemoryError
from kmeans_xp.contract.registry import available_backends, get_backend, get_backend_info

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
        n, d = _rows_features(X, ns) or (0, 0)
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
            if name == "numpy" and check_memory and ns in ("numpy", "list"):
                NUMPY_FIT_WORK.add(_fit_work(X, ns, n_clusters, iterations))
            return inst, f"auto: {why}; first of {candidates} installed that takes it"
        reasons.append(f"{name}: {reason}")
    if short_of_memory is not None:
        if len(reasons) == 1:
            raise short_of_memory
        raise KMeansMemoryError(f"no installed backend has room for this fit: "
                                f"{'; '.join(reasons)}") from short_of_memory
    raise ValueError(f"no installed backend takes this {ns} input ({'; '.join(reasons)}). "
                     f"Installed: {available_backends()}.")


def _rows_features(X: Any, ns: str) -> tuple[int, int] | None:
    """(n, d) of X, a list of rows (d 1 for a list of numbers) or an array; None where X has
    no 2-D shape."""
    if ns == "list":
        return len(X), len(X[0]) if len(X) and hasattr(X[0], "__len__") else 1
    shape = tuple(getattr(X, "shape", ()))
    return shape if len(shape) == 2 else None


def _fit_work(X: Any, ns: str, n_clusters: int, iterations: int) -> int:
    """n * k * d * iterations of a fit of X (NumPy array or list of rows)."""
    n, d = _rows_features(X, ns) or (0, 0)
    return n * n_clusters * max(d, 1) * max(1, iterations)


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


class FitWork:
    """The whole-fit work (n * k * d * iterations) of the fits `auto` gave the numpy backend
    in this process (`cpu_engines.Query.process_work`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.total = 0

    def add(self, work: int) -> None:
        with self._lock:
            self.total += int(work)


#: this process's: tests make it a fresh one each (tests/conftest.py)
NUMPY_FIT_WORK = FitWork()


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
    shape = _rows_features(X, ns)
    if shape is None:
        return candidates, ""
    n, d = shape
    loaded = numba_loaded()
    return cpu_engines.arrange(candidates, n, d, n_clusters, iterations=iterations,
                               threads=threads or usable_cores(),
                               numba_loaded=loaded, process_work=NUMPY_FIT_WORK.total)


def _reject_reason(name: str, X: Any, n_clusters: int, sample_weight: Any,
                   precision: str = "exact") -> str | None:
    """None when backend `name` is installed and takes X at `precision`, else why not (a
    sentence)."""
    found = get_backend_info(name)
    if found is None or not found[0]:
        return "not installed" if found is None else found[1].reason
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
