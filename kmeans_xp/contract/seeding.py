"""What a backend's own k-means++ steps (`KMeansBackend.seeding`) must agree on with the
driver's xp steps (`kmeans_xp.algorithms.init`) and the memory estimate: the number of
candidates drawn per center."""
from __future__ import annotations

import math


def local_trials(n_clusters) -> int:
    """Candidates per center of greedy k-means++ (scikit-learn's 2 + int(ln k))."""
    return 2 + int(math.log(n_clusters))
