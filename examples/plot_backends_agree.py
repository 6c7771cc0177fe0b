"""
Every backend gives the same partition
======================================

From the same initial centers, every backend runs the same Lloyd iterations: choosing a
backend chooses speed and memory, never a different answer (up to points so near a tie
between two centers that the last bits of rounding decide). This example fits the same data
on each CPU backend installed here that takes NumPy arrays and compares labels and inertia
with the ``numpy`` backend's.
"""
import numpy as np

from kmeans_xp import KMeans, get_backend, list_backends

rng = np.random.default_rng(1)
X = (rng.standard_normal((30_011, 4)) * [1.0, 3.0, 0.5, 10.0] + [0, 5, -2, 100]).astype(
    np.float32)
C0 = X[rng.choice(len(X), 16, replace=False)]

# the CPU backends that compute on NumPy arrays (not dask's, nor sparse X's)
cpu = [name for name, info in list_backends().items()
       if info.available and not info.gpu and "numpy" in get_backend(name).namespaces]
print("CPU backends installed:", cpu)

reference = KMeans(16, init=C0, n_init=1, max_iter=50, backend="numpy").fit(X)
for name in cpu:
    km = KMeans(16, init=C0, n_init=1, max_iter=50, backend=name).fit(X)
    agree = (km.labels_ == reference.labels_).mean()
    gap = abs(km.inertia_ - reference.inertia_) / reference.inertia_
    print(f"{name:10} iterations {km.n_iter_:3}  label agreement {agree:.4f}  "
          f"relative inertia gap {gap:.1e}")
