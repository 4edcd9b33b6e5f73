"""Where the CPU engine keeps the networks it exported: one ONNX model per cfg + weights.

An entry is named by the SHA-256 of what the export is made from: the cfg's text (and any
tree= file it names), the weights file (its real path, size and modification time), how
the weights were loaded (seed, cutoff, transfer), the Darknet flavour and precision, and
the exporter itself (the export package's source, onnx's version), so an edited cfg, a
rewritten weights file or another exporter makes a new entry. Entries are written to a
temporary file and renamed into place (a reader never sees half of one).

The cache lives in $DARKNET_ONNX_CACHE, else $XDG_CACHE_HOME/darknet-py/onnx, else
~/.cache/darknet-py/onnx: never beside the user's files.
"""
import hashlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

_FORMAT = "darknet-py onnx cache v1"


def cache_dir():
    if os.environ.get("DARKNET_ONNX_CACHE"):
        return os.environ["DARKNET_ONNX_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "darknet-py", "onnx")


def _exporter_digest():
    """The export package's source and onnx's version."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        h.update(importlib.metadata.version("onnx").encode())
    except importlib.metadata.PackageNotFoundError:
        pass
    return h.hexdigest()


def entry_key(net, weights, seed=0, cutoff=None, transfer=False):
    """The entry name for `net` as load_network built it from its cfg and `weights`; None
    where it cannot be named (no weights file: random parameters; a cfg not on disk)."""
    if weights is None:
        return None
    try:
        stat = os.stat(weights)
        parts = [_FORMAT, _exporter_digest(), Path(net.path).read_bytes(),
                 os.path.realpath(weights), str(stat.st_size), str(stat.st_mtime_ns)]
        for layer in net.layers:   # a class tree is read from its own file
            hierarchy = getattr(layer, "hierarchy", None)
            if hierarchy is not None:
                parts.append(Path(hierarchy.path).read_bytes())
    except OSError:
        return None
    parts += [net.darknet, net.precision, str(seed), str(cutoff), str(bool(transfer)),
              str(net.input_shape)]
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def entry_path(key):
    return os.path.join(cache_dir(), f"{key}.onnx")


def read_entry(key):
    """The model bytes cached under key, or None."""
    try:
        with open(entry_path(key), "rb") as f:
            return f.read()
    except OSError:
        return None


def write_entry(key, data):
    """Store data under key; returns the path, or None where the cache cannot be written
    (the engine then runs the model from memory and exports again next time)."""
    path = entry_path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".onnx")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return None
    return path
