"""Layer 4, the contract: the backend base class and what it needs (array namespaces, row
chunks, memory budgets and estimates, the registry, the choice of a fit's backend). Backends
(`kmeans_xp_backends` and plugins) import from here and nowhere above it."""
