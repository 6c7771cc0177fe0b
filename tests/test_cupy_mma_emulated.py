"""cupy-fused's v2 tensor-core kernel (cuda/fused_mma.cu) run on the CPU through the NumPy
stand-in for CuPy (tests/_fake_cupy.py) and the kernel emulator (tests/_cuda_emulator.py, which
defines mma.sync, ldmatrix and cp.async by the PTX ISA): its tiling, the resident and K-streamed
X paths, 16- and 4-byte copies, the K, row and column tails, the pre-rounded operands of
pack_centers (layouts 3 and 4) and the epilogue. precision="tf32" labels must be the exact
argmin up to TF32's rounding; gemm_kernel="3xtf32" labels must be numpy's up to near ties (the
bounds of kmeans_xp.testing.label_bounds). What the GPU adds (the hardware's fragment layouts,
its accumulation order, launch limits, speed) is left to the gpu tests. Skipped without g++."""
import numpy as np
import pytest
from kmeans_xp_backends.cupy import fused_plan, paths

from kmeans_xp.testing.label_bounds import tf32_error
from tests._cuda_emulator import EmulatedKernels
from tests._helpers import assert_numpys_up_to_near_ties, tile_problem

pytestmark = pytest.mark.skipif(not EmulatedKernels.available(), reason="needs g++")


_problem = tile_problem


def _assign(X, C, **options):
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    be = CupyFusedBackend(**options)
    lab, msq = be.assign(X, C)
    return be, np.asarray(lab), np.asarray(msq)


# (n, d, k): one and several row blocks (BM = 256), column tails (kpad = 128 multiples), k = 1,
# d not a multiple of 8 or 4 (K tail, 4-byte copies), d past the resident limit (K-streamed)
CASES = [(300, 20, 129), (257, 33, 13), (513, 128, 300), (100, 5, 1), (131, 152, 40),
         (131, 201, 7), (260, 160, 131)]


@pytest.mark.parametrize("n,d,k", CASES)
def test_tf32_v2_labels_within_tf32_rounding(emulated_cupy, n, d, k):
    X, C = _problem(n, d, k, seed=d + k)
    be, lab, msq = _assign(X, C, precision="tf32", tf32_kernel="fused")
    p = be._ws.plan
    assert p.path == "mma" and p.layout == 3
    assert p.resident == (fused_plan.mma_dk(d) <= 152)
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    exact = ((X64[:, None, :] - C64[None]) ** 2).sum(-1)
    got = exact[np.arange(n), lab]
    best = exact.min(1)
    nx, nc = np.sqrt((X64 ** 2).sum(1)), np.sqrt((C64 ** 2).sum(1))
    err, err_best = tf32_error(X, C, lab), tf32_error(X, C, exact.argmin(1))
    assert np.all(got - best <= err + err_best + 1e-6 * (nx ** 2 + nc[lab] ** 2))
    assert np.all(np.abs(msq - got) <= 2 * err + 1e-5 * (nx ** 2 + 1))
    if k > 4:  # the duplicate of center 1 never wins over it
        assert not np.any(lab == k // 2)


@pytest.mark.parametrize("n,d,k", CASES)
def test_3xtf32_labels_are_numpys_up_to_near_ties(emulated_cupy, n, d, k):
    X, C = _problem(n, d, k, seed=d * 3 + k)
    be, lab, msq = _assign(X, C, gemm_kernel="3xtf32", tf32_kernel="fused")
    p = be._ws.plan
    if d <= fused_plan.SMALL_D_MAX:
        assert p.path == "small"  # the option is for the d > 16 path only
        return
    assert p.path == "mma3" and p.layout == 4
    assert p.resident == (fused_plan.mma_dk(d) <= 144)
    assert_numpys_up_to_near_ties(X, C, lab, msq)
    if k > 4:
        assert not np.any(lab == k // 2)


def test_lloyd_iter_through_the_v2_kernel(emulated_cupy):
    """The iteration's statistics (inertia partials per block, changed labels) as assign's."""
    X, C = _problem(700, 40, 50, seed=4)
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    be = CupyFusedBackend(gemm_kernel="3xtf32", tf32_kernel="fused")
    lab, msq = be.assign(X, C)
    it = be.lloyd_iter(X, None, C, None)
    assert np.array_equal(np.asarray(it.labels), np.asarray(lab))
    assert float(it.n_changed) == len(X)
    assert float(it.inertia) == pytest.approx(float(np.sum(np.asarray(msq, np.float64))),
                                              rel=1e-9)
    assert np.array_equal(np.asarray(it.weight_in_clusters),
                          np.bincount(np.asarray(lab), minlength=50))
    it2 = be.lloyd_iter(X, None, C[::-1].copy(), it.labels)
    assert float(it2.n_changed) == np.count_nonzero(np.asarray(it2.labels) != np.asarray(lab))


def test_falls_back_where_the_v2_kernel_cannot_run():
    small = fused_plan.DeviceFacts(2, 99 * 1024, 100 * 1024, 86)   # sm_86: 99 KB a block
    old = fused_plan.DeviceFacts(80, 96 * 1024, 96 * 1024, 75)     # no TF32 tensor cores
    h200 = fused_plan.NOMINAL
    a100 = fused_plan.DeviceFacts(108, 163 * 1024, 164 * 1024, 80)
    # tf32: the wgmma kernel on compute capability 9.0 where its shared memory fits, else v2
    assert fused_plan.plan(10**6, 128, 4096, "float32", h200, precision="tf32").path == "wgmma"
    assert fused_plan.plan(10**6, 128, 4096, "float32", h200, precision="tf32",
                           tf32_kernel="fused").path == "mma"
    assert fused_plan.plan(10**6, 1024, 77, "float32", h200, precision="tf32",
                           tf32_kernel="wgmma").path == "mma"
    assert fused_plan.plan(10**6, 128, 4096, "float32", a100, precision="tf32").path \
        == fused_plan.plan(10**6, 128, 4096, "float32", a100, precision="tf32",
                           tf32_kernel="fused").path != "wgmma"
    p = fused_plan.plan(10**6 + 3, 33, 300, "float32", h200, precision="tf32")
    assert p.path == "wgmma" and p.layout == 3 and p.S == 40
    assert p.assign_smem == paths.wgmma_smem(33) <= h200.smem_block - 1024
    assert p.assign_grid == -(-(10**6 + 3) // (128 * paths.wgmma_tile(False)[0]))
    # 3xTF32: the wgmma kernel in split precision on 9.0 (tf32_kernel picks the kernel), X's
    # parts in registers: no shared memory for X's rows
    p = fused_plan.plan(10**6, 128, 4096, "float32", h200, gemm_kernel="3xtf32",
                        tf32_kernel="wgmma")
    assert p.path == "wgmma3" and p.layout == 4
    assert p.assign_smem == paths.wgmma_smem(128, True) <= h200.smem_block - 1024
    assert p.assign_smem == 1024 + 4 * 4 * 32 * 2 * paths.WGMMA_STAGES * 64
    assert p.assign_grid == -(-10**6 // 128)
    for d in (17, 64, 128):  # the default
        assert fused_plan.plan(10**6, d, 4096, "float32", h200).path == "wgmma3"
    assert fused_plan.plan(10**6, 129, 4096, "float32", h200).path == "mma3"
    p = fused_plan.plan(10**6, 128, 4096, "float32", h200, gemm_kernel="3xtf32",
                        tf32_kernel="fused")
    assert p.path == "mma3" and p.resident and p.assign_smem <= h200.smem_block - 1024
    assert fused_plan.plan(10**6, 128, 4096, "float64", h200, gemm_kernel="3xtf32").path \
        == "gemm"
    assert fused_plan.plan(10**6, 128, 4096, "float32", old, gemm_kernel="3xtf32").path \
        == "gemm"
    assert fused_plan.plan(10**6, 128, 64, "float32", small, precision="tf32").path \
        == "tf32mma"
    p = fused_plan.plan(10**6, 16, 64, "float32", small, precision="tf32")
    assert p.path == "mma" and p.resident
    assert fused_plan.plan(10, 128, 64, "float32", h200, precision="tf32",
                           tf32_kernel="fused-v1").path == "tf32mma"
    # K-streamed for large d, on the H200
    p = fused_plan.plan(10**5, 1024, 77, "float32", h200, gemm_kernel="3xtf32")
    assert p.path == "mma3" and not p.resident
    assert p.fixed_bytes["center_operands"] == (2 * p.kpad * 1024 + p.kpad) * 4


@pytest.mark.parametrize("layout,fmt", [(5, "fp16"), (6, "bf16")])
def test_half_operands_are_the_rounded_negated_centers(emulated_cupy, layout, fmt):
    """pack_centers' layouts 5 / 6 (the wgmma kernel's half formats): rows of roundup(d, 16)
    halves of -c rounded to nearest even as NumPy's float16 / ml_dtypes' bfloat16 round (ties,
    subnormals, fp16's overflow past 65504), zero padding, and ||c||^2 / 2 beside them."""
    from kmeans_xp_backends.cupy.nearest import pack_centers

    from kmeans_xp.contract.precision import round_to
    rng = np.random.default_rng(5)
    k, d = 37, 21
    C = (rng.normal(size=(k, d)) * np.logspace(-6, 4, d)).astype(np.float32)
    edges = [65504, 65519.99, 65520, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25,
             1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 0.0,
             -1.5 * 2.0 ** -24]
    C[0, :len(edges)] = np.float32(edges)
    S, kpad = paths.half_dk(d), 128
    ops = np.zeros(kpad * S // 2, np.float32)
    cnorm = np.full(kpad, np.inf, np.float32)
    pack_centers(np.ascontiguousarray(C), layout, ops, cnorm, S=S, kpad=kpad)
    got = ops.view(np.uint16).reshape(kpad, S)
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            want = (-C).astype(np.float16).view(np.uint16)
    else:
        want = (round_to(-C, "bf16").view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(got[:k, :d], want)
    assert not got[:, d:].any() and not got[k:].any()
    norm = np.einsum("ij,ij->i", C.astype(np.float64), C.astype(np.float64)) / 2
    np.testing.assert_allclose(cnorm[:k], norm, rtol=1e-6)
    assert np.isinf(cnorm[k:]).all()
