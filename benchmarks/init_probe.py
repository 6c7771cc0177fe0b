"""Seconds of init on the GPU and on the CPU, side by side: k-means++ and k-means|| on a device
X (n=500k, d=3, k=500, float32, the whole-fit issue's case) for every CuPy backend, the same
with k-means++'s steps left to xp code (the variant before `seeding.DeviceSeeding`), the part
of k-means|| spent in its candidates' k-means++, and on the host's cores scikit-learn's
`kmeans_plusplus` beside ours (numpy backend). Also whether the device draws numpy's centers.

    python benchmarks/init_probe.py --out init_probe.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from regression_probe import data  # noqa: E402

BACKENDS = ("cupy-kernels", "cupy-chunked", "cupy-fused")


def median_of(fn, repeats):
    fn()  # warm-up: kernels compile, pools fill
    return statistics.median(fn() for _ in range(repeats))


def init_seconds(KMeans, X, k, method, backend):
    km = KMeans(k, init=method, n_init=1, max_iter=1, random_state=0, backend=backend).fit(X)
    return km.timings_["init"]


def candidates_share(KMeans, X, k, backend, repeats):
    """(init seconds, seconds in the candidates' k-means++) of k-means||, device synchronised
    around the candidates' part."""
    import cupy as cp

    from kmeans_xp.algorithms import init as init_mod
    real = init_mod._plusplus_on_candidates
    spent = []

    def timed(*a, **kw):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        r = real(*a, **kw)
        cp.cuda.Device().synchronize()
        spent.append(time.perf_counter() - t)
        return r
    init_mod._plusplus_on_candidates = timed
    try:
        total = median_of(lambda: init_seconds(KMeans, X, k, "k-means||", backend), repeats)
    finally:
        init_mod._plusplus_on_candidates = real
    return total, statistics.median(spent[1:])


def agreement(X, k):
    """Whether the device's k-means++ (float32, float64) draws the rows numpy's does."""
    import cupy as cp
    from array_api_compat import cupy as cp_xp
    from array_api_compat import numpy as np_xp

    from kmeans_xp.algorithms.init import kmeans_plusplus
    from kmeans_xp.contract.seeding import local_trials
    from kmeans_xp.contract.registry import get_backend
    out = {}
    b = get_backend("cupy-kernels")()
    for dtype in (np.float32, np.float64):
        Xh = np.ascontiguousarray(X.astype(dtype) - X.astype(dtype).mean(axis=0))
        Xd = cp.asarray(Xh)
        got = kmeans_plusplus(Xd, k, sample_weight=None, random_state=np.random.RandomState(0),
                              xp=cp_xp, rows=Xh.shape[0],
                              seeding=b.seeding(Xd, None, local_trials(k), xp=cp_xp))[1]
        ref = kmeans_plusplus(Xh, k, sample_weight=None, random_state=np.random.RandomState(0),
                              xp=np_xp, rows=Xh.shape[0])[1]
        out[np.dtype(dtype).name] = {"same_rows": int(np.sum(got == ref)), "k": k,
                                     "first_differs_at": int(np.argmax(got != ref))
                                     if np.any(got != ref) else None}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--k", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="also the CPU rows (about a minute)")
    args = ap.parse_args()
    import cupy as cp
    from kmeans_xp_backends.cupy.base import CupyBackendBase

    from kmeans_xp import KMeans
    n, k = args.n, args.k
    X, _ = data(n, 3, k, seed=1)
    Xg = cp.asarray(X)
    out = {"n": n, "d": 3, "k": k, "dtype": "float32", "gpu": {}, "cpu": {}}
    for backend in BACKENDS:
        row = {}
        for method in ("k-means++", "k-means||"):
            row[method] = median_of(
                lambda method=method, backend=backend: init_seconds(KMeans, Xg, k, method,
                                                                    backend), args.repeats)
        row["k-means|| total, candidates' k-means++"] = candidates_share(
            KMeans, Xg, k, backend, args.repeats)
        saved = CupyBackendBase.seeding
        CupyBackendBase.seeding = lambda self, *a, **kw: None  # the xp steps
        try:
            row["k-means++, xp steps"] = median_of(
                lambda backend=backend: init_seconds(KMeans, Xg, k, "k-means++", backend), 2)
            row["k-means||, xp steps"] = median_of(
                lambda backend=backend: init_seconds(KMeans, Xg, k, "k-means||", backend), 2)
        finally:
            CupyBackendBase.seeding = saved
        out["gpu"][backend] = row
        print(backend, json.dumps(row), flush=True)
    out["agreement"] = agreement(X[:100_003], 300)
    print("agreement", json.dumps(out["agreement"]), flush=True)
    if args.cpu:
        from sklearn.cluster import kmeans_plusplus as sk_pp
        out["cpu"]["sklearn kmeans_plusplus"] = _timed(lambda: sk_pp(X, k, random_state=0))
        out["cpu"]["numpy backend k-means++"] = init_seconds(KMeans, X, k, "k-means++", "numpy")
        out["cpu"]["numpy backend k-means||"] = init_seconds(KMeans, X, k, "k-means||", "numpy")
        print("cpu", json.dumps(out["cpu"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
