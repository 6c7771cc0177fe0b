"""Small helpers shared by test modules (data, spies)."""

import numpy as np

#: the backend "auto" picks for NumPy input on the CPU below cpu_engines.AUTO_NUMBA_MIN_WORK (the
#: tests' sizes); numba from there where it is installed (test_numba_backend.py)
AUTO_CPU = "numpy"


def blobs(seed=0):
    """Five well-separated 3-D blobs of 3000 points (features on different scales) and five
    of the points as initial centers."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3000, 3)) * [1, 2, 3]
    c = rng.normal(size=(5, 3)) * 3
    X = np.concatenate([X + ci * 10 for ci in c])
    return X, X[rng.choice(len(X), 5, replace=False)]


def directions(n, d, k, seed, spread=0.05):
    """Rows around k directions (spherical k-means' data): features on different scales and
    offsets (asymmetric), lengths varied from 0.5 to 20, which a spherical fit ignores."""
    rng = np.random.default_rng(seed)
    scales = 1.0 + np.arange(d) * 0.7
    mus = rng.normal(size=(k, d)) * scales + np.arange(d) * 0.5
    mus /= np.linalg.norm(mus, axis=1, keepdims=True)
    X = mus[rng.integers(0, k, n)] + rng.normal(size=(n, d)) * scales * spread
    return X * rng.uniform(0.5, 20.0, size=(n, 1))


def spy_to_backend(monkeypatch, cls):
    """Record what `cls.to_backend` hands the fit (a list, filled as fits run)."""
    seen = []
    original = cls.to_backend

    def to_backend(self, X):
        out = original(self, X)
        seen.append(out)
        return out

    monkeypatch.setattr(cls, "to_backend", to_backend)
    return seen
