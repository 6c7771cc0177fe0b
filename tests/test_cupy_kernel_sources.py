"""The CuPy backends' CUDA sources compile with NVRTC the way CuPy compiles them at run time:
each file of kmeans_xp_backends/cupy/cuda/ with its headers inlined (`common.source`), the
backends' own options, every template instance they name. Needs CuPy and the NVRTC library,
not a GPU; skipped without them (tests/test_cuda_compile.py checks the same instances with
nvcc). And the rounding is explicit where numpy's is reproduced."""
import os

import pytest

cupy = pytest.importorskip("cupy")

from kmeans_xp_backends.cupy import common, fused_plan, nearest, paths, reductions  # noqa: E402

INSTANCES = sorted(set(nearest.kernel_instances() + reductions.kernel_instances()
                       + fused_plan.kernel_instances()))


@pytest.mark.parametrize("file,name", INSTANCES)
def test_instance_compiles_with_nvrtc(file, name):
    from cupy.cuda import compiler
    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    try:
        program = compiler._NVRTCProgram(common.source(file), file, (), (),
                                         name_expressions=[name], method="cubin")
    except Exception as exc:  # no NVRTC library here, or CuPy's internals moved
        pytest.skip(f"NVRTC unavailable: {exc}")
    try:
        arch = common.arch_target(file) or "sm_90"  # (wgmma: sm_90a, as at run time)
        binary, mapping = program.compile((*common.NVRTC_OPTIONS, f"-arch={arch}",
                                           f"-I{include}"))
    except compiler.CompileException as exc:
        pytest.fail(f"{name} ({file}) does not compile:\n{exc}")
    assert binary and mapping[name]


def test_arch_compile_names_a_fix_where_cupy_lacks_its_nvrtc_wrapper(monkeypatch, tmp_path):
    """The wgmma file compiles through CuPy's (private) NVRTC wrapper; a CuPy without it gets
    an error that says what to pass instead, not an AttributeError."""
    import types
    fake = types.SimpleNamespace(
        __version__="99", cuda=types.SimpleNamespace(
            nvrtc=types.SimpleNamespace(getVersion=lambda: (99, 0)),
            compiler=types.SimpleNamespace()))
    monkeypatch.setattr(common, "cupy", lambda: fake)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    name = paths.wgmma_kernel_name(128, True)
    with pytest.raises(RuntimeError, match="tf32_kernel"):
        common._ArchModule("fused_wgmma.cu", (name,), "sm_90a")


def test_distance_arithmetic_is_explicit_about_rounding():
    """The nearest-center loops round where numpy's BLAS does: fused multiply-adds and
    additions written as intrinsics (NVRTC contracts plain a * b + c by default; the modules
    are also compiled with --fmad=false)."""
    head = common.source("nearest.cu")
    body = head[head.index("center_distance("):head.index("sq_norm_seq(")]
    assert "fma_rn(" in body and "add_rn(acc, op[" in body
    assert "__fmaf_rn" in head and "__fadd_rn" in head and "__fma_rn" in head
    assert "--fmad=false" in common.NVRTC_OPTIONS
