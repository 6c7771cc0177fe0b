"""Host-side pieces of `cupy-fused` that need no GPU: numpy's summation order for ||c||^2 (which
the kernels reproduce so that near-ties break as in the numpy backend), the kernel-name lookup,
and the TF32 compute-type API of the installed CuPy (importable without a GPU)."""
import re
import types

import numpy as np
import pytest
from kmeans_xp_backends.cupy import common, einsum_order, fused_plan, paths


def test_einsum_order_is_detected():
    """Every numpy build we support (x86-64, aarch64) sums einsum in an order the kernels
    know; None would make them fall back to a sequential sum."""
    assert einsum_order.einsum_order() is not None


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128,
                               129, 255, 1024])
def test_einsum_emulation_matches_numpy(d):
    """The order the kernels use (emulated row-parallel on the host, same loop) gives the bits
    of np.einsum for every d, including the vector tails and the 4-vector groups."""
    order = einsum_order.einsum_order()
    if order is None:
        pytest.skip("einsum order not reproduced on this numpy build")
    rng = np.random.default_rng(d)
    C = (rng.standard_normal((257, d)) * rng.uniform(0.01, 100.0, d)).astype(np.float32)
    got = einsum_order.emulate_einsum_sq_norm(C, *order)
    assert np.array_equal(got, np.einsum("ij,ij->i", C, C))


def test_sequential_sum_is_not_einsum_beyond_d3():
    """Why the order matters: a sequential sum differs from einsum's in the last bit for many
    centers once d >= 4 (and such bits flip near-tie labels)."""
    rng = np.random.default_rng(0)
    C = (rng.standard_normal((2000, 16)) * rng.uniform(0.1, 10.0, 16)).astype(np.float32)
    seq = np.zeros(len(C), dtype=np.float32)
    for j in range(C.shape[1]):
        seq = seq + C[:, j] * C[:, j]
    assert np.mean(seq != np.einsum("ij,ij->i", C, C)) > 0.05


def test_norm_modes():
    order = einsum_order.einsum_order()
    if order is None:
        assert einsum_order.norm_mode("float32") == 0
        return
    vec_bytes, fused, hmode = order
    for dt, size in (("float32", 4), ("float64", 8)):
        mode = einsum_order.norm_mode(dt)
        assert mode & 0xFF == vec_bytes // size
        assert (mode >> 8) & 1 == int(fused) and (mode >> 9) & 3 == hmode


def test_every_kernel_the_backend_launches_has_a_file_and_an_instance():
    # (the backend, its update step and its workspace, which looks up what every call
    # launches)
    text = "".join(open(fused_plan.__file__.replace("fused_plan.py", name)).read()
                   for name in ("fused.py", "fused_sums.py", "workspace.py"))
    used = set(re.findall(r'fp\.kernel\(f?"([a-z_]+)[<"]', text))
    assert {"pack_centers", "finalize_sums", "accumulate_shared", "column_absmax"} <= used
    names = fused_plan.all_kernel_names()
    for name in used | {"assign_small", "assign_gemm", "assign_tf32", "assign_mma"}:
        assert name in fused_plan.KERNEL_FILES, name
        assert any(n.split("<")[0] == name for n in names), name
    for dt in ("float32", "float64"):
        for vec in (True, False):
            assert paths.gemm_kernel_name(dt, vec) in fused_plan.common_kernel_names(dt)


def test_tf32_api_exists_in_installed_cupy():
    cp = pytest.importorskip("cupy")
    get, set_, tf32 = common.tf32_api(cp)
    assert callable(get) and callable(set_) and isinstance(tf32, int)


def test_tf32_api_missing_is_a_clear_error(monkeypatch):
    cp = pytest.importorskip("cupy")
    import cupy._core
    monkeypatch.setattr(cupy._core, "_routines_linalg", types.ModuleType("stub"),
                        raising=False)
    with pytest.raises(RuntimeError, match="COMPUTE_TYPE_TF32.*precision='fp32'"):
        common.tf32_api(cp)
