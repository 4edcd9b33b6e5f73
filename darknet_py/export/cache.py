"""Where the CPU engine keeps the networks it exported: one ONNX model per cfg + weights,
and beside it ONNX Runtime's optimised form of that model.

An entry is named by the SHA-256 of what the export is made from: the cfg's text (and any
tree= file it names), the SHA-256 of the weights file's bytes, how the weights were loaded
(seed, cutoff, transfer), the Darknet flavour and precision, darknet-py's version and the
exporter's source, so an edited cfg, other weights (wherever they lie) or another
exporter makes a new entry, and the same weights copied elsewhere find theirs. An entry
was checked against NumPy when it was written: reading it skips the check.

Hashing a weights file costs about as much as reading it (50 ms for yolov3-tiny's 35 MB),
so its digest is remembered under the file's identity and change times (device, inode,
size, mtime, ctime: any write changes ctime, which no user call sets back) and hashed
again whenever one of them differs.

The optimised model (optimized/<entry>-<runtime>.onnx, its weights in a .data file beside
it) is what ONNX Runtime made of the entry at its highest graph optimisation level; it may
hold kernels for this CPU's vector units, so its name carries ONNX Runtime's version and a
digest of the CPU's model and flags, and another runtime or CPU optimises the entry again.

Files are written to a temporary name and renamed into place (a reader never sees half of
one). The cache lives in $DARKNET_ONNX_CACHE, else $XDG_CACHE_HOME/darknet-py/onnx, else
~/.cache/darknet-py/onnx: never beside the user's files.

The cache is bounded: every new entry (and every entry optimised again) is followed by a
trim, which removes whole entries (the export and its optimised files), those used
longest ago first, until the cache holds at most LIMIT_MB (DARKNET_ONNX_CACHE_MB sets
another bound); the entry in use always stays. A command that reads an entry marks it used
(its file's modification time). Without the bound every new cfg, weights file or
darknet-py version would leave its entry behind for good: on yolov2-tiny an entry with
its optimised form is 300 MB.
"""

import hashlib
import os
import platform
import re
import tempfile
import threading
import time
import warnings
from pathlib import Path

from ..version import __version__
from . import EngineCacheWarning

_FORMAT = "darknet-py onnx cache v2"
# A weights digest is remembered only for a file last changed longer ago than this: a
# write within the same tick of a coarse file-system clock leaves the times unchanged.
_SETTLED_S = 2.0
# An optimised model's weights file older than this, which the model in place does not
# name, is left over from a model replaced since, not one being written now.
_STAGING_S = 600.0
# The cache's default bound (trim): a few networks' entries with their optimised forms.
LIMIT_MB = 4096
LIMIT_VARIABLE = "DARKNET_ONNX_CACHE_MB"
_KEY = re.compile(r"[0-9a-f]{64}")


def cache_dir():
    if os.environ.get("DARKNET_ONNX_CACHE"):
        return os.environ["DARKNET_ONNX_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "darknet-py", "onnx")


def _exporter_digest():
    """darknet-py's version and the export package's source."""
    h = hashlib.sha256(__version__.encode() + b"\0")
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def file_sha256(path):
    """The SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_digest(path):
    """The SHA-256 of the weights file's bytes, remembered under its identity and change
    times (see the module docstring)."""
    stat = os.stat(path)
    identity = "\0".join(
        str(v)
        for v in (
            os.path.realpath(path),
            stat.st_dev,
            stat.st_ino,
            stat.st_size,
            stat.st_mtime_ns,
            stat.st_ctime_ns,
        )
    )
    memo = os.path.join(cache_dir(), "digests", hashlib.sha256(identity.encode()).hexdigest())
    try:
        with open(memo, encoding="ascii") as f:
            digest = f.read()
        if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
            return digest
    except (OSError, UnicodeDecodeError):
        pass
    digest = file_sha256(path)
    if time.time() - max(stat.st_mtime_ns, stat.st_ctime_ns) / 1e9 > _SETTLED_S:
        _write_atomically(memo, digest.encode())
    return digest


def entry_key(net, weights, seed=0, cutoff=None, transfer=False):
    """The entry name for `net` as load_network built it from its cfg and `weights`; None
    where it cannot be named (no weights file: random parameters; a cfg not on disk)."""
    if weights is None:
        return None
    try:
        parts = [_FORMAT, _exporter_digest(), Path(net.path).read_bytes(), weights_digest(weights)]
        for layer in net.layers:  # a class tree is read from its own file
            hierarchy = getattr(layer, "hierarchy", None)
            if hierarchy is not None:
                parts.append(Path(hierarchy.path).read_bytes())
    except OSError:
        return None
    parts += [
        net.darknet,
        net.precision,
        str(seed),
        str(cutoff),
        str(bool(transfer)),
        str(net.input_shape),
    ]
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def entry_path(key):
    return os.path.join(cache_dir(), f"{key}.onnx")


def read_entry(key):
    """The model bytes cached under key (marked used), or None."""
    try:
        with open(entry_path(key), "rb") as f:
            data = f.read()
    except OSError:
        return None
    mark_used(entry_path(key))
    return data


class StagedEntry:
    """An entry's bytes being written to a temporary file on a thread of their own, while
    the export is checked (on yolov3-tiny's engine graph the write's 0.3 s went in the
    check's shadow); keep() puts the file in place once the export passed, discard()
    drops it. Where the cache cannot be written, keep() gives None: the engine then runs
    the model from memory and exports again next time."""

    def __init__(self, key, data):
        self.key = key
        self.path = None  # the temporary file, once made
        self.written = False
        self._thread = threading.Thread(
            target=self._write, args=(data,), name="darknet-py onnx cache", daemon=True
        )
        self._thread.start()

    def _write(self, data):
        try:
            folder = cache_dir()
            os.makedirs(folder, exist_ok=True)
            fd, self.path = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.written = True
        except OSError:  # a full disk, a folder that cannot be written
            pass

    def keep(self):
        """The entry's path, in place; None where it could not be written."""
        self._thread.join()
        if self.written:
            try:
                os.replace(self.path, entry_path(self.key))
                return entry_path(self.key)
            except OSError:
                pass
        self.discard()
        return None

    def discard(self):
        self._thread.join()
        if self.path:
            remove(self.path)


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def mark_used(path):
    """Record that a cache file was just read: the trim removes the entries whose files
    were used longest ago first."""
    try:
        os.utime(path)
    except OSError:
        pass


def limit_bytes():
    """The cache's bound in bytes: DARKNET_ONNX_CACHE_MB, else LIMIT_MB. A value that is
    not a size gets a warning naming it, and the default."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return LIMIT_MB << 20
    try:
        mb = float(text)
        if not mb >= 0 or mb == float("inf"):
            raise ValueError
    except ValueError:
        warnings.warn(
            EngineCacheWarning(
                f"{LIMIT_VARIABLE}={text!r} is not a size in MB; the ONNX cache keeps its "
                f"default bound of {LIMIT_MB} MB"
            ),
            stacklevel=2,
        )
        return LIMIT_MB << 20
    return int(mb * (1 << 20))


def entries():
    """{key: (bytes, last used, paths)} of the cache's entries: each export with its
    optimised models and their weights files (files being written left out)."""
    found = {}
    root = cache_dir()
    for folder in (root, os.path.join(root, "optimized")):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            key = name[:64]
            if not _KEY.fullmatch(key):
                continue  # ".tmp-..." being written, the digests folder
            path = os.path.join(folder, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            size, used, paths = found.get(key, (0, 0.0, ()))
            found[key] = (size + stat.st_size, max(used, stat.st_mtime), paths + (path,))
    return found


def trim(keep):
    """Remove whole entries, those used longest ago first, until the cache is within its
    bound (limit_bytes); never the entry `keep` (the one in use). Returns the keys
    removed."""
    limit = limit_bytes()
    found = entries()
    total = sum(size for size, _, _ in found.values())
    removed = []
    for key, (size, _, paths) in sorted(found.items(), key=lambda item: item[1][1]):
        if total <= limit:
            break
        if key == keep:
            continue
        for path in paths:
            remove(path)  # a file another process has open stays readable to it
        total -= size
        removed.append(key)
    return removed


def _write_atomically(path, data):
    """Write data to path through a temporary file; False where that cannot be done."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            remove(tmp)
            raise
    except OSError:
        return False
    return True


def runtime_tag(runtime_version):
    """ONNX Runtime's version and a digest of this CPU's model and feature flags."""
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    cpu += line
                elif not line.strip():  # the first processor's block is enough
                    break
    except OSError:
        pass
    return f"{runtime_version}-{hashlib.sha256(cpu.encode()).hexdigest()[:16]}"


def optimized_path(key, tag):
    return os.path.join(cache_dir(), "optimized", f"{key}-{tag}.onnx")


def stage_optimized(key, tag):
    """(model path, weights file name) for ONNX Runtime to save an optimised model to before
    the model is checked (keep_optimized puts it in place), or None where the folder cannot
    be written. The weights go to their own file, which ONNX Runtime maps into memory when
    it loads the model (tens of milliseconds where parsing them takes hundreds); its name
    is new each time, so a file a running session maps is never rewritten."""
    folder = os.path.join(cache_dir(), "optimized")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None
    if not os.access(folder, os.W_OK):
        return None
    token = f"{os.getpid()}-{time.time_ns()}"
    return os.path.join(folder, f".tmp-{token}-{key}-{tag}.onnx"), f"{key}-{tag}-{token}.data"


def discard_staged(staged):
    if staged:
        model, weights = staged
        remove(model)
        remove(os.path.join(os.path.dirname(model), weights))


def keep_optimized(staged, key, tag):
    """Rename the staged optimised model into place and drop the entry's older optimised
    files (other runtimes or CPUs, weights files no model names any more); the model's
    path, or None where it was not saved."""
    model, weights = staged
    final = optimized_path(key, tag)
    try:
        os.replace(model, final)
    except OSError:
        discard_staged(staged)
        return None
    now = time.time()
    for other in Path(final).parent.glob(f"{key}-*"):
        if other.name in (os.path.basename(final), weights):
            continue
        try:
            # Another process may be writing a weights file for a model not yet in place.
            if other.suffix == ".onnx" or now - other.stat().st_mtime > _STAGING_S:
                remove(other)
        except OSError:
            pass
    return final
