"""The CuPy backends' kernels compile, checked without a GPU.

CuPy generates an ElementwiseKernel's / ReductionKernel's CUDA source at its first call, which
needs a device. This test asks CuPy's own code generator for the same source (private
functions, so the test skips if they change) and compiles it with NVRTC for sm_90, the way
CuPy would. It needs CuPy and the NVRTC library, not a GPU; it is skipped without them.
"""
import os

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from kmeans_xp_backends import _cupy_kmeans_kernels as K  # noqa: E402

ND, INDEXER, SCALAR = 1, 2, 3   # cupy._core._kernel._ArgKind
HEADERS = "".join(f"#include <cupy/{h}>\n" for h in
                  ("complex.cuh", "carray.cuh", "atomics.cuh", "math_constants.h"))
ARRAY_NDIM = {"X": 2, "C": 2, "sums": 2}


def _nvrtc(source, name):
    from cupy.cuda import compiler
    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    cccl = [f"-I{include}/cupy/_cccl/{lib}" for lib in ("libcudacxx", "thrust", "cub")]
    options = (f"-I{include}", *cccl, "--std=c++17", "-arch=sm_90",
               "--device-as-default-execution-space")
    try:
        program = compiler._NVRTCProgram(source, f"{name}.cu", (), (), method="cubin")
    except Exception as exc:  # no NVRTC library here
        pytest.skip(f"NVRTC unavailable: {exc}")
    try:
        binary, _ = program.compile(options)
    except compiler.CompileException as exc:
        pytest.fail(f"{name} does not compile:\n{exc}")
    return binary


def _internals():
    try:
        from cupy._core import _kernel, _reduction
        _kernel._ArgInfo(ND, cupy.ndarray, np.dtype(np.float32), 1, True, True)
        return _kernel, _reduction
    except Exception as exc:
        pytest.skip(f"CuPy's code generator internals changed: {exc}")


def _elementwise_source(kind, dtype, idx32):
    _kernel, _ = _internals()
    kern = K.elementwise(kind)
    infos = []
    for p in kern.params:
        dt = np.dtype(dtype) if p.dtype is None else p.dtype
        if p.name == "_ind":
            infos.append(_kernel._ArgInfo(INDEXER, object, None, 1, True, idx32))
        elif p.raw or p.name not in ("k", "d"):
            infos.append(_kernel._ArgInfo(ND, cupy.ndarray, dt, ARRAY_NDIM.get(p.name, 1), True,
                                          idx32))
        else:
            infos.append(_kernel._ArgInfo(SCALAR, object, dt, 0, True, True))
    type_map = _kernel._TypeMap((("T", np.dtype(dtype).type),))
    return HEADERS + _kernel._get_elementwise_kernel_code(
        tuple(infos), type_map, kern.params, kern.operation, kern.name, kern.preamble)


def _reduction_source(kind, dtype, ndim):
    _kernel, _reduction = _internals()
    red = K.reduction(kind)
    params = (red.in_params + red.out_params
              + _kernel._get_param_info("CIndexer _in_ind, CIndexer _out_ind", False)
              + _kernel._get_param_info("int32 _block_stride", True))
    infos = [_kernel._ArgInfo(ND, cupy.ndarray, np.dtype(dtype) if p.dtype is None else p.dtype,
                              ndim, True, True) for p in red.in_params]
    infos += [_kernel._ArgInfo(ND, cupy.ndarray, p.dtype, ndim - 1, True, True)
              for p in red.out_params]
    infos += [_kernel._ArgInfo(INDEXER, object, None, ndim, True, True),
              _kernel._ArgInfo(INDEXER, object, None, ndim - 1, True, True),
              _kernel._ArgInfo(SCALAR, object, np.dtype(np.int32), 0, True, True)]
    typed = any(p.dtype is None for p in red.in_params)
    type_map = _kernel._TypeMap(((("T", np.dtype(dtype).type),) if typed else ())
                                + (("IndexT", np.int32),))
    return HEADERS + _reduction._ReductionKernel_get_cached_function_code(
        red.nin, red.nout, tuple(params), tuple(infos), type_map, red.name, 512,
        red.reduce_type, red.identity, red.map_expr, red.reduce_expr, red.post_map_expr,
        red.preamble, ())


def _used_elementwise():
    """(kind, dtype, 32-bit indexing) of every elementwise kernel the backends launch."""
    cases = []
    for dtype in (np.float32, np.float64):
        kinds = sorted(K.ELEMENTWISE)
        cases += [(kind, dtype, True) for kind in kinds]
        # arrays past 2**31 elements index in 64 bits
        cases += [(kind, dtype, False) for kind in kinds]
    return cases


def _generated(make, *args):
    try:
        return make(*args)
    except (AttributeError, TypeError) as exc:  # private API moved: nothing to check against
        pytest.skip(f"CuPy's code generator internals changed: {exc}")


@pytest.mark.parametrize("kind,dtype,idx32", _used_elementwise())
def test_elementwise_kernels_compile(kind, dtype, idx32):
    assert _nvrtc(_generated(_elementwise_source, kind, dtype, idx32), kind)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("kind", sorted(K.REDUCTIONS))
def test_reduction_kernels_compile(kind, dtype, ndim):
    assert _nvrtc(_generated(_reduction_source, kind, dtype, ndim), kind)


@pytest.mark.parametrize("name", K.all_raw_kernel_names())
def test_raw_kernel_instances_compile(name):
    """Every template instance of the raw kernels, with the options the backends use."""
    from cupy.cuda import compiler
    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    try:
        program = compiler._NVRTCProgram(K.RAW_SOURCE, "kmeans_raw.cu", (), (),
                                         name_expressions=[name], method="cubin")
    except Exception as exc:  # no NVRTC library here
        pytest.skip(f"NVRTC unavailable: {exc}")
    try:
        binary, mapping = program.compile((*K.NVRTC_OPTIONS, "-arch=sm_90", f"-I{include}"))
    except compiler.CompileException as exc:
        pytest.fail(f"{name} does not compile:\n{exc}")
    assert binary and mapping[name]


def test_distance_arithmetic_is_explicit_about_rounding():
    """The nearest-center kernels round where numpy's BLAS does: fused multiply-adds and
    additions written as intrinsics (NVRTC contracts plain a * b + c by default)."""
    src = K.RAW_SOURCE
    body = src[src.index("nearest_small("):src.index("// per-cluster sums")]
    assert "fma_rn(" in body and "add_rn(acc, op[" in body
    assert "__fmaf_rn" in src and "__fadd_rn" in src and "__fma_rn" in src
