"""`estimate_memory` plans a GPU (or cluster) fit on a machine without CuPy (or Dask)."""
import json
import subprocess
import sys
import textwrap

import pytest

GPU = ("cupy-fused", "cupy-kernels", "cupy-chunked")

PLAN = textwrap.dedent("""
    import json, sys
    sys.modules["cupy"] = None   # as on a laptop, even where CuPy is installed
    sys.modules["dask"] = None
    import kmeans_xp
    from kmeans_xp import estimate_memory, list_backends
    from kmeans_xp_backends.cupy.common import DEVICE_AUTO_FRACTION, NOMINAL_DEVICE_BYTES
    out = {"available": {b: list_backends()[b].available for b in %(gpu)r}}
    nominal = int(NOMINAL_DEVICE_BYTES * DEVICE_AUTO_FRACTION)
    from kmeans_xp.contract.planning import planning_class
    for b in %(gpu)r:
        auto = estimate_memory(2_000_000, 3, 500, dtype="float32", backend=b)
        # (the backend's own parts: bytes given split max_memory with the driver's arrays)
        same = planning_class(b).estimate_memory(2_000_000, 3, 500, itemsize=4,
                                                 max_memory=nominal)
        small = estimate_memory(2_000_000, 3, 500, dtype="float32", backend=b,
                                max_memory="256MB")
        out[b] = {"parts": auto.parts, "total": auto.total, "rows": auto.chunk_rows,
                  "same": all(auto.parts[p] == v for p, v in same.parts.items()),
                  "small_rows": small.chunk_rows,
                  "small_within": small.total - small.parts["data"] <= 256 * 10**6}
    streamed = estimate_memory(10**8, 3, 1000, backend="cupy-kernels", max_memory="4GiB",
                               backend_options={"stream": True})
    out["streamed"] = {"total": streamed.total, "parts": sorted(streamed.parts)}
    out["dask"] = estimate_memory(10**6, 3, 100, backend="dask").total
    out["loaded"] = [m for m in ("cupy", "dask") if sys.modules.get(m) is not None]
    print(json.dumps(out))
""") % {"gpu": GPU}


@pytest.fixture(scope="module")
def planned():
    run = subprocess.run([sys.executable, "-c", PLAN], capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_no_library_is_imported_and_none_is_available(planned):
    assert planned["loaded"] == []
    assert not any(planned["available"].values())


@pytest.mark.parametrize("backend", GPU)
def test_gpu_backends_plan_without_cupy(planned, backend):
    est = planned[backend]
    # X on the device, the driver's arrays, and the sum of the parts
    assert est["parts"]["data"] == 2_000_000 * 3 * 4
    assert est["parts"]["driver_centered_copy"] == 2_000_000 * 3 * 4
    assert est["total"] == sum(est["parts"].values())
    # "auto" is a share of the nominal device, as if given in bytes
    assert est["same"]


def test_chunked_plan_follows_the_budget(planned):
    assert planned["cupy-chunked"]["small_rows"] < planned["cupy-chunked"]["rows"]


@pytest.mark.parametrize("backend", GPU)
def test_max_memory_bounds_every_part_beyond_x(planned, backend):
    """max_memory given in bytes holds the driver's arrays too (centered copy, labels,
    init), not only the backend's chunks (issue 37: 2.20 GiB planned under 1 GiB)."""
    assert planned[backend]["small_within"]


def test_streamed_and_dask_plans(planned):
    assert "stream_buffers" in planned["streamed"]["parts"]
    assert planned["streamed"]["total"] > 0 and planned["dask"] > 0


def test_unknown_backend_still_says_so():
    from kmeans_xp import estimate_memory
    with pytest.raises(ValueError, match="unknown backend 'cupy-fast'"):
        estimate_memory(1000, 3, 10, backend="cupy-fast")
