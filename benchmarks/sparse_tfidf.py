"""Sparse KMeans on a TF-IDF-like matrix: kmeans_xp's sparse paths against scikit-learn.

    python benchmarks/sparse_tfidf.py                     # n=1M, d=100k, 0.1% dense, k=100
    python benchmarks/sparse_tfidf.py --small             # a smoke run (seconds)
    python benchmarks/sparse_tfidf.py --rows scipy-sparse sklearn --threads 16

The matrix: float32 CSR, each row's terms drawn from a Zipf-like vocabulary (a few columns
in most rows, most columns in few), tf-idf weighted and L2-normalised, as
`TfidfVectorizer` gives. Every row starts from the same initial centers (k rows of X) and
runs `--max-iter` Lloyd iterations (tol=0, so only strict convergence stops it earlier);
scikit-learn runs on the same cores (its OpenMP threads, `--threads`). Reported per row:
whole-fit seconds (the fastest of `--repeat` fits), seconds per iteration, iterations,
inertia, and the share of labels equal to scikit-learn's (or the first row's). GPU rows
(cupy-sparse, from host CSR and from a cupyx CSR already on the device) run where CuPy finds
a GPU. `--json PATH` writes the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
from results_file import add_arguments, record_if_asked

ROWS = ("scipy-sparse", "sklearn", "cupy-sparse", "cupy-sparse-device")


def tfidf_like(n, d, density, seed=0, dtype=np.float32):
    """(n, d) CSR with about density * d terms per row, Zipf-like column frequencies,
    tf-idf values, unit rows."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    per_row = np.maximum(1, rng.poisson(density * d, n))
    indptr = np.concatenate([[0], np.cumsum(per_row)])
    nnz = int(indptr[-1])
    # column j drawn with probability ~ 1 / (j + 10): a long-tailed vocabulary, permuted
    cdf = np.cumsum(1.0 / (np.arange(d) + 10.0))
    cdf /= cdf[-1]
    vocab = rng.permutation(d)
    cols = vocab[np.minimum(np.searchsorted(cdf, rng.random(nnz)), d - 1)]
    tf = 1.0 + np.log1p(rng.geometric(0.6, nnz)).astype(np.float64)
    X = sp.csr_matrix((tf.astype(dtype), cols.astype(np.int32), indptr), shape=(n, d))
    X.sum_duplicates()
    df = np.bincount(X.indices, minlength=d)
    idf = (np.log((1.0 + n) / (1.0 + df)) + 1.0).astype(dtype)
    X.data *= idf[X.indices]
    norms = np.sqrt(np.add.reduceat(X.data.astype(np.float64) ** 2, X.indptr[:-1])
                    if X.nnz else np.zeros(n))
    norms[np.diff(X.indptr) == 0] = 1.0
    X.data /= np.repeat(norms, np.diff(X.indptr)).astype(dtype)
    return X


def _fit(row, X, init, max_iter, threads):
    from kmeans_xp import KMeans
    k = init.shape[0]
    sync = lambda: None  # noqa: E731
    if row == "sklearn":
        from sklearn.cluster import KMeans as SkKMeans
        from threadpoolctl import threadpool_limits
        est = SkKMeans(k, init=init, n_init=1, max_iter=max_iter, tol=0.0)
        with threadpool_limits(threads):
            t = time.perf_counter()
            est.fit(X)
            return est, time.perf_counter() - t, np.asarray(est.labels_)
    if row.startswith("cupy"):
        import cupy
        import cupyx.scipy.sparse as cusparse
        sync = cupy.cuda.get_current_stream().synchronize
        if row == "cupy-sparse-device":
            X = cusparse.csr_matrix(X)
            sync()
    est = KMeans(k, init=init, n_init=1, max_iter=max_iter, tol=0.0,
                 backend="cupy-sparse" if row.startswith("cupy") else "scipy-sparse")
    if row.startswith("cupy"):   # a first small fit: kernels compiled, pools warm
        KMeans(2, init=init[:2], n_init=1, max_iter=1, backend="cupy-sparse").fit(X[:1000])
        sync()
    t = time.perf_counter()
    est.fit(X)
    sync()
    seconds = time.perf_counter() - t
    labels = est.labels_
    labels = labels.get() if hasattr(labels, "get") else np.asarray(labels)
    return est, seconds, labels


def _gpu_present():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=100_000)
    p.add_argument("--density", type=float, default=0.001)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--max-iter", type=int, default=10)
    p.add_argument("--small", action="store_true",
                   help="n=3000, d=20000, density 0.002, k=10: a smoke run")
    p.add_argument("--rows", nargs="+", choices=ROWS, default=None,
                   help="default: the CPU rows, and the GPU rows where a GPU is present")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0))
                   if hasattr(os, "sched_getaffinity") else os.cpu_count())
    p.add_argument("--repeat", type=int, default=1,
                   help="fits per row, the fastest reported (a process's first fit also pays "
                        "for touching its memory for the first time)")
    p.add_argument("--json", default=None)
    add_arguments(p)
    argv = sys.argv[1:] if argv is None else list(argv)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    if a.small:
        a.n, a.d, a.density, a.k = 3000, 20_000, 0.002, 10
    rows = a.rows or [r for r in ROWS if not r.startswith("cupy") or _gpu_present()]
    t = time.perf_counter()
    X = tfidf_like(a.n, a.d, a.density)
    made = time.perf_counter() - t
    init = X[np.random.default_rng(1).choice(a.n, a.k, replace=False)].toarray()
    print(f"X: {a.n} x {a.d} CSR float32, nnz {X.nnz} ({X.nnz / a.n / a.d:.3%}), made in "
          f"{made:.1f} s; k={a.k}, {a.max_iter} iterations at most, {a.threads} CPU "
          f"threads; {platform.processor() or platform.machine()}")
    results = []
    for row in rows:
        est, seconds, labels = _fit(row, X, init, a.max_iter, a.threads)
        for _ in range(a.repeat - 1):
            seconds = min(seconds, _fit(row, X, init, a.max_iter, a.threads)[1])
        results.append({"row": row, "fit_s": seconds, "n_iter": int(est.n_iter_),
                        "per_iter_s": seconds / max(int(est.n_iter_), 1),
                        "inertia": float(est.inertia_), "labels": labels})
    base = next((r["labels"] for r in results if r["row"] == "sklearn"), results[0]["labels"])
    table = ["| row | fit s | s / iteration | iterations | inertia | labels as reference |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        r["agreement"] = float(np.mean(r.pop("labels") == base))
        table.append(f"| {r['row']} | {r['fit_s']:.3f} | {r['per_iter_s']:.4f} | "
                     f"{r['n_iter']} | {r['inertia']:.6g} | {r['agreement']:.4f} |")
    print("\n".join(table))
    if a.results is not None:
        head = [f"## sparse: n={a.n:,} d={a.d:,} density {a.density} k={a.k}, CSR float32",
                "", f"Whole fits from the same init, at most {a.max_iter} iterations, "
                f"{a.threads} CPU threads; labels against scikit-learn's.", ""]
        record_if_asked(a, [head + table], script="benchmarks/sparse_tfidf.py", argv=argv,
                        wall_s=time.perf_counter() - t0)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"n": a.n, "d": a.d, "density": a.density, "k": a.k, "nnz": int(X.nnz),
                       "max_iter": a.max_iter, "threads": a.threads, "rows": results}, f,
                      indent=2)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
