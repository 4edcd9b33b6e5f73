"""Backends: where a network's arrays live and how its ops run.

Layers never branch on the device; they call the ops of the backend they were
given. ``numpy_backend.NumpyBackend`` is the reference; ``cuda_backend.CudaBackend``
runs the same ops as hand-written CUDA kernels and is imported only when asked for,
so the package works without PyCUDA.
"""
import sys

from .numpy_backend import NumpyBackend


class BackendError(Exception):
    pass


class DeviceOutOfMemory(Exception):
    """A GPU backend could not allocate requested_bytes while holding allocated_bytes in live
    arrays. Defined here, not in cuda_backend, so callers can catch it without PyCUDA."""

    def __init__(self, requested_bytes, allocated_bytes, free_bytes=None, total_bytes=None):
        self.requested_bytes = int(requested_bytes)
        self.allocated_bytes = int(allocated_bytes)
        self.free_bytes = free_bytes
        self.total_bytes = total_bytes
        msg = (f"out of GPU memory: could not allocate {_mib(self.requested_bytes)} "
               f"with {_mib(self.allocated_bytes)} already allocated by darknet-py")
        if free_bytes is not None and total_bytes is not None:
            msg += f" (device: {_mib(free_bytes)} free of {_mib(total_bytes)})"
        super().__init__(msg)


class GraphCaptureError(Exception):
    """A backend could not record a step as a graph (it waits on the device, say); the
    step has not run, and running it eagerly is the fallback."""


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


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
        if notice and not _cpu_notice_given:   # once per process, not per network
            # NumPy stays the default on the CPU (Darknet's exact arithmetic); ONNX Runtime,
            # when installed, is offered, not picked (docs/onnx.md).
            import importlib.util
            faster = ("; inference runs faster with --engine onnxruntime" if
                      importlib.util.find_spec("onnxruntime") is not None else "")
            print(f"darknet-py: no CUDA GPU (or PyCUDA) found; running on the CPU "
                  f"(NumPy){faster}", file=sys.stderr)
            _cpu_notice_given = True
        return NumpyBackend()
    if device == "cuda" or device.startswith("cuda:"):
        index = 0 if device == "cuda" else device.split(":", 1)[1]
        try:
            index = int(index)
        except ValueError:
            raise BackendError(f"bad device '{device}': expected cuda:N") from None
        try:
            from .cuda_backend import CudaBackend
        except ImportError as e:
            raise BackendError(f"device '{device}' needs PyCUDA "
                               f"(pip install 'darknet-cfg-runner[cuda]'): {e}") from None
        # A device that is not there is the user's mistake, not a CUDA failure.
        count = cuda_device_count()
        if not 0 <= index < count:
            raise BackendError(f"no CUDA device {index}: {count} device(s) present")
        return CudaBackend(index)
    raise BackendError(f"unknown device '{device}': use cpu, cuda, cuda:N or auto")
