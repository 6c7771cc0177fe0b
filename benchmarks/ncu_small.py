"""One short cupy-fused fit of W3 (n=20M, d=3, k=1000, float32) for Nsight Compute to profile
the small-d assignment kernel (issue 13: issue rate, occupancy, the argmin's and the sums'
share). Backend options as JSON in argv[1], e.g. '{"center_group": 1}'.

    ncu --clock-control none --kernel-name regex:assign_small --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section InstructionStats \
        python3 benchmarks/ncu_small.py '{}'
"""
from __future__ import annotations

import json
import sys

from probe_fused import make_data

from kmeans_xp import KMeans


def main(argv):
    import cupy as cp
    opts = json.loads(argv[1]) if len(argv) > 1 else {}
    n, d, k = (int(v) for v in (argv[2] if len(argv) > 2 else "20000000,3,1000").split(","))
    X, init = make_data(cp, n, d, k)
    KMeans(k, init=init, n_init=1, max_iter=3, tol=0.0, backend="cupy-fused",
           backend_options=opts).fit(X)
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main(sys.argv)
