"""Layer 1, the tools: the `kmeans-xp` command, the comparison protocol (`bench`), plots and
workload data. Nothing in the library imports them."""
