"""The `numba` backend: compiled distance + argmin and sums, parallel over rows."""
