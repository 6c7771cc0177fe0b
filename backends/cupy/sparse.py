"""The GPU backends' sparse path: cupyx.scipy.sparse X, and scipy.sparse X moved to the
device once, through cuSPARSE (CSR @ dense) and CuPy's bincount.

The CPU sparse path's code (`kmeans_xp_backends.numpy.sparse`) reads its dense library off
X, so this backend is that class with a placement that keeps X on the GPU: chunks of CSR
rows, (rows, k) distances from the rows' squared norms and a cuSPARSE product, sums per
cluster as one bincount over the stored values. Chosen by "auto" for cupyx.scipy.sparse
input and for scipy.sparse input with nnz * k >= `selection.AUTO_GPU_SPARSE_MIN_WORK` where
a GPU works, and taken by a fit that names a CuPy backend with sparse X.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.backend import user_labels
from kmeans_xp.contract.sparse import CUPYX_SPARSE, SCIPY_SPARSE, SparseRows, as_csr, is_sparse

from kmeans_xp_backends.numpy.sparse import ScipySparseBackend, SparsePlacement


class CupySparsePlacement(SparsePlacement):
    """Host sparse X copied to the device once as CSR; results back on the host for host
    input."""

    def converts_from(self, namespace, X=None):
        return namespace == SCIPY_SPARSE

    def to_backend(self, X):
        import cupy
        import cupyx.scipy.sparse as cusparse
        if isinstance(X, SparseRows):
            return X
        if is_sparse(X):
            csr = as_csr(X)
            return csr if isinstance(csr, cusparse.spmatrix) else cusparse.csr_matrix(csr)
        return cupy.asarray(X)   # a kept k-sized array, or an init's rows

    def from_backend(self, arr, like):
        import cupy
        arr = user_labels(arr)
        on_host = isinstance(like, np.ndarray) or (is_sparse(like) and
                                                   not type(like).__module__.startswith("cupyx"))
        if on_host and isinstance(arr, cupy.ndarray):
            return cupy.asnumpy(arr)
        return arr

    def synchronize(self):
        import cupy
        cupy.cuda.get_current_stream().synchronize()

    def free_memory(self):
        import cupy
        free, _total = cupy.cuda.Device().mem_info
        return free + cupy.get_default_memory_pool().free_bytes()


class CupySparseBackend(ScipySparseBackend):
    name = "cupy-sparse"
    namespaces = frozenset({CUPYX_SPARSE})
    device = "gpu"
    placement_class = CupySparsePlacement
