"""The contract suite's batch checks (`check_backend` runs them): what a backend must do to
take part in batched fits. Its `batch_lloyd_iter` (its own, or the default loop) must give,
for every active problem, what its `lloyd_iter` gives on that problem alone, on dense and
ragged batches and on an active subset; and a whole batched fit on it must give, problem by
problem, the numpy backend's single fits from the same initial centers."""
from __future__ import annotations

import warnings

import numpy as np

from kmeans_xp.contract import registry
from kmeans_xp.contract.batching import BatchArray, BatchStats, row
from kmeans_xp.contract.namespaces import to_numpy
from kmeans_xp.testing.fits import _dev, _host, asymmetric_data, fit_max_memory


def _batch_data(dtype, sizes, d=5, k=9):
    """Asymmetric centered problems (each its own layout and offset), their weights (some
    zero) and (B, k, d) centers (problem 1 has three centers no point is near)."""
    problems, weights, centers = [], [], []
    for b, n in enumerate(sizes):
        X = asymmetric_data(n, d, 4, dtype=dtype, seed=31 + b, offset=2.0 * b)
        X -= X.mean(axis=0)
        rng = np.random.default_rng(b)
        w = rng.uniform(0.5, 2.0, n).astype(dtype)
        w[rng.random(n) < 0.1] = 0
        C = X[rng.choice(n, k, replace=False)] + rng.normal(size=(k, d)).astype(dtype) * 0.01
        if b == 1:
            C[:3] += 100
        problems.append(X)
        weights.append(w)
        centers.append(C)
    return problems, weights, np.stack(centers)


def check_batch_iteration(backend, to_arr, dtype):
    """batch_lloyd_iter against each problem's lloyd_iter: labels, sums, weights, inertia
    and changed labels, for all problems and for a subset, with and without labels_old."""
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    place = backend.placement
    checked = 0
    for layout, sizes in (("dense", [1031] * 3), ("ragged", [1031, 257, 2003])):
        problems, weights, C_np = _batch_data(dtype, sizes)
        if layout == "dense":
            dense = np.stack(problems)   # (moved as (B * n, d), as the estimator does)
            flat = place.to_backend(to_arr(dense.reshape(-1, dense.shape[2])))
            xp = place.namespace(flat)
            arr = xp.reshape(flat, dense.shape)
            X = BatchArray(arr)
            sw = BatchArray(xp.asarray(np.stack(weights), device=_dev(arr)))
        else:
            X = [place.to_backend(to_arr(p)) for p in problems]
            xp = place.namespace(X[0])
            sw = [xp.asarray(w, device=_dev(X[0])) for w in weights]
        for active in ((0, 1, 2), (0, 2)):
            where = f"{backend.name} {np.dtype(dtype)} {layout} batch, active {active}"
            C = xp.asarray(C_np[list(active)], device=_dev(X[0]))
            labels_old = None
            for weighted in (True, False):
                got = backend.batch_lloyd_iter(X, sw if weighted else None, C, labels_old,
                                               active, xp=xp)
                assert isinstance(got, BatchStats), f"{where}: returns {type(got).__name__}"
                for j, b in enumerate(active):
                    one = backend.lloyd_iter(X[b], sw[b] if weighted else None, C[j, ...],
                                             None if labels_old is None else row(labels_old, j),
                                             xp=xp)
                    _same(where + f", problem {b}", got, j, one, rtol)
                labels_old = got.labels
                checked += 1
    return checked


def _same(where, got, j, one, rtol):
    lab = to_numpy(row(got.labels, j)).astype(np.int64)
    ref = to_numpy(one.labels).astype(np.int64)
    # (a batched GEMM may round a near tie the other way: a few labels at most)
    differ = np.count_nonzero(lab != ref)
    assert differ <= max(1, lab.size // 1000), f"{where}: {differ} labels differ"
    scale = max(1.0, float(np.abs(_host(one.weighted_sums)).max()))
    if differ == 0:
        assert np.allclose(_host(got.weighted_sums[j, ...]), _host(one.weighted_sums),
                           rtol=rtol * 10, atol=rtol * scale), f"{where}: weighted_sums"
        assert np.allclose(_host(got.weight_in_clusters[j, ...]),
                           _host(one.weight_in_clusters), rtol=rtol * 10, atol=rtol), \
            f"{where}: weight_in_clusters"
        assert float(_host(got.n_changed[j])) == float(_host(one.n_changed)), \
            f"{where}: n_changed"
    assert np.isclose(float(_host(got.inertia[j])), float(_host(one.inertia)),
                      rtol=rtol * 100), f"{where}: inertia"


def check_batch_fit(backend, to_arr, dtype):
    """A ragged batched KMeans fit on the backend gives each problem's numpy single fit
    (partition, iterations, inertia) from the same initial centers."""
    from kmeans_xp.estimators.kmeans import KMeans
    problems, weights, C = _batch_data(dtype, [1031, 257, 2003])
    name = backend.name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with registry.registered(type(backend)):
            got = KMeans(9, init=C, max_iter=50, backend=name,
                         max_memory=fit_max_memory(backend, problems[-1], 9, True)).fit(
                [to_arr(p) for p in problems], sample_weight=[to_arr(w) for w in weights])
        refs = [KMeans(9, init=C[b], max_iter=50, backend="numpy").fit(
            p, sample_weight=weights[b]) for b, p in enumerate(problems)]
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    for b, ref in enumerate(refs):
        where = f"{name} {np.dtype(dtype)} batched fit, problem {b}"
        labels = to_numpy(got.labels_[b])
        assert np.array_equal(labels, ref.labels_), \
            f"{where}: partition differs from the numpy backend's single fit " \
            f"({np.mean(labels != ref.labels_):.4%} of labels)"
        assert got.n_iter_[b] == ref.n_iter_, f"{where}: n_iter {got.n_iter_[b]} != " \
                                              f"{ref.n_iter_}"
        assert abs(got.inertia_[b] - ref.inertia_) <= rtol * ref.inertia_ + 1e-12, \
            f"{where}: inertia {got.inertia_[b]} != {ref.inertia_}"
    return 1
