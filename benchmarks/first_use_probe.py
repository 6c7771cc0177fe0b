"""A fresh process's first GPU fit against its second, with CuPy's kernel cache warm and
empty: where the extra time goes (cProfile of the first fit: NVRTC compiles, module loads,
library handles), for the fits a user's first run makes (cupy-fused, d=3 float32, k-means++
and a given init).

    python benchmarks/first_use_probe.py --out first_use.txt
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import cProfile, io, json, pstats, sys, time, traceback
class FirstCupyx:  # where the first cupyx submodule is imported from (CuPy makes cupyx lazy)
    stack = None
    def find_spec(self, name, path=None, target=None):
        if FirstCupyx.stack is None and name.startswith("cupyx.") and "fit" in STATE:
            FirstCupyx.stack = "".join(traceback.format_stack(limit=30))
        return None
STATE = set()
sys.meta_path.insert(0, FirstCupyx())
t0 = time.perf_counter()
import numpy as np, cupy as cp
from kmeans_xp import KMeans
X = cp.asarray(np.random.default_rng(0).normal(size=(100_000, 3)).astype(np.float32))
cp.cuda.Device().synchronize()
t_import = time.perf_counter() - t0
init = sys.argv[1]
backend = sys.argv[2]
def fit():
    t = time.perf_counter()
    KMeans(100, init=init if init != "array" else cp.asnumpy(X[:100]), n_init=1, max_iter=5,
           random_state=0, backend=backend).fit(X)
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t
pr = cProfile.Profile()
STATE.add("fit")
pr.enable()
first = fit()
pr.disable()
second = fit()
s = io.StringIO()
st = pstats.Stats(pr, stream=s)
st.sort_stats("cumulative").print_stats(22)
st.sort_stats("tottime").print_stats(12)
st.print_callers(r"__getattribute__")  # who touches a lazily imported module (cupyx)
print(json.dumps({"init": init, "backend": backend, "import_s": t_import, "first_s": first,
                  "second_s": second, "extra_s": first - second,
                  "dont_write_bytecode": sys.flags.dont_write_bytecode}))
print(s.getvalue()[-9000:])
print("first cupyx import during the fit:", FirstCupyx.stack)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="k-means++:cupy-fused,array:cupy-fused,k-means++:auto")
    args = ap.parse_args()
    cases = [c.split(":") for c in args.cases.split(",")]
    with open(args.out, "w") as out:
        for init, backend in cases:
            cold, pyc = tempfile.mkdtemp(), tempfile.mkdtemp()
            # the image's site-packages hold no bytecode and cannot take any: every process
            # compiles CuPy's modules anew; PYTHONPYCACHEPREFIX gives them a cache, as a
            # pip-installed CuPy has (pip writes the bytecode at install time)
            for label, env in (("cold cache", {"CUPY_CACHE_DIR": cold}),
                               ("warm cache", {"CUPY_CACHE_DIR": cold}),
                               ("cold cache, bytecode cache", {"CUPY_CACHE_DIR": tempfile.mkdtemp(),
                                                               "PYTHONPYCACHEPREFIX": pyc}),
                               ("warm cache, bytecode cache", {"CUPY_CACHE_DIR": cold,
                                                               "PYTHONPYCACHEPREFIX": pyc})):
                env = {**os.environ, **env}
                if "PYTHONPYCACHEPREFIX" in env:  # (a bytecode cache is written, then read)
                    env.pop("PYTHONDONTWRITEBYTECODE", None)
                r = subprocess.run([sys.executable, "-c", CHILD, init, backend],
                                   capture_output=True, text=True, timeout=240, env=env)
                head = r.stdout.splitlines()[:1]
                print(label, init, backend, head, r.stderr[-300:], flush=True)
                out.write(f"===== {label}, init={init}, backend={backend}\n{r.stdout}\n"
                          f"{r.stderr[-2000:]}\n")


if __name__ == "__main__":
    main()
