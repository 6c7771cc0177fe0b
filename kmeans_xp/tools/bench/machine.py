"""Where a comparison ran: CPU, BLAS and its threads, GPUs, library versions, the commit.

Every result carries `machine_info()`, so a number is never read without its machine. Nothing
here imports CuPy or torch unless it is installed, and a missing device is "none", not an error.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from kmeans_xp.contract.host_memory import host_memory

_CPU_NAME = None


def cupy_gpu() -> bool:
    """CuPy imports and sees at least one CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        return importlib.import_module("cupy").cuda.runtime.getDeviceCount() > 0
    except Exception:  # a broken driver is "no GPU" here
        return False


def torch_cuda() -> bool:
    """torch is installed and sees a CUDA device."""
    if importlib.util.find_spec("torch") is None:
        return False
    return importlib.import_module("torch").cuda.is_available()


def device_name(kind) -> str:
    """The name of the first GPU ("gpu") or the CPU's model (anything else)."""
    if kind == "gpu":
        gpus = gpu_info()
        return gpus[0]["name"] if gpus and "name" in gpus[0] else "GPU"
    return cpu_model()


def cpu_model() -> str:
    global _CPU_NAME
    if _CPU_NAME is None:
        _CPU_NAME = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        _CPU_NAME = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
    return _CPU_NAME


def blas_info() -> list:
    """BLAS libraries and their threads: threadpoolctl when importable, else numpy's config."""
    try:
        from threadpoolctl import threadpool_info
        return [{k: v for k, v in lib.items() if k in (
            "user_api", "internal_api", "version", "num_threads", "threading_layer",
            "architecture", "prefix")} for lib in threadpool_info()]
    except ImportError:
        pass
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return [{"user_api": "blas", "internal_api": blas.get("name"),
                 "version": blas.get("version"), "num_threads": os.environ.get(
                     "OMP_NUM_THREADS", "unknown (threadpoolctl not installed)")}]
    except Exception:  # very old numpy: no dict config
        return []


def gpu_info() -> list:
    """Name and memory of each CUDA device, via CuPy; [] where there is none."""
    if not cupy_gpu():
        return []
    cp = importlib.import_module("cupy")
    out = []
    try:
        for i in range(cp.cuda.runtime.getDeviceCount()):
            props = cp.cuda.runtime.getDeviceProperties(i)
            name = props["name"]
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "memory_bytes": int(props["totalGlobalMem"]),
                        "compute_capability": f"{props['major']}.{props['minor']}",
                        "multiprocessors": int(props["multiProcessorCount"]),
                        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
                        "cuda_driver": cp.cuda.runtime.driverGetVersion()})
    except Exception as exc:  # report, do not fail the comparison over a property
        out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


#: distributions whose versions a result records when installed: ours, every library a row
#: or a backend runs on (numba and its llvmlite, faiss under each of its wheel names, scikit-
#: learn, CuPy, torch, dask), and what measures or draws (threadpoolctl, psutil, matplotlib)
_VERSIONED = ("kmeans_xp", "numpy", "scipy", "array-api-compat", "array-api-strict", "numba",
              "llvmlite", "cupy", "cupy-cuda12x", "cupy-cuda13x", "torch", "dask",
              "distributed", "scikit-learn", "faiss-cpu", "faiss-gpu", "faiss-gpu-cu12",
              "faiss", "threadpoolctl", "psutil", "tqdm", "matplotlib")


def library_versions() -> dict:
    """{"python": ..., distribution: version} for each of `_VERSIONED` that is installed."""
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": platform.python_version()}
    for dist in _VERSIONED:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def _git_commit():
    import subprocess
    # the checkout that holds kmeans_xp (kmeans_xp/tools/bench/machine.py: three folders up)
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    mem = host_memory()
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "platform": platform.platform(),
            "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count(),
                    "usable_cores": usable},
            "host_memory_bytes": mem.total, "host_memory_available_bytes": mem.available,
            "host_memory_source": mem.source, "blas": blas_info(), "gpus": gpu_info(),
            "versions": library_versions(), "kmeans_xp_commit": _git_commit()}
