"""The kernels' cubins, compiled by nvcc and cached on disk by what they are built from.

A kernel file's source is the .cu file with the headers it includes from its folder
(kernels/common.cuh) inlined: read_kernel_source. An entry's name is the SHA-256 of that
source, the nvcc options and the GPU architecture (entry_name; kernel_identity computes it
from a kernel file's path), so a header's change rebuilds every kernel that includes it.
An entry holds a tag line, the SHA-256 of the cubin and the cubin. Entries are written to a
temporary file and renamed into place, so a reader never sees half of one; an entry whose
digest does not match its cubin (a damaged disk, a partial copy) is compiled again and
replaced. Missing entries compile in parallel, one nvcc per file: a first start costs the
slowest file, not the sum. Reading the cache needs no nvcc, and no PyCUDA (this module
runs on the host alone).

The cache lives in $DARKNET_KERNEL_CACHE, else $XDG_CACHE_HOME/darknet-py/kernels, else
~/.cache/darknet-py/kernels. Where it cannot be written, kernels are compiled each start.
"""
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from .errors import BackendError

_TAG = b"darknet-py cubin v1\n"
_DIGEST = 32
# `#include "name"` of a header beside the kernel file (the only includes the kernels use
# besides the toolkit's own <...>, which nvcc resolves itself).
_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[^\n]*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r'^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$', re.MULTILINE)


class KernelCompileError(BackendError):
    """nvcc is missing or failed on a kernel file (the CLI reports it in one line)."""


def cache_dir():
    if os.environ.get("DARKNET_KERNEL_CACHE"):
        return os.environ["DARKNET_KERNEL_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "darknet-py", "kernels")


def read_kernel_source(path, _seen=None):
    """The text a kernel file's cubin is built from: the file with each header it includes
    as `#include "name"` (looked for beside it) inlined, recursively and once each, as the
    C preprocessor would with #pragma once. #line markers keep nvcc's messages naming the
    header's and the file's own lines. The result needs no include path: nvcc compiles it
    from anywhere, and hashing it covers every header."""
    path = os.path.abspath(path)
    seen = set() if _seen is None else _seen
    seen.add(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    name = os.path.basename(path)
    parts, at = [], 0
    for match in _LOCAL_INCLUDE.finditer(text):
        header = os.path.abspath(os.path.join(os.path.dirname(path), match.group(1)))
        parts.append(text[at:match.start()])
        if header not in seen:
            body = _PRAGMA_ONCE.sub("", read_kernel_source(header, seen))  # done here
            parts.append(f'#line 1 "{match.group(1)}"\n' + body.rstrip("\n") + "\n")
        line = text.count("\n", 0, match.end()) + 2
        parts.append(f'#line {line} "{name}"')
        at = match.end()
    parts.append(text[at:])
    return "".join(parts)


def kernel_identity(path, options, arch):
    """The cache entry's name of kernel file `path` compiled with nvcc `options` for
    `arch`: what identifies its cubin (a prebuilt cubin's manifest keys on it too)."""
    return entry_name(read_kernel_source(path), tuple(options), arch)


def entry_name(source, options, arch):
    h = hashlib.sha256()
    for part in (source, "\0".join(options), arch):
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


def compile_cubin(name, source, options, arch, nvcc="nvcc"):
    """Run nvcc on one kernel file's source; returns the cubin's bytes."""
    if shutil.which(nvcc) is None:
        raise KernelCompileError(
            f"nvcc ({nvcc}) not found: the CUDA toolkit's compiler builds the kernels on a first "
            f"start (put its bin folder on PATH); later starts read {cache_dir()}")
    with tempfile.TemporaryDirectory(prefix="darknet-py-nvcc-") as work:
        src, out = os.path.join(work, name), os.path.join(work, "kernel.cubin")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "--cubin", f"-arch={arch}", *options, "-o", out, src]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(out):
            raise KernelCompileError(f"nvcc failed on {name} for {arch} (exit {done.returncode}): "
                                     f"{(done.stderr or done.stdout).strip()}")
        with open(out, "rb") as f:
            return f.read()


def cubins(sources, arch, options=None, nvcc="nvcc", directory=None):
    """{file name: cubin} for {file name: source}, from the cache where it holds them;
    the others are compiled in parallel and stored. options: {file name: nvcc options}
    for the files that have any."""
    directory = directory or cache_dir()
    options = {name: tuple((options or {}).get(name, ())) for name in sources}
    paths = {name: os.path.join(directory, entry_name(src, options[name], arch))
             for name, src in sources.items()}
    found = {name: read_entry(path) for name, path in paths.items()}
    missing = [name for name, cubin in found.items() if cubin is None]
    if missing:
        workers = min(len(missing), os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            built = pool.map(lambda n: compile_cubin(n, sources[n], options[n], arch, nvcc),
                             missing)
            for name, cubin in zip(missing, built):
                found[name] = cubin
                write_entry(paths[name], cubin)
    return found
