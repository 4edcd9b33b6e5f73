"""Darknet .weights files, read and written byte for byte.

Layout: int32 major, minor, revision; `seen` as uint64 when major*10+minor >= 2
(and both < 1000), else int32; then float32 parameters, layer by layer in
network order, each layer's arrays in the order its params() lists them.
Files with major or minor > 1000 store connected weights transposed.
"""
import os
import struct
import tempfile

import numpy as np


class WeightsError(Exception):
    pass


def _header_layout(major, minor):
    seen_is_64 = (major * 10 + minor) >= 2 and major < 1000 and minor < 1000
    return seen_is_64, (major > 1000 or minor > 1000)


def _layers_upto(net, cutoff):
    n = len(net.layers) if cutoff is None else min(int(cutoff), len(net.layers))
    return [l for l in net.layers[:n] if not l.section.get_int("dontload", 0)]


def _arrays(layer):
    """(name, array) pairs of a layer as the file stores them (dontloadscales drops BN)."""
    params = layer.params()
    if layer.section.get_int("dontloadscales", 0):
        params = [(n, a) for n, a in params if n not in ("scales", "rolling_mean", "rolling_variance")]
    return params


def floats_needed(net, cutoff=None):
    return sum(a.size for l in _layers_upto(net, cutoff) for _, a in _arrays(l))


def read_header(f, path):
    head = f.read(12)
    if len(head) < 12:
        raise WeightsError(f"{path}: not a Darknet weights file ({len(head)} bytes, "
                           f"shorter than the 12-byte header)")
    major, minor, revision = struct.unpack("<3i", head)
    seen_is_64, transpose = _header_layout(major, minor)
    raw = f.read(8 if seen_is_64 else 4)
    seen = struct.unpack("<Q" if seen_is_64 else "<i", raw)[0] if raw else 0
    return (major, minor, revision), seen, transpose, 12 + (8 if seen_is_64 else 4)


def load_weights(net, path, cutoff=None, allow_partial=False):
    """Load parameters into the network's layers [0, cutoff).

    The file must hold exactly the floats those layers need (more is fine when a
    cutoff is given, as with Darknet's `partial`). With allow_partial, a file that
    ends on a layer boundary (a pretrained backbone such as darknet53.conv.74)
    fills the layers it covers and returns how many layers that was."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WeightsError(f"{path}: weights file not found")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header, seen, transpose, offset = read_header(f, path)
        data = np.frombuffer(f.read(), dtype="<f4")
    have = data.size
    if (size - offset) % 4:
        raise WeightsError(f"{path}: {size - offset} bytes after the header is not a whole "
                           f"number of floats")
    layers = _layers_upto(net, cutoff)
    need = floats_needed(net, cutoff)
    if have < need and allow_partial:
        boundary, covered = 0, 0
        for layer in layers:
            nxt = boundary + sum(a.size for _, a in _arrays(layer))
            if nxt > have:
                break
            boundary, covered = nxt, covered + 1
        if boundary != have:
            raise WeightsError(f"{path}: has {have} floats, which does not end on a layer "
                               f"boundary of this network (it needs {need})")
        layers = layers[:covered]
    elif have < need or (have > need and cutoff is None):
        more = "fewer" if have < need else "more"
        raise WeightsError(
            f"{path}: has {have} floats after its header but the network "
            f"{'up to layer ' + str(cutoff) + ' ' if cutoff is not None else ''}needs {need} "
            f"({more} than needed: is this the weights file for this cfg?)")
    pos = 0
    be = net.be
    for layer in layers:
        for name, arr in _arrays(layer):
            values = data[pos:pos + arr.size]
            pos += arr.size
            if transpose and layer.type == "connected" and name == "weights":
                values = values.reshape(layer.inputs, layer.outputs).T
            be.write(arr, values)
    net.params_changed()
    net.seen = int(seen)
    net.weights_header = header
    return len(layers)


def save_weights(net, path, cutoff=None):
    """Write the layers [0, cutoff) atomically, in the header format the network was loaded
    with (so an unchanged network saves the same bytes it loaded)."""
    path = os.fspath(path)
    major, minor, revision = getattr(net, "weights_header", (0, 2, 0))
    seen_is_64, transpose = _header_layout(major, minor)
    chunks = [struct.pack("<3i", major, minor, revision),
              struct.pack("<Q" if seen_is_64 else "<i", int(net.seen))]
    for layer in _layers_upto(net, cutoff):
        for name, arr in _arrays(layer):
            values = net.be.to_host(arr).astype("<f4")
            if transpose and layer.type == "connected" and name == "weights":
                values = values.reshape(layer.outputs, layer.inputs).T.reshape(-1)
            chunks.append(values.tobytes())
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".weights-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
