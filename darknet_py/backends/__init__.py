"""Backends: where a network's arrays live and how its ops run.

Layers never branch on the device; they call the ops of the backend they were
given. ``numpy_backend.NumpyBackend`` is the reference; ``cuda_backend.CudaBackend``
runs the same ops as hand-written CUDA kernels and is imported only when asked for,
so the package works without PyCUDA.
"""

import sys
import threading

from .errors import BackendError, DeviceOutOfMemory, GraphCaptureError  # noqa: F401
from .numpy_backend import NumpyBackend


def cuda_device_count():
    """How many CUDA devices the driver sees; 0 when PyCUDA or the driver is missing."""
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count()
    except Exception:
        return 0


def cuda_available():
    """True when PyCUDA imports and at least one CUDA device is present."""
    return cuda_device_count() > 0


_cpu_notice_given = False
_starting = {}  # CUDA device index -> the thread start_device started for it


def _cuda_index(device):
    """N of "cuda:N" (0 for "cuda", an int N as itself); None for any other device."""
    if isinstance(device, int):
        return device
    device = str(device).lower()
    if device == "cuda":
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    return None


def start_device(device):
    """Start CUDA device `device` ("cuda:N") on a thread of its own: PyCUDA's import, the
    driver and the device's context, its stream and pool, its kernels' binaries (about 1 s,
    1.5-2 s in each of several processes starting at once), while the caller goes on with
    work that needs no device (a data-parallel rank reads its lists and plans its network
    meanwhile). get_backend(device) waits for it. Any other device: nothing. A start that
    fails is made again by get_backend, which raises its error in the caller's thread."""
    index = _cuda_index(device)
    if index is None or index in _starting:
        return

    def start():
        try:
            from .cuda_backend import _KERNELS, _Device

            _Device.start_here(index, _KERNELS)
        except BaseException:  # get_backend makes it again, and says what is wrong
            pass

    _starting[index] = threading.Thread(
        target=start, daemon=True, name=f"darknet-py CUDA start on device {index}"
    )
    _starting[index].start()


def get_backend(device="auto", notice=True):
    """Return a backend for `device`: "cpu", "cuda", "cuda:N", an int N, or "auto"
    (CUDA when PyCUDA and a GPU are present, else NumPy with a one-line notice)."""
    if device is None:
        device = "auto"
    if isinstance(device, int):
        device = f"cuda:{device}"
    device = str(device).lower()
    if device == "cpu":
        return NumpyBackend()
    if device == "auto":
        if cuda_available():
            return get_backend("cuda:0")
        global _cpu_notice_given
        if notice and not _cpu_notice_given:  # once per process, not per network
            print(
                "darknet-py: no CUDA GPU (or PyCUDA) found; running on the CPU (NumPy)",
                file=sys.stderr,
            )
            _cpu_notice_given = True
        return NumpyBackend()
    if device == "cuda" or device.startswith("cuda:"):
        index = 0 if device == "cuda" else device.split(":", 1)[1]
        try:
            index = int(index)
        except ValueError:
            raise BackendError(f"bad device '{device}': expected cuda:N") from None
        if index in _starting:  # start_device's thread: wait for it
            _starting[index].join()
        try:
            from .cuda_backend import CudaBackend
        except ImportError as e:
            raise BackendError(
                f"device '{device}' needs PyCUDA (pip install 'darknet-cfg-runner[cuda]'): {e}"
            ) from None
        # A device that is not there is the user's mistake, not a CUDA failure.
        count = cuda_device_count()
        if not 0 <= index < count:
            raise BackendError(f"no CUDA device {index}: {count} device(s) present")
        return CudaBackend(index)
    raise BackendError(f"unknown device '{device}': use cpu, cuda, cuda:N or auto")
