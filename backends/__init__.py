"""First-party backends of kmeans_xp (installed as ``kmeans_xp_backends``).

Each module holds one backend; the registry (`kmeans_xp.contract.registry`) imports them lazily, so
importing kmeans_xp never imports CuPy or Dask.
"""
