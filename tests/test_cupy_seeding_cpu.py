"""k-means++ on the device (kmeans_xp_backends.cupy.seeding, cuda/seeding.cu), its kernels run
on the CPU (the fake_cupy fixture): the same centers as the xp steps of kmeans_xp.algorithms.init from
the same random state, with and without weights, on a centered copy and on DeviceRows, and the
cases it leaves to the xp steps. The GPU run is in tests/test_cupy_backends.py."""
import numpy as np
import pytest
from array_api_compat import numpy as np_xp

from kmeans_xp import KMeans
from kmeans_xp.algorithms.init import kmeans_parallel, kmeans_plusplus
from kmeans_xp.contract.seeding import local_trials
from kmeans_xp.contract.registry import get_backend
from kmeans_xp.testing import asymmetric_data


def _seed(X, k, w, seeding, seed=0):
    return kmeans_plusplus(X, k, sample_weight=w, random_state=np.random.RandomState(seed),
                           xp=np_xp, rows=X.shape[0], seeding=seeding)


def _data(n, d, dtype, seed):
    X = asymmetric_data(n, d, 7, dtype=dtype, seed=seed)
    return np.ascontiguousarray(X - X.mean(axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d,k", [(1, 5), (3, 1), (3, 40), (4, 17), (7, 12)])
@pytest.mark.parametrize("weighted", [False, True])
def test_device_seeding_draws_the_xp_steps_centers(fake_cupy, dtype, d, k, weighted):
    from kmeans_xp_backends.cupy.seeding import DeviceSeeding, device_seeding
    n = 3 * 256 * 4 + 101  # more rows than one grid pass, not a multiple of the block
    X = _data(n, d, dtype, seed=d + k)
    w = np.random.default_rng(k).uniform(0.2, 3.0, n).astype(dtype) if weighted else None
    steps = device_seeding(X, w, local_trials(k))
    assert isinstance(steps, DeviceSeeding)
    got_c, got_i = _seed(X, k, w, steps)
    ref_c, ref_i = _seed(X, k, w, None)
    np.testing.assert_array_equal(got_i, ref_i)
    np.testing.assert_array_equal(got_c, ref_c)
    assert len(set(got_i.tolist())) == k


def test_device_seeding_on_device_rows_centers_on_the_fly(fake_cupy):
    """DeviceRows (a device X seen centered): the centers drawn from the centered copy."""
    from kmeans_xp_backends.cupy.seeding import device_seeding
    from kmeans_xp_backends.cupy.staging import DeviceRows
    X = asymmetric_data(2053, 3, 5, dtype=np.float32, seed=4) + np.float32(40)
    mean = X.mean(axis=0).astype(np.float32)
    rows = DeviceRows(X, mean)
    got = _seed(rows, 11, None, device_seeding(rows, None, local_trials(11)))[1]
    ref = _seed(X - mean, 11, None, None)[1]
    np.testing.assert_array_equal(got, ref)


def test_device_seeding_with_no_potential_left_draws_by_weight(fake_cupy):
    """k equals the positive-weight rows: the last draws find no potential left and fall back
    to draws by weight, as the xp steps do (never a zero-weight row)."""
    from kmeans_xp_backends.cupy.seeding import device_seeding
    X = _data(600, 3, np.float64, seed=2)
    w = np.zeros(600)
    w[[3, 77, 300, 599]] = [1.0, 2.0, 0.5, 4.0]
    got = _seed(X, 4, w, device_seeding(X, w, local_trials(4)))[1]
    np.testing.assert_array_equal(got, _seed(X, 4, w, None)[1])
    assert set(got.tolist()) == {3, 77, 300, 599}


def test_device_seeding_leaves_what_it_cannot_take_to_the_xp_steps(fake_cupy):
    from kmeans_xp_backends.cupy.seeding import MAX_TRIALS, device_seeding
    from kmeans_xp_backends.cupy.staging import HostRows
    X = _data(500, 3, np.float32, seed=1)
    assert device_seeding(X, None, MAX_TRIALS) is not None
    assert device_seeding(X, None, MAX_TRIALS + 1) is None           # too many candidates
    assert device_seeding(HostRows(X, X[0]), None, 3) is None        # streamed from the host
    assert device_seeding(np.asfortranarray(X), None, 3) is None     # not C-contiguous
    wide = _data(50, 2000, np.float64, seed=1)
    assert device_seeding(wide, None, 8) is None                    # candidates past 48 KB


def test_fit_and_kmeans_parallel_use_the_device_steps(fake_cupy, monkeypatch):
    """A CuPy backend's fit seeds with DeviceSeeding; k-means|| runs its candidates'
    k-means++ on the device too; both give the numpy backend's centers."""
    from kmeans_xp_backends.cupy import seeding as seeding_mod
    made = []
    real = seeding_mod.DeviceSeeding
    monkeypatch.setattr(seeding_mod, "DeviceSeeding",
                        lambda *a: made.append(a[0].shape) or real(*a))
    X = asymmetric_data(4001, 3, 6, dtype=np.float64, seed=9)
    for init in ("k-means++", "k-means||"):
        made.clear()
        kw = dict(init=init, n_init=1, max_iter=1, tol=0, random_state=3)
        got = KMeans(6, backend="cupy-kernels", **kw).fit(X)
        ref = KMeans(6, backend="numpy", **kw).fit(X)
        np.testing.assert_allclose(got.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
        assert made and (made[0][0] == 4001) == (init == "k-means++"), made
    b = get_backend("cupy-kernels")()
    Xc = X - X.mean(axis=0)
    got = kmeans_parallel(Xc, 6, sample_weight=None, random_state=np.random.RandomState(0),
                          xp=np_xp, rows=4001, backend=b)[1]
    ref = kmeans_parallel(Xc, 6, sample_weight=None, random_state=np.random.RandomState(0),
                          xp=np_xp, rows=4001, backend=get_backend("numpy")())[1]
    np.testing.assert_array_equal(got, ref)


def test_the_contract_suite_checks_the_cupy_seeding(fake_cupy):
    from kmeans_xp.testing import check_seeding
    X = _data(1031, 3, np.float32, seed=5)
    w = np.random.default_rng(2).uniform(0.5, 2.0, 1031).astype(np.float32)
    w[::9] = 0
    assert check_seeding(get_backend("cupy-kernels")(), X, w, 6, np_xp, "cupy-kernels") == 2
