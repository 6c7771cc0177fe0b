"""Workloads: the seed's data and asymmetric blobs, generated the same way for every backend."""
from __future__ import annotations

import numpy as np


def seed_data(n_samples=2_000_000, n_features=3, *, dtype=np.float32, random_state=0):
    """The seed's workload: two unit Gaussians centred at +1 and -1 on every feature,
    (n_samples, n_features), as `numpy.r_[samples + 1, samples - 1]` in the original."""
    rng = np.random.default_rng(random_state)
    half = n_samples // 2
    samples = rng.standard_normal((n_samples - half, n_features), dtype=np.float64)
    return np.concatenate([samples + 1, samples[:half] - 1]).astype(dtype)


def blobs(n_samples, n_features, n_centers, *, dtype=np.float32, random_state=0):
    """Gaussian blobs with per-feature scales and offsets (asymmetric on purpose)."""
    from kmeans_xp.testing import asymmetric_data
    return asymmetric_data(n_samples, n_features, n_centers, dtype=dtype, seed=random_state)
