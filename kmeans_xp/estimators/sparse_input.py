"""Sparse X checked as dense X is, without densifying it: CSR of a floating dtype, finite,
with its max |value| for the fit's rescaling (`scaling.pow2_scale`)."""
from __future__ import annotations

import math

import numpy as np

from kmeans_xp.contract.sparse import as_csr, dense_module


def check_sparse(X, *, name="X", owner="KMeans", absmax=False):
    """scipy.sparse or cupyx.scipy.sparse X (any format, matrix or array) as CSR of float32
    or float64 (a copy only where the format or the dtype changes); with absmax, (X, max
    |X|)."""
    if len(X.shape) != 2:
        raise ValueError(f"Expected 2D array, got {len(X.shape)}D sparse array instead.")
    n, d = X.shape
    if n == 0 or d == 0:
        what = "sample(s)" if n == 0 else "feature(s)"
        raise ValueError(f"Found array with 0 {what} (shape={tuple(X.shape)}) while a minimum "
                         f"of 1 is required by {owner}.")
    dtype = np.dtype(X.dtype)
    if dtype.kind == "c":
        raise ValueError(f"Complex data not supported; give real-valued {name}.")
    if dtype.kind not in "biuf":
        raise ValueError(f"{name} has dtype {dtype}, which is not numeric; give float32 or "
                         f"float64 data.")
    target = (dtype if dtype in (np.float32, np.float64) else
              np.float32 if dtype.kind == "f" and dtype.itemsize < 4 else np.float64)
    csr = as_csr(X)
    if csr.dtype != target:
        csr = csr.astype(target)
    lib = dense_module(csr)
    top = float(lib.max(lib.abs(csr.data))) if csr.nnz else 0.0
    if not math.isfinite(top):
        if bool(lib.any(lib.isnan(csr.data))):
            raise ValueError(f"Input {name} contains NaN. Remove or impute missing values "
                             f"before clustering.")
        raise ValueError(f"Input {name} contains infinity or a value too large for "
                         f"dtype('{csr.dtype}').")
    return (csr, top) if absmax else csr
