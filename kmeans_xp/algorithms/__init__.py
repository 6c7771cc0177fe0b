"""Layer 3, the algorithms: THE Lloyd driver (`lloyd`), the mini-batch steps, initial
centers, written once in array-API code against a backend's primitives
(`kmeans_xp.contract`)."""
