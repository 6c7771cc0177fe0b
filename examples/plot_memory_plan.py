"""
Planning memory before a fit
============================

``estimate_memory`` returns the working bytes of a fit before anything runs, for any
backend, installed or not. Here: how the plan grows with the number of clusters for the
``numpy`` backend and for ``cupy-fused`` (planned without CuPy), and how ``max_memory`` bounds everything a fit
allocates beyond X (the backend's chunks and the driver's own arrays).
"""
import matplotlib.pyplot as plt
import numpy as np

from kmeans_xp import KMeans, estimate_memory

n, d = 2_000_000, 3
ks = [50, 100, 200, 500, 1000, 2000]
MiB = 2.0**20
plans = {backend: [estimate_memory(n, d, k, dtype="float32", backend=backend).total / MiB
                   for k in ks]
         for backend in ("numpy", "cupy-fused")}
print(estimate_memory(n, d, 500, dtype="float32", backend="cupy-fused"))

fig, ax = plt.subplots(figsize=(5, 3.5))
for backend, mib in plans.items():
    ax.plot(ks, mib, marker="o", label=backend)
ax.set_xlabel("n_clusters")
ax.set_ylabel("planned working memory (MiB)")
ax.set_title(f"n={n:,}, d={d}, float32")
ax.legend()
fig.tight_layout()

# %%
# ``max_memory`` bounds everything the fit allocates beyond X: the driver's own arrays (the
# centered copy of X, the labels, init's arrays) come first, and the numpy backend's chunk
# buffers shrink to fit in what is left. The fit gives the same partition.
X = np.random.default_rng(0).standard_normal((100_003, 3), dtype=np.float32)
C0 = X[:50].copy()
for budget in ("auto", "8MB"):
    plan = estimate_memory(len(X), 3, 50, dtype="float32", backend="numpy", max_memory=budget)
    km = KMeans(50, init=C0, n_init=1, max_iter=20, backend="numpy",
                max_memory=budget).fit(X)
    beyond_x = plan.total - plan.parts.get("data", 0)
    print(f"max_memory={budget!r}: chunk of {plan.chunk_rows} rows, "
          f"chunk buffers {plan.parts['chunk_buffers'] / MiB:.2f} MiB, "
          f"all beyond X {beyond_x / MiB:.2f} MiB, inertia {km.inertia_:.6g}")
