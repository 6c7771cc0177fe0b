"""The numpy backend at a reduced compute precision ("tf32", "fp16", "bf16"), emulated: each
chunk of X and the centers are rounded to the format's mantissa (`contract.precision.round_to`)
before the distance product, which accumulates in float32, as a tensor core does. Sums and
inertia stay exact (float64 sums of X as given: the backend's own pass over the emulated
labels, `NumpyBackend.lloyd_iter`), as on the GPU. This is the reference the
CI tests of reduced precision run on; it is not the fast path (a GPU is).
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.precision import round_to

#: rows per chunk of the emulated product: a (rows, k) float32 block beside its rounded rows
EMULATED_ROWS = 4096


def assign(X, centers, precision):
    """(labels int32, min_sq_dist float32) with distances computed at `precision`."""
    X = np.asarray(X)
    C = round_to(np.asarray(centers, dtype=np.float32), precision)
    c_sq = np.einsum("ij,ij->i", C, C)  # float32, as the kernels' center norms
    n = X.shape[0]
    labels = np.empty(n, dtype=np.int32)
    min_sq = np.empty(n, dtype=np.float32)
    for s in range(0, n, EMULATED_ROWS):
        A = round_to(X[s:s + EMULATED_ROWS], precision)
        D = A @ C.T
        D *= -2
        D += c_sq
        lab = np.argmin(D, axis=1)
        labels[s:s + len(A)] = lab
        x_sq = np.einsum("ij,ij->i", A, A)
        min_sq[s:s + len(A)] = np.maximum(D[np.arange(len(A)), lab] + x_sq, 0)
    return labels, min_sq


def labels_inertia(backend, X, sample_weight, centers):
    """The final pass at the reduced precision: its labels, their exact inertia."""
    labels = backend.assign(X, centers).labels
    return labels, backend.inertia(X, sample_weight, centers, labels)
