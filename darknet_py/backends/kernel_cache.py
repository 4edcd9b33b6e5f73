"""The kernels' cubins, compiled by nvcc and cached on disk by what they are built from.

An entry's name is the SHA-256 of kernel_digest (the source, the nvcc options and every
header the source includes) and the GPU architecture; the wheel's prebuilt kernels
(prebuilt.py) are matched to their sources by the same kernel_digest. An entry holds a
tag line, the SHA-256 of the cubin and the cubin. Entries are written to a temporary file
and renamed into place, so a reader never sees half of one; an entry whose digest does
not match its cubin (a damaged disk, a partial copy) is compiled again and replaced.
Missing entries compile in parallel, one nvcc per file: a first start costs the slowest
file, not the sum. Reading the cache needs no nvcc, and no PyCUDA (this module
runs on the host alone).

The cache lives in $DARKNET_KERNEL_CACHE, else $XDG_CACHE_HOME/darknet-py/kernels, else
~/.cache/darknet-py/kernels. Where it cannot be written, kernels are compiled each start.
"""

import concurrent.futures
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from .errors import BackendError

# nvcc options of a kernel file beyond the default (part of its digest). The yolo loss
# follows the NumPy reference's float32 operation by operation (its thresholds pick
# branches), so nothing is fused.
KERNEL_OPTIONS = {"yolo_loss.cu": ("--fmad=false",)}

_TAG = b"darknet-py cubin v1\n"
_DIGEST = 32


class KernelCompileError(BackendError):
    """nvcc is missing or failed on a kernel file (the CLI reports it in one line)."""


def cache_dir():
    if os.environ.get("DARKNET_KERNEL_CACHE"):
        return os.environ["DARKNET_KERNEL_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "darknet-py", "kernels")


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def included_headers(source, include_dirs=()):
    """[(name, text)] of the headers `source` includes by quotes, and theirs, in the order
    first met, each from the first of include_dirs that holds it; a header in none of them
    is left to nvcc (which reports it)."""
    found, queue = {}, [source]
    while queue:
        for name in _INCLUDE.findall(queue.pop(0)):
            if name not in found:
                text = _header_text(name, include_dirs)
                if text is not None:
                    found[name] = text
                    queue.append(text)
    return list(found.items())


def _header_text(name, include_dirs):
    """The text of header `name` from the first folder of include_dirs that holds it."""
    for folder in include_dirs:
        try:
            with open(os.path.join(folder, name)) as f:
                return f.read()
        except OSError:
            continue
    return None


def kernel_digest(source, options, include_dirs=()):
    """SHA-256 (hex) of what a kernel file's binary is built from, whatever the GPU: its
    text, its nvcc options and the text of every header it includes from include_dirs
    (by the name it includes, not the folder, so moving a header keeps its digest).
    The cache's entry names and the prebuilt kernels' manifest both use it, so a binary
    is never taken for a source it was not built from."""
    h = hashlib.sha256()
    parts = [source, "\0".join(options)]
    for name, text in included_headers(source, include_dirs):
        parts += [name, text]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def entry_name(source, options, arch, include_dirs=()):
    h = hashlib.sha256()
    for part in (kernel_digest(source, options, include_dirs), arch):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest() + ".cubin"


def read_entry(path):
    """The cubin of a cache entry; None when it is missing or damaged."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(_TAG) + _DIGEST
    cubin = data[head:]
    if data[: len(_TAG)] != _TAG or data[len(_TAG) : head] != hashlib.sha256(cubin).digest():
        return None
    return cubin


def write_entry(path, cubin):
    """Store a cubin atomically; False where the cache directory cannot be written."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".cubin")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_TAG + hashlib.sha256(cubin).digest() + cubin)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def require_nvcc(nvcc):
    if shutil.which(nvcc) is None:
        raise KernelCompileError(
            f"nvcc ({nvcc}) not found: the CUDA toolkit's compiler builds the kernels on a first "
            f"start (put its bin folder on PATH); later starts read {cache_dir()}"
        )


def run_nvcc(name, source, args, include_dirs=(), nvcc="nvcc", what=""):
    """nvcc on one kernel file's source with `args` (the output kind and architectures, the
    options); returns the bytes it wrote."""
    require_nvcc(nvcc)
    with tempfile.TemporaryDirectory(prefix="darknet-py-nvcc-") as work:
        src, out = os.path.join(work, name), os.path.join(work, "kernel.bin")
        with open(src, "w") as f:
            f.write(source)
        includes = [f"-I{folder}" for folder in include_dirs]
        done = subprocess.run(
            [nvcc, *args, *includes, "-o", out, src], capture_output=True, text=True
        )
        if done.returncode != 0 or not os.path.exists(out):
            raise KernelCompileError(
                f"nvcc failed on {name}{what} (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}"
            )
        with open(out, "rb") as f:
            return f.read()


def compile_cubin(name, source, options, arch, nvcc="nvcc", include_dirs=()):
    """Run nvcc on one kernel file's source; returns the cubin's bytes."""
    return run_nvcc(
        name, source, ["--cubin", f"-arch={arch}", *options], include_dirs, nvcc, f" for {arch}"
    )


def cubins(sources, arch, options=None, nvcc="nvcc", directory=None, include_dirs=()):
    """{file name: cubin} for {file name: source}, from the cache where it holds them;
    the others are compiled in parallel and stored. options: {file name: nvcc options}
    for the files that have any; include_dirs: the folders their quoted #includes are in."""
    directory = directory or cache_dir()
    options = {name: tuple((options or {}).get(name, ())) for name in sources}
    paths = {
        name: os.path.join(directory, entry_name(src, options[name], arch, include_dirs))
        for name, src in sources.items()
    }
    found = {name: read_entry(path) for name, path in paths.items()}
    if all(cubin is not None for cubin in found.values()):
        return found
    with compiling(directory):
        # Another process (a rank of the same machine) may have stored them meanwhile.
        found.update({name: read_entry(paths[name]) for name, c in found.items() if c is None})
        missing = [name for name, cubin in found.items() if cubin is None]
        if missing:
            workers = min(len(missing), os.cpu_count() or 1)
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                built = pool.map(
                    lambda n: compile_cubin(n, sources[n], options[n], arch, nvcc, include_dirs),
                    missing,
                )
                for name, cubin in zip(missing, built):
                    found[name] = cubin
                    write_entry(paths[name], cubin)
    return found


@contextlib.contextmanager
def compiling(directory):
    """One process at a time compiles into `directory` (an exclusive flock on it): the
    ranks of a machine starting together with a cold cache compile each kernel once, the
    others wait and read what it stored. Where the directory cannot be made or locked
    (not on Linux, an unwritable cache, a filesystem without locks), no lock."""
    try:
        import fcntl

        os.makedirs(directory, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # which releases the lock
