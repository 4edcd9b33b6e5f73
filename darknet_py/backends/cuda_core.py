"""The CUDA backend's core: the device (context, stream, pool, loaded kernels), arrays and
their allocation, kernel launches and their errors, synchronisation, host<->device copies
(synchronous, asynchronous on the copy stream, page-locked) and graph capture.

CudaCore is one of the mixins CudaBackend (cuda_backend.py) is composed of; each op
family's mixin names the kernel files it launches from (KERNEL_FILES) beside its launchers,
and cuda_backend.py reads their entry points and argument formats from the files
(kernel_signatures) for _Device.
"""

import atexit
import collections.abc
import ctypes
import threading

import numpy as np
import pycuda.driver as drv
from pycuda.tools import DeviceMemoryPool

from .. import precision as precisions
from ..processes import trace_start
from . import cuda_graph, cuda_transfer, kernel_cache, kernel_signatures, prebuilt
from .errors import DeviceOutOfMemory, GraphCaptureError
from .pinning import unpin_nothing

_KERNEL_OPTIONS = kernel_cache.KERNEL_OPTIONS

_BLOCK = 256
_MAX_GRID_Y = 65535


class _EventTimer:
    """start() and stop() record events on the stream; stop() waits for the second and
    returns the GPU time between them in seconds."""

    def __init__(self, stream):
        self.stream = stream
        self._start, self._stop = drv.Event(), drv.Event()

    def start(self):
        self._start.record(self.stream)

    def stop(self):
        self._stop.record(self.stream)
        self._stop.synchronize()
        return self._stop.time_since(self._start) / 1e3


class _Upload:
    """An upload_async in flight: the event recorded after its copy, and the host array
    it reads (kept alive until the copy is done)."""

    __slots__ = ("landed", "host")

    def __init__(self, landed, host):
        self.landed, self.host = landed, host


class CudaError(RuntimeError):
    """A CUDA error, with the kernel launch (name, grid, block) it is attributed to."""


def _ceil_div(a, b):
    return -(-a // b)


def start_driver(index):
    """cuInit and device `index`'s primary context through ctypes, which lets go of Python's
    lock during each call: the driver's slowest start calls (cuInit ~0.8 s alone, 1.3 s in
    each of 4 processes starting at once) no longer stop the caller's other threads.
    PyCUDA's own init and retain_primary_context then find both done. The context keeps
    this retain until the process ends. Errors are left to PyCUDA's calls, which follow
    and name them."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    if lib.cuInit(0) != 0:
        return
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if lib.cuDeviceGet(ctypes.byref(device), int(index)) == 0:
        lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)


class _KernelTable(collections.abc.Mapping):
    """{entry point: prepared function} of one device, a file's module loaded when one of
    its entry points is first asked for (its functions as they are): the device's start
    loads none, and a run loads only the files it launches (an fp32 run none of the 16-bit
    ones). The binaries themselves are all found (prebuilt, cached, or compiled together,
    in parallel) when the device starts."""

    def __init__(self, kernels, binaries, arch, compiled):
        self._file_of = {
            name: filename for filename, entries in kernels.items() for name in entries
        }
        self._format = {name: fmt for entries in kernels.values() for name, fmt in entries.items()}
        self._binaries, self._arch, self._compiled = binaries, arch, compiled
        self.modules = {}  # file name -> loaded module
        self._functions = {}

    def __getitem__(self, name):
        fn = self._functions.get(name)
        if fn is None:
            filename = self._file_of[name]  # KeyError: no such kernel
            fn = self._module(filename).get_function(name)
            fn.prepare(kernel_signatures.pycuda_format(name, self._format[name]))
            self._functions[name] = fn
        return fn

    def __contains__(self, name):
        return name in self._file_of

    def __iter__(self):
        return iter(self._file_of)

    def __len__(self):
        return len(self._file_of)

    def _module(self, filename):
        module = self.modules.get(filename)
        if module is None:
            try:
                module = drv.module_from_buffer(self._binaries[filename])
            except drv.Error as e:
                where = (
                    kernel_cache.cache_dir()
                    if filename in self._compiled
                    else prebuilt.PREBUILT_DIR
                )
                raise CudaError(
                    f"the driver cannot load the binary of {filename} for "
                    f"{self._arch} (from {where}): {e}"
                ) from e
            self.modules[filename] = module
        return module


class _PinnedRange:
    """pin()'s handle on a page-locked range: calling it unpins the range; so does dropping
    it, before the memory it holds can be freed. (A freed range left registered would be
    taken for page-locked memory by a later array at its address: copies from it failed
    with "invalid argument", or read the old pages.)"""

    def __init__(self, dev, host, pointer):
        self._dev, self._host, self._pointer = dev, host, pointer  # _host: kept mapped

    def __call__(self):
        if self._host is None:
            return
        self._dev.pinned.pop(self._pointer, None)
        try:
            cuda_graph.unregister_host(self._pointer)
        except Exception:  # the context is gone (at exit), and the registration with it
            pass
        self._host = None

    def __del__(self):
        self()


class _Device:
    """Per-process state of one GPU: primary context, stream, pool, compiled kernels.

    Shared by every CudaBackend on that device, so kernels compile once per process. Its
    context is made current on each thread that gets it."""

    _by_index = {}
    _making = threading.Lock()  # one thread makes a device; others (a communicator's) wait

    @classmethod
    def get(cls, index, kernels):
        with cls._making:
            dev = cls._by_index.get(index)
            if dev is None:
                dev = cls._by_index[index] = cls(index, kernels)
        dev.make_current()
        return dev

    @classmethod
    def start_here(cls, index, kernels):
        """Make the device on this thread (backends.start_device's), leaving its context
        current nowhere: PyCUDA aborts the process when a thread ends with a context on its
        stack. The thread that uses the device pushes it (get)."""
        try:
            cls.get(index, kernels).leave_thread()
        except BaseException:
            while drv.Context.get_current() is not None:  # a start that failed half-way
                drv.Context.pop()
            raise

    def __init__(self, index, kernels):
        trace_start(f"CUDA start on device {index}")
        start_driver(index)
        drv.init()
        count = drv.Device.count()
        if not 0 <= index < count:
            raise CudaError(f"no CUDA device {index}: {count} device(s) present")
        self.index = index
        self.device = drv.Device(index)
        self._here = threading.local()  # .current: the context pushed on that thread
        self.context = self.device.retain_primary_context()
        self.context.push()
        self._here.current = True
        trace_start(f"CUDA context of device {index} current")
        self.closed = False
        atexit.register(self.close)
        self.stream = drv.Stream()
        self.pool = DeviceMemoryPool()
        self.transfers = cuda_transfer.PinnedTransfers(self.stream)  # large copies
        self.pinned = {}  # host address -> bytes: the ranges pin() page-locked
        self.sm_count = self.device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        self.total_bytes = self.device.total_memory()
        self.peak_allocated_bytes = 0
        sources, paths = {}, prebuilt.kernel_paths()
        for filename in kernels:  # their headers: found by nvcc -I, hashed by kernel_digest
            with open(paths[filename]) as f:
                sources[filename] = f.read()
        arch = "sm_%d%d" % self.device.compute_capability()
        # The wheel's prebuilt binaries where they match; nvcc (cached) for the rest.
        binaries, self.compiled = prebuilt.binaries(
            sources, arch, _KERNEL_OPTIONS, include_dirs=prebuilt.KERNEL_DIRS
        )
        self.functions = _KernelTable(kernels, binaries, arch, self.compiled)
        trace_start(f"kernels of device {index} found (loaded on first use)")

    def make_current(self):
        """Push the context on the calling thread, once per thread."""
        if not getattr(self._here, "current", False):
            self.context.push()
            self._here.current = True

    def leave_thread(self):
        """Pop the context from the calling thread's stack, where make_current pushed it."""
        if getattr(self._here, "current", False):
            self.context.pop()
            self._here.current = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.make_current()  # at exit: the main thread may never have used the device
            self.stream.synchronize()
            self.pool.stop_holding()
            self.transfers.close()  # page-locked buffers go while their context lives
            self.__dict__.pop("geometry_slots", None)  # ops/images/cuda.py's, page-locked too
        except drv.Error:
            pass
        self.leave_thread()
        from pycuda.tools import clear_context_caches

        clear_context_caches()


def _end_failed_capture(handle):
    """Close a capture that fn broke off, dropping whatever it recorded."""
    try:
        cuda_graph.destroy(None, cuda_graph.end_capture(handle))
    except cuda_graph.GraphError:
        pass  # the capture was invalidated: ending it was all that was left to do


class _Graph:
    """An instantiated CUDA graph: each call replays it on the backend's stream."""

    def __init__(self, backend, graph, graph_exec, keep):
        self._backend, self._graph, self._exec, self._keep = backend, graph, graph_exec, keep

    def __call__(self):
        try:
            cuda_graph.launch(self._exec, self._backend.stream.handle)
        except cuda_graph.GraphError as e:
            raise CudaError(f"replaying a captured step: {e}") from e

    def close(self):
        """Free the graph now (it is also freed when garbage-collected)."""
        if self._exec is None or self._backend._dev.closed:
            return
        graph_exec, graph, self._exec, self._graph = self._exec, self._graph, None, None
        cuda_graph.destroy(graph_exec, graph)
        self._keep = None

    def __del__(self):
        try:
            self.close()
        except cuda_graph.GraphError:
            pass  # at interpreter exit the context may be gone: the driver frees it then


class DeviceArray:
    """A 1-D run of device memory: a pointer, a length and a dtype, holding the pool
    allocation it lies in (freed when its last view goes). Slicing ``a[i:j]`` makes a
    view in one small object; PyCUDA's general GPUArray indexing cost about 20 us a
    slice, paid for every view of every layer on each forward."""

    __slots__ = ("ptr", "size", "dtype", "base")
    ndim = 1

    def __init__(self, ptr, size, dtype, base):
        self.ptr, self.size, self.dtype, self.base = ptr, size, dtype, base

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def shape(self):
        return (self.size,)

    def __len__(self):
        return self.size

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise TypeError("CUDA backend arrays take only flat slices a[i:j]")
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("CUDA backend array slices must be contiguous (step 1)")
        n = max(0, stop - start)
        return DeviceArray(
            self.ptr + start * self.dtype.itemsize if n else 0, n, self.dtype, self.base
        )

    def __repr__(self):
        return f"DeviceArray({self.size} x {self.dtype}, at 0x{self.ptr:x})"


class CudaCore:
    """Arrays, launches, synchronisation and copies; CudaBackend.__init__ sets the state."""

    # ---- infrastructure ------------------------------------------------------
    def leave_thread(self):
        """Pop the device's context from the calling thread, where getting this backend
        pushed it: a thread other than the main one does this before it ends."""
        self._dev.leave_thread()

    @property
    def context(self):
        """The device's primary CUDA context (PyCUDA's): another thread that works on this
        device (NCCL starting) pushes it."""
        return self._dev.context

    @property
    def allocated_bytes(self):
        """Bytes held by live arrays (the pool's active bytes)."""
        return int(self.pool.active_bytes)

    @property
    def reserved_bytes(self):
        """Bytes the pool holds from the driver (live arrays plus cached free blocks)."""
        return int(self.pool.managed_bytes)

    @property
    def peak_allocated_bytes(self):
        return self._dev.peak_allocated_bytes

    def reset_peak_allocated(self):
        """Start peak_allocated_bytes again from the bytes live now (one part of a run)."""
        self._dev.peak_allocated_bytes = self.allocated_bytes

    def _out_of_memory(self, nbytes):
        try:
            free, total = drv.mem_get_info()
        except drv.Error:
            free, total = None, self._dev.total_bytes
        return DeviceOutOfMemory(nbytes, self.allocated_bytes, free, total)

    def _allocate(self, nbytes):
        if nbytes > self._dev.total_bytes:
            # Fail at once: the pool and driver take seconds to refuse the impossible.
            raise self._out_of_memory(nbytes)
        try:
            block = self.pool.allocate(nbytes)
        except drv.MemoryError:
            # Cached free blocks of other sizes may be what is missing.
            self.pool.free_held()
            try:
                block = self.pool.allocate(nbytes)
            except drv.MemoryError:
                raise self._out_of_memory(nbytes) from None
        active = self.allocated_bytes
        if active > self._dev.peak_allocated_bytes:
            self._dev.peak_allocated_bytes = active
        return block

    def _new(self, n, dtype=np.float32):
        n = int(n)
        if n < 0:
            raise ValueError(f"negative array size {n}")
        dtype = np.dtype(dtype)
        if n == 0:
            return DeviceArray(0, 0, dtype, None)
        block = self._allocate(n * dtype.itemsize)
        if self._capture_keep is not None:
            self._capture_keep.append(block)
        return DeviceArray(int(block), n, dtype, block)

    def _scratch_buffer(self, key, nbytes):
        """A reusable device buffer of at least nbytes (grows, never shrinks)."""
        buf = self._scratch.get(key)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None and self._capture_keep is not None:
                self._capture_keep.append(buf)
            buf = self._scratch[key] = self._new(max(1, (nbytes + 7) // 8), np.float64)
        return buf

    @staticmethod
    def _ptr(a):
        if not isinstance(a, DeviceArray):
            raise TypeError(f"expected a CUDA backend array, got {type(a).__name__}")
        return a.ptr

    def _launch(self, name, grid, block, *args):
        grid = (*map(int, grid), 1, 1)[:3]  # sizes may arrive as NumPy integers
        block = (*map(int, block), 1, 1)[:3]
        if min(grid) <= 0:
            return  # nothing to do (an empty array)
        try:
            self._fn[name].prepared_async_call(grid, block, self.stream, *args)
        except drv.Error as e:
            raise CudaError(
                f"CUDA error launching kernel {name} with grid={grid} block={block}: {e}"
                + self._recent_launches()
            ) from e
        self._launched(name, grid, block)

    def _launched(self, name, grid, block, error=CudaError):
        """Note a launch for error messages; with sync_each_launch, wait for it and raise
        `error` naming the kernel if it failed."""
        self._recent.append((name, grid, block))  # formatted only if an error is reported
        if self.sync_each_launch:
            try:
                self.stream.synchronize()
            except drv.Error as e:
                raise error(
                    f"CUDA error in kernel {name} with grid={grid} block={block}: {e}"
                ) from e

    def _recent_launches(self):
        if not self._recent:
            return ""
        return "; launches before it, oldest first: " + ", ".join(
            f"{name} grid={grid} block={block}" for name, grid, block in self._recent
        )

    def _sync(self, where):
        try:
            self.stream.synchronize()
        except drv.Error as e:
            raise CudaError(
                f"CUDA error surfaced at {where}: {e}; it comes from one of the most recent "
                f"kernels (set DARKNET_CUDA_SYNC=1 to pin it down)" + self._recent_launches()
            ) from e

    def _grid1d(self, n, block=_BLOCK):
        """Blocks for a grid-stride kernel over n elements."""
        return (max(0, min((int(n) + block - 1) // block, self._max_blocks)),)

    def _launch_rows(self, name, rows, width, *args, per_thread=1):
        """Launch a row-wise kernel: x (blocks and threads) spans `width`, y spans `rows`.
        Narrow rows get several rows per block so warps stay full. per_thread: elements of
        a row a thread takes (for kernels that stride over the row by the grid's width)."""
        rows, width = int(rows), int(width)
        if rows <= 0 or width <= 0:
            return
        bx = min(_BLOCK, 1 << (width - 1).bit_length())
        by = _BLOCK // bx
        grid = (_ceil_div(width, bx * per_thread), min((rows + by - 1) // by, _MAX_GRID_Y))
        self._launch(name, grid, (bx, by), *args)

    @staticmethod
    def _check_matrix(what, arr, offset, rows, cols, ld):
        if rows > 0 and cols > 0:
            need = offset + (rows - 1) * ld + cols
            if offset < 0 or need > arr.size:
                raise ValueError(
                    f"{what}: matrix view {rows}x{cols} (ld {ld}) at {offset} "
                    f"exceeds array of {arr.size}"
                )

    @staticmethod
    def _check_size(what, arr, need):
        if arr.size < need:
            raise ValueError(f"{what}: array of {arr.size} elements, needs {need}")

    def _sizes_match(self, what, x, y):
        if x.size != y.size:
            raise ValueError(f"{what}: arrays of {x.size} and {y.size} elements")

    # ---- memory -------------------------------------------------------------
    def zeros(self, n):
        a = self._new(n)
        if a.size:
            drv.memset_d32_async(self._ptr(a), 0, a.size, self.stream)
        return a

    def empty(self, n):
        return self._new(n)

    def int_zeros(self, n):
        """An int32 array (maxpool argmax indexes), zeroed."""
        a = self._new(n, np.int32)
        if a.size:
            drv.memset_d32_async(self._ptr(a), 0, a.size, self.stream)
        return a

    def from_host(self, host):
        h = np.ascontiguousarray(np.asarray(host, dtype=self.dtype).reshape(-1))
        a = self._new(h.size)
        self._htod(a, h)
        return a

    def _staged(self, nbytes, host=None, download=False):
        """Whether a copy of nbytes (from or to host array `host`) goes through the
        page-locked staging (cuda_transfer): not memory that pin() locked already, whose
        copy is a DMA the host does not wait for."""
        least = (
            cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES if download else cuda_transfer.MIN_STAGED_BYTES
        )
        if nbytes < least or self._capture_keep is not None:
            return False
        if host is not None and self._dev.pinned:
            start = host.__array_interface__["data"][0]
            return not any(
                first <= start and start + nbytes <= first + size
                for first, size in self._dev.pinned.items()
            )
        return True

    def _htod(self, arr, h):
        """Queue the copy of contiguous host array h into arr; h may go once this returns
        (the driver stages a pageable source before returning, and so do the transfers)."""
        if not h.size:
            return
        if self._staged(h.nbytes, h):
            self._transfers.upload(self._ptr(arr), h)
        else:
            drv.memcpy_htod_async(self._ptr(arr), h, self.stream)

    def to_host(self, arr):
        """A NumPy copy of `arr` (float32; int64 for an integer array). A 16-bit storage
        array (storage_zeros': float16 for fp16, uint16 holding bf16's bits) comes back as
        the float32 values it holds, widened exactly, as NumPy's StoredArray holds them."""
        out = np.empty(arr.size, dtype=arr.dtype)
        if arr.size and self._staged(out.nbytes, download=True):
            try:
                self._transfers.download(self._ptr(arr), out)
            except drv.Error:
                self._sync("to_host")  # names the error and the launches before it
                raise
        else:
            if arr.size:
                drv.memcpy_dtoh_async(out, self._ptr(arr), self.stream)
            self._sync("to_host")
        if out.dtype == np.uint16:  # bf16's bits
            return precisions.widened(out)
        return out.astype(self.dtype if arr.dtype.kind == "f" else np.int64, copy=False)

    def download_async(self, arr, out):
        """Start copying `arr` into host array `out` (contiguous, arr.size elements of
        arr's dtype) after the work queued so far; finish_download(the returned handle)
        returns once out holds the values. Work queued meanwhile may overwrite arr."""
        if out.size != arr.size or out.dtype != arr.dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"download_async: {out.size} {out.dtype} for an array of {arr.size} {arr.dtype}"
            )
        if arr.size and self._capture_keep is None:
            # Staged whatever its size (the driver's copy into pageable memory would wait
            # for the work queued before it): a snapshot on the device (fast), then the
            # DMAs on the copy stream, beside the work queued next instead of after it.
            self._transfers.finish_in_flight()  # the snapshot buffer is free again
            snapshot = self._ptr(self._scratch_buffer("download", out.nbytes))
            drv.memcpy_dtod_async(snapshot, self._ptr(arr), out.nbytes, self.stream)
            taken = drv.Event(drv.event_flags.DISABLE_TIMING)
            taken.record(self.stream)
            copy_stream = self._copy_stream_after(taken)
            return self._transfers.start_download(snapshot, out, copy_stream)
        if arr.size:
            drv.memcpy_dtoh_async(out, self._ptr(arr), self.stream)
        landed = drv.Event(drv.event_flags.DISABLE_TIMING)
        landed.record(self.stream)
        return landed

    def upload_from(self, arr, host):
        """Queue the copy of host array `host` (contiguous, arr.size elements of arr's
        dtype, page-locked by pin(): a DMA on the stream, which a captured graph can record,
        reading the host memory at each replay) into `arr`."""
        if host.size != arr.size or host.dtype != arr.dtype or not host.flags.c_contiguous:
            raise ValueError(
                f"upload_from: {host.size} {host.dtype} for an array of {arr.size} {arr.dtype}"
            )
        if arr.size:
            drv.memcpy_htod_async(self._ptr(arr), host, self.stream)

    def download_into(self, arr, out):
        """Queue the copy of `arr` into host array `out` (contiguous, arr.size elements of
        arr's dtype, page-locked by pin(): a DMA on the stream, which a captured graph can
        record); it has landed once the work queued so far is done (synchronize)."""
        if out.size != arr.size or out.dtype != arr.dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"download_into: {out.size} {out.dtype} for an array of {arr.size} {arr.dtype}"
            )
        if arr.size:
            drv.memcpy_dtoh_async(out, self._ptr(arr), self.stream)

    def finish_download(self, download):
        try:
            download.finish() if hasattr(download, "finish") else download.synchronize()
        except drv.Error:
            self._sync("a download")  # names the error and the launches before it
            raise

    def write(self, arr, host):
        h = np.ascontiguousarray(np.asarray(host, dtype=arr.dtype).reshape(-1))
        if h.size != arr.size:
            raise ValueError(f"write: {h.size} values for an array of {arr.size}")
        self._htod(arr, h)

    # ---- asynchronous uploads ------------------------------------------------
    # A batch uploads on a copy stream of its own while the compute stream works on the
    # previous one; events order the two (the copy after the compute work queued before
    # it, the compute that uses it after the copy). From page-locked memory the copy is
    # a DMA the call does not wait for; from pageable memory the driver stages it
    # through its own buffer, and the call may wait for the copy stream to reach it.
    def pin(self, host):
        """Page-lock the memory of host array `host` so uploads from it run asynchronously
        at full speed; returns a function that unpins it (call it before the memory goes).
        Where the driver refuses (no such memory, a limit reached), uploads from `host`
        stay correct, only pageable-slow, and the function does nothing."""
        host = np.asarray(host)
        if not host.flags.c_contiguous or not host.nbytes:
            return unpin_nothing
        pointer = host.__array_interface__["data"][0]
        try:
            cuda_graph.register_host(pointer, host.nbytes)
        except cuda_graph.GraphError:
            return unpin_nothing
        self._dev.pinned[pointer] = host.nbytes  # its copies need no staging
        return _PinnedRange(self._dev, host, pointer)

    def upload_async(self, host):
        """(array, upload): a backend array that receives host's values (flattened), and
        the upload filling it, which starts after the work queued so far. Ops queued after
        wait_upload(upload) see the values; `host` must stay unchanged until
        finish_upload(upload) returns."""
        return self._upload_flat_async(
            np.ascontiguousarray(np.asarray(host, dtype=self.dtype).reshape(-1))
        )

    def _upload_flat_async(self, h):
        """upload_async of contiguous 1-D host array h, into an array of h's dtype."""
        dst = self._new(h.size, h.dtype)
        queued = drv.Event(drv.event_flags.DISABLE_TIMING)
        queued.record(self.stream)
        copy_stream = self._copy_stream_after(queued)
        if h.size and self._staged(h.nbytes, h):
            self._transfers.upload(self._ptr(dst), h, copy_stream)
        elif h.size:
            drv.memcpy_htod_async(self._ptr(dst), h, copy_stream)
        landed = drv.Event(drv.event_flags.DISABLE_TIMING)
        landed.record(self._copy_stream)
        return dst, _Upload(landed, h)

    def _copy_stream_after(self, event):
        """The copies' stream (made at first use), its next work after `event`."""
        if self._copy_stream is None:
            self._copy_stream = drv.Stream()
        self._copy_stream.wait_for_event(event)
        return self._copy_stream

    def wait_upload(self, upload):
        """Ops queued from now on run after `upload` has landed (no wait on the host)."""
        self.stream.wait_for_event(upload.landed)

    def finish_upload(self, upload):
        """Return once `upload` has read its host memory (which may then change)."""
        try:
            upload.landed.synchronize()
        except drv.Error as e:
            raise CudaError(f"CUDA error surfaced at an upload: {e}") from e

    def timer(self):
        """A stopwatch for benchmarks: CUDA events recorded on this backend's stream."""
        return _EventTimer(self.stream)

    def synchronize(self):
        self._sync("synchronize")

    def capture(self, fn):
        """Record the work fn queues on the stream as a CUDA graph (fn runs once, here; its
        kernels are recorded, not run) and return a callable that replays it. The graph
        holds the arrays fn allocated. Raises GraphCaptureError when the work cannot be
        recorded (fn waits on the device, or DARKNET_CUDA_SYNC is set): nothing of it has
        run then, and the stream is back to normal."""
        if self.sync_each_launch:
            raise GraphCaptureError(
                "DARKNET_CUDA_SYNC=1 synchronizes after every launch, which a graph cannot record"
            )
        handle = self.stream.handle
        try:
            cuda_graph.begin_capture(handle)
        except cuda_graph.GraphError as e:
            raise GraphCaptureError(str(e)) from e
        keep = self._capture_keep = []
        try:
            fn()
        except Exception as e:
            self._capture_keep = None
            _end_failed_capture(handle)
            raise GraphCaptureError(f"the step could not be recorded as a CUDA graph: {e}") from e
        self._capture_keep = None
        keep += self._scratch.values()  # grown later, they must outlive the graph's use
        try:
            graph = cuda_graph.end_capture(handle)
        except cuda_graph.GraphError as e:
            raise GraphCaptureError(str(e)) from e
        try:
            graph_exec = cuda_graph.instantiate(graph)
        except cuda_graph.GraphError as e:
            cuda_graph.destroy(None, graph)
            raise GraphCaptureError(str(e)) from e
        return _Graph(self, graph, graph_exec, keep)

    def fill(self, arr, value):
        """Every element of arr set to value (a 16-bit storage array: value rounded to its
        storage, as NumPy's fill of a StoredArray)."""
        if not arr.size:
            return
        if arr.dtype.itemsize == 2:
            kept = np.float32([value])
            if arr.dtype == np.uint16:  # bf16's bits (storage_of)
                bits = precisions.round_to(kept, "bf16").view(np.uint32)[0] >> 16
            else:
                with np.errstate(over="ignore"):
                    bits = kept.astype(np.float16).view(np.uint16)[0]
            drv.memset_d16_async(self._ptr(arr), int(bits), arr.size, self.stream)
            return
        bits = np.array([value], dtype=arr.dtype).view(np.uint32)[0]
        drv.memset_d32_async(self._ptr(arr), int(bits), arr.size, self.stream)

    def copy(self, src, dst):
        """dst <- src, the bytes as they are: arrays of one storage (storage_of) only, a
        ValueError naming both otherwise."""
        self._sizes_match("copy", src, dst)
        if src.dtype != dst.dtype:
            raise ValueError(
                f"copy: src kept at {self.storage_of(src)} ({src.dtype}), dst kept "
                f"at {self.storage_of(dst)} ({dst.dtype}): copy takes arrays of "
                f"one storage (copy_rounded rounds into a 16-bit one)"
            )
        if src.size:
            drv.memcpy_dtod_async(self._ptr(dst), self._ptr(src), src.nbytes, self.stream)
