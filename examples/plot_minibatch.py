"""
Mini-batch k-means against the full fit
=======================================

``MiniBatchKMeans`` updates the centers from small random batches: a fraction of the full
fit's work for an inertia close to it. ``partial_fit`` takes one step per call, for data that
arrives in blocks.
"""
import matplotlib.pyplot as plt
import numpy as np

from kmeans_xp import KMeans, MiniBatchKMeans

rng = np.random.default_rng(2)
X = rng.standard_normal((100_000, 3), dtype=np.float32) * [1.0, 2.0, 4.0]
X = X.astype(np.float32)

full = KMeans(50, random_state=0).fit(X)
sizes = [256, 1024, 4096, 16384]
gaps = []
for b in sizes:
    mb = MiniBatchKMeans(50, batch_size=b, random_state=0).fit(X)
    inertia = -mb.score(X)
    gaps.append(100 * (inertia - full.inertia_) / full.inertia_)
    print(f"batch_size={b:6}: {mb.n_steps_:5} steps, inertia {inertia:.5g} "
          f"({gaps[-1]:+.2f}% vs the full fit)")

online = MiniBatchKMeans(50, random_state=0)
for block in np.array_split(X, 40):
    online.partial_fit(block)
print("partial_fit over 40 blocks:", -online.score(X))

fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(sizes, gaps, marker="o")
ax.set_xscale("log", base=2)
ax.set_xlabel("batch_size")
ax.set_ylabel("inertia above the full fit (%)")
fig.tight_layout()
