"""cupy-fused's batch of problems in one launch per step (`KMeansBackend.batch_lloyd_iter`).

The active problems are taken as runs of consecutive indices (`batched.runs`: one run while
all are active), each run of m problems a contiguous (m * n, d) view of the (B, n, d) array.
A run's iteration is the single problem's launches, each once for the whole run:
pack_centers and the assignment kernel with the problems along the grid's y (`to_problem`
in cuda/common.cuh: problem p's rows, operands, partials and changed counter), then the
sums of all m problems by one accumulation over the labels offset by p * k (problem p owns
clusters p*k .. p*k + k - 1 of one table of m * k), and one finalize_sums that writes every
problem's sums, weights, inertia and changed labels. The workspace (`Workspace` with
`problems=m`) is kept while the same run comes back.

Numerics: each problem's labels and inertia are those of its own `lloyd_iter` bit for bit
(the same kernel, tiles and per-block partials, and the same fixed-order inertia tree); the
sums are fixed point in both, scaled by the run's max |x| per feature and its rows (a
problem's own scale otherwise), so they agree to float64 rounding.

What runs the per-problem loop instead (`contract.batching.loop_batch_lloyd_iter`): a ragged
batch (problems of different n), a non-contiguous one, a problem whose path is not a tile
kernel (small d, where the sums are fused into the pass; tf32's cuBLAS chunks), and a run
whose batched buffers would not fit the memory budget.
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.batching import BatchStats, dense_array, loop_batch_lloyd_iter

from . import fused_plan as fp
from . import fused_sums, paths
from .batched import runs
from .common import device_ptr
from .workspace import Workspace


def loop_reason(backend, X, k):
    """Why the batch runs the per-problem loop (None: it runs batched)."""
    arr = dense_array(X)
    if arr is None:
        return "a ragged batch"
    if not (isinstance(arr, backend._cp.ndarray) and arr.flags.c_contiguous):
        return "X is not one contiguous device array"
    plan = backend._plan_for(arr[0], k)
    if paths.VARIANTS[plan.path].kind != "tile":
        return f"its path {plan.path!r} has no batched kernel"
    return None


def batch_lloyd_iter(backend, X, sample_weight, centers, labels_old, active):
    """`BatchStats` of the active problems; the loop where `loop_reason` says so."""
    cp = backend._cp
    k = centers.shape[1]
    if loop_reason(backend, X, k) is not None:
        return loop_batch_lloyd_iter(backend, X, sample_weight, centers, labels_old, active,
                                     xp=cp)
    arr = X.array
    parts, kept = [], {}
    for j0, j1, b0 in runs(active):
        m = j1 - j0
        old = None if labels_old is None else _rows(cp, labels_old, j0, j1)
        ws = _workspace(backend, arr, sample_weight, b0, m, k)
        if ws is None:   # beyond the budget: this run's problems one at a time
            part = loop_batch_lloyd_iter(backend, X, sample_weight, centers[j0:j1],
                                         None if old is None else list(old), active[j0:j1],
                                         xp=cp)
            parts.append((_rows(cp, part.labels, 0, m), part.weighted_sums,
                          part.weight_in_clusters, part.inertia, part.n_changed))
            continue
        kept[(b0, m)] = ws
        parts.append(_run_iteration(backend, ws, centers[j0:j1], old))
    backend._batch_ws = kept  # (the runs of this call; a run that left frees its buffers)
    # (one run while every problem is active: its arrays as they are)
    fields = [p[0] if len(parts) == 1 else cp.concatenate(p) for p in zip(*parts)]
    return BatchStats(*fields)


def _run_iteration(backend, ws, centers, labels_old):
    """One iteration of a run of m problems from their (m, n) int32 labels_old (or None):
    labels (m, n), sums (m, k, d), weights (m, k), inertia (m,), changed (m,)."""
    cp = backend._cp
    m, k1, d = ws.problems, ws.k // ws.problems, ws.d
    C = cp.ascontiguousarray(centers.astype(ws.T, copy=False))
    backend._pack(ws, C)
    labels = cp.empty((m, ws.rows), dtype=cp.int32)
    backend._assign_pass(ws, labels.reshape(-1), labels_old=labels_old)
    # problem p's labels name clusters p*k1 .. p*k1 + k1 - 1 of the run's one sums table
    # (the workspace's buffer, counted in batch_plan's shifted_labels: none made per
    # iteration)
    if ws.shifted is None:
        ws.shifted = cp.empty((m, ws.rows), dtype=cp.int32)
        ws.offsets = cp.arange(0, m * k1, k1, dtype=cp.int32)[:, None]   # (no host operand)
    cp.add(labels, ws.offsets, out=ws.shifted)
    fused_sums.accumulate(ws, ws.shifted.reshape(-1), backend.scratch)
    K = ws.k
    out = cp.empty(K * (d + 1) + 2 * m, dtype=cp.float64)
    fused_sums.finalize(ws, out, backend.scratch, stats=True,
                        changed_if_none=float(ws.rows) if labels_old is None else -1.0)
    stats = out[K * (d + 1):].reshape(m, 2)
    return (labels, out[:K * d].reshape(m, k1, d), out[K * d:K * (d + 1)].reshape(m, k1),
            stats[:, 0], stats[:, 1])


def _rows(cp, labels, j0, j1):
    """Rows j0 .. j1 - 1 of labels (a 2-D array, or a sequence of rows) as one contiguous
    (j1 - j0, n) int32 array (a 2-D array's slice is not copied)."""
    if getattr(labels, "ndim", 1) == 2:
        block = labels[j0:j1]
    else:
        block = cp.stack([labels[j] for j in range(j0, j1)])
    return cp.ascontiguousarray(block.astype(cp.int32, copy=False))


def _workspace(backend, arr, sample_weight, b0, m, k):
    """The workspace of problems b0 .. b0 + m - 1 (cached while the run comes back), or None
    when its buffers would exceed the memory budget."""
    cp = backend._cp
    n, d = arr.shape[1], arr.shape[2]
    Xrun = arr[b0:b0 + m].reshape(m * n, d)
    cache = getattr(backend, "_batch_ws", None) or {}
    ws = cache.get((b0, m))
    if ws is not None and device_ptr(ws.X) == device_ptr(Xrun) and ws.X.shape == Xrun.shape \
            and ws.k == m * k and ws.w_in is sample_weight:
        return ws   # (the same X and weights as the last iteration)
    w = None
    if sample_weight is not None:   # (the run's rows of weights, contiguous in X's dtype)
        whole = getattr(sample_weight, "array", None)
        w = backend.contiguous(whole[b0:b0 + m] if whole is not None
                               else cp.stack(list(sample_weight)[b0:b0 + m]), arr.dtype)
        w = w.reshape(-1)
    plan = batch_plan(backend, arr[0], k, m)
    if sum(plan.fixed_bytes.values()) > backend.memory.bytes():
        return None
    dev = fp.device_facts(cp.cuda.Device().id)
    ws = Workspace(cp, plan, Xrun, w, k, dev, problems=m)
    ws.w_in = sample_weight
    ws.shifted = ws.offsets = None   # (`_run_iteration`'s, made on its first call)
    # (a run's scales from its problems' max |x|, measured once per batch: a run that the
    # active set splits off costs no pass over its rows, and gets the same bits)
    problem_bits = _problem_bits(backend, arr)
    fused_sums.scales(ws, backend.scratch,
                      bits=cp.asarray(np.max(problem_bits[b0:b0 + m], axis=0)))
    return ws


def _problem_bits(backend, arr):
    """(B, d) uint64 host array: each problem's per-feature max |x| (`absmax_bits`), kept
    on the backend for this batch array until its buffers are released."""
    cp = backend._cp
    key = (id(arr), device_ptr(arr), arr.shape)
    cached = getattr(backend, "_batch_bits", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    out = cp.zeros(arr.shape[0] * arr.shape[2], dtype=cp.uint64)
    d = arr.shape[2]
    fused_sums.absmax_bits(arr, out)   # (all problems in one launch: arr is contiguous)
    bits = cp.asnumpy(out).reshape(arr.shape[0], d)
    backend._batch_bits = (key, bits)
    return bits


def batch_plan(backend, X1, k, m):
    """A problem's plan (X1 one problem's (n, d) rows) for a run of m problems: its
    assignment (grid, tiles, operands) per problem, the sums' kernel sized for all m * n
    rows and m * k clusters, and the working memory of all of them."""
    n, d = X1.shape
    name = str(X1.dtype)
    dev = fp.device_facts(backend._cp.cuda.Device().id)
    one = backend._plan_for(X1, k)
    acc_mode, acc_smem, acc_grid, acc_rows = fp.update_plan(m * n, d, m * k, name, dev)
    plan = fp.one_wave(one._replace(acc_mode=acc_mode, acc_smem=acc_smem, acc_grid=acc_grid,
                                    acc_rows=acc_rows), m * n, d, name, dev)
    parts = {part: size * m for part, size in one.fixed_bytes.items()}
    if acc_mode == "sorted":
        parts["sort_buffers"] = 4 * m * n + 4 * (3 * m * k + 1)
    else:
        parts.pop("sort_buffers", None)
    parts["shifted_labels"] = 4 * m * n
    return plan._replace(fixed_bytes=parts)
