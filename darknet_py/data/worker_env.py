"""Preloaded by the data loader's worker server (multiprocessing's forkserver) alone, never
imported elsewhere: it makes the math libraries single-threaded in the server, so that
every worker forked from it is from its first instruction (the workers are the
parallelism). A worker re-imports the training process's main script before it runs any
loader code, and a script that imports OpenCV would otherwise load OpenCV's bundled
OpenBLAS there with a thread for every CPU but one; NumPy's OpenBLAS, loaded in the server
already, would start as many at a worker's first matrix product (loader._work sets the
variables too, for a server something else started)."""

import ctypes
import os

from .loader import WORKER_THREAD_VARIABLES

# OpenBLAS's setters, by the names its builds export (NumPy's wheels: scipy_openblas64_).
_OPENBLAS_SETTERS = (
    "openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
    "openblas_set_num_threads64_",
)


def _loaded_openblas():
    """Paths of the OpenBLAS libraries this process has loaded (Linux; elsewhere none)."""
    try:
        with open("/proc/self/maps") as f:
            fields = [line.split() for line in f]
    except OSError:
        return []
    return sorted({f[-1] for f in fields if len(f) > 5 and "openblas" in f[-1].lower()})


def single_threaded():
    """One thread for the libraries this process loads from now on (their variables) and
    for the OpenBLAS builds it has loaded already (their setters)."""
    os.environ.update(dict.fromkeys(WORKER_THREAD_VARIABLES, "1"))  # libraries yet to load
    for path in _loaded_openblas():
        try:
            library = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
        except OSError:
            continue
        setter = next((getattr(library, n) for n in _OPENBLAS_SETTERS if hasattr(library, n)), None)
        if setter is not None:
            setter(1)


single_threaded()
