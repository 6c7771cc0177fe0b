"""cupy-fused's kernel-path table (backends/cupy/paths.py): which path a problem takes, and
why, on the devices the plan meets (no GPU needed). A new CUDA variant adds its row here."""
import pytest
from kmeans_xp_backends.cupy import fused_plan, paths

H200 = fused_plan.NOMINAL
A100 = fused_plan.DeviceFacts(108, 163 * 1024, 164 * 1024, 80)
SM86 = fused_plan.DeviceFacts(2, 99 * 1024, 100 * 1024, 86)    # 99 KB a block
SM75 = fused_plan.DeviceFacts(80, 96 * 1024, 96 * 1024, 75)    # no TF32 tensor cores

# (d, dtype, precision, device, options) -> path: each row of PATHS, as the docs say it
DOCUMENTED = [
    # precision="tf32": wgmma on compute capability 9.0 up to d = 128, else mma.sync v2
    ((128, "float32", "tf32", H200, {}), "wgmma"),
    ((3, "float32", "tf32", H200, {"tf32_kernel": "wgmma"}), "wgmma"),
    ((129, "float32", "tf32", H200, {}), "mma"),
    ((64, "float32", "tf32", A100, {}), "mma"),
    ((128, "float32", "tf32", A100, {}), "tf32mma"),  # v2 resident nor streamed fits
    ((128, "float32", "tf32", H200, {"tf32_kernel": "fused"}), "mma"),
    ((128, "float32", "tf32", H200, {"tf32_kernel": "cublas"}), "tf32"),
    ((128, "float32", "tf32", H200, {"tf32_kernel": "fused-v1"}), "tf32mma"),
    ((128, "float32", "tf32", SM86, {}), "tf32mma"),   # v2's shared memory does not fit
    # precision="fp16" / "bf16": the wgmma kernel's half formats, d <= 256 (elsewhere the
    # backend refuses the fit: test_half_formats_have_no_path_off_hopper)
    ((128, "float32", "fp16", H200, {}), "wgmma-fp16"),
    ((256, "float32", "bf16", H200, {}), "wgmma-bf16"),
    # half_kernel="registers": X's fragments in registers up to d = 128, then the shared tile
    ((128, "float32", "fp16", H200, {"half_kernel": "registers"}), "wgmma-fp16r"),
    ((64, "float32", "bf16", H200, {"half_kernel": "registers"}), "wgmma-bf16r"),
    ((129, "float32", "fp16", H200, {"half_kernel": "registers"}), "wgmma-fp16"),
    ((128, "float32", "fp16", H200, {"half_kernel": "shared"}), "wgmma-fp16"),
    # exact: small d, then 3xTF32 on float32 up to d = 160, else the SIMT kernel
    ((16, "float32", "fp32", H200, {}), "small"),
    ((1, "float64", "fp32", SM75, {}), "small"),
    ((17, "float32", "fp32", H200, {}), "wgmma3"),
    ((128, "float32", "fp32", H200, {}), "wgmma3"),
    ((129, "float32", "fp32", H200, {}), "mma3"),
    ((160, "float32", "fp32", A100, {}), "mma3"),
    ((128, "float32", "fp32", H200, {"tf32_kernel": "fused"}), "mma3"),
    ((1024, "float32", "fp32", H200, {"gemm_kernel": "3xtf32"}), "mma3"),
    ((161, "float32", "fp32", H200, {}), "gemm"),
    ((64, "float64", "fp32", H200, {"gemm_kernel": "3xtf32"}), "gemm"),
    ((64, "float32", "fp32", H200, {"gemm_kernel": "simt"}), "gemm"),
    ((64, "float32", "fp32", SM75, {}), "gemm"),    # no tensor-core kernel runs there
]


@pytest.mark.parametrize("problem,path", DOCUMENTED)
def test_documented_paths(problem, path):
    d, dtype, precision, dev, options = problem
    row = paths.choose(d, 300, dtype, precision, dev, **options)
    assert row.path == path, row
    assert paths.explain(d, 300, dtype, precision, dev, **options).startswith(f"{path}: ")


def test_every_row_is_reached_and_says_why():
    """No row is dead (each documented problem names the row it takes)."""
    reached = {id(paths.choose(d, 300, dt, pr, dev, **opt))
               for (d, dt, pr, dev, opt), _ in DOCUMENTED}
    assert [row for row in paths.PATHS if id(row) not in reached] == []
    assert all(len(row.why) > 20 for row in paths.PATHS)


def test_rows_name_known_variants_and_option_values():
    for row in paths.PATHS:
        assert row.path in paths.VARIANTS
        assert set(row.when) <= {"precision", "dtype", "tf32_kernel", "gemm_kernel",
                                 "half_kernel", "d_max", "d_min", "fits"}, row
        for key, values in (("tf32_kernel", paths.TF32_KERNELS),
                            ("gemm_kernel", paths.GEMM_KERNELS),
                            ("half_kernel", paths.HALF_KERNELS)):
            want = row.when.get(key, ())
            assert set(want if isinstance(want, tuple) else (want,)) <= set(values), row
    # every option combination on every device has a path
    for dev in (H200, A100, SM86, SM75):
        for tk in paths.TF32_KERNELS:
            for gk in paths.GEMM_KERNELS:
                for d in (1, 16, 17, 128, 129, 160, 161, 4096):
                    for dt in ("float32", "float64"):
                        for pr in ("fp32", "tf32"):
                            paths.choose(d, 1, dt, pr, dev, tf32_kernel=tk, gemm_kernel=gk)


def test_half_formats_have_no_path_off_hopper():
    for dev, d in ((A100, 128), (H200, 257)):
        with pytest.raises(ValueError, match="no kernel path"):
            paths.choose(d, 300, "float32", "fp16", dev)
    assert paths.wgmma_atoms(256, 1) == paths.wgmma_atoms(128) == 4
    assert paths.wgmma_smem(256, False, 2) == paths.wgmma_smem(128)


def test_the_plan_takes_the_tables_path_and_its_variants_kernel():
    """The plan reads the table, and sizes the variant's launch: its grid, shared memory,
    operand layout; every instance a variant launches is compiled by the compile check."""
    instances = set(fused_plan.all_kernel_names())
    for (d, dtype, precision, dev, options), path in DOCUMENTED:
        p = fused_plan.plan(10**6 + 3, d, 300, dtype, dev, precision=precision, **options)
        assert p.path == path
        v = paths.VARIANTS[path]
        if v.kind == "small":
            continue
        assert (p.resident, p.assign_smem) == v.fit(d, dev)
        assert p.assign_grid == v.grid(10**6 + 3, dtype, dev) and p.layout == v.layout
        for vec in (True, False):
            name = fused_plan.assign_kernel_name(p, dtype, d, vec)
            assert name in instances and fused_plan.KERNEL_FILES[name.split("<")[0]] == v.file
