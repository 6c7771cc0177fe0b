"""
A first fit, and what the estimator tells about it
===================================================

Fit ``KMeans`` on three-dimensional points, plot the partition, and read what the fitted
estimator records besides scikit-learn's attributes: which backend ran and why, the inertia
per iteration (``history_``) and the seconds per stage (``timings_``). On a GPU,
``memory_report_`` adds the peak device memory per stage.
"""
import matplotlib.pyplot as plt
import numpy as np

from kmeans_xp import KMeans

rng = np.random.default_rng(0)
# asymmetric clusters: different spreads per feature and per cluster
centers = rng.uniform(-10, 10, size=(6, 3))
X = np.concatenate([c + rng.standard_normal((3000, 3)) * rng.uniform(0.5, 2.0, 3)
                    for c in centers]).astype(np.float32)

km = KMeans(n_clusters=6, random_state=0).fit(X)
print("backend:", km.backend_, "-", km.backend_reason_)
print("inertia:", km.inertia_, "after", km.n_iter_, "iterations")
print("seconds per stage:", {k: round(v, 4) for k, v in km.timings_.items()})

# %%
# The partition, seen along the first two features, and the inertia per iteration.
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.8))
ax0.scatter(X[:, 0], X[:, 1], c=km.labels_, s=2, cmap="tab10")
ax0.scatter(*km.cluster_centers_[:, :2].T, c="black", marker="x", s=60)
ax0.set_xlabel("feature 0")
ax0.set_ylabel("feature 1")
ax0.set_title("labels_ and cluster_centers_")
ax1.plot(km.history_["inertia"], marker="o")
ax1.set_xlabel("iteration")
ax1.set_ylabel("inertia")
ax1.set_title("history_")
fig.tight_layout()
plt.show()
