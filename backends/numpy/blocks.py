"""The numpy backend's work on one block of rows, run by one pool thread on its own buffers.

Every call here is one NumPy call on many rows, and each is one whose loop runs without the
GIL (read in NumPy's sources, and timed on many cores by benchmarks/test_bench_numpy.py):
matmul, argmin, take, argsort of small integer keys (a radix sort), casting copies, einsum,
searchsorted, and ``np.add.reduceat`` on a *one-dimensional* float64 array. Not among them:
np.bincount (its min/max pass and weight conversion hold the GIL), ``np.add.at``, and
``np.add.reduceat`` on a 2-d array with fewer than 500 columns (NumPy releases the GIL there
only past 500 outer iterations, and with a cast it copies the input first, GIL held). On many
threads every GIL-held microsecond queues, so the per-cluster sums group the block's rows by
label and add each feature's column in one flat reduceat (`sorted_sums`); on one thread,
where nothing queues, d bincounts are cheaper for few features (`bincount_sums`).

The inertia of an iteration needs no per-row distances: with S_j and W_j the weighted sums
and weights of cluster j, sum_i w_i ||x_i - c_l(i)||^2 = sum_i w_i ||x_i||^2 - 2 sum_j c_j.S_j
+ sum_j W_j ||c_j||^2, all in float64 (`inertia`). So `lloyd_iter`'s GEMM sub-chunk is two
calls (matmul, argmin); `assign` adds the take of each row's minimum. The inertia of a
fit's final assignment (and `inertia`) is by differences, ||x - c_label||^2 per row in
float64 (`sq_dist_block`), summed per block: no n distances are kept.

A block's labels are computed (argmin) and read by the sums as intp in the thread's buffer
("lab"), then stored in the pass's output, in the type the backend keeps them in (compact
between iterations: an argmin into uint8 goes through an intp temporary of its own).
"""
from __future__ import annotations

import threading

import numpy as np

from kmeans_xp.contract.chunks import inertia_of_sums
from kmeans_xp.contract.rows import center_rows

from kmeans_xp_backends.cpu_threads import check_stop


class Operands:
    """The centers as the GEMM takes them, in X's dtype: the augmented ``[-2 C^T; ||c||^2]``
    (d + 1, k), so that one GEMM on ``[x, 1]`` gives ||c||^2 - 2 x.c (no separate
    + ||c||^2 call per sub-chunk). ||c||^2 is summed in X's dtype as scikit-learn's
    ``row_norms`` does, so near-ties break the same way."""

    __slots__ = ("gemm", "c64", "c")

    def __init__(self, centers, dtype):
        c = np.asarray(centers, dtype=dtype)
        d = c.shape[1]
        self.gemm = np.empty((d + 1, c.shape[0]), dtype=dtype)
        np.multiply(c.T, -2, out=self.gemm[:d])
        self.gemm[d] = np.einsum("ij,ij->i", c, c)
        self.c64 = c.astype(np.float64)
        self.c = c


class Acc:
    """One thread's float64 accumulators of a pass: sums (feature-major (d, k) where the
    sums are made feature by feature, `sorted_sums`), weights, sum of w ||x||^2, the count
    of changed labels, and sum of w ||x - c_label||^2 by differences (`direct`)."""

    __slots__ = ("sums", "weights", "sq_norms", "changed", "feature_major", "direct")

    def __init__(self, k, d, feature_major=False):
        self.feature_major = feature_major
        self.sums = np.zeros((d, k) if feature_major else (k, d), dtype=np.float64)
        self.weights = np.zeros(k, dtype=np.float64)
        self.sq_norms = 0.0
        self.changed = 0
        self.direct = 0.0

    def merge(self, other):
        self.sums += other.sums
        self.weights += other.weights
        self.sq_norms += other.sq_norms
        self.changed += other.changed
        self.direct += other.direct
        return self

    @staticmethod
    def flat_size(k, d):
        return k * d + k + 3

    def to_flat(self, out):
        """Write the accumulators into `out` (`flat_size` float64: a worker process's slot
        in shared memory)."""
        kd, k = self.sums.size, self.weights.size
        out[:kd] = self.sums.reshape(-1)
        out[kd:kd + k] = self.weights
        out[kd + k:] = (self.sq_norms, self.changed, self.direct)

    @classmethod
    def from_flat(cls, flat, k, d, feature_major=False):
        acc = cls(k, d, feature_major)
        acc.sums.reshape(-1)[:] = flat[:k * d]
        acc.weights[:] = flat[k * d:k * d + k]
        acc.sq_norms, changed, acc.direct = (float(v) for v in flat[k * d + k:])
        acc.changed = int(changed)
        return acc

    def cluster_sums(self):
        """(k, d) float64."""
        return np.ascontiguousarray(self.sums.T) if self.feature_major else self.sums

    def inertia(self, ops):
        """sum of w ||x - c_label||^2 from the sums (see the module's note), at least 0."""
        return inertia_of_sums(self.sq_norms, ops.c64, self.cluster_sums(), self.weights)


def merged(accs):
    """The accumulators added in thread order (into the first)."""
    total = None
    for a in accs:
        total = a if total is None else total.merge(a)
    return total


def key_dtype(k):
    """Labels as the smallest unsigned type holding them: NumPy radix-sorts 8- and 16-bit
    integers (stable, O(n), without the GIL)."""
    return np.uint8 if k <= 1 << 8 else np.uint16 if k <= 1 << 16 else np.intp


def allocate(block, sub, k, d, dtype, *, sorted_sums, group=None, diff_rows=None):
    """One job's buffers (allocated once per fit and reused by every pass: `BufferSets`).
    The augmented GEMM's buffer [x, 1] also holds X's rows where they are copied before use
    (centered from a memmap, or X not C-contiguous). diff_rows: rows of the final pass's x - c_label pieces
    (default: sub)."""
    b = {"D": np.empty((sub, k), dtype=dtype),
         "diff_rows": diff_rows or sub,   # x - c_label's buffers: at the first `sq_dist_block`
         "idx": np.empty(sub, dtype=np.intp),
         "lab": np.empty(block, dtype=np.intp),      # the block's labels
         "offs": np.arange(sub, dtype=np.intp) * k,   # row starts in the flat GEMM result
         "xnorm": np.empty(block, dtype=dtype),
         "w64": np.empty(block, dtype=np.float64),
         "m64": np.empty(block, dtype=np.float64)}
    b["Xa"] = np.empty((block, d + 1), dtype=dtype)
    b["Xa"][:, d] = 1
    if sorted_sums:
        kd = key_dtype(k)
        b["keys"] = np.empty(block, dtype=kd)
        b["ks"] = np.empty(block, dtype=kd)
        b["key_range"] = np.arange(k, dtype=kd)
        b["gathered"] = np.empty(block * (d + 1), dtype=dtype)
        b["group"] = group = group or d    # features cast at a time (`sorted_sums`)
        b["cols"] = np.empty(block * group + 1, dtype=np.float64)   # (+ a 0: `sorted_sums`)
        b["ws"] = np.empty(block, dtype=np.float64)
    else:
        b["xw64"] = np.empty(block, dtype=np.float64)
    return b


class BufferSets:
    """A backend's sets of pass buffers (`allocate`): a pass's job takes one for its
    share and gives it back when the share is done, so a fit holds as many sets as jobs run
    at once (its plan's threads, what `estimate_memory` counts), whichever of the process's
    pass threads run them. (Kept per OS thread, sets piled up: the pass threads are grown to
    the most any fit asked for, and a later pass's jobs landing on other threads of them
    made sets anew.)"""

    def __init__(self):
        self._lock = threading.Lock()
        self._free = []   # (plan key, buffers)

    def take(self, key, make):
        """A free set made for `key`, else `make()`; free sets of another plan are dropped
        first (before the new one is allocated)."""
        with self._lock:
            while self._free:
                k, bufs = self._free.pop()
                if k == key:
                    return bufs
        return make()

    def give(self, key, bufs):
        with self._lock:
            self._free.append((key, bufs))

    def clear(self):
        with self._lock:
            self._free = []


def block_row_bytes(d, itemsize, *, sorted_sums, group=None):
    """Bytes per block row of `allocate`'s buffers and of the transient arrays of one block
    (argsort's order)."""
    n = (d + 1) * itemsize                      # the augmented rows [x, 1]
    n += itemsize + 24                          # ||x||^2 (assign), w64, m64, intp labels
    if sorted_sums:
        # keys and sorted keys (at most 8 bytes each), gathered rows in X's dtype, the
        # float64 columns (of a group of features), sorted weights, argsort's order
        n += 16 + (d + 1) * itemsize + 8 * (group or d) + 8 + 8
    else:
        n += 8
    return n


def block_rows(X, mean, s0, e0, bufs, *, gemm):
    """(rows, src): rows [s0, e0) as the kernels read them, and a C-contiguous array whose
    first d columns are those rows, for row gathers (X's own rows where they will do: a
    gather from the augmented buffer's 516-byte rows, then their transposition, took 3x
    longer at d=128). Copied into this thread's augmented buffer when the GEMM needs them
    (gemm; `assign_block` reads the buffer), when X is seen centered (mean: a memmap's rows,
    centered here, bit for bit the centered copy's) or is not C-contiguous."""
    r, d = e0 - s0, X.shape[1]
    rows = X[s0:e0]
    own = mean is None and rows.flags.c_contiguous
    if gemm or not own:
        A = bufs["Xa"][:r]
        center_rows(X, mean, s0, e0, A[:, :d])
        return A[:, :d], rows if own else A
    return rows, rows


def assign_block(rows, ops, labels, min_sq, bufs, sub, stop=None):
    """Labels (intp, the block's) and, when min_sq is an array, squared distances of the
    block's `rows` (`block_rows`, which filled the augmented buffer). `stop`: the pass's
    event, polled before each sub-chunk (`cpu_threads.PassThreads`)."""
    r0 = rows.shape[0]
    D = bufs["D"]
    A = bufs["Xa"][:r0]   # the GEMM's left operand: [x, 1]
    want = min_sq is not None
    for s in range(0, r0, sub):
        check_stop(stop)
        e = min(s + sub, r0)
        r = e - s
        Dv, lab = D[:r], labels[s:e]
        np.matmul(A[s:e], ops.gemm, out=Dv)
        Dv.argmin(axis=1, out=lab)
        if want:  # each row's minimum: a flat take (no take_along_axis temporaries)
            idx = bufs["idx"][:r]
            np.add(lab, bufs["offs"][:r], out=idx)
            D.reshape(-1).take(idx, out=min_sq[s:e], mode="clip")
    if want:
        xn = bufs["xnorm"][:r0]
        np.einsum("ij,ij->i", rows, rows, out=xn)
        min_sq += xn
        np.maximum(min_sq, 0, out=min_sq)


def block_labels(labels, s0, e0, bufs):
    """Rows [s0, e0) of `labels` (any integer type) as the block's intp labels."""
    lab = bufs["lab"][:e0 - s0]
    np.copyto(lab, labels[s0:e0], casting="unsafe")
    return lab


def sq_dist_block(rows, lab, c, bufs, step, stop=None):
    """(r,) float64 ||x - c_label||^2 of the block's rows, by differences: x - c in X's
    dtype, as the driver's `chunks.labelled_sq_dist`, squared and added in float64. In the
    thread's "m64" buffer, `step` rows at a time (a row's value does not depend on it).
    (Cast by a copy: an einsum that casts, or a subtraction of mixed types, allocates
    NumPy's casting buffers on every call.)"""
    r0 = rows.shape[0]
    out = bufs["m64"][:r0]
    if "diff" not in bufs:   # (a pass that keeps no distances never makes them)
        shape = (bufs["diff_rows"], rows.shape[1])
        bufs["diff"] = np.empty(shape, dtype=rows.dtype)
        if rows.dtype != np.float64:
            bufs["diff64"] = np.empty(shape, dtype=np.float64)
    for s in range(0, r0, step):
        check_stop(stop)
        e = min(s + step, r0)
        diff = bufs["diff"][:e - s]
        np.take(c, lab[s:e], axis=0, out=diff, mode="clip")
        np.subtract(rows[s:e], diff, out=diff)
        if diff.dtype != np.float64:
            diff64 = bufs["diff64"][:e - s]
            np.copyto(diff64, diff)
            diff = diff64
        np.einsum("ij,ij->i", diff, diff, out=out[s:e])
    return out


def block_weights(sample_weight, s0, e0, bufs):
    """The block's weights as contiguous float64 (None: unit weights)."""
    if sample_weight is None:
        return None
    w64 = bufs["w64"][:e0 - s0]
    np.copyto(w64, sample_weight[s0:e0], casting="unsafe")
    return w64


#: rows a transposed cast copies at a time: in one piece, NumPy's strided cast walks the
#: whole destination for every source row (25,000 x 128 float32: 34 ms against 3.2 ms in
#: pieces of 128 rows, whose rows stay in cache)
TRANSPOSE_ROWS = 128


def transpose_cast(out, src):
    """out[...] = src.T (cast to out's dtype), a piece of rows at a time: the same values."""
    for i in range(0, src.shape[0], TRANSPOSE_ROWS):
        np.copyto(out[:, i:i + TRANSPOSE_ROWS], src[i:i + TRANSPOSE_ROWS].T)


def sorted_sums(Xb, src, lab, w64, acc, bufs, sq_norms):
    """acc += the block's per-cluster float64 sums of w * x and of w, rows grouped by label.
    The rows are gathered in label order (stable: row order within a cluster), then cast to
    float64 and laid out feature-major, a group of features at a time (bufs["group"], all d
    by default), so that one flat reduceat adds every (feature, cluster) run of the group at
    once. The order of additions is fixed by the block's rows, not by which thread ran when,
    nor by the group size. sq_norms: also add sum of w ||x||^2 into acc."""
    r = len(lab)
    if r == 0:
        return
    d = Xb.shape[1]
    k = acc.weights.shape[0]
    keys, ks = bufs["keys"][:r], bufs["ks"][:r]
    np.copyto(keys, lab, casting="unsafe")
    order = np.argsort(keys, kind="stable")
    # (takes into an `out` with mode="clip": with "raise", NumPy gathers into a new array
    # and copies that into out, 7x slower here; the indices are valid by construction)
    np.take(keys, order, out=ks, mode="clip")
    starts = ks.searchsorted(bufs["key_range"])            # (k,) first row of each label
    counts = np.empty(k, dtype=np.intp)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1])
    counts[-1] = r - starts[-1]
    filled = counts > 0
    rows = bufs["gathered"][:r * src.shape[1]].reshape(r, src.shape[1])
    np.take(src, order, axis=0, out=rows, mode="clip")
    if w64 is None:
        acc.weights += counts
    else:
        ws = bufs["ws"][:r]
        np.take(w64, order, out=ws, mode="clip")
        # (in row order, as bincount_sums adds them: one call, whose min/max pass over the
        # labels holds the GIL)
        acc.weights += np.bincount(lab, weights=w64, minlength=k)
    # one run per (feature, cluster), empty clusters' too: a run that starts where the next
    # one does is one element, left out of the sum by `where` (a scatter of the filled
    # clusters' sums cost more than their reduceat); a trailing empty cluster's run starts
    # past the group's values, on a 0 appended to them
    where = True if filled.all() else filled
    g = bufs["group"]
    runs = (starts + np.arange(0, min(g, d) * r, r, dtype=np.intp)[:, None]).reshape(-1)
    for j0 in range(0, d, g):
        j1 = min(j0 + g, d)
        flat = bufs["cols"][:r * (j1 - j0) + 1]
        flat[-1] = 0.0
        cols = flat[:-1].reshape(j1 - j0, r)
        transpose_cast(cols, rows[:, j0:j1])
        if sq_norms:
            if w64 is None:
                v = cols.reshape(-1)
                acc.sq_norms += float(np.dot(v, v))
            else:
                m = bufs["m64"][:r]
                np.einsum("ji,ji->i", cols, cols, out=m)
                acc.sq_norms += float(np.dot(m, ws))
        if w64 is not None:
            cols *= ws
        part = np.add.reduceat(flat, runs[:(j1 - j0) * k]).reshape(j1 - j0, k)
        out = acc.sums[j0:j1]         # (feature-major: contiguous)
        np.add(out, part, out=out, where=where)


def bincount_sums(Xb, src, lab, w64, acc, bufs, sq_norms):
    """The same sums by one np.bincount per feature (cheaper on one thread for few
    features; each holds the GIL for part of its pass)."""
    r = len(lab)
    k = acc.weights.shape[0]
    if w64 is None:
        acc.weights += np.bincount(lab, minlength=k)
    else:
        acc.weights += np.bincount(lab, weights=w64, minlength=k)
    x64, xw = bufs["m64"][:r], bufs["xw64"][:r]
    for j in range(Xb.shape[1]):
        np.copyto(x64, Xb[:, j], casting="unsafe")
        if w64 is None:
            xw = x64
        else:
            np.multiply(x64, w64, out=xw)
        if sq_norms:
            acc.sq_norms += float(np.dot(x64, xw))
        acc.sums[:, j] += np.bincount(lab, weights=xw, minlength=k)


class Pass:
    """One pass over X as each thread, or worker process, runs its share (`run_share`): the
    mode ("assign": int32 labels and distances; "reduce": sums of labels_in's clusters;
    "iter": labels, sums, inertia, changed labels; "final": labels and their inertia by
    differences; "inertia": labels_in's, by differences; "stats": labels_in's sums and
    inertia by differences, one pass), X (seen centered with `mean`: a
    memmap's rows), the weights, the backend's plan, the centers (`Operands` where the pass
    assigns, `c` in X's dtype where it takes differences) and the arrays of all n rows.
    Share t of `threads` is a fixed, contiguous run of the n_tasks blocks."""

    __slots__ = ("mode", "X", "mean", "w", "plan", "ops", "c", "labels", "min_sq",
                 "labels_in", "labels_old", "threads", "n_tasks", "sub", "stop")

    def __init__(self, mode, X, mean, w, plan, ops, c, *, labels=None, min_sq=None,
                 labels_in=None, labels_old=None, threads=1, n_tasks=1, sub=1, stop=None):
        self.mode, self.X, self.mean, self.w, self.plan = mode, X, mean, w, plan
        self.ops, self.c, self.labels, self.min_sq = ops, c, labels, min_sq
        self.labels_in, self.labels_old = labels_in, labels_old
        self.threads, self.n_tasks, self.sub = threads, n_tasks, sub
        self.stop = stop   # a threading.Event polled between sub-chunks, or None


def run_share(p, t, bufs):
    """Share t of pass `p` on this thread's buffers: its blocks in order, added into its own
    accumulators (returned). A block's changed labels are counted before its new labels are
    stored: a worker process reads the old ones where it writes the new."""
    plan, n = p.plan, p.X.shape[0]
    assign = p.mode in ("assign", "iter", "final")
    reduce = p.mode in ("reduce", "iter", "stats")
    direct = p.mode in ("final", "inertia", "stats")   # inertia by differences
    sums = sorted_sums if plan.sorted_sums else bincount_sums
    acc = Acc(plan.k, plan.d, plan.sorted_sums)
    for i in range(t * p.n_tasks // p.threads, (t + 1) * p.n_tasks // p.threads):
        check_stop(p.stop)
        s0, e0 = i * plan.block, min((i + 1) * plan.block, n)
        rows, src = block_rows(p.X, p.mean, s0, e0, bufs, gemm=assign)
        if assign:  # the block's labels (intp), then stored in the output's type
            lab = bufs["lab"][:e0 - s0]
            assign_block(rows, p.ops, lab, None if p.min_sq is None else p.min_sq[s0:e0],
                         bufs, p.sub, p.stop)
            if p.labels_old is not None:
                acc.changed += int(np.count_nonzero(lab != p.labels_old[s0:e0]))
            np.copyto(p.labels[s0:e0], lab, casting="unsafe")
        else:
            lab = block_labels(p.labels_in, s0, e0, bufs)
        w64 = block_weights(p.w, s0, e0, bufs) if reduce or direct else None
        if reduce:
            sums(rows, src, lab, w64, acc, bufs, sq_norms=assign)
        if direct:
            dist = sq_dist_block(rows, lab, p.c, bufs, plan.diff_rows, p.stop)
            acc.direct += float(dist.sum() if w64 is None else np.dot(dist, w64))
    return acc
