"""`cupy-chunked`: the fix the seed asks for, distances by cuBLAS GEMM over row chunks.

Each chunk of rows gets -2 x.c from one GEMM into a preallocated block, and a warp-per-row
kernel adds ||c||^2 and takes the argmin (||x||^2 does not change the argmin). Chunk rows are
sized from the budget so the working memory stays under `max_memory` whatever n and k are;
when even a few thousand rows of all k centers would not fit, the centers are tiled too and
a running minimum is carried across tiles. The blocks are allocated once per fit and reused
every iteration, so the pool does not grow; an OutOfMemoryError halves the chunk and retries.
Per-cluster sums use the atomicAdd kernel shared with cupy-kernels (no (k, n) arrays).

Numerics: ||c||^2 is numpy's (pack_centers, np.einsum's order) and is added to the GEMM's
-2 x.c with one rounding, as numpy does; the GEMM itself is cuBLAS's, whose summation order
may differ from OpenBLAS's in the last bit, so a near-tie can go the other way than on the
numpy backend (cupy-kernels reproduces OpenBLAS's order exactly). NumPy X too large for the
device is streamed from the host (see `streaming`), chunk by chunk through the same GEMM loop.
"""
from __future__ import annotations

from typing import NamedTuple

from kmeans_xp.contract.memory import MemoryEstimate, chunk_rows
from kmeans_xp.contract.precision import round_to

from . import batched, nearest, reductions
from .base import BASE_OPTIONS, STREAM_OPTIONS, CupyBackendBase
from .common import MIN_CHUNK_ROWS, ctype, with_oom_retry

#: a chunk narrower than this many rows makes GEMMs too thin: tile the centers instead
TILE_MIN_ROWS = 8192
#: a distance block larger than this buys no speed, only memory
MAX_BLOCK_BYTES = 1 << 30
#: a reduced precision rounds X's rows and the centers (`contract.precision.round_to`, the
#: numpy emulation's rounding) and runs cuBLAS's FP32 GEMM on them: a product of two values of
#: at most 11 significant bits is exact in float32, so that GEMM computes what a tensor core
#: computes on the format with FP32 accumulation (up to the order of the sum), the semantics
#: on any GPU, not the speed. Float32 values per row a rounding needs beside X's: the rounded
#: row, and the in-place rounding's temporaries (a word and a flag a value)
ROUNDED_ROW_FACTOR = 3


class ChunkPlan(NamedTuple):
    rows: int     # rows per chunk
    k_tile: int   # centers per GEMM (k when not tiled)

    def buffer_bytes(self, itemsize):
        return self.rows * (self.k_tile + 1) * itemsize


def plan_chunks(n, d, k, itemsize, budget) -> ChunkPlan:
    """Rows and center tile so that the distance block (rows x k_tile), the running minimum
    (rows) and the center norms (k) fit in `budget` bytes:

        rows * (k_tile + 1) * itemsize + k * itemsize <= budget

    k_tile = k unless a block of TILE_MIN_ROWS rows of all k centers would not fit in the
    budget or in MAX_BLOCK_BYTES; rows are capped so the block stays under MAX_BLOCK_BYTES
    (or TILE_MIN_ROWS rows, when a tile is that wide)."""
    fixed = k * itemsize
    want = min(n, TILE_MIN_ROWS)
    room = min(max(budget - fixed, 0), MAX_BLOCK_BYTES)
    if room // ((k + 1) * itemsize) >= want:
        k_tile = k
    else:
        k_tile = int(min(k, max(1, room // want // itemsize - 1)))
    rows = chunk_rows(budget, (k_tile + 1) * itemsize, fixed, n_samples=n,
                      floor=min(n, MIN_CHUNK_ROWS),
                      what=f"cupy-chunked (k={k}, {k_tile} centers per tile)")
    rows = min(rows, max(want, MAX_BLOCK_BYTES // ((k_tile + 1) * itemsize)))
    return ChunkPlan(int(rows), k_tile)


class CupyChunkedBackend(CupyBackendBase):
    name = "cupy-chunked"
    options = {**BASE_OPTIONS, **STREAM_OPTIONS}
    supports_streaming = True
    #: the reduced ones round X's rows and the centers, then the FP32 GEMM (ROUNDED_ROW_FACTOR): the
    #: semantics of tensor-core arithmetic on any GPU, not its speed (docs/precision.md)
    precisions = ("exact", "tf32", "fp16", "bf16")

    def __init__(self, max_memory="auto", **options):
        super().__init__(max_memory, **options)
        self._plan = None      # (n, d, k, dtype) -> ChunkPlan, fixed for a fit
        self._blocks = None    # (rows, k_tile, dtype, d rounded, distance block, running
        #                        minimum, rounded rows or None)
        self._stream_plan = None  # ChunkPlan of the GEMM blocks when X is streamed

    # -- buffers, kept for the whole fit ---------------------------------------------------------
    def _plan_for(self, n, d, k, dtype):
        key = (n, d, k, dtype, self.compute_precision)
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, self._planned(n, d, k, dtype.itemsize))
        return self._plan[1]

    def _planned(self, n, d, k, itemsize):
        # the driver allocates the next iteration's labels and distances beside the blocks
        reserve = n * (4 + itemsize)
        # a reduced precision's rounded rows are planned as more columns of the block
        extra = 0 if self.compute_precision == "exact" else ROUNDED_ROW_FACTOR * d
        with self.memory.explain(f"cupy-chunked (n={n}, k={k}, d={d})", reserve,
                                 "labels and squared distances"):
            plan = plan_chunks(n, d, k + extra, itemsize, self.memory.bytes(reserve=reserve))
        return plan._replace(k_tile=max(1, min(k, plan.k_tile - extra)))

    def _keep_rows(self, rows):
        """Remember the chunk that fitted after halving, so later iterations start there."""
        key, plan = self._plan
        if rows != plan.rows:
            self._plan = (key, plan._replace(rows=rows))

    def _chunk_blocks(self, rows, k_tile, dtype, d_rounded=0):
        key = (rows, k_tile, dtype, d_rounded)
        if self._blocks is None or self._blocks[:4] != key:
            self._blocks = None  # release the old blocks before asking for new ones
            cp = self._cp
            self._blocks = (*key, cp.empty(rows * k_tile, dtype=dtype),
                            cp.empty(rows, dtype=dtype),
                            cp.empty((rows, d_rounded), dtype=dtype) if d_rounded else None)
        return self._blocks[4:]

    def _forget_blocks(self, rows=None):
        self._blocks = None

    drop_work_buffers = _forget_blocks

    def release_buffers(self):
        super().release_buffers()
        self._blocks = None
        self._plan = None
        self._stream_plan = None

    def fit_kernels(self, n, d, k, dtype, *, seeding=None):
        return super().fit_kernels(n, d, k, dtype, seeding=seeding) + nearest.assignment_kernels(
            k, d, dtype, ("row_argmin.cu", f"row_argmin_shifted<{ctype(dtype)}>"))

    def batch_lloyd_iter(self, X, sample_weight, centers, labels_old, active, *, xp=None):
        """A dense batch on the device: one batched GEMM per chunk and one scatter for all
        active problems (`batched`); a ragged batch, or a reduced precision, each problem's
        `lloyd_iter`."""
        arr = getattr(X, "array", None)
        # (the batched GEMM is exact FP32: a reduced precision rounds per problem)
        if arr is None or self.is_streamed(arr) or self.compute_precision != "exact":
            return super().batch_lloyd_iter(X, sample_weight, centers, labels_old, active,
                                            xp=xp)
        return batched.batch_lloyd_iter(self, X, sample_weight, centers, labels_old, active)

    # -- the per-chunk primitive ----------------------------------------------------------------
    def chunk_centers(self, centers, dtype):
        C = self.contiguous(centers, dtype)
        return C, nearest.center_norms(C, dtype)

    def assign_chunk(self, X, state, labels, min_sq):
        """labels and min_sq (by direct differences, not the cancellation-prone expansion) of
        the rows of X, in row chunks and center tiles of the plan (streamed: its own plan)."""
        C, c_norm = state
        (n, d), k = X.shape, C.shape[0]
        if self._stream_plan is not None and self.is_streaming:
            plan = self._stream_plan
            self._assign_chunks(X, C, c_norm, labels, plan.rows, plan.k_tile)
        else:
            plan = self._plan_for(n, d, k, X.dtype)
            rows = with_oom_retry(
                lambda rows: self._assign_chunks(X, C, c_norm, labels, rows, plan.k_tile),
                plan.rows, what=f"cupy-chunked assignment (n={n}, k={k}, d={d})",
                on_halve=self._forget_blocks)
            self._keep_rows(rows)
        reductions.labelled_sq_dist(X, labels, C, min_sq)

    @property
    def is_streaming(self):
        return self._engine is not None and self._engine.running

    def _assign_chunks(self, X, C, c_norm, labels, rows, k_tile):
        from cupy import cublas  # needs the cuBLAS library: imported only when used

        n, k = X.shape[0], C.shape[0]
        precision = self.compute_precision
        reduced = precision != "exact"
        block, run_min, rounded = self._chunk_blocks(rows, k_tile, X.dtype,
                                                     X.shape[1] if reduced else 0)
        if reduced:   # the centers and their norms as the format holds them
            C = round_to(C, precision, self._cp.empty(C.shape, C.dtype))
            c_norm = nearest.center_norms(C, X.dtype)
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            m = stop - start
            A = X[start:stop]
            if reduced:
                A = round_to(A, precision, rounded[:m])
            for j0 in range(0, k, k_tile):
                j1 = min(j0 + k_tile, k)
                dist = block[: m * (j1 - j0)].reshape(m, j1 - j0)
                cublas.gemm("N", "T", A, C[j0:j1], out=dist, alpha=-2.0)
                nearest.row_argmin_shifted(dist, c_norm[j0:j1], j0, j0 == 0, run_min[:m],
                                           labels[start:stop])
        return rows

    def stream_work_bytes(self, rows, d, k, itemsize, budget):
        """Plan the GEMM blocks for chunks of `rows` streamed rows within `budget` bytes (a
        share of the streaming budget); the bytes they take."""
        plan = plan_chunks(rows, d, k, itemsize, budget)
        self._stream_plan = plan
        return plan.buffer_bytes(itemsize) + k * itemsize

    # -- memory --------------------------------------------------------------------------------
    @classmethod
    def estimate_memory(cls, n_samples, n_features, n_clusters, *, itemsize,
                        max_memory="auto", stream="auto") -> MemoryEstimate:
        """Device bytes of the backend's own part of a fit (the driver's arrays are counted by
        the core): X on the device (`data`), the assignment's distances, the GEMM block
        with its running minimum and center norms (k-means++'s steps: `seeding_bytes`).
        stream=True: the parts of a fit streamed from the host."""
        n, d, k = n_samples, n_features, n_clusters
        inst = cls.planner(max_memory)
        if stream is True:
            return inst.stream_estimate(n, d, k, itemsize)
        plan = inst._planned(n, d, k, itemsize)
        parts = {
            "data": n * d * itemsize,
            "per_sample_work": n * itemsize,
            "chunk_buffers": plan.buffer_bytes(itemsize) + k * itemsize,
            "centers_and_stats": k * (d + 1) * itemsize + 2 * 8 * 1024,
        }
        return MemoryEstimate(parts, sum(parts.values()), plan.rows)
