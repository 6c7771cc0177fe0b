"""X on the host seen mean-centered, without a centered copy: the fit of a memory-mapped X
(numpy backend) or of a host X streamed through a GPU (the CuPy backends) reads X chunk by
chunk and centers each chunk where it computes, so X is held once and never written."""
from __future__ import annotations

import mmap

import numpy as np


class HostRows:
    """X seen mean-centered (X - mean), without a centered copy of X.

    Row selections (`X[rows]`, `X[rows, ...]`, `X[rows, :]`, `np.take(X, idx, axis=0)`) give
    centered NumPy arrays, as `X - mean` would, row for row and bit for bit; `np.asarray`
    makes the full centered copy (transform does, its output is n x k anyway). Backends read
    `data` and `mean` and center each chunk themselves (`center_rows` on the host)."""

    ndim = 2
    device = "cpu"

    def __init__(self, data, mean):
        self.data = data
        self.mean = self._asarray(mean, dtype=data.dtype)
        self.shape = data.shape
        self.dtype = data.dtype

    _asarray = staticmethod(np.asarray)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        return self.data[row_key(key, self)] - self.mean

    def take(self, indices, axis=None, out=None, mode="raise"):
        if axis != 0 or out is not None:
            raise TypeError(f"{type(self).__name__}.take gathers rows: axis=0, no out")
        return self._gather(indices, mode) - self.mean

    def _gather(self, indices, mode):
        return np.take(self.data, indices, axis=0, mode=mode)

    def __array__(self, dtype=None, copy=None):
        centered = np.subtract(self.data, self.mean)
        return centered if dtype is None else centered.astype(dtype, copy=False)

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype})"


def center_rows(data, mean, start, stop, out):
    """Rows [start, stop) of X - mean written into `out`: bit for bit the rows of the
    centered copy (mean None: the rows as they are)."""
    if mean is None:
        np.copyto(out, data[start:stop])
    else:
        np.subtract(data[start:stop], mean, out=out)
    return out


def is_memmap(X) -> bool:
    """Whether X's memory is a mapped file (np.memmap or a view of an mmap)."""
    a = X
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


def row_key(key, owner):
    """The rows `key` selects (`X[rows]`, `X[rows, ...]` or `X[rows, :]`), for the row views
    here and in `contract.sparse`: they select whole rows only."""
    if isinstance(key, tuple):
        if len(key) == 2 and (key[1] is Ellipsis or key[1] == slice(None)):
            return key[0]
        raise TypeError(f"{type(owner).__name__} selects whole rows, not {key!r}")
    return key
