"""Which device allocations outlive a free_memory=True fit (tests/test_cupy_backends.py::
test_free_memory_hands_cached_blocks_back): the pool's cached bytes after the fit, and every
allocation of 1 MiB or more made from the start of `Placement.finish` to the end of the fit,
with where it was made."""
import sys
import traceback

import cupy as cp
import numpy as np
from cupy.cuda.memory_hook import MemoryHook
from kmeans_xp_backends.cupy import placement

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data

pool = cp.get_default_memory_pool()
X = cp.asarray(asymmetric_data(1_000_003, 3, 10, dtype=np.float32, seed=5))


class Where(MemoryHook):
    name = "where"
    active = False

    def malloc_preprocess(self, device_id, size, mem_size):
        if self.active and mem_size >= 1 << 20:
            stack = [f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}"
                     for f in traceback.extract_stack()[-9:-1]]
            print(f"  alloc {mem_size >> 20} MiB after finish began: {' <- '.join(stack[::-1])}")


hook = Where()
original = placement.CupyPlacement.finish


def spy(self, kept=None):
    hook.active = True
    return original(self, kept)


placement.CupyPlacement.finish = spy
with hook:
    for name in sys.argv[1:] or ["cupy-kernels", "cupy-chunked", "cupy-fused"]:
        pool.free_all_blocks()
        print(name, "before: used", pool.used_bytes() >> 20, "MiB, cached",
              pool.free_bytes() >> 20, "MiB")
        km = KMeans(10, backend=name, max_iter=3, random_state=0,
                    backend_options={"free_memory": True}).fit(X)
        hook.active = False
        print(name, "after: used", pool.used_bytes() >> 20, "MiB, cached",
              pool.free_bytes() >> 20, "MiB (X is", X.nbytes >> 20, "MiB)")
        del km
