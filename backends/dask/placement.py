"""Where a dask fit's arrays live: X persisted on the workers (checked for NaN/inf once), per-
sample arrays laid out like X's rows, small ones (centers, sums) in NumPy on the client."""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.backend import Placement
from kmeans_xp.contract.chunks import tol_from_variances
from kmeans_xp.contract.namespaces import array_namespace, namespace_name, to_numpy

from .blocks import (
    block_absmax,
    block_kind,
    center_block,
    center_scale_block,
    checked_block,
    like_block,
    moments_block,
    running_sum_block,
    take,
    unit_rows_block,
)
from .cluster import is_materialized, nonempty_rows, restore_rows, row_keys
from .namespace import DaskNamespace


def _is_dask(x) -> bool:
    return namespace_name(x) == "dask.array"


def checked(X):
    """(X's blocks after the NaN/inf check, their max |x| as a (blocks, 1) array): both from
    one task per block, so persisting both reads each block once."""
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    token = tokenize(X.name)
    pair, data, top = (f"kmeans-{p}-{token}" for p in ("checked", "finite", "absmax"))
    layers = {pair: {(pair, i): (checked_block, key) for i, key in enumerate(row_keys(X))}}
    layers[data] = {(data, i, 0): (take, (pair, i), 0) for i in range(X.numblocks[0])}
    layers[top] = {(top, i, 0): (take, (pair, i), 1) for i in range(X.numblocks[0])}
    deps = {pair: set(X.__dask_layers__()), data: {pair}, top: {pair}}
    graph = HighLevelGraph.merge(HighLevelGraph(layers, deps), X.__dask_graph__())
    return (da.Array(graph, data, chunks=X.chunks, dtype=X.dtype, meta=X._meta),
            da.Array(graph, top, chunks=((1,) * X.numblocks[0], (1,)), dtype=np.float64,
                     meta=np.empty((0, 0))))


class DaskPlacement(Placement):
    """X as a dask array of whole rows on the workers; the driver's k x d center math in
    NumPy on the client (the stats arrive there as NumPy); per-sample arrays (weights, labels)
    as dask arrays chunked like X's rows, persisted next to X's blocks."""

    def __init__(self, backend):
        super().__init__(backend)
        self.X = None   # the fit's X (to_backend), which per-sample arrays are laid out like

    @property
    def cluster(self):
        return self.backend.cluster

    def converts_from(self, namespace, X=None):
        return namespace in ("numpy", "list")

    def to_backend(self, X):
        """X as a dask array with whole rows per block and no 0-row block (`from_backend` puts
        them back in per-sample results), checked for NaN/inf block by block while it is
        persisted (once) on the workers."""
        import dask.array as da
        if not isinstance(X, da.Array):
            X = np.asarray(X) if namespace_name(X) == "list" else X
            X = da.from_array(X, chunks=("auto", -1))
        if X.numblocks[1] > 1:
            X = X.rechunk({1: -1})
        X = nonempty_rows(X)
        cluster = self.cluster
        if is_materialized(X) and cluster.in_place(X):
            # already in memory (persisted by the user): check it in place, no second copy
            tops = X.map_blocks(block_absmax, dtype=np.float64, chunks=(
                (1,) * X.numblocks[0], (1,)), meta=np.empty((0, 0))).compute()
        else:
            X, tops = checked(X)
            X, tops = cluster.persist(X, tops)
            cluster.wait(X)
            tops = tops.compute()   # one (1, 1) array per block: no pass over X
        self.absmax = float(np.max(tops))
        self.X = X
        return X

    def from_backend(self, arr, like):
        """Per-sample results (labels_, transform) stay dask arrays laid out like X (labels
        held by the actors are copied out of them first: labels_ outlives the fit); small
        ones (cluster_centers_) are NumPy, or CuPy for CuPy input. With non-dask input,
        everything is computed."""
        import dask.array as da
        cupy_in = (isinstance(like, da.Array) and block_kind(like) == "cupy") or \
            namespace_name(like) == "cupy"
        if not isinstance(arr, da.Array):
            return like_block(arr, "cupy") if cupy_in else arr
        if isinstance(like, da.Array) and arr.ndim >= 1 and arr.shape[0] == like.shape[0]:
            if self.backend.actors.call_of(arr) is not None:
                self.backend.actors.check_alive()  # else its tasks wait for a dead worker
                (arr,) = self.cluster.persist(arr, optimize=False, on_cluster=True)
                self.cluster.wait(arr)
            arr = restore_rows(arr, like.chunks[0])  # X's 0-row blocks, dropped by to_backend
            if arr.chunks[0] == like.chunks[0]:
                return arr
        out = arr.compute()
        return out if isinstance(like, da.Array) or cupy_in else to_numpy(out)

    def namespace(self, X):
        """DaskNamespace for dask arrays (the driver's O(n) passes: init, defaults), the
        array's own otherwise (NumPy for the small arrays `small` makes)."""
        if _is_dask(X):
            return DaskNamespace.for_array(X)
        return array_namespace(X)

    def small(self, x, plan=None):
        """Centers and the mean as NumPy on the client (computed if lazy)."""
        return np.asarray(to_numpy(x))

    def persist(self, x):
        """Per-sample dask arrays: persisted on the workers, chunked like X's rows, next to
        X's blocks. Small ones (the mean, k-means++ candidates): computed to a NumPy (CuPy
        for CuPy blocks) array on the client."""
        if not _is_dask(x):
            return x
        X = self.X
        if X is None or x.ndim == 0 or x.shape[0] != X.shape[0]:
            return x.compute()
        return self.cluster.persist_like(x, X)

    def feature_stats(self, X, tol, *, xp):
        """(mean, absolute tol), computed where X's blocks are: the mean is X's float64 sum in
        row order (`blocks.running_sum_block`, chained block after block), so X is centered
        bit for bit as the numpy backend centers it whatever the chunks (the driver's near
        ties follow the mean's last bit); tol's variance from the blocks' moments."""
        if not _is_dask(X):
            return super().feature_stats(X, tol, xp=xp)
        graph = self.backend.graph
        n, d = X.shape
        total = graph.chain(X, running_sum_block, np.zeros(d))
        mean = (total / n).astype(X.dtype)
        abs_tol = 0.0
        if tol != 0:
            _, moments = graph.run(X, moments_block, (mean,), columns=False, combine="add",
                                   size=2 * d)
            var = moments[:d] / n - (moments[d:] / n) ** 2   # the mean's rounding, removed
            abs_tol = tol_from_variances(var, tol)
        return like_block(mean, block_kind(X)), abs_tol

    def center(self, X, mean, *, xp, in_place=False):
        """X - mean block by block (in X's dtype, in the blocks' library), persisted once next
        to X's blocks: the iterations (and init's passes) read it, never recompute it."""
        if not _is_dask(X) or mean is None:
            return super().center(X, mean, xp=xp, in_place=in_place)
        mean = np.asarray(to_numpy(mean))
        if not np.any(mean):
            return X  # copy_x=False: the fit computes on X as given (persisted by to_backend)
        Xc = X.map_blocks(center_block, mean=mean, dtype=X.dtype, meta=X._meta)
        return self.cluster.persist_like(Xc, X)

    def center_scaled(self, X, mean, scale, *, xp):
        """(X - mean) * scale block by block in one task each, persisted once (`center`)."""
        if not _is_dask(X):
            return super().center_scaled(X, mean, scale, xp=xp)
        Xc = X.map_blocks(center_scale_block, mean=np.asarray(to_numpy(mean)), scale=scale,
                          dtype=X.dtype, meta=X._meta)
        return self.cluster.persist_like(Xc, X)

    def unit_rows(self, X, *, xp):
        """X's rows at unit norm block by block, persisted once next to X's blocks (as
        `center`); a row of norm 0 raises on its worker, and again here."""
        if not _is_dask(X):
            return super().unit_rows(X, xp=xp)
        Xu = X.map_blocks(unit_rows_block, dtype=X.dtype, meta=X._meta)
        return self.cluster.persist_like(Xu, X)

    def finish(self, kept=None):
        """After a fit: drop the handles on the persisted X, weights and actors, so the
        workers can free them (labels_ stays, as the user holds it)."""
        self.X = None
        self.cluster.reset()
        self.backend.graph.reset()
        self.backend.actors.reset()
        return kept
