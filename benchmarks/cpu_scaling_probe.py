"""What limits the numpy backend on many cores: each NumPy primitive of its inner loop run by
1..T threads on private buffers (so only the GIL, BLAS locks or the memory system can stop it
scaling), the d=128 kernels old and new (cluster sums: the 2-d reduceat with a cast that the
backend used, the flat float64 reduceat it uses now; the GEMM with K = d + 1 and with K = d
plus an add), and the whole backend's iteration at W1 and d=128 by thread count (one thread
on one core: BLAS held to one thread as well).

    python benchmarks/cpu_scaling_probe.py --out cpu_scaling.json

Speed-up = t x (time of one thread doing r calls) / (time of t threads each doing r calls).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def buffers(rng, k, sub, d, block):
    return dict(D=rng.standard_normal((sub, k)).astype(np.float32),
                DT=rng.standard_normal((k, sub)).astype(np.float32),
                Xa=np.ones((sub, d + 1), np.float32),
                aug=rng.standard_normal((d + 1, k)).astype(np.float32),
                lab=np.empty(sub, np.intp), idx=np.arange(sub) * k, m=np.empty(sub, np.float32),
                L=rng.integers(0, k, block), w=rng.random(block),
                Xl=rng.random((block, d)).astype(np.float32), o=np.empty(block),
                oh=np.empty((sub, k), np.float32), ar=np.arange(k))


OPS = {  # name: (function of the buffers, calls per timing)
    "matmul (sub,d+1)@(d+1,k)": (lambda b: np.matmul(b["Xa"], b["aug"], out=b["D"]), 200),
    "argmin axis=1": (lambda b: b["D"].argmin(axis=1, out=b["lab"]), 200),
    "min axis=1": (lambda b: np.min(b["D"], axis=1, out=b["m"]), 200),
    "min axis=0 of (k,sub)": (lambda b: np.min(b["DT"], axis=0, out=b["m"]), 200),
    "argmin axis=0 of (k,sub)": (lambda b: b["DT"].argmin(axis=0, out=b["lab"]), 200),
    "take": (lambda b: b["D"].reshape(-1).take(b["idx"], out=b["m"], mode="clip"), 200),
    "bincount weights (block)": (
        lambda b: np.bincount(b["L"], weights=b["w"], minlength=len(b["ar"])), 20),
    "bincount (block)": (lambda b: np.bincount(b["L"], minlength=len(b["ar"])), 20),
    "einsum rows (block)": (lambda b: np.einsum("ij,ij->i", b["Xl"], b["Xl"], out=b["o"]), 20),
    "copyto cast (block)": (lambda b: np.copyto(b["o"], b["Xl"][:, 0], casting="unsafe"), 20),
    "one-hot == (sub,k)": (lambda b: np.equal(b["lab"][:, None], b["ar"], out=b["oh"],
                                              casting="unsafe"), 100),
    "argsort labels (block)": (lambda b: np.argsort(b["L"], kind="stable"), 5),
    "add 1-d (sub)": (lambda b: np.add(b["lab"], b["idx"], out=b["lab"]), 200),
}


def op_scaling(threads, k, sub, d, block, repeats=3):
    rng = np.random.default_rng(0)
    out = {}
    pool = ThreadPoolExecutor(max(threads))
    bufs = [buffers(rng, k, sub, d, block) for _ in range(max(threads))]
    for name, (fn, calls) in OPS.items():
        out[name] = _scale(pool, bufs, fn, calls, threads, repeats)
        _print(name, out[name])
    pool.shutdown()
    return out


SIZED = {  # the GEMM sub-chunk's primitives at other sizes: (function, elements of work per call)
    "matmul": lambda b: np.matmul(b["Xa"], b["aug"], out=b["D"]),
    "dot": lambda b: np.dot(b["Xa"], b["aug"], out=b["D"]),
    "einsum ij,jk": lambda b: np.einsum("ij,jk->ik", b["Xa"], b["aug"], out=b["D"]),
    "argmin axis=1": lambda b: b["D"].argmin(axis=1, out=b["lab"]),
    "take": lambda b: b["D"].reshape(-1).take(b["idx"], out=b["m"], mode="clip"),
}

SUMS = {  # per-cluster sums of a block, other ways than bincount
    "bincount int32 labels": lambda b: np.bincount(b["L32"], weights=b["w"], minlength=200),
    "add.at": lambda b: np.add.at(b["acc"], b["L"], b["w"]),
    "argsort uint8 stable": lambda b: np.argsort(b["L8"], kind="stable"),
    "reduceat sorted": lambda b: np.add.reduceat(b["Xs"], b["starts"], axis=0),
    "take rows": lambda b: np.take(b["Xl"], b["perm"], axis=0, out=b["Xs"]),
}


def sized_scaling(threads, k, d, subs, repeats=3):
    rng = np.random.default_rng(1)
    pool = ThreadPoolExecutor(max(threads))
    out = {}
    for sub in subs:
        bufs = [buffers(rng, k, sub, d, 65536) for _ in range(max(threads))]
        calls = max(4, int(200 * 655 / sub))
        for name, fn in SIZED.items():
            key = f"{name} sub={sub}"
            out[key] = _scale(pool, bufs, fn, calls, threads, repeats)
            _print(key, out[key])
    bufs = []
    for _ in range(max(threads)):
        b = buffers(rng, k, 655, d, 65536)
        b["L32"], b["L8"] = b["L"].astype(np.int32), b["L"].astype(np.uint8)
        b["acc"] = np.zeros(k)
        b["perm"] = np.argsort(b["L8"], kind="stable")
        b["Xs"] = b["Xl"][b["perm"]]
        b["starts"] = np.searchsorted(b["L"][b["perm"]], np.arange(k))
        bufs.append(b)
    for name, fn in SUMS.items():
        out[name] = _scale(pool, bufs, fn, 10, threads, repeats)
        _print(name, out[name])
    pool.shutdown()
    return out


def _print(name, row):
    print(f"{name:28s} {row['us_per_call_1thread']:8.1f} us  "
          + " ".join(f"{t}:{s:.1f}" for t, s in row["speedup"].items()), flush=True)


def _scale(pool, bufs, fn, calls, threads, repeats):
    """One thread's time per call, and the speed-up of t threads each making `calls` calls
    on its own buffers."""
    def job(t):
        b = bufs[t]
        for _ in range(calls):
            fn(b)
    job(0)
    row = {}
    for t in threads:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(job, range(t)))
            best = min(best, time.perf_counter() - t0)
        row[t] = best
    return {"us_per_call_1thread": row[threads[0]] / calls * 1e6,
            "speedup": {t: round(t * row[threads[0]] / row[t], 2) for t in threads}}


def d128_scaling(threads, r=12_500, d=128, k=1024, repeats=3):
    """The d=128 kernels on one thread's block (n=200k over 16 threads): cluster sums old
    (2-d reduceat of float32 rows with a float64 cast) and new (rows gathered, cast and
    transposed, one flat float64 reduceat), and GEMM sub-chunks with K = d + 1 and K = d."""
    rng = np.random.default_rng(3)
    pool = ThreadPoolExecutor(max(threads))
    bufs = []
    for _ in range(max(threads)):
        X = rng.standard_normal((r, d)).astype(np.float32)
        L = rng.integers(0, k, r)
        order = np.argsort(L.astype(np.uint16), kind="stable")
        counts = np.bincount(L, minlength=k)
        starts = (np.cumsum(counts) - counts)[counts > 0]
        b = dict(X=X, L16=L.astype(np.uint16), order=order, starts=starts,
                 runs=(starts + np.arange(0, d * r, r)[:, None]).ravel(),
                 rows=np.empty((r, d), np.float32), cols=np.empty((d, r)),
                 Xs=X[order], w=rng.random(r), L=L)
        for sub in (256, 2048):
            b[f"Xa{sub}"] = np.ones((sub, d + 1), np.float32)
            b[f"D{sub}"] = np.empty((sub, k), np.float32)
        b["aug"] = rng.standard_normal((d + 1, k)).astype(np.float32)
        b["m2"] = np.ascontiguousarray(b["aug"][:d])
        b["cn"] = b["aug"][d].copy()
        b["X256"], b["X2048"] = X[:256], X[:2048]
        bufs.append(b)
    ops = {
        "sums old: 2-d reduceat f32->f64": (lambda b: np.add.reduceat(
            b["Xs"], b["starts"], axis=0, dtype=np.float64), 3),
        "sums new: take+cast+T+flat reduceat": (lambda b: (
            np.take(b["X"], b["order"], axis=0, out=b["rows"]),
            np.copyto(b["cols"], b["rows"].T),
            np.add.reduceat(b["cols"].reshape(-1), b["runs"])), 3),
        "flat reduceat f64 alone": (lambda b: np.add.reduceat(b["cols"].reshape(-1),
                                                              b["runs"]), 3),
        "argsort u16 stable": (lambda b: np.argsort(b["L16"], kind="stable"), 10),
        "bincount weights": (lambda b: np.bincount(b["L"], weights=b["w"], minlength=k), 10),
    }
    for sub in (256, 2048):
        calls = 40 if sub == 256 else 5
        ops[f"matmul K=d+1 sub={sub}"] = (
            lambda b, s=sub: np.matmul(b[f"Xa{s}"], b["aug"], out=b[f"D{s}"]), calls)
        ops[f"matmul K=d + add sub={sub}"] = (
            lambda b, s=sub: (np.matmul(b[f"X{s}"], b["m2"], out=b[f"D{s}"]),
                              np.add(b[f"D{s}"], b["cn"], out=b[f"D{s}"])), calls)
        ops[f"argmin sub={sub}"] = (
            lambda b, s=sub: b[f"D{s}"].argmin(axis=1), calls)
    out = {}
    for name, (fn, calls) in ops.items():
        out[name] = _scale(pool, bufs, fn, calls, threads, repeats)
        _print(name, out[name])
    pool.shutdown()
    return out


def blas_threads_matmul(threads, n=65536, d=3, k=200):
    """One large GEMM with BLAS's own threads (not ours)."""
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(2)
    Xa = np.ones((n, d + 1), np.float32)
    aug = rng.standard_normal((d + 1, k)).astype(np.float32)
    D = np.empty((n, k), np.float32)
    out = {}
    for t in threads:
        with threadpool_limits(t, "blas"):
            np.matmul(Xa, aug, out=D)
            t0 = time.perf_counter()
            for _ in range(5):
                np.matmul(Xa, aug, out=D)
            out[t] = (time.perf_counter() - t0) / 5 * 1e3
        print(f"one matmul ({n},{d + 1})@({d + 1},{k}) with {t} BLAS threads: {out[t]:.2f} ms",
              flush=True)
    return out


def backend_scaling(threads, n, d, k, repeats=3):
    """Best of `repeats` lloyd_iter times by thread count; one thread on one core (BLAS held
    to one thread too, as the pool holds it for its threads)."""
    import kmeans_xp_backends.numpy.backend as nb
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((n, d)) * np.arange(1, d + 1)).astype(np.float32)
    C = X[rng.choice(n, k, replace=False)].copy()
    out = {}
    for t in threads:
        b = nb.NumpyBackend(n_threads=t)
        with threadpool_limits(1, "blas") if t == 1 else contextlib.nullcontext():
            b.lloyd_iter(X, None, C, None)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                b.lloyd_iter(X, None, C, None)
                best = min(best, time.perf_counter() - t0)
        b.finish()
        out[t] = best * 1e3
        print(f"backend n={n} d={d} k={k} threads {t}: {best * 1e3:.1f} ms", flush=True)
    print(f"backend n={n} d={d} k={k}: {threads[-1]} threads {out[threads[-1]] / out[1]:.3f} "
          f"of one thread's time ({out[1] / out[threads[-1]]:.2f}x)", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=2_000_000)
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    threads = sorted({1, 2, 4, 8, cores} & set(range(1, cores + 1)))
    from threadpoolctl import threadpool_info, threadpool_limits
    res = {"cores": cores, "numpy": np.__version__, "threadpool": threadpool_info()}
    with threadpool_limits(1, "blas"):
        res["ops_k200_sub655"] = op_scaling(threads, 200, 655, 3, 65536)
        res["sized_k200"] = sized_scaling(threads, 200, 3, (655, 2621, 8192, 32768))
        res["d128_k1024"] = d128_scaling(threads)
    res["blas_threads_matmul_ms"] = blas_threads_matmul(threads)
    res["backend_ms_d128"] = backend_scaling(sorted({1, cores}), a.n // 10, 128, 1024)
    res["backend_ms"] = backend_scaling(threads, a.n, 3, 200)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
