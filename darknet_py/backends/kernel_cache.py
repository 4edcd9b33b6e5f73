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


def included_headers(source, include_dir):
    """[(name, text)] of the headers `source` includes by quotes, and theirs, in the order
    first met; a header not in include_dir is left to nvcc (which reports it)."""
    found, queue = {}, [source]
    while queue:
        for name in _INCLUDE.findall(queue.pop(0)):
            if name in found or include_dir is None:
                continue
            try:
                with open(os.path.join(include_dir, name)) as f:
                    found[name] = f.read()
            except OSError:
                continue
            queue.append(found[name])
    return list(found.items())


def kernel_digest(source, options, include_dir=None):
    """SHA-256 (hex) of what a kernel file's binary is built from, whatever the GPU: its
    text, its nvcc options and the text of every header it includes from include_dir.
    The cache's entry names and the prebuilt kernels' manifest both use it, so a binary
    is never taken for a source it was not built from."""
    h = hashlib.sha256()
    parts = [source, "\0".join(options)]
    for name, text in included_headers(source, include_dir):
        parts += [name, text]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def entry_name(source, options, arch, include_dir=None):
    h = hashlib.sha256()
    for part in (kernel_digest(source, options, include_dir), arch):
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
    if data[:len(_TAG)] != _TAG or data[len(_TAG):head] != hashlib.sha256(cubin).digest():
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
            f"start (put its bin folder on PATH); later starts read {cache_dir()}")


def run_nvcc(name, source, args, include_dir=None, nvcc="nvcc", what=""):
    """nvcc on one kernel file's source with `args` (the output kind and architectures, the
    options); returns the bytes it wrote."""
    require_nvcc(nvcc)
    with tempfile.TemporaryDirectory(prefix="darknet-py-nvcc-") as work:
        src, out = os.path.join(work, name), os.path.join(work, "kernel.bin")
        with open(src, "w") as f:
            f.write(source)
        includes = [f"-I{include_dir}"] if include_dir else []
        done = subprocess.run([nvcc, *args, *includes, "-o", out, src],
                              capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(out):
            raise KernelCompileError(f"nvcc failed on {name}{what} (exit {done.returncode}): "
                                     f"{(done.stderr or done.stdout).strip()}")
        with open(out, "rb") as f:
            return f.read()


def compile_cubin(name, source, options, arch, nvcc="nvcc", include_dir=None):
    """Run nvcc on one kernel file's source; returns the cubin's bytes."""
    return run_nvcc(name, source, ["--cubin", f"-arch={arch}", *options], include_dir, nvcc,
                    f" for {arch}")


def cubins(sources, arch, options=None, nvcc="nvcc", directory=None, include_dir=None):
    """{file name: cubin} for {file name: source}, from the cache where it holds them;
    the others are compiled in parallel and stored. options: {file name: nvcc options}
    for the files that have any; include_dir: where their quoted #includes are."""
    directory = directory or cache_dir()
    options = {name: tuple((options or {}).get(name, ())) for name in sources}
    paths = {name: os.path.join(directory, entry_name(src, options[name], arch, include_dir))
             for name, src in sources.items()}
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
                built = pool.map(lambda n: compile_cubin(n, sources[n], options[n], arch, nvcc,
                                                         include_dir), missing)
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
        os.close(fd)   # which releases the lock
