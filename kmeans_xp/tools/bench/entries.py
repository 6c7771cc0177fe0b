"""kmeans_xp backends as rows of a comparison.

A backend entry is "name" or "name@namespace" (feed it arrays of another library, e.g.
"array-api@cupy"); it fits through `KMeans`, the product path. The reference rows are in
`references` (scikit-learn, faiss-cpu), `torch_rows` and `seed`; `selection` picks the rows.
"""
from __future__ import annotations

import importlib
import os

from kmeans_xp.tools.bench.machine import torch_cuda
from kmeans_xp.tools.bench.protocol import CupyPeak, Entry, Fitted, NoPeak, TorchPeak, Unavailable, sync_namespace
from kmeans_xp.tools.bench.workload import Workload


class BackendEntry(Entry):
    """A kmeans_xp backend, fitted through `KMeans` (the product path); the copy in is the
    backend's own `to_backend` (or, for "name@ns", a plain copy into that namespace)."""

    library = "kmeans_xp"
    timed = "KMeans.fit's Lloyd loop (timings_['lloyd']: iterations, final labels), / iterations"
    memory_measured = "measured: peak of the device pool over the fit's stages (includes X)"
    memory_estimated = "estimate: kmeans_xp.estimate_memory (working memory) plus X"

    def __init__(self, spec, w: Workload):
        self.name = spec
        self.backend_name, _, self.namespace = spec.partition("@")
        self.w = w
        from kmeans_xp.contract.registry import list_backends
        info = list_backends().get(self.backend_name)
        self.device = "gpu" if (info is not None and info.gpu) or self.namespace == "cupy" \
            else "cpu"

    def check(self):
        from kmeans_xp.contract.registry import get_backend, list_backends
        info = list_backends().get(self.backend_name)
        if info is None:
            raise Unavailable(f"unknown backend; known: {sorted(list_backends())}")
        if not info.available:
            raise Unavailable(info.reason + (f" ({info.install})" if info.install else ""))
        self.cls = get_backend(self.backend_name)
        self.device = "gpu" if (self.cls.device == "gpu" or self.namespace == "cupy" or (
            self.namespace == "torch" and torch_cuda())) else "cpu"
        self.backend = self.cls(max_memory=self.w.max_memory)

    def to_input(self, X):
        if self.namespace:
            return _converter(self.namespace)(X)
        if self.backend.reject_reason(X, n_clusters=self.w.k) is None:
            return self.backend.placement.to_backend(X)
        return _converter(sorted(self.cls.namespaces)[0])(X)

    def memory_scope(self):
        # the library's own counters where the backend reports none (array-api on a GPU)
        if self.namespace in ("cupy", "torch"):
            self.memory_measured = (f"measured: peak of the {self.namespace} allocator over "
                                    f"copy and fit (includes X)")
        if self.namespace == "cupy":
            return CupyPeak()
        if self.namespace == "torch" and self.device == "gpu":
            return TorchPeak(importlib.import_module("torch"))
        return NoPeak()

    def sync(self):
        # the backend's own sync, and the namespace's for "name@ns" (array-api's is a no-op)
        self.backend.placement.synchronize()
        sync_namespace(self.namespace)

    def fit(self, Xb, C, iters) -> Fitted:
        from kmeans_xp.estimators.kmeans import KMeans
        km = KMeans(self.w.k, init=C, n_init=1, max_iter=iters, tol=0, random_state=0,
                    backend=self.backend_name, max_memory=self.w.max_memory).fit(Xb)
        # the copy-in stage was recorded by our own instance (to_input), the rest by the fit's
        stages = {**self.backend.memory.report, **km.memory_report_}
        report = {k: int(v) for k, v in stages.items()}
        return Fitted(km.labels_, km.cluster_centers_, km.inertia_, km.n_iter_,
                      km.timings_["lloyd"], report)

    def estimate(self):
        from kmeans_xp.contract.planning import estimate_memory
        try:
            est = estimate_memory(self.w.n, self.w.d, self.w.k, dtype=self.w.dtype,
                                  backend=self.backend_name, max_memory=self.w.max_memory)
        except Exception:  # no estimate (plugin without one, or the budget refuses)
            return None
        return int(est.total)


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
