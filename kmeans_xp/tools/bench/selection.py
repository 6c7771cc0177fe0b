"""Which rows a comparison runs, and what it leaves out and how to get it.

A row spec is a kmeans_xp backend name, "name@namespace" (e.g. "array-api@cupy"), either with
backend options "name[option=value]" (e.g. "cupy-fused[precision=tf32]"), "kmeans_xp-auto"
(KMeans' own choice), or a reference row: "scikit-learn" (also "sklearn"), "scikit-learn-elkan"
("sklearn-elkan"), "faiss-cpu" ("faiss"), "torch-gemm" ("torch"), "flash-kmeans[fp32]" and
"flash-kmeans[fp16]".
A spec string is a comma-separated list of those and of two sets:
- "default" (also "auto", or no spec): every installed kmeans_xp backend except the generic
  ones (`GENERIC`: correct everywhere, slow where a specialised backend exists), then every
  reference library that is installed. What it leaves out is in `Selection.skipped`, each with
  the reason and how to add it;
- "all": every known backend (a missing one is a row that says why), "array-api@cupy" when
  CuPy imports, and every reference row.
"default,array-api" is the default set plus array-api. The seed's own code stays behind
`include_seed` (it exists to show its out-of-memory failure).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util

from kmeans_xp.tools.bench.entries import AUTO, BackendEntry, split_options, split_specs
from kmeans_xp.tools.bench.machine import cupy_gpu
from kmeans_xp.tools.bench.flash_rows import FLASH_FP16_ROW, FLASH_FP32_ROW, FlashEntry
from kmeans_xp.tools.bench.references import (
    FAISS_ROW,
    SKLEARN_ELKAN_ROW,
    SKLEARN_ROW,
    FaissEntry,
    SklearnElkanEntry,
    SklearnEntry,
)
from kmeans_xp.tools.bench.seed import SeedEntry
from kmeans_xp.tools.bench.torch_rows import TORCH_ROW, TorchEntry
from kmeans_xp.tools.bench.workload import Workload

#: generic rows the default set leaves out: the reason, said where they are skipped
GENERIC = {
    "array-api": "the standard-only generic path: right answers, but on NumPy about 20x the "
                 "numpy backend's time (7 s per iteration at n=2M, k=500)",
    "array-api@cupy": "the standard-only generic path on CuPy: 10 to 60 times the cupy-* "
                      "backends' time (38 ms per iteration at n=2M, k=500; cupy-fused 0.64)",
    "dask": "a backend for clusters and several GPUs: on one machine it is the numpy backend "
            "plus scheduling",
}

#: reference rows: spec -> (entry class, module it needs, how to install it)
REFERENCES = {
    SKLEARN_ROW: (SklearnEntry, "sklearn", "pip install scikit-learn"),
    SKLEARN_ELKAN_ROW: (SklearnElkanEntry, "sklearn", "pip install scikit-learn"),
    FAISS_ROW: (FaissEntry, "faiss", "pip install faiss-cpu"),
    TORCH_ROW: (TorchEntry, "torch", "pip install torch"),
    FLASH_FP32_ROW: (FlashEntry, "flash_kmeans", "pip install flash-kmeans"),
    FLASH_FP16_ROW: (FlashEntry, "flash_kmeans", "pip install flash-kmeans"),
}
#: reference rows the default set leaves out, and why
NOT_DEFAULT = {
    SKLEARN_ELKAN_ROW: "scikit-learn's Elkan bounds pay in fits to convergence; the "
                       "comparison's fixed budget (tol=0, few iterations) is Lloyd's work "
                       "plus bookkeeping",
}
ALIASES = {"sklearn": SKLEARN_ROW, "faiss": FAISS_ROW, "torch": TORCH_ROW,
           "sklearn-elkan": SKLEARN_ELKAN_ROW, "elkan": SKLEARN_ELKAN_ROW}
SETS = ("default", "auto", "all")


@dataclasses.dataclass
class Selection:
    specs: list                  # row specs, in order, no repeats
    skipped: list                # [{"name", "reason", "how", "gpu"}] left out by "default"


def select(spec=None, *, include_torch=False) -> Selection:
    """Row specs and the skipped rows for a spec string (see the module's docstring)."""
    tokens = split_specs(spec or "default")
    if not tokens:
        raise ValueError("--backends is empty; give names such as numpy,cupy-fused, "
                         "'default' or 'all'")
    specs, skipped = [], []
    for token in tokens:
        if token in ("default", "auto"):
            names, left_out = _default()
            specs += names
            skipped += left_out
        elif token == "all":
            specs += _all()
        else:
            specs.append(ALIASES.get(token, token))
    if include_torch:
        specs.append(TORCH_ROW)
    specs = list(dict.fromkeys(specs))
    return Selection(specs, [s for s in skipped if s["name"] not in specs])


def resolve_backends(spec) -> list:
    """The row specs of a spec string (`select(spec).specs`)."""
    return select(spec).specs


def _default():
    from kmeans_xp.contract.registry import list_backends
    from kmeans_xp.contract.selection import SPARSE_PATH
    names, skipped = [], []
    sparse_only = set(SPARSE_PATH.values())
    for name, info in list_backends().items():
        if name in sparse_only:   # the workloads here are dense arrays
            skipped.append(_skip(name, "computes on scipy/cupyx sparse X only; the workloads "
                                       "here are dense",
                                 "fit sparse X (docs/sparse.md)", gpu=info.gpu))
        elif name in GENERIC:
            skipped.append(_skip(name, GENERIC[name], f"--backends default,{name} "
                                                      f"(or --backends all)"))
        elif info.available:
            names.append(name)
        else:
            how = info.install or ""
            if info.gpu and "not installed" not in info.reason:
                how = "run on a machine with a CUDA GPU"
            skipped.append(_skip(name, info.reason, how, gpu=info.gpu))
    if importlib.util.find_spec("cupy") is not None and cupy_gpu():
        skipped.append(_skip("array-api@cupy", GENERIC["array-api@cupy"],
                             "--backends default,array-api@cupy (or --backends all)"))
    for ref, (_, module, install) in REFERENCES.items():
        if ref in NOT_DEFAULT:
            skipped.append(_skip(ref, NOT_DEFAULT[ref], f"--backends default,{ref}"))
        elif importlib.util.find_spec(module) is not None:
            names.append(ref)
        else:
            skipped.append(_skip(ref, f"{module} is not installed", install))
    return names, skipped


def _all():
    from kmeans_xp.contract.registry import list_backends
    names = list(list_backends())
    if importlib.util.find_spec("cupy") is not None and "array-api" in names:
        names.insert(names.index("array-api") + 1, "array-api@cupy")
    return names + list(REFERENCES)


def _skip(name, reason, how, gpu=False):
    return {"name": name, "reason": reason, "how": how, "gpu": gpu}


def unknown_specs(specs) -> list:
    """The specs that name no known backend, namespace or reference row."""
    from kmeans_xp.contract.registry import list_backends
    known = set(list_backends())
    namespaces = {"", "numpy", "cupy", "torch", "array_api_strict", "dask.array"}
    out = []
    for spec in specs:
        if spec in REFERENCES:
            continue
        try:
            base, _ = split_options(spec)
        except ValueError:
            out.append(spec)
            continue
        name, _, ns = base.partition("@")
        if spec not in REFERENCES and name != AUTO and (name not in known
                                                         or ns not in namespaces):
            out.append(spec)
    return out


def check_specs(specs):
    """ValueError naming the unknown specs (each with the close known names: did you mean)
    and what is known, if any spec is unknown."""
    from kmeans_xp.contract.registry import list_backends
    unknown = unknown_specs(specs)
    if unknown:
        known = [*list_backends(), *REFERENCES, *ALIASES, *SETS]
        raise ValueError(f"--backends: unknown {', '.join(map(_with_guess(known), unknown))}; "
                         f"known: {', '.join([*list_backends(), *REFERENCES])}, 'default', "
                         f"'all', NAME@numpy|cupy|torch|array_api_strict|dask.array")


def _with_guess(known):
    """spec -> "'spec'" or "'spec' (did you mean 'numpy'?)": the closest known names."""
    def said(spec):
        name, at, ns = spec.partition("@")
        close = difflib.get_close_matches(name.lower(), known, n=2, cutoff=0.6)
        guesses = [c + at + ns for c in close]
        return repr(spec) + (f" (did you mean {' or '.join(map(repr, guesses))}?)"
                             if guesses else "")
    return said


def make_entries(specs, w: Workload, *, include_seed=False, seed_device="auto",
                 include_torch=False):
    """Entries for row specs (backends and reference rows) plus the seed's rows."""
    specs = list(specs) + ([TORCH_ROW] if include_torch and TORCH_ROW not in specs else [])
    entries = [_reference(s, w) if s in REFERENCES else BackendEntry(s, w) for s in specs]
    if include_seed:
        devices = {"auto": ["gpu" if cupy_gpu() else "cpu"], "both": ["gpu", "cpu"],
                   "gpu": ["gpu"], "cpu": ["cpu"]}[seed_device]
        entries += [SeedEntry(dev, w) for dev in devices]
    return entries


def _reference(spec, w):
    cls = REFERENCES[spec][0]
    return cls(w, spec) if cls is FlashEntry else cls(w)
