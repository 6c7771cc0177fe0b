"""cupy-fused's kernel-path table (backends/cupy/paths.py): which path a problem takes, and
why, on the devices the plan meets (no GPU needed)."""
import itertools

import pytest
from kmeans_xp_backends.cupy import fused_plan, paths

H200 = fused_plan.NOMINAL
A100 = fused_plan.DeviceFacts(108, 163 * 1024, 164 * 1024, 80)
SM86 = fused_plan.DeviceFacts(2, 99 * 1024, 100 * 1024, 86)    # 99 KB a block
SM75 = fused_plan.DeviceFacts(80, 96 * 1024, 96 * 1024, 75)    # no TF32 tensor cores
EMULATED = fused_plan.DeviceFacts(2, 227 * 1024, 228 * 1024, 80)  # tests/_fake_cupy.py
DEVICES = {"H200": H200, "A100": A100, "sm86": SM86, "sm75": SM75, "emulated": EMULATED}
DS = (*range(1, 21), 24, 32, 33, 63, 64, 65, 100, 127, 128, 129, 136, 144, 152, 153, 160,
      161, 200, 256, 512, 1024, 4096)


@pytest.mark.parametrize("dev", DEVICES.values(), ids=DEVICES)
def test_the_table_takes_the_plans_path(dev):
    """Every (d, k, dtype, precision, options) on every device: the table's row is the path
    the plan takes."""
    for d, k, dtype, precision, tk, gk in itertools.product(
            DS, (1, 300, 5000), ("float32", "float64"), ("fp32", "tf32"),
            paths.TF32_KERNELS, paths.GEMM_KERNELS):
        want = fused_plan.plan(10**6, d, k, dtype, dev, precision=precision, tf32_kernel=tk,
                               gemm_kernel=gk).path
        row = paths.choose(d, k, dtype, precision, dev, tf32_kernel=tk, gemm_kernel=gk)
        assert row.path == want, (d, k, dtype, precision, tk, gk, row)
