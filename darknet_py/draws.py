"""The counter-based uniform draw that dropout and [detection]'s training share between the
CPU and the GPU (ops/elementwise/dropout.cu implements the same function); below the layers and
the backends."""

import numpy as np


def uniform_hash(seed, n):
    """n uniform floats in [0, 1) from a 32-bit integer hash of (seed, index).

    Counter-based, so the GPU draws the same numbers without any RNG state
    (ops/elementwise/dropout.cu implements the same function)."""
    v = np.arange(n, dtype=np.uint32) + np.uint32((int(seed) * 0x9E3779B9) & 0xFFFFFFFF)
    v ^= v >> np.uint32(16)
    v *= np.uint32(0x7FEB352D)
    v ^= v >> np.uint32(15)
    v *= np.uint32(0x846CA68B)
    v ^= v >> np.uint32(16)
    return (v >> np.uint32(8)).astype(np.float64) / 16777216.0
