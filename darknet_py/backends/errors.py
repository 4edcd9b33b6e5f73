"""The backends' exceptions, in a module of their own so that the backends (imported by
the package lazily) and their callers share them without importing each other, and
without PyCUDA."""

from ..errors import DarknetError


class BackendError(DarknetError):
    """A device that is not there, or a backend that cannot run here (no PyCUDA, no nvcc)."""


class DeviceOutOfMemory(Exception):
    """A GPU backend could not allocate requested_bytes while holding allocated_bytes in live
    arrays. Defined here, not in cuda_backend, so callers can catch it without PyCUDA."""

    def __init__(self, requested_bytes, allocated_bytes, free_bytes=None, total_bytes=None):
        self.requested_bytes = int(requested_bytes)
        self.allocated_bytes = int(allocated_bytes)
        self.free_bytes = free_bytes
        self.total_bytes = total_bytes
        msg = (
            f"out of GPU memory: could not allocate {_mib(self.requested_bytes)} "
            f"with {_mib(self.allocated_bytes)} already allocated by darknet-py"
        )
        if free_bytes is not None and total_bytes is not None:
            msg += f" (device: {_mib(free_bytes)} free of {_mib(total_bytes)})"
        super().__init__(msg)


class GraphCaptureError(Exception):
    """A backend could not record a step as a graph (it waits on the device, say); the
    step has not run, and running it eagerly is the fallback."""


def _mib(n):
    return f"{n / 2**20:.1f} MiB"
