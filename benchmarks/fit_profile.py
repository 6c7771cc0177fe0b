"""Where a CuPy fit's time goes, on the device: per-iteration device time against the driver's
loop, and the whole fit under cProfile (the functions that wait on the device show as
`synchronize`/`get`/`asnumpy` time).

    python benchmarks/fit_profile.py --out profile.txt

Rows: (1) W1 cupy-fused, the pass alone (lloyd_iter back to back), the pass with the driver's
center update, and the driver's loop; (2) whole fits (W1, W3 from device and host X) with a
cProfile table each; (3) k-means++ at n=500k, k=500 on the device.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from regression_probe import WORKLOADS, data  # noqa: E402


def clock(cp, fn, repeats=20):
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / repeats


def pass_rows(cp, out, backend_name="cupy-fused", workload="W1"):
    """ms per iteration of the backend's pass alone, pass + driver update, the driver loop."""
    from kmeans_xp import KMeans
    from kmeans_xp.algorithms import lloyd as L
    from kmeans_xp.contract.registry import get_backend
    n, d, k = WORKLOADS[workload]
    X, init = data(n, d, k)
    Xg = cp.asarray(X - X.mean(axis=0))
    c0 = cp.asarray(init - X.mean(axis=0))
    b = get_backend(backend_name)()
    it0 = b.lloyd_iter(Xg, None, c0, None, xp=cp)
    alone = clock(cp, lambda: b.lloyd_iter(Xg, None, c0, it0.labels, xp=cp))

    def with_update():
        it = b.lloyd_iter(Xg, None, c0, it0.labels, xp=cp)
        L._update(b, Xg, None, c0, c0.astype(cp.float64), it, xp=cp, cxp=cp, relocate=False)
    upd = clock(cp, with_update)
    if backend_name == "cupy-fused":
        host_rows(cp, out, b, Xg, init - X.mean(axis=0), it0.labels)
    km = KMeans(k, init=init, n_init=1, max_iter=10, tol=0, backend=backend_name)
    km.fit(Xg)
    loop = km.timings_["per_iteration"]
    km.fit(Xg)
    loop = min(loop, km.timings_["per_iteration"])
    out.write(f"{workload} {backend_name}: pass alone {alone * 1e3:.3f} ms, pass + update "
              f"{upd * 1e3:.3f} ms, driver loop {loop * 1e3:.3f} ms per iteration\n")


def host_rows(cp, out, b, Xg, c_host, labels):
    """cupy-fused with centers on the host: the pass + read + host update, pinned buffers
    (HostCenters) against pageable copies."""
    from kmeans_xp_backends.cupy import host_centers

    from kmeans_xp.algorithms import lloyd as L
    c_host = c_host.astype(np.float32)
    c64 = c_host.astype(np.float64)

    def step():
        it = b.lloyd_iter(Xg, None, c_host, labels, xp=cp)
        L._update(b, Xg, None, c_host, c64, it, xp=cp, cxp=np, relocate=False)
    pinned = clock(cp, step)
    saved = host_centers.HostCenters.upload, host_centers.HostCenters.read
    host_centers.HostCenters.upload = lambda self, cp_, c: cp_.asarray(c)
    host_centers.HostCenters.read = lambda self, o: cp.asnumpy(o)
    try:
        pageable = clock(cp, step)
    finally:
        host_centers.HostCenters.upload, host_centers.HostCenters.read = saved
    out.write(f"  host centers: pass + read + update {pinned * 1e3:.3f} ms pinned, "
              f"{pageable * 1e3:.3f} ms pageable\n")


def profiled(out, title, fn, top=30):
    fn()  # warm
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    pr = cProfile.Profile()
    pr.enable()
    result = fn()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats("kmeans_xp", top)  # the library's own frames
    out.write(f"\n===== {title}: wall {wall * 1e3:.1f} ms (unprofiled); result {result}\n")
    out.write(s.getvalue())


FIRST_USE = """
import time, numpy as np, cupy as cp
t0 = time.perf_counter()
from kmeans_xp import KMeans
X = cp.asarray(np.random.default_rng(0).normal(size=(100_000, 3)).astype(np.float32))
t_import = time.perf_counter() - t0
def fit():
    t = time.perf_counter()
    KMeans(100, init="random", n_init=1, max_iter=5, random_state=0,
           backend="cupy-fused").fit(X)
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t
first, second = fit(), fit()
print(f"import {t_import:.2f} s, first fit {first:.2f} s, second {second:.3f} s, "
      f"extra {first - second:.2f} s")
"""


def first_use(out):
    """The first cupy-fused fit of a fresh process against its second, with CuPy's kernel
    cache as this machine has it (warm) and empty (cold)."""
    import os
    import subprocess
    import tempfile
    for label, env in (("warm cache", {}), ("cold cache", {"CUPY_CACHE_DIR": tempfile.mkdtemp()})):
        r = subprocess.run([sys.executable, "-c", FIRST_USE], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=300)
        out.write(f"first use, {label}: {r.stdout.strip()} {r.stderr.strip()[-500:]}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import cupy as cp

    from kmeans_xp import KMeans
    with open(args.out, "w") as out:
        first_use(out)
        for b in ("cupy-fused", "cupy-kernels"):
            pass_rows(cp, out, b)
        out.flush()
        for w in ("W1", "W3"):
            n, d, k = WORKLOADS[w]
            X, init = data(n, d, k)
            Xg = cp.asarray(X)
            for where, Xin in (("device", Xg), ("host", X)):
                def fit(Xin=Xin, init=init, k=k):
                    km = KMeans(k, init=init, n_init=1, max_iter=10, tol=0,
                                backend="cupy-fused").fit(Xin)
                    cp.cuda.Device().synchronize()
                    return {key: round(v * 1e3, 2) for key, v in km.timings_.items()}
                profiled(out, f"{w} cupy-fused fit from {where} X", fit)
                out.flush()
        Xp, _ = data(500_000, 3, 500, seed=1)
        Xpg = cp.asarray(Xp)

        def pp():
            km = KMeans(500, init="k-means++", n_init=1, max_iter=1, random_state=0,
                        backend="cupy-fused").fit(Xpg)
            return round(km.timings_["init"], 3)
        profiled(out, "k-means++ n=500k k=500 cupy-fused (init seconds)", pp)
    print(open(args.out).read()[:3000])


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
