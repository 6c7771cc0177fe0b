"""Index-scale k: flat, hierarchical and balanced fits, FAISS-style subsampled training and
cuVS's k-means, on the same data: time per fit, the size spread and the inertia.

    python benchmarks/large_k.py                                  # n=200k d=32 k=1024, numba
    python benchmarks/large_k.py --n 10M --d 128 --k 65536 --backend cupy-fused --json out.json
    python benchmarks/large_k.py --rows flat hierarchical --max-iter 20

Rows (`--rows`, default all that run here):

    flat                 KMeans(init="k-means++"), max_iter iterations (tol=0)
    hierarchical         KMeans(init="hierarchical"), --refine flat iterations after it
    balanced             KMeans(balance=--cap), k-means++ and max_iter iterations
    balanced-hierarchical  both: the IVF training recipe (cuVS's balanced hierarchical)
    subsampled           FAISS's recipe: a flat fit of 256 * k sampled rows (--per-center),
                         then every row assigned to its nearest center
    cuvs                 cuVS's KMeans (cuvs.cluster.kmeans), when `cuvs` imports
    cuvs-balanced        cuVS's balanced hierarchical k-means (an IVF-Flat build's lists),
                         when `cuvs` imports

Columns: seconds of the whole fit (init included; data already on the device), max/mean
cluster size and inertia of the partition each row ends with (labels_, or the nearest
center for the subsampled and cuVS rows), both over all n rows, and the inertia over the
flat row's. The figures for docs/large_k.md come from here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

ROWS = ("flat", "hierarchical", "balanced", "balanced-hierarchical", "subsampled", "cuvs",
        "cuvs-balanced")


def size(text):
    text = str(text).strip().lower()
    mult = {"k": 10**3, "m": 10**6}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def make_data(n, d, seed=0):
    """float32 rows of a Gaussian mixture of sqrt(n) components of uneven weight: flat
    k-means leaves clusters of uneven size on it, as on real embeddings."""
    rng = np.random.default_rng(seed)
    comps = max(2, int(np.sqrt(n)) // 4)
    means = rng.normal(size=(comps, d)).astype(np.float32) * 4
    which = rng.choice(comps, size=n, p=rng.dirichlet(np.full(comps, 0.5)))
    X = rng.standard_normal(size=(n, d), dtype=np.float32)
    X *= np.linspace(0.5, 2.0, d, dtype=np.float32)
    X += means[which]
    return X


def to_device(X, backend):
    if backend.startswith("cupy"):
        import cupy
        return cupy.asarray(X)
    return X


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def partition_stats(X, C, labels, k):
    """(max/mean cluster size, inertia) of labels over X (host, float64 chunks)."""
    Xh, Ch, lab = host(X), host(C).astype(np.float64), host(labels).astype(np.int64)
    counts = np.bincount(lab, minlength=k)
    total = 0.0
    for s in range(0, len(Xh), 1 << 16):
        diff = Xh[s:s + (1 << 16)].astype(np.float64) - Ch[lab[s:s + (1 << 16)]]
        total += float(np.einsum("ij,ij->", diff, diff))
    return float(counts.max() / counts.mean()), total


def sync(backend):
    if backend.startswith("cupy"):
        import cupy
        cupy.cuda.runtime.deviceSynchronize()


def run_row(row, X, args):
    """(seconds, centers, labels over all rows) of one row."""
    from kmeans_xp import KMeans
    k, b = args.k, args.backend
    common = dict(n_init=1, tol=0, random_state=args.seed, backend=b)
    sync(b)
    t0 = time.perf_counter()
    if row in ("flat", "balanced", "hierarchical", "balanced-hierarchical"):
        hier = "hierarchical" in row
        km = KMeans(k, init="hierarchical" if hier else "k-means++",
                    max_iter=args.refine if hier else args.max_iter,
                    balance=args.cap if row.startswith("balanced") else None, **common)
        km.fit(X)
        sync(b)
        return time.perf_counter() - t0, km.cluster_centers_, km.labels_
    if row == "subsampled":
        m = min(X.shape[0], args.per_center * k)
        idx = np.sort(np.random.default_rng(args.seed).choice(X.shape[0], m, replace=False))
        km = KMeans(k, max_iter=args.max_iter, **common).fit(X[idx])
        labels = km.predict(X)
        sync(b)
        return time.perf_counter() - t0, km.cluster_centers_, labels
    return run_cuvs(row, X, args, t0)


def run_cuvs(row, X, args, t0):
    import cupy
    Xd = cupy.asarray(X)
    if row == "cuvs":
        from cuvs.cluster import kmeans
        params = kmeans.KMeansParams(n_clusters=args.k, max_iter=args.max_iter, tol=0.0)
        C, _, _ = kmeans.fit(params, Xd)
    else:   # the balanced hierarchical k-means of an IVF-Flat build: its lists' centers
        from cuvs.neighbors import ivf_flat
        params = ivf_flat.IndexParams(n_lists=args.k, kmeans_n_iters=args.max_iter,
                                      kmeans_trainset_fraction=1.0, add_data_on_build=False)
        C = ivf_flat.build(params, Xd).centers
    C = cupy.asarray(C)
    labels = cupy.argmin((C * C).sum(1)[None, :] - 2 * Xd @ C.T, axis=1) if X.shape[0] * \
        args.k <= 1 << 28 else _chunked_argmin(Xd, C)
    cupy.cuda.runtime.deviceSynchronize()
    return time.perf_counter() - t0, C, labels


def _chunked_argmin(Xd, C):
    import cupy
    c2 = (C * C).sum(1)[None, :]
    step = max(1, (1 << 28) // C.shape[0])
    return cupy.concatenate([cupy.argmin(c2 - 2 * Xd[s:s + step] @ C.T, axis=1)
                             for s in range(0, Xd.shape[0], step)])


def available(row):
    if not row.startswith("cuvs"):
        return True
    try:
        import cuvs  # noqa: F401
        import cupy  # noqa: F401
        return True
    except ImportError:
        return False


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=size, default=200_000)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--backend", default="numba")
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--refine", type=int, default=5,
                   help="flat iterations after the hierarchical init")
    p.add_argument("--cap", type=float, default=1.1, help="balance: max size over mean")
    p.add_argument("--per-center", type=int, default=256, help="subsampled rows per center")
    p.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    X = to_device(make_data(args.n, args.d, args.seed), args.backend)
    out = []
    print(f"n={args.n} d={args.d} k={args.k} backend={args.backend} "
          f"max_iter={args.max_iter} refine={args.refine} cap={args.cap}")
    print("| row | seconds | max/mean size | inertia | inertia / flat |")
    print("|---|---|---|---|---|")
    flat = None
    for row in args.rows:
        if not available(row):
            print(f"| {row} | (not installed) | | | |")
            continue
        if row == "subsampled" and args.per_center * args.k >= args.n:
            print(f"| {row} | (per-center * k >= n: the flat fit) | | | |")
            continue
        seconds, C, labels = run_row(row, X, args)
        spread, inertia = partition_stats(X, C, labels, args.k)
        flat = inertia if row == "flat" else flat
        ratio = inertia / flat if flat else float("nan")
        out.append(dict(row=row, seconds=seconds, spread=spread, inertia=inertia,
                        over_flat=ratio))
        print(f"| {row} | {seconds:.3f} | {spread:.3f} | {inertia:.6g} | {ratio:.4f} |")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args={k: v for k, v in vars(args).items()}, rows=out), f, indent=1)
    return out


if __name__ == "__main__":
    main()
