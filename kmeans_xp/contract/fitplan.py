"""FitPlan: what a fit is, handed to a backend's collaborators as an argument.

A backend's collaborators (its placement, its memory check) decide from the shape of the fit:
how many rows, features and clusters, in which dtype, on which device, within which memory
bound, whether X is centered on a copy. The estimator knows these before anything runs and
passes them along in one frozen value, so a collaborator neither calls back into its backend
nor keeps what an earlier call told it for a later one to read.
"""
from __future__ import annotations

import dataclasses

from kmeans_xp.contract.memory import compute_itemsize, parse_memory


@dataclasses.dataclass(frozen=True)
class FitPlan:
    n: int                       # rows of X
    d: int                       # features
    k: int                       # clusters
    dtype: str                   # the dtype the fit computes in: "float32" or "float64"
    precision: str = "exact"     # compute precision of the distances (contract.precision)
    batch: int | None = None     # B of a batched fit of B problems (None: one problem)
    device: str = "cpu"          # the backend's `device`: "cpu", "gpu" or "any"
    max_memory: int | str = "auto"  # the working-memory bound: bytes, or "auto"
    copy_x: bool = True          # whether the fit centers a copy of X (False: X as given)
    weighted: bool = False       # whether the fit gets sample weights

    @property
    def itemsize(self) -> int:
        """Bytes per value of the dtype the fit computes in."""
        return compute_itemsize(self.dtype)

    @classmethod
    def of(cls, X, n_clusters, *, device="cpu", max_memory="auto", copy_x=True,
           weighted=False, precision="exact") -> FitPlan:
        """The plan of a fit of X (anything with a 2-d `shape` and a `dtype`) into
        n_clusters clusters."""
        n, d = X.shape[0], X.shape[1]  # (as given: a lazy X may not know its n yet, nan)
        try:
            itemsize = compute_itemsize(X.dtype)
        except TypeError:  # a dtype NumPy does not name (bfloat16): planned as float64
            itemsize = 8
        return cls(n, d, int(n_clusters), "float32" if itemsize == 4 else "float64",
                   precision=precision, device=device, max_memory=parse_memory(max_memory),
                   copy_x=bool(copy_x), weighted=bool(weighted))
