"""A CuPy fit applies no operator to a CuPy array and a host operand (a Python scalar, a NumPy
array or scalar). CuPy sends such an operator through NumPy's ufunc dispatch, and its
`__array_ufunc__` imports `cupyx.scipy.special`, and with it all of cupyx: 0.33 of a fresh
process's first fit with CuPy's kernel cache warm, most of that fit's time. A fresh
interpreter runs the fits with NumPy's binary ufuncs wrapped (CuPy's operators look them up
by name at each call) and an import hook on cupyx, and reports each place in kmeans_xp or its
backends that reached them. Marker gpu."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

CHILD = r"""
import json, sys, traceback
ROOTS = ("kmeans_xp", "kmeans_xp_backends", "backends")
sites, fitting = {}, [False]

def where(stack):
    # the innermost frame in the package: the line that applied the operator
    for f in reversed(stack):
        parts = f.filename.replace("\\", "/").split("/")
        if any(r in parts for r in ROOTS) and "tests" not in parts:
            return f"{'/'.join(parts[-2:])}:{f.lineno}: {f.line}"
    return "outside the package: " + "; ".join(
        f"{f.filename.split('/')[-1]}:{f.lineno}" for f in stack[-4:])

def record(kind):
    if fitting[0]:
        key = f"{kind} at {where(traceback.extract_stack()[:-2])}"
        sites[key] = sites.get(key, 0) + 1

class CupyxImport:
    def find_spec(self, name, path=None, target=None):
        if name == "cupyx" or name.startswith("cupyx."):
            record("cupyx import")
        return None

sys.meta_path.insert(0, CupyxImport())
import numpy as np
import cupy as cp

class Watched:
    # a NumPy ufunc that records calls with a CuPy operand (its methods pass through)
    def __init__(self, ufunc):
        self._ufunc = ufunc
    def __call__(self, *args, **kwargs):
        if any(isinstance(a, cp.ndarray) for a in args):
            record(f"np.{self._ufunc.__name__}")
        return self._ufunc(*args, **kwargs)
    def __getattr__(self, name):
        return getattr(self._ufunc, name)

for name in ("add", "subtract", "multiply", "matmul", "divide", "true_divide", "floor_divide",
             "remainder", "divmod", "power", "left_shift", "right_shift", "bitwise_and",
             "bitwise_or", "bitwise_xor", "equal", "not_equal", "less", "less_equal",
             "greater", "greater_equal"):
    setattr(np, name, Watched(getattr(np, name)))

from kmeans_xp import KMeans
from kmeans_xp.testing import asymmetric_data
cases = json.loads(sys.argv[1])
for backend, init, dtype, where_x, weighted in cases:
    Xh = asymmetric_data(20_011, 3, 40, dtype=np.dtype(dtype).type, seed=3)
    X = cp.asarray(Xh) if where_x == "device" else Xh
    w = np.linspace(0.5, 2.0, Xh.shape[0]).astype(dtype) if weighted else None
    start = Xh[:: Xh.shape[0] // 40][:40].copy() if init in ("array", "far") else init
    if init == "far":
        start[:3] += 1000   # nobody's nearest: empty clusters relocated
    if where_x == "batch":   # two problems in one (2, n, d) array
        X = cp.asarray(np.stack([Xh, Xh[::-1] * 2]))
        start = start if isinstance(start, str) else np.stack([start, start * 2])
    fitting[0] = True
    KMeans(40, init=start, n_init=1, max_iter=5, random_state=0, backend=backend).fit(
        X, sample_weight=w)
    cp.cuda.Device().synchronize()
    fitting[0] = False
print(json.dumps(sites))
"""

BACKENDS = ("cupy-fused", "cupy-kernels", "cupy-chunked")
CASES = ([[b, init, "float32", "device", False] for b in BACKENDS
          for init in ("array", "k-means++", "k-means||", "random")]
         + [[b, "k-means++", "float32", "host", True] for b in BACKENDS]
         + [["auto", "k-means++", "float32", "device", False],
            ["cupy-fused", "array", "float64", "device", True]]
         + [[b, init, "float32", "batch", False] for b in ("cupy-fused", "cupy-chunked")
            for init in ("far", "k-means++")]
         + [[b, "far", "float32", "device", True] for b in BACKENDS])


def test_a_cupy_fit_applies_no_operator_to_a_host_operand():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    sites = json.loads(r.stdout.strip().splitlines()[-1])
    assert not sites, "operators on a CuPy array and a host operand, or cupyx imports " \
        "(count: place):\n" + "\n".join(f"{n}: {s}" for s, n in sorted(sites.items()))
