"""Which device arrays outlive a free_memory=True fit (tests/test_cupy_backends.py::
test_free_memory_hands_cached_blocks_back): the pool's cached bytes after the fit, and every
live CuPy array at `finish` with what refers to it."""
import gc
import sys

import cupy as cp
import numpy as np

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
from kmeans_xp_backends.cupy import placement

pool = cp.get_default_memory_pool()
X = cp.asarray(asymmetric_data(1_000_003, 3, 10, dtype=np.float32, seed=5))
original = placement.CupyPlacement.finish


def spy(self, kept=None):
    self.backend.release_buffers()
    gc.collect()
    live = [o for o in gc.get_objects() if isinstance(o, cp.ndarray) and o.nbytes > 1 << 20]
    for a in live:
        if a is X:
            continue
        refs = [type(r).__name__ + (":" + ",".join(list(r)[:6]) if isinstance(r, dict) else "")
                for r in gc.get_referrers(a) if r is not live]
        print(f"  live at finish: {a.shape} {a.dtype} {a.nbytes >> 20} MiB <- {refs[:5]}")
    return original(self, kept)


placement.CupyPlacement.finish = spy
for name in sys.argv[1:] or ["cupy-kernels", "cupy-chunked", "cupy-fused"]:
    pool.free_all_blocks()
    print(name, "before: used", pool.used_bytes() >> 20, "MiB, cached",
          pool.free_bytes() >> 20, "MiB")
    km = KMeans(10, backend=name, max_iter=3, random_state=0,
                backend_options={"free_memory": True}).fit(X)
    print(name, "after: used", pool.used_bytes() >> 20, "MiB, cached",
          pool.free_bytes() >> 20, "MiB (X is", X.nbytes >> 20, "MiB)")
    del km
