"""What every row computes: the workload, its host data and the ONE shared init.

The data are generated once on the host (or read from a .npy file), and one set of initial
centers is computed once from them and handed to every row, so every row does the same work
from the same start; `fingerprint` lets the JSON show that they did.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from kmeans_xp.algorithms.init import INIT_METHODS

#: the shared inits a comparison can start from: the seed's random rows, or an init method
SHARED_INITS = tuple(dict.fromkeys(["random", *INIT_METHODS]))
#: the named workloads of issues 3-5 (d=3 unless said; float32)
WORKLOADS = {
    "W1": dict(n=2_000_000, d=3, k=200),
    "W2": dict(n=2_000_000, d=3, k=500),
    "W3": dict(n=20_000_000, d=3, k=1000),
    "W5": dict(n=1_000_000, d=128, k=4096),
    # issue 35's embeddings workload: n=8M, d=128, k=1024 (rows of the precision you name)
    "F1": dict(n=8_000_000, d=128, k=1024),
}


@dataclasses.dataclass
class Workload:
    """What every row computes: data, k, iterations, dtype and the protocol's knobs."""
    n: int = 200_000
    d: int = 3
    k: int = 100
    iters: int = 10
    dtype: str = "float32"
    data: str = "seed"           # "seed", "blobs", or a path to a .npy file
    init: str = "random"         # "random" (the seed's) or an init method, computed once
    seed: int = 0
    repeats: int = 3
    warmup_iters: int = 2
    cpu_repeats: int | None = None   # timed fits for CPU rows (None: `repeats`); slow rows
    max_memory: Any = "auto"
    tol: float = 0.0             # 0: the fixed iteration budget; > 0: fits to convergence
    threads: int | None = None   # every row held to this many threads (None: all cores)
    agreement: bool = True       # labels against the numpy backend's (a host fit where no
                                 # numpy row ran: off for large GPU-only sweeps)

    def repeats_for(self, device):
        return self.cpu_repeats if device == "cpu" and self.cpu_repeats else self.repeats

    def pairs(self, n_iter):
        return self.n * self.k * n_iter


def _open(w: Workload):
    """The .npy file of `w.data`, memory-mapped (only its header is read)."""
    path = Path(w.data)
    if path.suffix != ".npy":
        raise ValueError(f"--data must be 'seed', 'blobs' or a .npy file; got {w.data!r}")
    if not path.is_file():
        raise FileNotFoundError(f"--data {w.data}: no such file")
    try:
        X = np.load(path, mmap_mode="r")
    except (ValueError, OSError) as exc:
        raise OSError(f"--data {w.data}: not a readable .npy array ({exc})") from None
    if X.ndim != 2:
        raise ValueError(f"--data {w.data} holds an array of shape {X.shape}; need 2-D "
                         f"(n_samples, n_features)")
    return X


def data_shape(w: Workload) -> tuple:
    """(n, d) the workload's data will have, without generating or reading them all."""
    if w.data in ("seed", "blobs"):
        return w.n, w.d
    n, d = _open(w).shape
    return (min(n, w.n) if w.n else n), d


def make_data(w: Workload) -> np.ndarray:
    """The host data of the workload (updates w.n and w.d when read from a file)."""
    from kmeans_xp.tools.data import blobs, seed_data
    dtype = np.dtype(w.dtype)
    if w.data == "seed":
        return seed_data(w.n, w.d, dtype=dtype, random_state=w.seed)
    if w.data == "blobs":
        return blobs(w.n, w.d, max(w.k, 1), dtype=dtype, random_state=w.seed)
    X = _open(w)
    X = np.ascontiguousarray(X[: w.n] if w.n and w.n < len(X) else X, dtype=dtype)
    w.n, w.d = X.shape
    return X


def shared_init(X, w: Workload) -> np.ndarray:
    """The one set of initial centers every row starts from (host, X's dtype)."""
    if w.init == "random":
        idx = np.random.default_rng(w.seed).choice(len(X), w.k, replace=False)
        return np.ascontiguousarray(X[np.sort(idx)])
    if w.init in INIT_METHODS:  # the estimators' method, in NumPy on the host
        from array_api_compat import array_namespace

        from kmeans_xp.estimators.validation import check_random_state
        xp = array_namespace(X)
        rows = max(256, (64 << 20) // (8 * max(w.k, 1)))
        C = INIT_METHODS[w.init].run(X, w.k, sample_weight=np.ones(len(X), X.dtype),
                                     random_state=check_random_state(w.seed), xp=xp, rows=rows)
        return np.ascontiguousarray(C)
    raise ValueError(f"init must be one of {', '.join(SHARED_INITS)}, got {w.init!r}")


def fingerprint(a) -> str:
    """Short hash of an array's bytes: the JSON shows every row started from the same init."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
