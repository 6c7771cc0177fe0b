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


def assert_numpys_up_to_near_ties(X, C, lab, msq):
    """3xTF32's assignment (float32 X, C): the numpy backend's labels except near ties, and
    its distances within 16 eps of the terms' scale where the labels agree."""
    from kmeans_xp_backends.numpy.backend import NumpyBackend

    from kmeans_xp.testing.label_bounds import near_tie
    ref_lab, ref_min = NumpyBackend(n_threads=1).assign(X, C)
    bad = np.flatnonzero(lab != ref_lab)
    ties = near_tie(X[bad], C, lab[bad], ref_lab[bad], np.float32)
    assert ties.all(), f"{np.count_nonzero(~ties)} of {bad.size} labels not near ties"
    same = lab == ref_lab
    scale = (X.astype(np.float64) ** 2).sum(1) + (C.astype(np.float64) ** 2).sum(1)[lab]
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(msq[same] - ref_min[same]) <= 16 * eps * scale[same])


def tile_problem(n, d, k, seed=0):
    """A centered float32 problem for the tensor-core kernels' tests and (k, d) centers near
    its points, two of them equal where k > 4 (the lower index must win)."""
    from kmeans_xp.testing import asymmetric_data
    X = asymmetric_data(n, d, max(1, min(k, 20)), dtype=np.float32, seed=seed)
    X -= X.mean(axis=0)
    rng = np.random.default_rng(seed + 1)
    C = X[rng.choice(n, k, replace=k > n)] + rng.normal(size=(k, d)).astype(np.float32) * 0.05
    if k > 4:
        C[k // 2] = C[1]  # equal centers: the lower index must win
    return np.ascontiguousarray(X), np.ascontiguousarray(C.astype(np.float32))


def half_problem(n, d, k, seed, offset=20.0):
    """(float16 X away from the origin, so that centering matters; k of its rows as float32
    initial centers): the half-data tests' problem."""
    from kmeans_xp.testing import asymmetric_data
    X16 = (asymmetric_data(n, d, k, dtype=np.float32, seed=seed) + offset).astype(np.float16)
    init = X16[np.random.default_rng(seed).choice(n, k, replace=False)].astype(np.float32)
    return X16, init


def quiet_fit(X, init, **kw):
    """KMeans from `init` (tol 0, one run, max_iter 20 and cupy-fused unless given; a
    `sample_weight` goes to fit), warnings silenced."""
    import warnings

    from kmeans_xp import KMeans
    sw = kw.pop("sample_weight", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return KMeans(len(init), init=init, n_init=1, tol=0, max_iter=kw.pop("max_iter", 20),
                      backend=kw.pop("backend", "cupy-fused"), **kw).fit(X, sample_weight=sw)
