"""A fair CPU/GPU comparison, as a library: `compare(...)` and `sweep(...)`.

One data set, ONE shared init handed to every row, a fixed iteration budget (tol=0), a warm-up
fit first, the device synchronised before every clock read, the copy timed apart from the fit,
the median of `repeats`; a row that cannot run is a row that says why (see `comparison`).

Modules, each importing only those above it:
- `machine`: where it ran (CPU, BLAS, GPUs, versions, commit);
- `workload`: `Workload`, `WORKLOADS`, the host data and the shared init;
- `protocol`: `Entry` (the clocking), `measure` (one row), synchronising and peaks;
- `seed`, `torch_rows`, `references`, `flash_rows`: the reference rows (the seed's
  algorithm, a torch baseline, scikit-learn lloyd and elkan, faiss-cpu, flash-kmeans), shipped in the package so an installed wheel runs them;
- `entries`: kmeans_xp backends as rows;
- `selection`: which rows run ("default", "all", names) and what the default leaves out;
- `summary`: the baseline (the fastest CPU row), speed-ups, the headline;
- `report`: rows as JSON and as a table;
- `comparison`: `compare` and `sweep`;
- `batched`: batches of problems (F2): the batched fit against a loop of single fits.
"""
from kmeans_xp.tools.bench.batched import (
    BATCH_WORKLOADS,
    SMALL_BATCH_WORKLOADS,
    BatchWorkload,
    compare_batched,
)
from kmeans_xp.tools.bench.comparison import compare, sweep
from kmeans_xp.tools.bench.entries import AUTO, BackendEntry
from kmeans_xp.tools.bench.flash_rows import FLASH_FP16_ROW, FLASH_FP32_ROW, FlashEntry
from kmeans_xp.tools.bench.machine import (
    blas_info,
    cpu_model,
    cupy_gpu,
    device_name,
    gpu_info,
    library_versions,
    machine_info,
    torch_cuda,
)
from kmeans_xp.tools.bench.protocol import (
    Entry,
    Fitted,
    Measurement,
    Row,
    Unavailable,
    host_inertia,
    is_out_of_memory,
    measure,
    release_device_memory,
)
from kmeans_xp.tools.bench.references import (
    FAISS_ROW,
    SKLEARN_ELKAN_ROW,
    SKLEARN_ROW,
    FaissEntry,
    SklearnElkanEntry,
    SklearnEntry,
)
from kmeans_xp.tools.bench.report import SCHEMA, describe, format_table, row_dict
from kmeans_xp.tools.bench.seed import SEED_ROW, SeedEntry
from kmeans_xp.tools.bench.selection import (
    GENERIC,
    REFERENCES,
    Selection,
    check_specs,
    make_entries,
    resolve_backends,
    select,
    unknown_specs,
)
from kmeans_xp.tools.bench.summary import choose_baseline, headline, no_gpu_note, skipped_text
from kmeans_xp.tools.bench.torch_rows import TORCH_ROW, TorchEntry
from kmeans_xp.tools.bench.workload import WORKLOADS, Workload, data_shape, fingerprint, make_data, shared_init

__all__ = [
    "BATCH_WORKLOADS", "SMALL_BATCH_WORKLOADS", "BatchWorkload", "compare_batched",
    "SCHEMA", "WORKLOADS", "SEED_ROW", "TORCH_ROW", "SKLEARN_ROW", "SKLEARN_ELKAN_ROW",
    "FAISS_ROW", "FLASH_FP32_ROW", "FLASH_FP16_ROW", "AUTO", "GENERIC",
    "REFERENCES", "compare", "sweep",
    "Workload", "make_data", "data_shape", "shared_init", "fingerprint",
    "Entry", "BackendEntry", "SeedEntry", "TorchEntry", "SklearnEntry", "SklearnElkanEntry",
    "FaissEntry", "FlashEntry",
    "Selection", "select", "check_specs", "make_entries", "resolve_backends", "unknown_specs",
    "choose_baseline", "headline", "no_gpu_note", "skipped_text",
    "Fitted", "Measurement", "Row", "Unavailable", "measure", "host_inertia",
    "is_out_of_memory", "release_device_memory",
    "format_table", "describe", "row_dict",
    "machine_info", "cpu_model", "blas_info", "gpu_info", "library_versions", "cupy_gpu",
    "torch_cuda", "device_name",
]
