"""A dask worker killed mid-fit: the graph engine recomputes the lost blocks and gives the exact
answer; the actors engine raises `WorkerLostError` at once (which worker, which blocks, what to
do), never a raw CommClosedError or the 30 s connect timeout, and the next fit works."""
import os
import signal
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("distributed")

from kmeans_xp_backends.dask import actors, graph  # noqa: E402

from kmeans_xp import KMeans, WorkerLostError  # noqa: E402
from kmeans_xp.testing import asymmetric_data  # noqa: E402

X = asymmetric_data(4000, 3, 8, seed=1)
INIT = X[:8]


@pytest.fixture
def client(client):
    """conftest's two worker processes, both up: they run under nannies, which restart the
    one a test killed."""
    client.wait_for_workers(2, timeout=30)
    yield client


def _fit(engine, max_iter=20):
    return KMeans(8, init=INIT, backend="dask", max_iter=max_iter, tol=0,
                  backend_options={"engine": engine}).fit(da.from_array(X, chunks=(500, 3)))


def _reference():
    return KMeans(8, init=INIT, backend="numpy", max_iter=20, tol=0).fit(X)


def _busiest(client):
    """The worker holding the most keys (X's blocks: it has some of them, and actors)."""
    held = client.has_what()
    return max(sorted(held), key=lambda w: len(held[w]))


def _kill_a_worker_at_iteration(monkeypatch, client, engine_class, at=3):
    """The engine's `at`-th lloyd_iter first SIGKILLs the worker process holding the most
    of X (deterministic: from the client, between two iterations)."""
    original, calls = engine_class.lloyd_iter, []

    def hooked(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            address = _busiest(client)
            os.kill(client.run(os.getpid, workers=[address])[address], signal.SIGKILL)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(engine_class, "lloyd_iter", hooked)
    return calls


def _same_as_reference(km):
    ref = _reference()
    np.testing.assert_array_equal(km.labels_.compute(), ref.labels_)
    assert km.n_iter_ == ref.n_iter_
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)


def _lost_clearly(info, started):
    msg = str(info.value)
    assert time.monotonic() - started < 10   # not the 30 s connect timeout
    assert "worker" in msg and "lost" in msg and "blocks" in msg
    assert "engine': 'graph'" in msg and "again" in msg


def test_graph_engine_survives_a_killed_worker(client, monkeypatch):
    calls = _kill_a_worker_at_iteration(monkeypatch, client, graph.GraphEngine)
    km = _fit("graph")
    assert len(calls) > 3
    _same_as_reference(km)


def test_actors_engine_killed_worker_between_calls(client, monkeypatch):
    _kill_a_worker_at_iteration(monkeypatch, client, actors.ActorEngine)
    started = time.monotonic()
    with pytest.raises(WorkerLostError) as info:
        _fit("actors")
    _lost_clearly(info, started)
    monkeypatch.undo()
    client.wait_for_workers(2, timeout=30)
    _same_as_reference(_fit("actors"))   # what the message says to do works


def test_actors_engine_worker_killed_during_a_call(client):
    """The worker dies inside an actor's iteration (its own SIGKILL, on the 3rd call)."""
    def die_on_third_iterate():
        from kmeans_xp_backends.dask import actors as worker_actors
        original, calls = worker_actors.BlockActor.iterate, []

        def iterate(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)

        worker_actors.BlockActor.iterate = iterate

    client.run(die_on_third_iterate)   # every worker: each one that holds blocks dies
    started = time.monotonic()
    with pytest.raises(WorkerLostError) as info:
        _fit("actors")
    _lost_clearly(info, started)
    assert "worker tcp://" in str(info.value)
