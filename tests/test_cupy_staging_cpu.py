"""`staging.upload` and `staging.download` on the CPU: a NumPy stand-in for the few CuPy calls
they make (device arrays with set/get, streams whose copies run at once), chunks of any size
against the pinned buffers, a ragged last chunk, and labels widened on the way back."""
import types

import numpy as np
import pytest
from kmeans_xp_backends.cupy import staging


class DeviceArray(np.ndarray):
    """A "device" array: CuPy's set and get, done at once."""

    def set(self, src, stream=None):
        self[...] = src

    def get(self, stream=None, out=None, blocking=True):
        out[...] = self
        return out


class Stream:
    def __init__(self, non_blocking=False):
        pass

    def record(self):
        return types.SimpleNamespace(synchronize=lambda: None)

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


def _cupy():
    pinned = []

    def alloc_pinned_memory(nbytes):
        pinned.append(nbytes)
        return bytearray(nbytes)

    cp = types.SimpleNamespace(
        empty=lambda shape, dtype: np.empty(shape, dtype).view(DeviceArray),
        asarray=lambda a: np.array(a).view(DeviceArray),
        asnumpy=np.asarray,
        cuda=types.SimpleNamespace(Stream=Stream, get_current_stream=lambda: Stream(),
                                   alloc_pinned_memory=alloc_pinned_memory,
                                   runtime=types.SimpleNamespace(CUDARuntimeError=RuntimeError)))
    return cp, pinned


@pytest.fixture
def small_chunks(monkeypatch):
    """Staged from 1 KiB on, in chunks of 700 bytes."""
    monkeypatch.setattr(staging, "UPLOAD_STAGED_BYTES", 1 << 10)
    monkeypatch.setattr(staging, "DOWNLOAD_STAGED_BYTES", 1 << 10)
    monkeypatch.setattr(staging, "UPLOAD_CHUNK_BYTES", 700)
    monkeypatch.setattr(staging, "STAGING_MIN_ROWS", 8)  # several copy threads per chunk


@pytest.mark.parametrize("buffers", [2, 3, 5])
def test_upload_goes_through_the_pinned_buffers_chunk_by_chunk(small_chunks, monkeypatch,
                                                                buffers):
    monkeypatch.setattr(staging, "UPLOAD_BUFFERS", buffers)
    cp, pinned = _cupy()
    X = np.random.default_rng(0).standard_normal((1001, 3)).astype(np.float32)
    got = staging.upload(cp, X)
    np.testing.assert_array_equal(np.asarray(got), X)
    assert len(pinned) == buffers and max(pinned) <= 700  # the buffers, not X's size


@pytest.mark.parametrize("buffers", [2, 3])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32])
def test_download_widens_compact_labels_as_it_copies(small_chunks, monkeypatch, buffers,
                                                     dtype):
    monkeypatch.setattr(staging, "UPLOAD_BUFFERS", buffers)
    cp, pinned = _cupy()
    labels = np.random.default_rng(1).integers(0, 200, 3001).astype(dtype).view(DeviceArray)
    got = staging.download(cp, labels, np.int32)
    assert type(got) is np.ndarray and got.dtype == np.int32
    np.testing.assert_array_equal(got, np.asarray(labels).astype(np.int32))
    assert pinned, "labels of 3001 values (over DOWNLOAD_STAGED_BYTES) are staged"
    small = staging.download(cp, labels[:10], np.int32)  # below the staging size: one copy
    assert small.dtype == np.int32 and np.array_equal(small, np.asarray(labels[:10]))



def test_an_array_of_one_chunk_takes_one_buffer(monkeypatch):
    """X above the staging size but within one chunk is staged through one pinned buffer
    (a second would be allocated for nothing: page-locking costs time on a first fit)."""
    monkeypatch.setattr(staging, "UPLOAD_STAGED_BYTES", 1 << 10)
    monkeypatch.setattr(staging, "UPLOAD_CHUNK_BYTES", 1 << 20)
    cp, pinned = _cupy()
    X = np.random.default_rng(2).standard_normal((1001, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(staging.upload(cp, X)), X)
    assert pinned == [X.nbytes]
