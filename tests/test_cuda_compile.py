"""The CUDA sources of the CuPy backends (kmeans_xp_backends/cupy/cuda/) compile for Hopper
(sm_90; sm_90a for the files that name it, common.arch_target) with nvcc, every template
instance the backends can ask NVRTC for, so CI catches compile errors without a GPU. Skipped
without nvcc. Also reports registers and spills (-Xptxas -v) and fails if an assignment kernel
spills in a way that would cost speed (any spill in the small-d kernels, the float32 GEMM-like
kernels or the tensor-core kernels)."""
import re
import shutil
import subprocess

import pytest
from kmeans_xp_backends.cupy import common, fused_plan, nearest, paths, reductions, seeding

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def all_instances():
    """{file: [instances]} of every kernel the backends launch."""
    out = {}
    for file, name in (nearest.kernel_instances() + reductions.kernel_instances()
                       + fused_plan.kernel_instances() + seeding.kernel_instances()):
        out.setdefault(file, [])
        if name not in out[file]:
            out[file].append(name)
    return out


def test_every_source_has_instances_and_includes_the_common_header():
    files = set(common.cuda_files())
    assert set(all_instances()) == files, "a .cu file with no instance, or a missing file"
    for f in files:
        text = (common.CUDA_DIR / f).read_text()
        assert '#include "common.cuh"' in text, f
        assert "__device__ __forceinline__ float add_rn" not in text, f"{f} redefines helpers"
        assert len(text.splitlines()) <= 450, f"{f} is over 450 lines"
    assert "add_rn" in common.source("nearest.cu") and "#include" not in common.source(
        "nearest.cu"), "headers are inlined for NVRTC"


@pytest.fixture(scope="module")
def ptxas_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nvcc")
    reports = []
    for i, (file, names) in enumerate(sorted(all_instances().items())):
        refs = ",\n    ".join(f"(void*)&{name}" for name in names)
        src = tmp / f"instances_{i}.cu"
        src.write_text(f'#include "{common.CUDA_DIR / file}"\n'
                       f"// every instance the backends name through name_expressions\n"
                       f"void* kmeans_xp_instances[] = {{\n    {refs}\n}};\n")
        arch = common.arch_target(file) or "sm_90"  # (wgmma: sm_90a, as NVRTC compiles it)
        cmd = [NVCC, f"-arch={arch}", "-std=c++17", "-fmad=false", "-Xptxas", "-v", "-cubin",
               f"-I{common.CUDA_DIR}", "-o", str(tmp / f"instances_{i}.cubin"), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"nvcc failed on {file}:\n{proc.stderr[-6000:]}"
        reports.append(proc.stderr)
    return "\n".join(reports)


def _functions(report):
    """{mangled name: (registers, spill store bytes)} from the ptxas -v report."""
    out, current, spill = {}, None, 0
    for line in report.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and current:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            out[current] = (int(m.group(1)), spill)
            current, spill = None, 0
    return out


def test_every_instance_compiles_for_sm90(ptxas_report):
    funcs = _functions(ptxas_report)
    for kernel in ("assign_small", "assign_gemm", "assign_tf32", "assign_mma",
                   "assign_wgmma", "accumulate_shared", "accumulate_sorted", "sort_place",
                   "finalize_sums", "pack_centers", "relocation_keys", "direct_inertia",
                   "argmin_rows", "nearest_small", "nearest_tiled", "nearest_mem",
                   "cluster_sums_shared", "row_argmin_shifted", "weighted_total",
                   "count_changed", "store_labels", "column_moments", "fixed_point_scales"):
        assert any(kernel in f for f in funcs), f"{kernel} missing from the ptxas report"


def test_small_d_kernels_do_not_spill(ptxas_report):
    funcs = _functions(ptxas_report)
    small = {f: v for f, v in funcs.items() if "assign_small" in f}
    assert len(small) == 2 * 2 * fused_plan.SMALL_D_MAX
    spilling = {f: v for f, v in small.items() if v[1] > _spill_allowance(f)}
    assert not spilling, f"small-d assignment kernels spill: {spilling}"


def _spill_allowance(mangled):
    """0 bytes at the workloads' d <= 4 in float32; elsewhere up to 64 bytes: ptxas keeps these
    kernels near 64 registers and parks a few per-point values (weights, validity, the fused
    sums' float64 products) in local memory across the center loop, one store and one load a
    point against k * d multiply-adds; a spill inside the center loop would be far larger."""
    m = re.search(r"assign_smallI([fd])Li(\d+)ELi(\d+)ELb(\d)E", mangled)
    return 0 if m and m.group(1) == "f" and int(m.group(2)) <= 4 else 64


def test_float32_large_d_kernels_do_not_spill(ptxas_report):
    """The float32 GEMM-like and TF32 assignment kernels (the W5 workload's time) stay within
    their 128-register budget (two blocks per SM) without spilling."""
    funcs = _functions(ptxas_report)
    hot = {f: v for f, v in funcs.items()
           if ("assign_gemmIf" in f or "assign_tf32" in f)}
    assert len(hot) == 4, sorted(funcs)
    spilling = {f: v for f, v in hot.items() if v[1] > 0 or v[0] > 128}
    assert not spilling, f"float32 large-d assignment kernels spill: {spilling}"


def test_tensor_core_v2_kernels_do_not_spill(ptxas_report):
    """The v2 tensor-core kernels (cuda/fused_mma.cu: TF32 and 3xTF32, X resident or
    K-streamed, 16- or 4-byte copies) run one 256-thread block per SM (64 x 64 warp tiles:
    128 accumulators a thread), so up to 255 registers, and must not spill."""
    funcs = _functions(ptxas_report)
    mma = {f: v for f, v in funcs.items() if "assign_mma" in f}
    assert len(mma) == 8, sorted(funcs)
    spilling = {f: v for f, v in mma.items() if v[1] > 0 or v[0] > 255}
    assert not spilling, f"tensor-core v2 kernels spill: {spilling}"


def test_wgmma_kernels_do_not_spill(ptxas_report):
    """The wgmma kernels (cuda/fused_wgmma.cu, sm_90a) hold two sets of accumulators a
    warpgroup (ping-pong: one set's argmin while the other's products run), the 3xTF32 one
    also X's A fragments (128 registers at d = 128), one block per SM, up to 255 registers,
    and must not spill; the fp16 and bf16 instances (d up to WGMMA_MAX_D_HALF) too, and
    those with X's fragments in registers (d up to WGMMA_MAX_D_AREG), and each format's on
    X stored in it (xhalf, xbf16) in both forms."""
    funcs = _functions(ptxas_report)
    wg = {f: v for f, v in funcs.items() if "assign_wgmma" in f}
    # (x 2: 16-byte rows or not; each half format twice: on float32 X and on X in it)
    half = 2 * 2 * len(paths.HALF_FORMATS) * (paths.wgmma_atoms(paths.WGMMA_MAX_D_HALF, 1) +
                                                paths.wgmma_atoms(paths.WGMMA_MAX_D_AREG, 1))
    assert len(wg) == 4 * paths.wgmma_atoms(paths.WGMMA_MAX_D) + half, sorted(funcs)
    spilling = {f: v for f, v in wg.items() if v[1] > 0 or v[0] > 255}
    assert not spilling, f"wgmma kernels spill: {spilling}"


def test_tensor_core_module_compiles_below_sm80(tmp_path):
    """Below sm_80 the PTX is guarded out (the host never launches these kernels there), so
    the module still builds for every GPU CuPy may compile it for."""
    file = common.CUDA_DIR / "fused_mma.cu"
    names = [n for f, n in fused_plan.kernel_instances() if f == "fused_mma.cu"]
    refs = ", ".join(f"(void*)&{n}" for n in names)
    src = tmp_path / "mma75.cu"
    src.write_text(f'#include "{file}"\nvoid* kmeans_xp_instances[] = {{{refs}}};\n')
    proc = subprocess.run([NVCC, "-arch=sm_75", "-std=c++17", "-fmad=false", "-cubin",
                           f"-I{common.CUDA_DIR}", "-o", str(tmp_path / "mma75.cubin"), str(src)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
