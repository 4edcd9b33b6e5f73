"""The NumPy backend's CPU thread scheduling: how many threads to use now (the cores other
processes leave free), splitting element-wise work over them (`parallel`; NumPy releases
the GIL inside its loops) and capping BLAS's threads around a GEMM (`blas_threads`)."""

import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# The least work (in floats) worth handing to another thread: below it, the hand-over
# (tens of microseconds) costs more than it saves.
GRAIN_FLOATS = 1 << 17
_PARTS_PER_THREAD = 4
_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
_pool = None


def parallel(count, work, grain):
    """work(start, stop) over [0, count) in contiguous parts of at least `grain` items,
    a few per core. The calling thread and the pool's threads claim parts until none is
    left, and the caller returns once every part is done: a pool thread the OS has not
    scheduled yet (a loaded machine) finds nothing left instead of being waited for.
    The parts follow the machine's core count, not the load (threads_now): a part's
    bounds can decide its values' last bits (NumPy's vector loops treat a run's tail
    elements apart), so the same work splits the same way however busy the machine is."""
    global _pool
    parts = max(1, min(_PARTS_PER_THREAD * _THREADS, count // max(1, grain)))
    bounds = [count * i // parts for i in range(parts + 1)]
    threads = threads_now()
    if parts == 1 or threads <= 1:
        for i in range(parts):
            work(bounds[i], bounds[i + 1])
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(_THREADS - 1, thread_name_prefix="darknet-py")
    claims = itertools.count()  # next() on it is atomic under the GIL
    finished, errors = [], []
    all_done = threading.Event()

    def drain():
        try:
            while (i := next(claims)) < parts:
                work(bounds[i], bounds[i + 1])
                finished.append(i)
                if len(finished) == parts:
                    all_done.set()
        except BaseException as e:  # re-raised on the calling thread
            errors.append(e)
            all_done.set()

    for _ in range(min(threads - 1, parts - 1)):
        _pool.submit(drain)
    drain()
    all_done.wait()
    if errors:
        raise errors[0]


def threads_now():
    """How many threads to use now: every core, less those other processes keep busy at
    this moment (runnable tasks in /proc/loadavg, not counting this process's own). On an
    oversubscribed machine every multi-threaded BLAS call and pool hand-over waits for a
    thread the OS has descheduled: yolov3-tiny at load 10 on 2 cores took 425-575 ms with
    2 threads against 122-126 ms with one. Re-read at most every _RECHECK_S;
    DARKNET_CPU_THREADS fixes the count."""
    global _threads_checked, _threads_cached, _others_before
    if _FIXED_THREADS:
        return _FIXED_THREADS
    now = time.monotonic()
    if now - _threads_checked < _RECHECK_S:
        return _threads_cached
    _threads_checked = now
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        own = 0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/stat") as f:
                own += f.read().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, ValueError, IndexError):  # not Linux: use every core
        running, own = 0, 0
    others = max(0, running - own)
    # The smaller of the last two readings: a task that runs for a moment is not load.
    _threads_cached = max(1, min(_THREADS, _THREADS - min(others, _others_before)))
    _others_before = others
    return _threads_cached


def _openblas_local_threads():
    """NumPy's bundled OpenBLAS's per-thread thread-count setter, or None (another BLAS,
    or an OpenBLAS without it: then it keeps its own count)."""
    import ctypes
    import glob

    libs = glob.glob(
        os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*")
    )
    try:
        setter = ctypes.CDLL(libs[0]).openblas_set_num_threads_local
    except (IndexError, OSError, AttributeError):
        return None
    setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
    return setter


class blas_threads:
    """Runs the block with BLAS limited to n threads (never raised above what it had), and
    leaves it as it was. The limit is this thread's where OpenBLAS keeps a count per thread
    (OpenMP builds) and the whole process's where it keeps one (pthreads builds: NumPy's
    wheels), so a block that hands BLAS work to other threads holds it until they finish."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.previous = None
        if _SET_BLAS_THREADS:
            previous = _SET_BLAS_THREADS(self.n)
            if previous <= self.n:
                _SET_BLAS_THREADS(previous)
            else:
                self.previous = previous

    def __exit__(self, *exc):
        if self.previous is not None:
            _SET_BLAS_THREADS(self.previous)


_RECHECK_S = 0.05
_FIXED_THREADS = int(os.environ.get("DARKNET_CPU_THREADS", "0") or 0)
_threads_checked, _threads_cached = float("-inf"), _THREADS
_others_before = 0
_SET_BLAS_THREADS = _openblas_local_threads()
