"""Workloads: the seed's data and asymmetric blobs, generated the same way for every backend."""
from __future__ import annotations

import numpy as np


def seed_data(n_samples=2_000_000, n_features=3, *, dtype=np.float32, random_state=0):
    """The seed's workload: two unit Gaussians centred at +1 and -1 on every feature,
    (n_samples, n_features), as `numpy.r_[samples + 1, samples - 1]` in the original."""
    rng = np.random.default_rng(random_state)
    half = n_samples // 2
    samples = rng.standard_normal((n_samples - half, n_features), dtype=np.float64)
    # written into X's dtype in place: the float64 sums rounded once, as `.astype` did, with
    # no float64 copy of the whole (`seed_data_peak_bytes`)
    X = np.empty((n_samples, n_features), dtype=dtype)
    np.add(samples, 1, out=X[: n_samples - half], casting="same_kind")
    np.subtract(samples[:half], 1, out=X[n_samples - half:], casting="same_kind")
    return X


def seed_data_peak_bytes(n_samples, n_features, dtype=np.float32) -> int:
    """Host bytes `seed_data` holds at its peak: the float64 draws of half the rows and X."""
    n, d = int(n_samples), int(n_features)
    return (n - n // 2) * d * 8 + n * d * np.dtype(dtype).itemsize


def blobs(n_samples, n_features, n_centers, *, dtype=np.float32, random_state=0):
    """Gaussian blobs with per-feature scales and offsets (asymmetric on purpose)."""
    from kmeans_xp.testing import asymmetric_data
    return asymmetric_data(n_samples, n_features, n_centers, dtype=dtype, seed=random_state)
