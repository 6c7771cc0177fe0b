"""kmeans_xp backends as rows of a comparison.

A backend entry is "name" or "name@namespace" (feed it arrays of another library, e.g.
"array-api@cupy"), optionally with backend options, "name[option=value,...]" (e.g.
"cupy-fused[precision=tf32]": `precision` is KMeans' own option, "exact", "tf32", "fp16" or
"bf16", the others the backend's), or "kmeans_xp-auto" (KMeans' own choice, named in the row's
`engine`);
it fits through `KMeans`, the product path, with the workload's tol and threads (the
backends' `n_threads` option). The reference rows are in
`references` (scikit-learn, faiss-cpu), `torch_rows` and `seed`; `selection` picks the rows.
"""
from __future__ import annotations

import contextlib
import importlib
import os

import numpy as np

from kmeans_xp.contract.precision import storage_dtype
from kmeans_xp.tools.bench.machine import torch_cuda
from kmeans_xp.tools.bench.protocol import CupyPeak, Entry, Fitted, NoPeak, TorchPeak, Unavailable, sync_namespace
from kmeans_xp.tools.bench.workload import Workload

#: the row of KMeans' own choice (backend="auto"; "auto" alone names the default set)
AUTO = "kmeans_xp-auto"


#: the dtypes a row's X may arrive in (`input=`): the half formats' (bfloat16 via ml_dtypes)
INPUTS = ("float16", "bfloat16")


def _input_dtype(name):
    dtype = storage_dtype({"float16": "fp16", "bfloat16": "bf16"}[name], np)
    if dtype is None:
        raise Unavailable(f"input={name}: NumPy names no {name} here (pip install ml_dtypes)")
    return dtype


class BackendEntry(Entry):
    """A kmeans_xp backend, fitted through `KMeans` (the product path); the copy in is the
    backend's own `to_backend` (or, for "name@ns", a plain copy into that namespace)."""

    library = "kmeans_xp"
    timed = "KMeans.fit's Lloyd loop (timings_['lloyd']: iterations, final labels), / iterations"
    memory_measured = "measured: peak of the device pool over the fit's stages (includes X)"
    memory_estimated = "estimate: kmeans_xp.estimate_memory (working memory) plus X"

    def __init__(self, spec, w: Workload):
        self.name = spec
        base, self.options = split_options(spec)
        # (the estimator's precision, not a backend option; "fp32" is the old name of exact)
        self.precision = str(self.options.pop("precision", "exact")).replace("fp32", "exact")
        # "name[input=float16]" (or bfloat16): X as the user hands it, in that dtype (an
        # embedding model's half output), converted once before the timed copies in (not a
        # backend option)
        self.input = self.options.pop("input", None)
        if self.input not in (None, *INPUTS):
            raise ValueError(f"{spec}: input={self.input!r}; the row takes input= one of "
                             f"{', '.join(INPUTS)}")
        self.backend_name, _, self.namespace = base.partition("@")
        self.w = w
        from kmeans_xp.contract.registry import list_backends
        info = list_backends().get(self.backend_name)
        self.device = "gpu" if (info is not None and info.gpu) or self.namespace == "cupy" \
            else "cpu"

    def check(self):
        from kmeans_xp.contract.registry import get_backend, list_backends
        if self.input is not None:
            _input_dtype(self.input)   # (NumPy names it here, or the row does not run)
        if self.backend_name == AUTO:
            return self._check_auto()
        info = list_backends().get(self.backend_name)
        if info is None:
            raise Unavailable(f"unknown backend; known: {sorted(list_backends())}")
        if not info.available:
            raise Unavailable(info.reason + (f" ({info.install})" if info.install else ""))
        self.cls = get_backend(self.backend_name)
        self.device = "gpu" if (self.cls.device == "gpu" or self.namespace == "cupy" or (
            self.namespace == "torch" and torch_cuda())) else "cpu"
        self.backend = self.cls(max_memory=self.w.max_memory, **self.options)

    def _check_auto(self):
        """auto: KMeans(backend="auto") on host X; its choice is known after the fit."""
        from kmeans_xp.contract.backend import KMeansBackend
        self.cls, self.device = None, "cpu"
        self.backend = KMeansBackend(max_memory=self.w.max_memory)  # placement, memory

    def backend_options(self):
        """The row's options, and the workload's threads through `n_threads` (where the
        backend takes it; auto's CPU backends all do)."""
        options = dict(self.options)
        if self.w.threads is not None and (self.cls is None or "n_threads" in self.cls.options):
            options["n_threads"] = int(self.w.threads)
        return options or None

    def threads_scope(self, threads):
        # the backend's own n_threads; its BLAS is held to one thread inside its pool, and
        # a limit set here would stop it (threadpoolctl lets one thread set OpenBLAS's
        # limit): only one thread's run gets BLAS held to one thread here
        if threads == 1:
            from threadpoolctl import threadpool_limits
            return threadpool_limits(limits=1, user_api="blas")
        return contextlib.nullcontext()

    def to_input(self, X):
        if self.input is not None:   # (converted once: the user's data comes this way)
            if getattr(self, "_converted", (None,))[0] is not X:
                self._converted = (X, X.astype(_input_dtype(self.input)))
            X = self._converted[1]
        if self.backend_name == AUTO:
            return X
        if self.namespace:
            return _converter(self.namespace)(X)
        if self.backend.reject_reason(X, n_clusters=self.w.k) is None:
            Xd = self.backend.placement.to_backend(X)
            # (the copy is the row's input, not a fit's own: the placement lets go of it,
            # so it goes with the run's last reference; held, every later row's peak had
            # counted it)
            self.backend.placement.finish()
            return Xd
        return _converter(sorted(self.cls.namespaces)[0])(X)

    def memory_scope(self, peak=True):
        # the library's own counters where the backend reports none (array-api on a GPU)
        if self.namespace in ("cupy", "torch"):
            self.memory_measured = (f"measured: peak of the {self.namespace} allocator over "
                                    f"copy and fit (includes X)")
        if self.namespace == "cupy":
            return CupyPeak(peak)
        if self.namespace == "torch" and self.device == "gpu":
            return TorchPeak(importlib.import_module("torch"), peak)
        return NoPeak()

    def sync(self):
        # the backend's own sync, and the namespace's for "name@ns" (array-api's is a no-op)
        self.backend.placement.synchronize()
        sync_namespace(self.namespace)

    def fit(self, Xb, C, iters) -> Fitted:
        from kmeans_xp.estimators.kmeans import KMeans
        km = KMeans(self.w.k, init=C, n_init=1, max_iter=iters, tol=self.w.tol,
                    random_state=0,
                    backend="auto" if self.backend_name == AUTO else self.backend_name,
                    backend_options=self.backend_options(),
                    max_memory=self.w.max_memory, precision=self.precision).fit(Xb)
        # the copy-in stage was recorded by our own instance (to_input), the rest by the fit's
        stages = {**self.backend.memory.report, **km.memory_report_}
        report = {k: int(v) for k, v in stages.items()}
        return Fitted(km.labels_, km.cluster_centers_, km.inertia_, km.n_iter_,
                      km.timings_["lloyd"], report, engine_of(km))

    def estimate(self):
        from kmeans_xp.contract.planning import estimate_memory
        if self.backend_name == AUTO:
            return None
        try:
            est = estimate_memory(self.w.n, self.w.d, self.w.k, dtype=self.w.dtype,
                                  backend=self.backend_name, max_memory=self.w.max_memory,
                                  backend_options=self.options or None)
        except Exception:  # no estimate (plugin without one, or the budget refuses)
            return None
        return int(est.total)


def split_specs(text):
    """A list of row specs from "a,b[x=1,y=2],c": split at the commas outside brackets."""
    specs, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            specs.append(text[start:i])
            start = i + 1
    specs.append(text[start:])
    return [s.strip() for s in specs if s.strip()]


def split_options(spec):
    """"name[a=1,b=x]" -> ("name", {"a": 1, "b": "x"}); "name" -> ("name", {})."""
    base, bracket, rest = spec.partition("[")
    if not bracket:
        return spec, {}
    if not rest.endswith("]"):
        raise ValueError(f"row spec {spec!r}: options go in brackets, name[option=value,...]")
    options = {}
    for item in filter(None, rest[:-1].split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"row spec {spec!r}: {item!r} is not option=value")
        options[key.strip()] = _value(value.strip())
    return base, options


def _value(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def engine_of(km):
    """What a fit ran: its backend, and its bounds where it took them ("numba+yinyang")."""
    bounds = (getattr(km, "_bounds_path", None) or (None,))[0]
    return km.backend_ + (f"+{bounds}" if bounds else "")


def _converter(ns):
    """Host -> `ns` array copy, for "backend@ns" entries and backends that do not copy in."""
    if ns == "numpy":
        return lambda X: X
    if ns == "cupy":
        return lambda X: importlib.import_module("cupy").asarray(X)
    if ns == "torch":
        def to_torch(X):
            t = importlib.import_module("torch")
            return t.from_numpy(X).to("cuda" if t.cuda.is_available() else "cpu")
        return to_torch
    if ns == "array_api_strict":
        return lambda X: importlib.import_module("array_api_strict").asarray(X)
    if ns == "dask.array":
        def to_dask(X):
            da = importlib.import_module("dask.array")
            return da.from_array(X, chunks=(max(1, len(X) // (os.cpu_count() or 1)), -1))
        return to_dask
    raise Unavailable(f"no converter from NumPy to {ns!r}")
