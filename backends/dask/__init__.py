"""The `dask` backend (`backend.DaskBackend`): exact Lloyd on dask arrays of NumPy or CuPy
blocks, on dask's local scheduler or a distributed cluster.

    backend.py    the backend: options, engine choice, the contract's primitives
    placement.py  X on the workers, per-sample arrays laid out like X, small ones in NumPy
    namespace.py  the namespace the driver computes with on a dask X
    cluster.py    the client's plumbing: scheduler, persisting next to X, futures
    graph.py      the graph engine: one task graph per call
    actors.py     the actors engine: one Actor per worker, one message per worker and call
    blocks.py     what runs on the workers: one row block on its local backend

Importing this package imports no dask: the registry loads `backend` only when asked.
"""
