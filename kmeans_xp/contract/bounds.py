"""Exact triangle-inequality bounds for the driver's assignment: Hamerly, Elkan and Yinyang.

A fit with bounds is the same Lloyd run (`algorithms.lloyd`, `bounds=`; its iteration:
`algorithms.bounded`): the driver holds a `Bounds` object and asks the backend for
`assign_bounded(X, centers, bounds)` instead of a plain assignment. The object remembers,
for every row, its label, an upper bound on its distance to its own center and lower bounds
on its distances to the others, all valid for the centers it last saw. When the centers move
by s_c, the bounds move by s_c (triangle inequality); a row whose lower bounds still exceed
its upper bound keeps its label without a distance being computed. The rest are recomputed
against all k centers by the backend's own distance formula, so they get the label a plain
`assign` gives.

Methods (the lower bounds a row keeps; `bound_path` chooses):

    hamerly   one: to the second-nearest center, lowered by the largest shift of the others
    elkan     k: one per center, each lowered by that center's shift (n * k floats)
    yinyang   t = k / YINYANG_GROUP: one per group of centers, lowered by the group's
              largest shift (the groups: a small k-means of the initial centers)

All three also use Hamerly's center-center test: d(x, c) >= d(c_a, c) - d(x, c_a).

Exactness. A plain assignment takes the argmin of ||c||^2 - 2 x.c as computed in X's dtype,
each within gamma (2|x||c| + |c|^2) of the exact value (`testing.label_bounds.near_tie`).
Bounds are kept on exact distances (float64, from the computed ones widened by that error),
and a row is kept only where its nearest other center is farther than its own by more than
twice that error (`margin`), and by PRUNE_SLACK for the bounds' own float64 rounding: where
a plain assignment could pick another center by rounding, the row is recomputed, and where
its recomputed nearest two are within that error (`near_ties`) it takes the backend's plain
pass's label for it (`assign_bounded_numpy`'s `ties`: BLAS rounds by the shapes it gets).
So the labels are the plain assignment's, not merely a labelling as good.

Rows are the unit of work: a row that fails its test is recomputed against all k centers in
a GEMM (vectorised NumPy here, `assign_bounded_numpy`; a backend may pass its own distance
formula, and the numba backend its own compiled test). The default `assign_bounded` of the
contract runs this on NumPy input and a plain `assign` on any other (exact, no pruning).
"""
from __future__ import annotations

import numpy as np

from kmeans_xp.contract.memory import accepted_options

#: a kept row's bounds must clear the test by this factor: float64 bounds lose ~1e-16 per
#: update, so this covers far more iterations than any fit runs
PRUNE_SLACK = 1.0 + 1e-6
#: centers per Yinyang group (Ding et al. 2015 take t = k / 10)
YINYANG_GROUP = 10
#: the k x k center distances of the center-center test are computed up to this k (k^2 d
#: flops an iteration, against the n k d the bounds save)
CENTER_TEST_MAX_K = 2048
#: bytes of one recompute chunk's (rows, k) distances and their float64 copy
RECOMPUTE_BYTES = 16 << 20
#: (n,) float64 temporaries of the vectorised row test, at most
ROW_TEMPORARIES = 6
#: an assignment recomputing more than this share of the rows costs about a plain one:
#: the run pauses the bounds for PAUSE_ITERATIONS plain iterations (doubling each time, up
#: to MAX_PAUSE), then starts them again
PAUSE_SHARE = 0.5
PAUSE_ITERATIONS, MAX_PAUSE = 2, 16
#: near-tie rows whose blocks (`labels_by_block`) hold this share of X or more take their
#: labels from one whole pass instead
WHOLE_PASS_SHARE = 0.25
#: Elkan keeps k bounds a row up to this k; beyond it Yinyang's groups, O(k / 10) a row
ELKAN_MAX_K = 64
#: below this many features Hamerly's single bound: a distance costs about what Elkan's
#: O(k) bookkeeping of a row does
ELKAN_MIN_D = 8
#: below this k * d an iteration's distances cost about what the bookkeeping does: Lloyd's
#: kernels (a conservative choice: `benchmarks/bounds_fit.py` measures it)
BOUNDS_MIN_KD = 32
#: engines whose plain pass beats every bounded run measured on them, and by how much the
#: bounds lost: whole fits to convergence from one init, 2 cores, `benchmarks/bounds_fit.py`
#: (--grid over d 32-768, k 8-256, n 20k-100k, seed and blobs data; docs/bounds.md). Their
#: fused or BLAS pass reads a row once; a bounded iteration still walks n * k bounds and
#: gathers the failing rows for a GEMM of their own, more than the pass it saves even where
#: 13% of the rows fail. Lloyd's kernels there; `algorithm="elkan"` gives the same answer
FUSED_PASS_ENGINES = {"numba": "1.8-18x", "numpy": "1.2-4.4x"}

METHODS = ("hamerly", "elkan", "yinyang")


def bound_path(algorithm, *, device, n, d, k, room, asynchronous=False, engine=None):
    """(method or None, why): the assignment a fit takes. The table of the CPU engine:

    - not the CPU, or an asynchronous placement: Lloyd's kernels (a GPU computes a
      distance tile faster than it branches on bounds, and its iterations are queued ahead)
    - k == 1, or k * d < BOUNDS_MIN_KD: Lloyd's kernels (nothing to prune, or distances as
      cheap as the bookkeeping)
    - `engine` (the backend's name) in FUSED_PASS_ENGINES: Lloyd's kernels (measured faster
      than every bounded run there)
    - algorithm="lloyd": Lloyd's kernels (`auto` chooses among the engines above, where
      bounds lost at every point measured)
    - then, within `room` (bytes of max_memory the backend's own chunks leave, `room`; a
      function giving them, called only here):
      yinyang for k > ELKAN_MAX_K, hamerly for d < ELKAN_MIN_D or where Elkan's n * k
      bounds do not fit, else elkan; Lloyd's kernels where not even Hamerly's fit.
    """
    if device != "cpu" or asynchronous:
        return None, "Lloyd's kernels: bounds run on the CPU backends only"
    if k < 2 or k * d < BOUNDS_MIN_KD:
        return None, f"Lloyd's kernels: k * d = {k * d} < {BOUNDS_MIN_KD}"
    if engine in FUSED_PASS_ENGINES:
        return None, (f"Lloyd's kernels: on {engine} bounded runs took "
                      f"{FUSED_PASS_ENGINES[engine]} its plain pass's time (docs/bounds.md)")
    if algorithm != "elkan":
        return None, "Lloyd's kernels (algorithm='lloyd')"
    if callable(room):  # (the backend's estimate, asked only here)
        room = room()
    if k > ELKAN_MAX_K:
        groups = yinyang_groups(n, d, k, room)
        if groups >= 2:
            return "yinyang", f"yinyang: k = {k} > {ELKAN_MAX_K}, {groups} groups"
    elif d >= ELKAN_MIN_D and state_bytes("elkan", n, d, k) <= room:
        return "elkan", f"elkan: k = {k} <= {ELKAN_MAX_K}, d = {d} >= {ELKAN_MIN_D}"
    if state_bytes("hamerly", n, d, k) <= room:
        return "hamerly", "hamerly: few features, or no room for more bounds"
    return None, "Lloyd's kernels: max_memory leaves no room for the bounds"


def room(backend, n, d, k, itemsize):
    """Bytes of the fit's budget its backend's own chunks leave for the bound state: the
    budget less the backend's `estimate_memory` (half the budget where it gives none)."""
    budget = backend.memory.bytes()
    estimate = type(backend).estimate_memory
    options = {name: getattr(backend, opt.attr or name) for name, opt in backend.options.items()}
    try:
        used = estimate(n, d, k, itemsize=itemsize, max_memory=backend.max_memory,
                        **accepted_options(estimate, options)).total
    except NotImplementedError:
        used = budget // 2
    except MemoryError:
        return 0
    return max(0, budget - used)


def state_bytes(method, n, d, k, groups=1):
    """Bytes a `Bounds` of this method takes: per row its label, upper bound, squared norm,
    test flag, lower bounds and the row test's temporaries; the recompute chunks; the
    centers' float64 copies and the center-center distances."""
    lower = {"elkan": k, "yinyang": groups}.get(method, 1)
    per_row = 4 + 8 + 8 + 1 + 8 * lower + 8 * ROW_TEMPORARIES
    centers = 8 * k * (3 * d + (k if k <= CENTER_TEST_MAX_K else 0))
    return n * per_row + 2 * RECOMPUTE_BYTES + centers


def yinyang_groups(n, d, k, room=None):
    """Yinyang's groups: k / YINYANG_GROUP, fewer where `room` cannot hold their bounds."""
    t = -(-k // YINYANG_GROUP)
    if room is not None:
        while t > 1 and state_bytes("yinyang", n, d, k, t) > room:
            t = max(1, min(t - 1, int(t * 0.8)))
    return max(1, min(t, k))


class Shift:
    """How far the centers moved since the bounds were last valid, and what the row tests
    need from it (all float64 NumPy): `s` per center, the largest two (`s1` at `j1`, `s2`),
    per group (`group`), half the distance to each center's nearest other (`half`), and the
    largest ||c||^2 (`c2max`)."""

    __slots__ = ("s", "s1", "j1", "s2", "group", "half", "c2max")


class Bounds:
    """The bound state a driver's run holds (NumPy arrays, on the host): `labels` (int32),
    `upper` (n,), `lower` ((n, 1) Hamerly, (n, k) Elkan, (n, t) Yinyang), `x2` the rows'
    squared norms, `centers` (float64) the centers the bounds are valid for (None until the
    first assignment), `groups` and `order` (Yinyang: each center's group, and the centers
    sorted by group)."""

    def __init__(self, method, n, d, k, dtype, room=None):
        if method not in METHODS:
            raise ValueError(f"bounds method {method!r}: one of {METHODS}")
        self.method, self.n, self.d, self.k = method, n, d, k
        self.dtype = np.dtype(dtype)
        self.t = yinyang_groups(n, d, k, room) if method == "yinyang" else 1
        # a computed ||c||^2 - 2 x.c is within gamma (|x|^2 + 2 |c|^2) of the exact value
        # (2|x||c| <= |x|^2 + |c|^2); gamma of d + 2 roundings, doubled for headroom
        u = float(np.finfo(self.dtype).eps) / 2
        self.gamma = 2 * (d + 4) * u
        self.centers = None
        self.labels = self.upper = self.lower = self.x2 = None
        self.groups = self.order = self.starts = None
        self.sq_norm_total = None
        self.recomputed = 0  # rows recomputed by the last assignment
        self.full = True     # the last assignment computed every row (a start)

    @property
    def started(self):
        return self.centers is not None

    def restart(self):
        """Forget the centers: the next assignment computes every row and sets all bounds
        again (the per-row arrays are kept)."""
        self.centers = None

    # -- the centers --------------------------------------------------------------------
    def advance(self, centers):
        """The `Shift` from the bounds' centers to `centers` (NumPy, X's dtype), whose
        values become the bounds' centers; None on the first call."""
        c64 = np.asarray(centers, dtype=np.float64)
        if self.centers is None:
            if self.method == "yinyang":
                self._make_groups(c64)
            self.centers = c64.copy()
            return None
        sh = Shift()
        # rounded up: a shift must not be smaller than the exact one
        sh.s = np.sqrt(np.einsum("ij,ij->i", c64 - self.centers, c64 - self.centers))
        sh.s *= PRUNE_SLACK
        order = np.argsort(sh.s)
        sh.j1 = int(order[-1])
        sh.s1 = float(sh.s[sh.j1])
        sh.s2 = float(sh.s[order[-2]]) if self.k > 1 else 0.0
        sh.group = (np.maximum.reduceat(sh.s[self.order], self.starts)
                    if self.method == "yinyang" else None)
        c2 = np.einsum("ij,ij->i", c64, c64)
        sh.c2max = float(c2.max())
        sh.half = self._half_gaps(c64, c2) if self.k <= CENTER_TEST_MAX_K else \
            np.zeros(self.k)
        self.centers = c64.copy()
        return sh

    def _half_gaps(self, c64, c2):
        """Half the distance from each center to its nearest other, a lower bound (the
        expansion's float64 error taken off)."""
        D = c2[:, None] + c2[None, :] - 2.0 * (c64 @ c64.T)
        D -= 8 * (self.d + 2) * np.finfo(np.float64).eps * (c2[:, None] + c2[None, :])
        np.fill_diagonal(D, np.inf)
        return 0.5 * np.sqrt(np.maximum(D.min(axis=1), 0.0))

    def _make_groups(self, c64):
        """Yinyang's groups: a few Lloyd steps on the initial centers (any grouping is
        exact; a good one prunes more), from centers spread over the index range."""
        t, k = self.t, self.k
        G = c64[np.linspace(0, k - 1, t).astype(np.intp)].copy()
        g = np.zeros(k, dtype=np.intp)
        for _ in range(5):
            d2 = (np.einsum("ij,ij->i", c64, c64)[:, None] - 2 * c64 @ G.T
                  + np.einsum("ij,ij->i", G, G)[None, :])
            g = d2.argmin(axis=1)
            for j in range(t):
                members = g == j
                if members.any():
                    G[j] = c64[members].mean(axis=0)
        # groups numbered densely (an empty group is dropped)
        _, g = np.unique(g, return_inverse=True)
        self.groups = g.astype(np.intp)
        self.t = int(g.max()) + 1
        self.order = np.argsort(self.groups, kind="stable")
        counts = np.bincount(self.groups, minlength=self.t)
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.intp)

    # -- the rows -----------------------------------------------------------------------
    def start_rows(self, X):
        """Per-row arrays, on the first assignment (||x||^2 in float64: the rows' error
        margins, and the inertia from the per-cluster sums, `inertia_from_sums`)."""
        n, k = self.n, self.k
        self.x2 = np.empty(n)
        step = max(1, RECOMPUTE_BYTES // (8 * max(self.d, 1)))
        for s in range(0, n, step):
            rows = np.asarray(X[s:s + step], dtype=np.float64)
            self.x2[s:s + step] = np.einsum("ij,ij->i", rows, rows)
        self.labels = np.zeros(n, dtype=np.int32)
        self.upper = np.zeros(n)
        width = {"hamerly": 1, "elkan": k, "yinyang": self.t}[self.method]
        self.lower = np.zeros((n, width))

    def margin(self, c2max):
        """(n,) the error of a computed squared distance of each row (see the module)."""
        return self.gamma * (self.x2 + 2.0 * c2max)

    def set_rows(self, idx, D, x2, delta, labels=None):
        """Labels and bounds of rows `idx` from D, their (rows, k) computed ||c||^2 - 2 x.c
        (left as given): the argmin (the lowest index on a tie, as a plain assignment), or
        `labels` where given, and bounds widened by each row's error `delta`. Hamerly and
        Yinyang take their minima on D in X's dtype (the shift by x2 - delta keeps the
        order), so only (rows, 1) or (rows, t) values go to float64 and sqrt; Elkan all
        (rows, k)."""
        lab = np.argmin(D, axis=1) if labels is None else np.asarray(labels, dtype=np.intp)
        r = np.arange(len(idx))
        self.labels[idx] = lab
        computed = D[r, lab]
        own = computed.astype(np.float64)
        self.upper[idx] = np.sqrt(np.maximum(own + x2 + delta, 0.0))
        D[r, lab] = np.inf  # a row's own center is in none of its lower bounds
        if self.method == "elkan":
            low = D
        elif self.method == "hamerly":
            low = D.min(axis=1, keepdims=True)
        else:
            low = np.minimum.reduceat(D[:, self.order], self.starts, axis=1)
        # (cast and shift in one pass)
        low = np.add(low, (x2 - delta)[:, None], dtype=np.float64)
        np.maximum(low, 0.0, out=low)
        np.sqrt(low, out=low)  # (inf stays inf: no other center, or none in the group)
        self.lower[idx] = low
        D[r, lab] = computed   # (D as given again: its near ties are read after)
        return lab


def filter_rows_numpy(bounds, X, centers, sh):
    """The row tests, vectorised: bounds moved by the shift `sh`, each row's upper bound
    tightened to its exact distance where the moved one fails; returns the rows that must
    be recomputed (intp indices)."""
    b = bounds
    lab = b.labels
    u = b.upper
    u += sh.s[lab]
    if b.method == "hamerly":
        others = np.where(lab == sh.j1, sh.s2, sh.s1)
        b.lower[:, 0] -= others
        z = b.lower[:, 0].copy()
    elif b.method == "elkan":
        b.lower -= sh.s[None, :]
        z = b.lower.min(axis=1)
    else:
        b.lower -= sh.group[None, :]
        z = b.lower.min(axis=1)
    np.maximum(z, 2.0 * sh.half[lab] - u, out=z)
    delta2 = 2.0 * b.margin(sh.c2max)
    fail = np.flatnonzero(z <= np.sqrt(u * u + delta2) * PRUNE_SLACK)
    if fail.size == 0:
        return fail
    # the failing rows' exact distance to their own center (float64 differences)
    step = max(1, RECOMPUTE_BYTES // (16 * max(b.d, 1)))
    c = b.centers
    for s in range(0, fail.size, step):
        idx = fail[s:s + step]
        diff = np.asarray(X[idx], dtype=np.float64) - c[lab[idx]]
        u[idx] = np.sqrt(np.einsum("ij,ij->i", diff, diff)) * PRUNE_SLACK
    keep = z[fail] > np.sqrt(u[fail] ** 2 + delta2[fail]) * PRUNE_SLACK
    return fail[~keep]


def plain_distances(rows, centers):
    """(rows, k) ||c||^2 - 2 x.c in X's dtype: one GEMM, then ||c||^2 added."""
    c = np.asarray(centers, dtype=rows.dtype)
    D = rows @ (c.T * rows.dtype.type(-2))
    D += np.einsum("ij,ij->i", c, c)[None, :]
    return D


def near_ties(bounds, idx, delta):
    """Of rows `idx`, just set from their computed distances (each within `delta` of the
    exact value), those whose nearest center another computation could order otherwise:
    their second-nearest within 4 delta of the nearest (two computations, each within
    delta, can disagree only where the exact gap is within 2 delta, the computed one then
    within 4 delta). Read from the rows' new bounds, which hold the two widened by delta:
    lower^2 - upper^2 = D_2 - D_1 - 2 delta."""
    up = bounds.upper[idx]
    low = bounds.lower[idx].min(axis=1)
    return np.flatnonzero(low <= np.sqrt(up * up + 2.0 * delta) * PRUNE_SLACK)


def labels_by_block(idx, starts, stops, labels_of, whole, n):
    """Labels of rows `idx` of an n-row X (a `ties` hook's answer) from their own blocks of
    a pass, rows [starts[j], stops[j]) for row idx[j]: `labels_of(start, stop)` -> a block's
    labels, each block labelled once; `whole()` -> every row's labels from one whole pass,
    taken instead where the blocks hold WHOLE_PASS_SHARE of the rows or more (a call of
    the pass a block would then cost more)."""
    idx = np.asarray(idx, dtype=np.intp)
    first, at, inverse = np.unique(starts, return_index=True, return_inverse=True)
    last = np.asarray(stops)[at]
    if (last - first).sum() >= WHOLE_PASS_SHARE * n:
        return np.asarray(whole())[idx].astype(np.intp)
    out = np.empty(len(idx), dtype=np.intp)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(first) + 1))
    for u, (s0, e0) in enumerate(zip(first.tolist(), last.tolist())):
        rows = order[bounds[u]:bounds[u + 1]]
        out[rows] = np.asarray(labels_of(s0, e0))[idx[rows] - s0]
    return out


def assign_bounded_numpy(X, centers, bounds, *, distances=None, row_filter=None,
                         row_setter=None, ties=None):
    """`assign_bounded` on NumPy X: labels (int32, a new array) against `centers`, with
    `bounds` updated to them. `distances(rows, centers)` -> (rows, k) ||c||^2 - 2 x.c
    (default `plain_distances`); `row_filter(bounds, X, centers, shift)` -> rows to
    recompute (default `filter_rows_numpy`); `row_setter(bounds, idx, D, x2, delta)` sets
    their labels and bounds from D, leaving D as given (default `Bounds.set_rows`). `ties(idx)` -> the labels
    the backend's plain assignment gives rows `idx`, which recomputed rows at a near tie
    (`near_ties`) take: BLAS rounds by the shapes it gets, and the recomputed rows are
    gathered into other shapes (docs/bounds.md). None: the argmin of `distances`."""
    X = np.asarray(X)
    b = bounds
    if b.labels is None:
        b.start_rows(X)
    sh = b.advance(centers)
    c2max = float(np.einsum("ij,ij->i", b.centers, b.centers).max())
    if sh is None:
        todo = None  # every row
    else:
        todo = (row_filter or filter_rows_numpy)(b, X, centers, sh)
    dist = distances or plain_distances
    n = b.n
    count = n if todo is None else todo.size
    step = max(1, RECOMPUTE_BYTES // (max(b.k, 1) * 16))
    for s in range(0, count, step):
        idx = np.arange(s, min(s + step, n)) if todo is None else todo[s:s + step]
        rows = X[s:s + step] if todo is None else X[idx]
        D = dist(rows, centers)
        x2 = b.x2[idx]
        delta = b.gamma * (x2 + 2.0 * c2max)
        if row_setter is None:
            b.set_rows(idx, D, x2, delta)
        else:
            row_setter(b, idx, D, x2, delta)
        near = near_ties(b, idx, delta) if ties is not None and b.k > 1 else ()
        if len(near):   # (their bounds from D hold whichever of the near two they take)
            b.set_rows(idx[near], D[near], x2[near], delta[near], labels=ties(idx[near]))
    b.recomputed, b.full = count, todo is None
    return b.labels.copy()
