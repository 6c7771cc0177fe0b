"""cupy-fused's wgmma kernel (cuda/fused_wgmma.cu, Hopper) run on the CPU through the NumPy
stand-in for CuPy and the kernel emulator (tests/_cuda_emulator.py defines wgmma by the PTX
ISA): its TF32, fp16, bf16 and 3xTF32 instances, X by cp.async (16-byte rows) and by
registers (other rows), the K tails inside an atom, the row and column tails, k = 1, the
ping-pong of column blocks and the epilogue. In the emulator the mma.sync kernel and this one
sum a product in the same order, so their TF32 results must be equal bit for bit; the half
formats must keep each assignment within the certified bound, 3xTF32 numpy's labels up to
near ties. What the GPU adds (the hardware's accumulation order, speed) is left to the gpu
tests. Skipped without g++."""
import numpy as np
import pytest
from kmeans_xp_backends.cupy import fused_plan, paths

from kmeans_xp.contract.precision import assignment_error
from tests._cuda_emulator import EmulatedKernels
from tests._helpers import assert_numpys_up_to_near_ties, tile_problem

pytestmark = pytest.mark.skipif(not EmulatedKernels.available(), reason="needs g++")

#: a compute capability 9.0 GPU (the wgmma kernel's), with the stand-in's 2 SMs
HOPPER = fused_plan.DeviceFacts(2, 227 * 1024, 228 * 1024, 90)

# (n, d, k): one and two row blocks (BM = 256 TF32 / half, 128 3xTF32), column tails (BN =
# 64), odd and even column-block counts (the ping-pong's two ends), k = 1; d = 100 and 64: X
# by cp.async with a K tail inside the last atom, and without; d = 33: X by registers (rows
# not 16-byte multiples)
CASES = [(300, 100, 129), (257, 33, 13), (513, 64, 200), (100, 40, 1)]


@pytest.fixture
def hopper(emulated_cupy, monkeypatch):
    monkeypatch.setattr(fused_plan, "device_facts", lambda device_id: HOPPER)
    return emulated_cupy


_problem = tile_problem


def _assign(X, C, precision="exact", **options):
    from kmeans_xp_backends.cupy.fused import CupyFusedBackend
    be = CupyFusedBackend(**options)
    be.use_precision(precision)  # (the estimator's precision, as a fit sets it)
    lab, msq = be.assign(X, C)
    return be._ws.plan.path, np.asarray(lab), np.asarray(msq)


@pytest.mark.parametrize("n,d,k", CASES)
def test_tf32_wgmma_equals_the_mma_kernel(hopper, n, d, k):
    X, C = _problem(n, d, k, seed=d + k)
    path, lab, msq = _assign(X, C, precision="tf32")
    assert path == "wgmma"
    ref_path, ref_lab, ref_msq = _assign(X, C, precision="tf32", tf32_kernel="fused")
    assert ref_path == "mma"
    assert np.array_equal(lab, ref_lab)
    assert np.array_equal(msq, ref_msq)
    if k > 4:  # the duplicate of center 1 never wins over it
        assert not np.any(lab == k // 2)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("n,d,k", CASES)
def test_half_wgmma_within_the_certified_bound(hopper, precision, n, d, k):
    X, C = _problem(n, d, k, seed=d * 2 + k)
    path, lab, msq = _assign(X, C, precision=precision)
    assert path == f"wgmma-{precision}"
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    dist = ((X64[:, None, :] - C64[None]) ** 2).sum(-1)
    excess = dist[np.arange(n), lab] - dist.min(1)
    eps = assignment_error(precision, d, np.linalg.norm(X64, axis=1),
                           np.linalg.norm(C64, axis=1).max())
    assert np.all(excess <= 2 * eps)
    # min_sq_dist: ||x||^2 (exact float32) + the ranked distance (half operands)
    assert np.all(np.abs(msq - dist[np.arange(n), lab]) <= 2 * eps + 1e-5 * (dist.max() + 1))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("n,d,k", CASES)
def test_half_fragments_in_registers_equal_the_shared_tile(hopper, precision, n, d, k):
    """half_kernel='registers' (each thread's A fragments of X, rounded to the format, in
    registers: the m16n8k16 layout) computes the products of the shared tile's kernel: the
    same labels and min_sq_dist bit for bit (the emulator sums both in k order); a row
    fragment out of place (k or row swapped) would move both."""
    X, C = _problem(n, d, k, seed=d * 5 + k)
    path, lab, msq = _assign(X, C, precision=precision, half_kernel="registers")
    assert path == f"wgmma-{precision}r"
    ref_path, ref_lab, ref_msq = _assign(X, C, precision=precision)
    assert ref_path == f"wgmma-{precision}"
    assert np.array_equal(lab, ref_lab)
    assert np.array_equal(msq, ref_msq)


def test_half_registers_beyond_their_d_take_the_shared_tile(hopper):
    """Past d = 128 the fragments would not fit the registers: the table's next row, the
    shared tile, runs instead (the path says so)."""
    X, C = _problem(130, 200, 7, seed=4)
    path, _, _ = _assign(X, C, precision="fp16", half_kernel="registers")
    assert path == "wgmma-fp16"


@pytest.mark.parametrize("n,d,k", CASES)
def test_3xtf32_wgmma_labels_are_numpys_up_to_near_ties(hopper, n, d, k):
    X, C = _problem(n, d, k, seed=d * 3 + k)
    path, lab, msq = _assign(X, C)
    assert path == "wgmma3"
    assert_numpys_up_to_near_ties(X, C, lab, msq)


def test_the_cases_reach_both_ways_of_loading_x():
    """d = 100 and 64 rows are 16-byte multiples (X by cp.async), d = 33 and 40's are not
    all (33: registers); every case fits the kernel on a Hopper GPU."""
    assert {d % 4 == 0 for _, d, _ in CASES} == {True, False}
    for _, d, _ in CASES:
        assert paths.wgmma_fits(d, HOPPER) and paths.wgmma_fits(d, HOPPER, False, 1)
