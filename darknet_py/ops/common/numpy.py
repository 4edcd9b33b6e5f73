"""Helpers the NumPy references of several op families share: one_storage (the storage a
set of arrays share, both backends' check), matrix (a strided 2-D view of a flat array) and
scratch (a thread's reusable buffer)."""

import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import precision as precisions


def one_storage(op, storage_of, allowed=None, **arrays):
    """The storage (storage_of: fp32, fp16, bf16) that the named arrays share, None ones
    skipped: a 16-bit array mixes only with arrays of its own storage (issue 26), so a mix
    raises a ValueError naming op and each array's storage. allowed: the storages op takes
    (None: any); another raises a TypeError naming op and the array's storage. Both
    backends call it with their storage_of."""
    kept = {name: storage_of(a) for name, a in arrays.items() if a is not None}
    storages = set(kept.values())
    mixed = len(storages) > 1
    storage = precisions.DEFAULT if mixed or not storages else next(iter(storages))
    if not mixed and (allowed is None or storage in allowed):
        return storage  # the common case: no message to build
    named = ", ".join(f"{name} kept at {stored}" for name, stored in kept.items())
    if mixed:
        raise ValueError(f"{op}: {named}: a 16-bit array mixes only with arrays of its own storage")
    raise TypeError(f"{op}: {named}: takes {' or '.join(allowed)} arrays only")


# Floats per block of activate/bias_activate: the passes over a block stay in L2 cache.
BLOCK_FLOATS = 1 << 16
_local = threading.local()


def scratch(n, dtype):
    """This thread's reusable buffer of n elements (grows, never shrinks)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < n or buf.dtype != dtype:
        buf = _local.buf = np.empty(max(n, BLOCK_FLOATS), dtype=dtype)
    return buf[:n]


def matrix(flat, offset, rows, cols, ld):
    """A (rows x cols) strided view of a flat array, row stride `ld` elements."""
    if rows == 0 or cols == 0:
        return flat[offset:offset].reshape(rows, cols)
    need = offset + (rows - 1) * ld + cols
    if need > flat.size:
        raise ValueError(
            f"matrix view {rows}x{cols} (ld {ld}) at {offset} exceeds array of {flat.size}"
        )
    base = flat[offset:]
    return as_strided(base, (rows, cols), (ld * flat.itemsize, flat.itemsize))
