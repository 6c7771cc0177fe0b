"""The `numpy` backend: blocked GEMM + argmin on threads (and worker processes for few
features), float64 sums per cluster."""
