"""Batches of problems: what `KMeansBackend.batch_lloyd_iter` receives and returns, and its
default, a loop over the problems through the backend's own `lloyd_iter`, so that every
backend takes part in batched fits (docs/batches.md).

A batch is B independent problems with the same d and k: X is a sequence of B (n_b, d)
arrays (a 3-D (B, n, d) array, whose rows X[b] are views, or a tuple of 2-D arrays of
different n: "ragged"); the weights likewise (None: unit weights for all). The driver hands
the hook only the problems still running (`active`, increasing problem indices): a problem
that converged costs no more work.

    hook argument   shape                       what
    X               B x (n_b, d)                every problem's centered data (all B): a
                                                `BatchArray` (dense) or a list of arrays
    sample_weight   None or B x (n_b,)          every problem's weights
    centers         (A, k, d)                   the active problems' centers, in order
    labels_old      None or A x (n_b,)          their labels of the last iteration (what
                                                the hook returned, its rows taken)
    active          tuple of A ints             which problems (indices into X)

It returns `BatchStats`: the `IterStats` of each active problem, stacked.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from kmeans_xp.contract import return_checks as returned


class BatchArray:
    """A dense batch: the (B, n, d) `array`, seen as its B problems (`X[b]`, a 2-D view).
    What `batch_lloyd_iter` gets for X given as one array; a backend's batched kernels
    take `array` whole (a ragged batch is a tuple or list of 2-D arrays)."""

    def __init__(self, array):
        self.array = array
        self.shape = tuple(array.shape)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, b):
        return self.array[b, ...]


class BatchStats(NamedTuple):
    """One iteration's results for A active problems (row j: problem active[j])."""
    labels: Any               # A label arrays of (n_b,) (a list, or a 2-D array's rows)
    weighted_sums: Any        # (A, k, d) float64
    weight_in_clusters: Any   # (A, k) float64
    inertia: Any              # (A,) float64
    n_changed: Any            # (A,) float64


def problem(batch, b):
    """Problem b of a batch (X or weights; None stays None)."""
    return None if batch is None else row(batch, b)


def row(a, j):
    """Entry j of a sequence of arrays: a list's item, or a 2-D (or 3-D) array's row (the
    array API indexes one axis of a many-axis array only with a trailing ellipsis)."""
    return a[j] if isinstance(a, (list, tuple, BatchArray)) else a[j, ...]


def batch_size(X) -> int:
    return len(X)


def dense_array(X):
    """The (B, n, d) array of a dense batch, else None (a ragged one)."""
    return getattr(X, "array", None)


def loop_batch_lloyd_iter(backend, X, sample_weight, centers, labels_old, active, *,
                          xp) -> BatchStats:
    """`batch_lloyd_iter`'s default: each active problem's `lloyd_iter`, stacked. It is the
    honest fastest where one problem already fills the device (the CPU backends' threads);
    a GPU backend overrides the hook to compute the whole batch in one launch per step."""
    stats = []
    for j, b in enumerate(active):
        Xb = X[b]
        it = backend.lloyd_iter(Xb, problem(sample_weight, b), centers[j, ...],
                                None if labels_old is None else row(labels_old, j), xp=xp)
        stats.append(returned.check_iteration(backend, it, Xb.shape[0], centers.shape[1],
                                              Xb.shape[1], values=False))
    return stack_stats(stats, xp)


def stack_stats(stats, xp) -> BatchStats:
    """Per-problem `IterStats` (one namespace) as one `BatchStats`."""
    def f64(a):
        return a if a.dtype == xp.float64 else xp.astype(a, xp.float64)
    return BatchStats([s.labels for s in stats],
                      xp.stack([s.weighted_sums for s in stats]),
                      xp.stack([s.weight_in_clusters for s in stats]),
                      xp.stack([f64(s.inertia) for s in stats]),
                      xp.stack([f64(s.n_changed) for s in stats]))


def check_batch_stats(backend, stats, X, active, k, *, values=True):
    """The hook's return, checked as the driver reads it: one row per active problem, each
    problem's labels of its own length (with values, in [0, k): a read per problem, done on
    the first iteration only)."""
    if not isinstance(stats, BatchStats):
        stats = BatchStats(*stats)
    a, d = len(active), X[active[0]].shape[1] if active else 0
    want = {"weighted_sums": (a, k, d), "weight_in_clusters": (a, k), "inertia": (a,),
            "n_changed": (a,)}
    for field, shape in want.items():
        got = tuple(getattr(stats, field).shape)
        if got != shape:
            raise returned.BackendContractError(
                f"backend {backend.name!r}: batch_lloyd_iter returned {field} of shape {got} "
                f"for {a} active problems; expected {shape} (docs/batches.md)")
    if len(stats.labels) != a:
        raise returned.BackendContractError(
            f"backend {backend.name!r}: batch_lloyd_iter returned {len(stats.labels)} label "
            f"arrays for {a} active problems")
    # (a 2-D array of a dense batch's labels: their values read once for all its rows)
    rows = getattr(stats.labels, "ndim", 1) == 2 and not isinstance(
        stats.labels, (list, tuple, BatchArray))
    for j, b in enumerate(active):
        returned.check_labels(backend, "batch_lloyd_iter", row(stats.labels, j),
                              X[b].shape[0], k, values=values and not rows)
    if values and rows:
        returned.check_label_values(backend, "batch_lloyd_iter", stats.labels, k)
    return stats
