"""Layer 2, the estimators: `KMeans`, `MiniBatchKMeans`, `SphericalKMeans` and their
scikit-learn interop. Parameters, input checks, n_init and the best run, fitted attributes.

They call the algorithms (`kmeans_xp.algorithms`) and never a backend's primitives directly.
"""
