"""The CUDA backend: NumpyBackend's ops as hand-written kernels (kernels/*.cu) via PyCUDA.

Arrays are 1-D float32 ``DeviceArray``s (int32 for maxpool indexes): a pointer
into a pool allocation and a length. A flat slice ``a[i:j]`` is a view, and kernels
get raw pointers, so views work everywhere. Every op is asynchronous on the backend's one stream except those
that hand data to the host (to_host, sum, synchronize).

Design:
  * The device's primary context is retained and pushed at start, popped at exit.
  * One stream, one thread; one DeviceMemoryPool for every array and scratch buffer.
  * The kernels/*.cu files come prebuilt in the wheel (prebuilt.py) for the common
    architectures; otherwise nvcc compiles them in parallel on a first start and their
    cubins are cached on disk (kernel_cache.py); later starts load them from there. Kernels
    are launched with prepared_async_call.
  * A failed launch raises CudaError naming the kernel and its grid/block. Errors
    that surface later (a kernel's illegal access shows at the next sync) name the
    recent launches; DARKNET_CUDA_SYNC=1 synchronizes after every launch to pin
    them to one kernel.
  * Running out of device memory raises DeviceOutOfMemory.

This module imports PyCUDA at the top on purpose: backends.get_backend imports it
only when a CUDA device is asked for and turns the ImportError into a clear message.
"""
import atexit
import collections
import os

import numpy as np
import pycuda.driver as drv
from pycuda.tools import DeviceMemoryPool

from . import cuda_graph, cuda_transfer, cuda_wgmma, kernel_cache, prebuilt
from .errors import DeviceOutOfMemory, GraphCaptureError

from .. import activations, precision as precisions
from ..losses.detection import DETECTION_SCALARS
from ..losses.region import PRIOR_SEEN, REGION_SCALARS, REGION_TRUTHS
from ..losses.yolo import FLT_MAX, IOU_LOSSES, SCALARS
from ..shapes import conv_out_size, conv_strides
from .pinning import unpin_nothing

KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")

# Kernel file -> {entry point: argument format}. Formats are struct codes:
# P device pointer, i int32, I uint32, q int64, f float32.
_GEMM_ARGS = "iiifPiPifPiiiq"
_GEMM_TILES = {  # variant (see kernels/gemm.cu) -> (BM, BN, BK, threads per block)
    "128x128x8s4": (128, 128, 8, 256),
    "64x64x8s4r8": (64, 64, 8, 64),
    "32x32x8s4w": (32, 32, 8, 32),
}
# Tensor-core tiles (kernels/gemm_tc.cu's TC_TILES) -> (BM, BN, threads per block).
_TC_TILES = {
    "128x128": (128, 128, 256),
    "64x128": (64, 128, 256),
    "32x128": (32, 128, 128),
    "16x128": (16, 128, 128),
    "64x64": (64, 64, 128),
}
# precision -> (kernel name part, bytes of an operand element)
_TC_PRECISIONS = {"fp16": ("f16", 2), "bf16": ("bf16", 2), "tf32": ("tf32", 4)}
_TC_CONV_ARGS = "PiPqiiiiiiiiiiiiPiPq"
_TC_SLICE_BYTES = 64   # SLICE_BYTES of kernels/gemm_tc.cu: K advances by this many bytes a row
_KERNELS = {
    "blas.cu": {
        "axpy_kernel": "ifPP",
        "axpy_array_kernel": "iPPP",
        "scal_kernel": "ifP",
        "mul_kernel": "iPP",
        "scale_add_strided": "Piiiff",
        "mul_add_kernel": "iPPP",
        "sum_partial": "iPP",
        "sum_final": "iPP",
        "sum_final_f32": "iPP",
    },
    "gemm.cu": dict(
        {f"sgemm_{tile}_{case}": _GEMM_ARGS for tile in _GEMM_TILES for case in ("nn", "nt", "tn", "tt")},
        splitk_reduce="iiiPffPi",
    ),
    "gemm_tc.cu": dict(
        {f"conv_tc_{p}_{tile}": _TC_CONV_ARGS for p, _ in _TC_PRECISIONS.values()
         for tile in _TC_TILES},
        **{f"gemm_tc_{p}_{tile}_{case}": _GEMM_ARGS[:11] + "iq" for p, _ in _TC_PRECISIONS.values()
           for tile in _TC_TILES for case in ("nn", "nt", "tn")},
        **{f"pack_weights_{p}": "PiiiP" for p, _ in _TC_PRECISIONS.values()},
    ),
    "im2col.cu": {
        "im2col_kernel": "PiiiiiiiiiiPiq",
        "col2im_kernel": "PiiiiiiiiiiPiq",
    },
    "batchnorm.cu": {
        "add_bias": "PPiii",
        "scale_bias": "PPiii",
        "channel_sums": "PPPiiiiiPP",
        "channel_finalize": "PiiiqPPP",
        "normalize_kernel": "PPPiii",
        "normalize_sqrt_eps_kernel": "PPPiiif",
        "normalize_delta_kernel": "PPPPPiiifPPi",
    },
    "activations.cu": {
        "activate_array": "Pii",
        "bias_activate": "PPiiii",
        "batchnorm_apply_kernel": "PPPPPiiifiP",
        "activate_strided": "Piiii",
        "gradient_array": "PiiP",
        "gradient_strided": "PiiiiP",
        "gradient_from_input_array": "PiiP",
        "normalize_channels_kernel": "Piiii",
        "normalize_channels_gradient_kernel": "PiiiiP",
    },
    "pooling.cu": {
        "maxpool_forward_kernel": "PiiiiiiiiiPP",
        "maxpool_depth_kernel": "PiiiiPP",
        "local_avgpool_forward_kernel": "PiiiiiiiiiP",
        "local_avgpool_backward_kernel": "PiiiiiiiiiP",
        "maxpool_backward_kernel": "PPiP",
        "avgpool_forward_kernel": "PiiP",
        "avgpool_backward_kernel": "PiiP",
    },
    "softmax.cu": {
        "softmax_kernel": "PiiiiiifP",
        "softmax_x_ent_kernel": "iPPPP",
        "softmax_tree_kernel": "PiiifPPiP",
        "mask_kernel": "iPPf",
        "l2_kernel": "iPPPP",
        "logistic_x_ent_kernel": "iPPPP",
    },
    "shape.cu": {
        "copy_blocks_kernel": "PiqPiqiiii",
        "upsample_forward_kernel": "PiiiifP",
        "upsample_backward_kernel": "PiiiifP",
        "reorg_kernel": "PiiiiiiP",
        "shortcut_kernel": "iiiiiiPiiiPiiiff",
        "scale_channels_kernel": "PPiiiiP",
        "scale_channels_src_delta_kernel": "PPiiiiP",
        "scale_channels_scale_delta_kernel": "PPiiiiP",
        "shortcut_weights_kernel": "PiiiP",
        "channel_weighted_add_kernel": "PiPiiiPi",
        "channel_weighted_dot_kernel": "PiPiiiiP",
    },
    "normalization.cu": {
        "l2normalize_kernel": "Piii",
        "lrn_forward_kernel": "PiiiifffPP",
        "lrn_backward_kernel": "iPPfP",
    },
    "binary.cu": {
        "binarize_weights_kernel": "PiiP",
        "binarize_kernel": "iPP",
    },
    "dropout.cu": {
        "dropout_forward_kernel": "PiffPIP",
        "dropout_backward_kernel": "PiffP",
        "uniform_kernel": "PiI",
    },
    "region_loss.cu": {
        "region_cells": "PPiiiPiiiiiffiP",
        "region_truths": "PPiiiPiiiiiiiifffPPPPPPP",
        "detection_grid": "PiiiiiiP",
        "detection_base": "PiiiifP",
        "detection_objects": "PPPiiiiiiifffPP",
        "loss_sums": "PPiiiiP",
        "loss_final": "PiPiiP",
    },
    "yolo_loss.cu": {
        "yolo_predictions": "PPPP",
        "yolo_truths": "PPPPP",
        "yolo_finish": "PPPP",
        "yolo_reduce": "PPiPP",
    },
}
# Per-image figures the truth kernels of region_loss.cu leave for loss_final.
_LOSS_IMAGE_STATS = 5
# Threads of the kernels that walk one image's truths in order (one thread an image).
_IMAGE_THREADS = 64
_KERNEL_OPTIONS = kernel_cache.KERNEL_OPTIONS
_YOLO_STATS = 8   # per-image statistics of kernels/yolo_loss.cu (enum Stat)

# channel_sums terms and channel_finalize ops (enums in kernels/batchnorm.cu)
_TERM_A, _TERM_A_MINUS_MEAN_SQ, _TERM_A_TIMES_B, _TERM_A_TIMES_B_MINUS_MEAN = range(4)
_FINAL_MEAN, _FINAL_VARIANCE, _FINAL_ACCUMULATE, _FINAL_MEAN_DELTA, _FINAL_VARIANCE_DELTA = range(5)

_BLOCK = 256
_MAX_GRID_Y = 65535
_COPY_RUN = 4   # COPY_RUN of kernels/shape.cu


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


class _Device:
    """Per-process state of one GPU: primary context, stream, pool, compiled kernels.

    Shared by every CudaBackend on that device, so kernels compile once per process."""

    _by_index = {}

    @classmethod
    def get(cls, index):
        dev = cls._by_index.get(index)
        if dev is None:
            dev = cls._by_index[index] = cls(index)
        return dev

    def __init__(self, index):
        drv.init()
        count = drv.Device.count()
        if not 0 <= index < count:
            raise CudaError(f"no CUDA device {index}: {count} device(s) present")
        self.index = index
        self.device = drv.Device(index)
        self.context = self.device.retain_primary_context()
        self.context.push()
        self.closed = False
        atexit.register(self.close)
        self.stream = drv.Stream()
        self.pool = DeviceMemoryPool()
        self.transfers = cuda_transfer.PinnedTransfers(self.stream)   # large copies
        self.pinned = {}   # host address -> bytes: the ranges pin() page-locked
        self.sm_count = self.device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        self.total_bytes = self.device.total_memory()
        self.peak_allocated_bytes = 0
        self.functions = {}
        self.modules = []
        sources = {}
        for filename in _KERNELS:   # their headers: found by nvcc -I, hashed by kernel_digest
            with open(os.path.join(KERNEL_DIR, filename)) as f:
                sources[filename] = f.read()
        arch = "sm_%d%d" % self.device.compute_capability()
        # The wheel's prebuilt binaries where they match; nvcc (cached) for the rest.
        cubins, self.compiled = prebuilt.binaries(sources, arch, _KERNEL_OPTIONS,
                                                  include_dir=KERNEL_DIR)
        for filename, entries in _KERNELS.items():
            try:
                module = drv.module_from_buffer(cubins[filename])
            except drv.Error as e:
                where = (kernel_cache.cache_dir() if filename in self.compiled
                         else prebuilt.PREBUILT_DIR)
                raise CudaError(f"the driver cannot load the binary of {filename} for {arch} "
                                f"(from {where}): {e}") from e
            self.modules.append(module)
            for name, fmt in entries.items():
                fn = module.get_function(name)
                fn.prepare(fmt)
                self.functions[name] = fn

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.stream.synchronize()
            self.pool.stop_holding()
            self.transfers.close()   # page-locked buffers go while their context lives
        except drv.Error:
            pass
        self.context.pop()
        from pycuda.tools import clear_context_caches
        clear_context_caches()


def _end_failed_capture(handle):
    """Close a capture that fn broke off, dropping whatever it recorded."""
    try:
        cuda_graph.destroy(None, cuda_graph.end_capture(handle))
    except cuda_graph.GraphError:
        pass   # the capture was invalidated: ending it was all that was left to do


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
            pass   # at interpreter exit the context may be gone: the driver frees it then


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
        return DeviceArray(self.ptr + start * self.dtype.itemsize if n else 0, n, self.dtype,
                           self.base)

    def __repr__(self):
        return f"DeviceArray({self.size} x {self.dtype}, at 0x{self.ptr:x})"


class CudaBackend:
    """NumpyBackend's op contract on one CUDA device (float32)."""

    name = "cuda"
    dtype = np.dtype(np.float32)

    def __init__(self, device_index=0, seed=0):
        self._dev = _Device.get(int(device_index))
        self.device_index = int(device_index)
        self.device_name = self._dev.device.name()
        self.stream = self._dev.stream
        self.pool = self._dev.pool
        self.sm_count = self._dev.sm_count
        self.rng = np.random.default_rng(seed)  # host RNG for weight init, as NumpyBackend
        self.sync_each_launch = os.environ.get("DARKNET_CUDA_SYNC", "") not in ("", "0")
        self._fn = self._dev.functions
        self._recent = collections.deque(maxlen=8)
        self._scratch = {}
        self._yolo_args = {}   # packed YoloArgs bytes -> their device copy
        self._max_blocks = self.sm_count * 8  # one full wave of 256-thread blocks
        # Forced gemm plan (tile name, splits) for benchmarks and tests; None = heuristic.
        self.gemm_override = None
        # Forced tensor-core plan (tile name, splits) for benchmarks and tests; None = heuristic.
        self.tc_override = None
        self._copy_stream = None   # uploads' stream, made at the first upload_async
        self._transfers = self._dev.transfers
        # While a graph is being captured: every array allocated (or scratch buffer
        # replaced) meanwhile, kept alive with the graph, whose kernels hold their addresses.
        self._capture_keep = None

    # ---- infrastructure ------------------------------------------------------
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
        grid = (*map(int, grid), 1, 1)[:3]     # sizes may arrive as NumPy integers
        block = (*map(int, block), 1, 1)[:3]
        if min(grid) <= 0:
            return  # nothing to do (an empty array)
        try:
            self._fn[name].prepared_async_call(grid, block, self.stream, *args)
        except drv.Error as e:
            raise CudaError(f"CUDA error launching kernel {name} with grid={grid} block={block}: {e}"
                            + self._recent_launches()) from e
        self._recent.append((name, grid, block))  # formatted only if an error is reported
        if self.sync_each_launch:
            try:
                self.stream.synchronize()
            except drv.Error as e:
                raise CudaError(f"CUDA error in kernel {name} with grid={grid} block={block}: {e}") from e

    def _recent_launches(self):
        if not self._recent:
            return ""
        return "; launches before it, oldest first: " + ", ".join(
            f"{name} grid={grid} block={block}" for name, grid, block in self._recent)

    def _sync(self, where):
        try:
            self.stream.synchronize()
        except drv.Error as e:
            raise CudaError(f"CUDA error surfaced at {where}: {e}; it comes from one of the most recent "
                            f"kernels (set DARKNET_CUDA_SYNC=1 to pin it down)" + self._recent_launches()) from e

    def _grid1d(self, n, block=_BLOCK):
        """Blocks for a grid-stride kernel over n elements."""
        return (max(0, min((int(n) + block - 1) // block, self._max_blocks)),)

    def _launch_rows(self, name, rows, width, *args):
        """Launch a row-wise kernel: x (blocks and threads) spans `width`, y spans `rows`.
        Narrow rows get several rows per block so warps stay full."""
        rows, width = int(rows), int(width)
        if rows <= 0 or width <= 0:
            return
        bx = min(_BLOCK, 1 << (width - 1).bit_length())
        by = _BLOCK // bx
        grid = ((width + bx - 1) // bx, min((rows + by - 1) // by, _MAX_GRID_Y))
        self._launch(name, grid, (bx, by), *args)

    @staticmethod
    def _check_matrix(what, arr, offset, rows, cols, ld):
        if rows > 0 and cols > 0:
            need = offset + (rows - 1) * ld + cols
            if offset < 0 or need > arr.size:
                raise ValueError(f"{what}: matrix view {rows}x{cols} (ld {ld}) at {offset} "
                                 f"exceeds array of {arr.size}")

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
        least = (cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES if download
                 else cuda_transfer.MIN_STAGED_BYTES)
        if nbytes < least or self._capture_keep is not None:
            return False
        if host is not None and self._dev.pinned:
            start = host.__array_interface__["data"][0]
            return not any(first <= start and start + nbytes <= first + size
                           for first, size in self._dev.pinned.items())
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
        """A NumPy copy of `arr` (float32; int64 for an integer array)."""
        out = np.empty(arr.size, dtype=arr.dtype)
        if arr.size and self._staged(out.nbytes, download=True):
            try:
                self._transfers.download(self._ptr(arr), out)
            except drv.Error:
                self._sync("to_host")   # names the error and the launches before it
                raise
        else:
            if arr.size:
                drv.memcpy_dtoh_async(out, self._ptr(arr), self.stream)
            self._sync("to_host")
        return out.astype(self.dtype if arr.dtype.kind == "f" else np.int64, copy=False)

    def download_async(self, arr, out):
        """Start copying `arr` into host array `out` (contiguous, arr.size elements of
        arr's dtype) after the work queued so far; finish_download(the returned handle)
        returns once out holds the values. Work queued meanwhile may overwrite arr."""
        if out.size != arr.size or out.dtype != arr.dtype or not out.flags.c_contiguous:
            raise ValueError(f"download_async: {out.size} {out.dtype} for an array of "
                             f"{arr.size} {arr.dtype}")
        if arr.size and self._capture_keep is None:
            # Staged whatever its size (the driver's copy into pageable memory would wait
            # for the work queued before it): a snapshot on the device (fast), then the
            # DMAs on the copy stream, beside the work queued next instead of after it.
            self._transfers.finish_in_flight()   # the snapshot buffer is free again
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

    def finish_download(self, download):
        try:
            download.finish() if hasattr(download, "finish") else download.synchronize()
        except drv.Error:
            self._sync("a download")   # names the error and the launches before it
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
        holder = [host]   # the memory must stay mapped while registered
        self._dev.pinned[pointer] = host.nbytes   # its copies need no staging

        def unpin():
            self._dev.pinned.pop(pointer, None)
            if holder:
                try:
                    cuda_graph.unregister_host(pointer)
                except cuda_graph.GraphError:
                    pass   # the context is gone (at exit), and the registration with it
                holder.clear()
        return unpin

    def upload_async(self, host):
        """(array, upload): a backend array that receives host's values (flattened), and
        the upload filling it, which starts after the work queued so far. Ops queued after
        wait_upload(upload) see the values; `host` must stay unchanged until
        finish_upload(upload) returns."""
        h = np.ascontiguousarray(np.asarray(host, dtype=self.dtype).reshape(-1))
        dst = self._new(h.size)
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
            raise GraphCaptureError("DARKNET_CUDA_SYNC=1 synchronizes after every launch, "
                                    "which a graph cannot record")
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
        keep += self._scratch.values()   # grown later, they must outlive the graph's use
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
        if arr.size:
            bits = np.array([value], dtype=arr.dtype).view(np.uint32)[0]
            drv.memset_d32_async(self._ptr(arr), int(bits), arr.size, self.stream)

    def copy(self, src, dst):
        self._sizes_match("copy", src, dst)
        if src.size:
            drv.memcpy_dtod_async(self._ptr(dst), self._ptr(src), src.nbytes, self.stream)

    def copy_blocks(self, src, src_offset, src_stride, dst, dst_offset, dst_stride,
                    width, rows, accumulate=False, planes=1, src_plane_stride=0,
                    dst_plane_stride=0):
        """For p in planes, r in rows: dst[dst_offset + p*dst_plane_stride + r*dst_stride : +width]
        (+)= src[src_offset + p*src_plane_stride + r*src_stride : +width]."""
        planes = int(planes)
        for what, arr, off, stride, pstride in (("src", src, src_offset, src_stride, src_plane_stride),
                                                ("dst", dst, dst_offset, dst_stride, dst_plane_stride)):
            self._check_matrix(f"copy_blocks {what}", arr, off, rows, width, stride)
            if planes > 1:
                self._check_matrix(f"copy_blocks {what} last plane", arr,
                                   off + (planes - 1) * pstride, rows, width, stride)
        if rows <= 0 or width <= 0 or planes <= 0:
            return
        # x spans the width in runs of _COPY_RUN elements a thread (kernels/shape.cu)
        self._launch_rows("copy_blocks_kernel", rows * planes, _ceil_div(width, _COPY_RUN),
                          self._ptr(src) + 4 * int(src_offset), int(src_stride), int(src_plane_stride),
                          self._ptr(dst) + 4 * int(dst_offset), int(dst_stride), int(dst_plane_stride),
                          int(width), int(rows), planes, int(bool(accumulate)))

    # ---- BLAS-like ----------------------------------------------------------
    def axpy(self, alpha, x, y):
        """y += alpha * x"""
        self._sizes_match("axpy", x, y)
        self._launch("axpy_kernel", self._grid1d(y.size), (_BLOCK,),
                     y.size, float(alpha), self._ptr(x), self._ptr(y))

    def axpy_array(self, alpha, x, y):
        """y += alpha[0] * x, alpha a one-element array: read on the device when the kernel
        runs, so a captured step takes the value written before each replay."""
        self._sizes_match("axpy_array", x, y)
        self._check_size("axpy_array alpha", alpha, 1)
        self._launch("axpy_array_kernel", self._grid1d(y.size), (_BLOCK,),
                     y.size, self._ptr(alpha), self._ptr(x), self._ptr(y))

    def scal(self, alpha, x):
        """x *= alpha"""
        self._launch("scal_kernel", self._grid1d(x.size), (_BLOCK,), x.size, float(alpha), self._ptr(x))

    def mul(self, x, y):
        """y *= x (element-wise)"""
        self._sizes_match("mul", x, y)
        self._launch("mul_kernel", self._grid1d(y.size), (_BLOCK,), y.size, self._ptr(x), self._ptr(y))

    def mul_add(self, a, b, y):
        """y += a * b (element-wise)"""
        self._sizes_match("mul_add", a, y)
        self._sizes_match("mul_add", b, y)
        self._launch("mul_add_kernel", self._grid1d(y.size), (_BLOCK,), y.size, self._ptr(a),
                     self._ptr(b), self._ptr(y))

    def sum(self, x):
        """Sum of all elements as a Python float (accumulated in double; a host sync)."""
        if x.size == 0:
            return 0.0
        blocks = self._grid1d(x.size)[0]
        scratch = self._scratch_buffer("sum", 8 * (blocks + 1))
        partial = self._ptr(scratch)
        self._launch("sum_partial", (blocks,), (_BLOCK,), x.size, self._ptr(x), partial)
        self._launch("sum_final", (1,), (_BLOCK,), blocks, partial, partial + 8 * blocks)
        out = np.empty(1, dtype=np.float64)
        drv.memcpy_dtoh_async(out, partial + 8 * blocks, self.stream)
        self._sync("sum")
        return float(out[0])

    def sum_into(self, x, out):
        """out[0] = the sum of x (accumulated in double, stored as float32), queued on the
        stream: no host sync."""
        if x.size == 0:
            self.fill(out[:1], 0.0)
            return
        blocks = self._grid1d(x.size)[0]
        scratch = self._scratch_buffer("sum", 8 * (blocks + 1))
        partial = self._ptr(scratch)
        self._launch("sum_partial", (blocks,), (_BLOCK,), x.size, self._ptr(x), partial)
        self._launch("sum_final_f32", (1,), (_BLOCK,), blocks, partial, self._ptr(out))

    def gemm_plan(self, m, n, k):
        """(variant, splits) the gemm heuristic picks for an m x n x k product.

        Rules from timing every plan on the convolutions of yolov3-tiny and cifar
        (bench/conv_bench.py --sweep; bench/NOTES.md, "G1"):
          * m or n at most 32 (a first layer's few filters or weights): one-warp
            32x32 tiles, K split until about 8 blocks per SM (each split >= 256 of K);
          * at least 2.5 waves of 128x128 tiles (2 per SM): 128x128, K whole;
          * fewer, but still 48 or more: 128x128 with K split into up to 8 slices,
            toward ~1150 blocks, each slice >= 512 of K (a weight gradient, or a
            forward whose tiles would leave a second wave nearly empty);
          * else 64x64 tiles with K split toward 16 blocks per SM (each >= 512)."""
        if self.gemm_override is not None:
            return self.gemm_override
        sms = self.sm_count
        if min(m, n) <= 32:
            tiles = _ceil_div(m, 32) * _ceil_div(n, 32)
            return "32x32x8s4w", max(1, min(_ceil_div(8 * sms, tiles), k // 256))
        big = _ceil_div(m, 128) * _ceil_div(n, 128)
        if m > 64 and n > 64 and 2 * big >= 5 * sms:
            return "128x128x8s4", 1
        if m > 64 and n > 64 and big >= 48:
            return "128x128x8s4", max(1, min(8, _ceil_div(1152, big), k // 512))
        tiles = _ceil_div(m, 64) * _ceil_div(n, 64)
        return "64x64x8s4r8", max(1, min(_ceil_div(16 * sms, tiles), k // 512))

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """C = alpha * op(A) @ op(B) + beta * C, row-major, as Darknet's gemm()."""
        m, n, k, lda, ldb, ldc = (int(v) for v in (m, n, k, lda, ldb, ldc))
        if ta:
            self._check_matrix("gemm A", a, 0, k, m, lda)
        else:
            self._check_matrix("gemm A", a, 0, m, k, lda)
        if tb:
            self._check_matrix("gemm B", b, 0, n, k, ldb)
        else:
            self._check_matrix("gemm B", b, 0, k, n, ldb)
        self._check_matrix("gemm C", c, 0, m, n, ldc)
        if m <= 0 or n <= 0:
            return
        tile, splits = self.gemm_plan(m, n, k)
        bm, bn, bk, threads = _GEMM_TILES[tile]
        kernel = f"sgemm_{tile}_{'t' if ta else 'n'}{'t' if tb else 'n'}"
        grid_mn = (_ceil_div(n, bn), _ceil_div(m, bm))
        if splits > 1 and k > 0:
            # Chunks are whole BK slices; recount splits so none is empty.
            chunk = _ceil_div(_ceil_div(k, splits), bk) * bk
            splits = _ceil_div(k, chunk)
        else:
            splits, chunk = 1, max(k, 1)
        pa, pb, pc = self._ptr(a), self._ptr(b), self._ptr(c)
        alpha, beta = float(alpha), float(beta)
        if splits == 1:
            vec4 = int(pc % 16 == 0 and ldc % 4 == 0)
            self._launch(kernel, grid_mn + (1,), (threads,), m, n, k, alpha, pa, lda, pb, ldb,
                         beta, pc, ldc, chunk, vec4, 0)
            return
        ws = self._ptr(self._scratch_buffer("gemm", 4 * splits * m * n))
        self._launch(kernel, grid_mn + (splits,), (threads,), m, n, k, 1.0, pa, lda, pb, ldb,
                     0.0, ws, n, chunk, int(n % 4 == 0), m * n)
        # Threads per output: one per 16 splits, up to 32 (a block is 256 threads).
        per_output = min(32, 1 << (max(1, splits // 16).bit_length() - 1))
        width = _BLOCK // per_output
        self._launch("splitk_reduce", (_ceil_div(m * n, width),), (width, per_output), m, n,
                     splits, ws, alpha, beta, pc, ldc)

    # ---- reduced precision: tensor cores (kernels/gemm_tc.cu) ---------------------
    def tc_plan(self, m, n, k, split=True):
        """(tile, splits) for an m x n x k tensor-core product: the tile's rows follow m
        (few filters: 16 or 32 rows), 64x64 where wider tiles would not fill the SMs
        once; K split (split=True) until about 2 blocks per SM, each split >= 1024 of K."""
        if self.tc_override is not None:
            return self.tc_override
        sms = self.sm_count
        if m <= 16:
            tile = "16x128"
        elif m <= 32:
            tile = "32x128"
        elif m <= 64:
            tile = "64x128" if _ceil_div(n, 128) >= sms else "64x64"
        else:
            tile = "128x128" if _ceil_div(m, 128) * _ceil_div(n, 128) >= sms else "64x64"
        bm, bn, _ = _TC_TILES[tile]
        tiles = _ceil_div(m, bm) * _ceil_div(n, bn)
        splits = max(1, min(_ceil_div(2 * sms, tiles), k // 1024, 256)) if split else 1
        return tile, splits

    @staticmethod
    def _tc_name(precision):
        try:
            return _TC_PRECISIONS[precision]
        except KeyError:
            raise ValueError(f"no tensor-core kernels for precision '{precision}' "
                             f"(use one of {', '.join(_TC_PRECISIONS)})") from None

    def gemm_lowp(self, precision, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """gemm on the tensor cores: op(A), op(B) rounded to `precision`, fp32 sums."""
        part, _ = self._tc_name(precision)
        m, n, k, lda, ldb, ldc = (int(v) for v in (m, n, k, lda, ldb, ldc))
        if ta and tb:
            raise ValueError("gemm_lowp: op(A) and op(B) both transposed is not supported")
        self._check_matrix("gemm A", a, 0, *((k, m) if ta else (m, k)), lda)
        self._check_matrix("gemm B", b, 0, *((n, k) if tb else (k, n)), ldb)
        self._check_matrix("gemm C", c, 0, m, n, ldc)
        if m <= 0 or n <= 0:
            return
        # Hopper: wgmma + TMA where the product fills the chip (cuda_wgmma.handles).
        if cuda_wgmma.gemm_lowp(self, precision, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
            return
        tile, splits = self.tc_plan(m, n, k)
        bm, bn, threads = _TC_TILES[tile]
        kernel = f"gemm_tc_{part}_{tile}_{'t' if ta else 'n'}{'t' if tb else 'n'}"
        chunk = _ceil_div(_ceil_div(max(k, 1), splits), 32) * 32
        splits = max(1, _ceil_div(k, chunk))
        grid = (_ceil_div(n, bn), _ceil_div(m, bm), splits)
        pa, pb, pc = self._ptr(a), self._ptr(b), self._ptr(c)
        if splits == 1:
            self._launch(kernel, grid, (threads,), m, n, k, float(alpha), pa, lda, pb, ldb,
                         float(beta), pc, ldc, chunk, 0)
            return
        ws = self._ptr(self._scratch_buffer("gemm", 4 * splits * m * n))
        self._launch(kernel, grid, (threads,), m, n, k, 1.0, pa, lda, pb, ldb, 0.0, ws, n,
                     chunk, m * n)
        per_output = min(32, 1 << (max(1, splits // 16).bit_length() - 1))
        width = _BLOCK // per_output
        self._launch("splitk_reduce", (_ceil_div(m * n, width),), (width, per_output), m, n,
                     splits, ws, float(alpha), float(beta), pc, ldc)

    def pack_weights(self, weights, rows, k, precision):
        """A convolution group's weights (rows x k fp32) converted once for conv_forward:
        rows of `pitch` elements (16-byte aligned, zero past k)."""
        part, size = self._tc_name(precision)
        rows, k = int(rows), int(k)
        self._check_size("pack_weights weights", weights, rows * k)
        pitch = _ceil_div(k, 16 // size) * (16 // size)
        data = self._new(rows * pitch, np.float16 if size == 2 else np.float32)
        words = rows * pitch * size // 4
        self._launch(f"pack_weights_{part}", self._grid1d(words), (_BLOCK,), self._ptr(weights),
                     rows, k, pitch, self._ptr(data))
        return precisions.PackedWeights(data, rows, k, pitch, precision)

    def conv_forward(self, packed, im, channels, height, width, ksize, stride, pad, dilation,
                     batch, im_stride, biases, activation, out, out_stride):
        """NumpyBackend.conv_forward as one implicit-GEMM launch (no col buffer)."""
        part, _ = self._tc_name(packed.precision)
        if activation not in precisions.EPILOGUE_ACTIVATIONS:
            raise ValueError(f"conv_forward applies {', '.join(precisions.EPILOGUE_ACTIVATIONS)}, "
                             f"not {activation}")
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        stride_y, stride_x = conv_strides(stride)
        batch, positions = int(batch), out_h * out_w
        im_stride = int(im_stride) or channels * height * width
        if packed.k != channels * ksize * ksize:
            raise ValueError(f"conv_forward: weights of {packed.k} per filter for "
                             f"{channels} channels of {ksize}x{ksize}")
        self._check_size("conv_forward im", im,
                         (batch - 1) * im_stride + channels * height * width)
        self._check_size("conv_forward out", out,
                         (batch - 1) * out_stride + packed.rows * positions)
        if biases is not None:
            self._check_size("conv_forward biases", biases, packed.rows)
        n = batch * positions
        tile, _ = self.tc_plan(packed.rows, n, packed.k, split=False)
        bm, bn, threads = _TC_TILES[tile]
        self._launch(f"conv_tc_{part}_{tile}", (_ceil_div(n, bn), _ceil_div(packed.rows, bm)),
                     (threads,), self._ptr(packed.data), packed.pitch, self._ptr(im), im_stride,
                     int(height), int(width), int(ksize), int(stride_y), int(stride_x), int(pad),
                     int(dilation), int(out_h), int(out_w), packed.rows, packed.k, n,
                     0 if biases is None else self._ptr(biases),
                     activations.ACTIVATION_IDS[activation], self._ptr(out), int(out_stride))

    # ---- convolution helpers -----------------------------------------------
    def _conv_args(self, src, channels, height, width, ksize, stride, pad, dilation, dst):
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        stride_y, stride_x = conv_strides(stride)
        return (self._ptr(src), int(channels), int(height), int(width), int(ksize), int(stride_y),
                int(stride_x), int(pad), int(dilation), int(out_h), int(out_w), self._ptr(dst))

    def im2col(self, im, channels, height, width, ksize, stride, pad, dilation, col,
               batch=1, im_stride=0):
        """Unfold images (`im_stride` apart; 0: packed) into col, laid out
        (channels*k*k) x batch x (out_h*out_w)."""
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        batch, im_stride = int(batch), int(im_stride) or channels * height * width
        self._check_size("im2col im", im, (batch - 1) * im_stride + channels * height * width)
        self._check_size("im2col col", col,
                         channels * ksize * ksize * batch * max(out_h, 0) * max(out_w, 0))
        if out_h > 0 and out_w > 0:
            # one thread per (channel, image, output position)
            self._launch_rows("im2col_kernel", channels * batch, out_h * out_w,
                              *self._conv_args(im, channels, height, width, ksize, stride, pad,
                                               dilation, col), batch, im_stride)

    def col2im(self, col, channels, height, width, ksize, stride, pad, dilation, im,
               batch=1, im_stride=0):
        """Fold col back, *adding* into the images (the adjoint of im2col)."""
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        batch, im_stride = int(batch), int(im_stride) or channels * height * width
        self._check_size("col2im im", im, (batch - 1) * im_stride + channels * height * width)
        self._check_size("col2im col", col,
                         channels * ksize * ksize * batch * max(out_h, 0) * max(out_w, 0))
        if out_h > 0 and out_w > 0:
            # one thread per image element: (channel, image) x pixels
            self._launch_rows("col2im_kernel", channels * batch, height * width,
                              *self._conv_args(col, channels, height, width, ksize, stride, pad,
                                               dilation, im), batch, im_stride)

    # ---- bias / scale (per-channel, layout batch x n x size) ----------------
    def add_bias(self, output, biases, batch, n, size):
        self._check_size("add_bias output", output, batch * n * size)
        self._check_size("add_bias biases", biases, n)
        self._launch_rows("add_bias", batch * n, size, self._ptr(output), self._ptr(biases),
                          int(batch * n), int(n), int(size))

    def scale_bias(self, output, scales, batch, n, size):
        self._check_size("scale_bias output", output, batch * n * size)
        self._check_size("scale_bias scales", scales, n)
        self._launch_rows("scale_bias", batch * n, size, self._ptr(output), self._ptr(scales),
                          int(batch * n), int(n), int(size))

    def _channel_reduce(self, term, a, b, mean, batch, filters, spatial, final_op, out,
                        variance=None, scales=None, sum_a=None):
        """out[f] <- final_op(sum over batch and space of term(a, b, mean) for channel f),
        the sum first multiplied by scales[f] when scales is given. sum_a = (final_op,
        out): the same for the sum of a alone, from the same pass over a."""
        batch, filters, spatial = int(batch), int(filters), int(spatial)
        if filters <= 0:
            return
        count = batch * spatial
        self._check_size("channel reduction input", a, batch * filters * spatial)
        if b is not None:
            self._check_size("channel reduction input", b, batch * filters * spatial)
        for arr in (out, variance, scales) + ((sum_a[1],) if sum_a else ()):
            if arr is not None:
                self._check_size("channel reduction per-channel array", arr, filters)
        if filters > _MAX_GRID_Y:
            raise ValueError(f"{filters} channels: at most {_MAX_GRID_Y}")
        # Enough blocks in all for 8 per SM (all 2048 threads resident: this pass is
        # bound by memory bandwidth), each with >= 4096 terms.
        parts = max(1, min(_ceil_div(8 * self.sm_count, filters), _ceil_div(count, 4096), 1024))
        plane = 8 * filters * parts
        partial = self._ptr(self._scratch_buffer("channels", 2 * plane))
        ptr = lambda arr: 0 if arr is None else self._ptr(arr)  # noqa: E731 (0: null)
        self._launch("channel_sums", (parts, filters), (_BLOCK,), self._ptr(a), ptr(b),
                     ptr(mean), term, batch, filters, spatial, parts, partial,
                     partial + plane if sum_a else 0)
        for final, destination, sums in ((final_op, out, partial),) + (
                ((sum_a[0], sum_a[1], partial + plane),) if sum_a else ()):
            self._launch("channel_finalize", (_ceil_div(filters, _BLOCK),), (_BLOCK,),
                         sums, parts, filters, final, count, ptr(variance), ptr(scales),
                         self._ptr(destination))

    def backward_bias(self, bias_updates, delta, batch, n, size):
        """bias_updates += sum of delta over batch and space."""
        self._channel_reduce(_TERM_A, delta, None, None, batch, n, size, _FINAL_ACCUMULATE,
                             bias_updates)

    def backward_scale(self, x_norm, delta, batch, n, size, scale_updates):
        self._channel_reduce(_TERM_A_TIMES_B, delta, x_norm, None, batch, n, size,
                             _FINAL_ACCUMULATE, scale_updates)

    def bias_scale_updates(self, delta, x_norm, batch, n, size, bias_updates, scale_updates):
        """backward_bias (unless bias_updates is None) and backward_scale in one pass."""
        self._channel_reduce(_TERM_A_TIMES_B, delta, x_norm, None, batch, n, size,
                             _FINAL_ACCUMULATE, scale_updates,
                             sum_a=None if bias_updates is None else (_FINAL_ACCUMULATE,
                                                                      bias_updates))

    # ---- batch normalisation ------------------------------------------------
    def mean(self, x, batch, filters, spatial, mean):
        self._channel_reduce(_TERM_A, x, None, None, batch, filters, spatial, _FINAL_MEAN, mean)

    def variance(self, x, mean, batch, filters, spatial, variance):
        self._check_size("variance mean", mean, filters)
        self._channel_reduce(_TERM_A_MINUS_MEAN_SQ, x, None, mean, batch, filters, spatial,
                             _FINAL_VARIANCE, variance)

    def normalize(self, x, mean, variance, batch, filters, spatial):
        self._check_size("normalize x", x, batch * filters * spatial)
        self._check_size("normalize mean", mean, filters)
        self._check_size("normalize variance", variance, filters)
        self._launch_rows("normalize_kernel", batch * filters, spatial, self._ptr(x), self._ptr(mean),
                          self._ptr(variance), int(batch * filters), int(filters), int(spatial))

    def normalize_sqrt_eps(self, x, mean, variance, batch, filters, spatial, eps):
        """x = (x - mean) / sqrt(variance + eps) per channel (the AlexeyAB fork's forward)."""
        self._check_size("normalize_sqrt_eps x", x, batch * filters * spatial)
        self._check_size("normalize_sqrt_eps mean", mean, filters)
        self._check_size("normalize_sqrt_eps variance", variance, filters)
        self._launch_rows("normalize_sqrt_eps_kernel", batch * filters, spatial, self._ptr(x),
                          self._ptr(mean), self._ptr(variance), int(batch * filters), int(filters),
                          int(spatial), float(eps))

    def batchnorm_apply(self, x, mean, variance, scales, biases, batch, filters, spatial, eps,
                        activation, x_norm):
        """NumpyBackend.batchnorm_apply in one pass (kernels/activations.cu)."""
        total = batch * filters * spatial
        self._check_size("batchnorm_apply x", x, total)
        for what, arr in (("mean", mean), ("variance", variance), ("scales", scales),
                          ("biases", biases)):
            self._check_size(f"batchnorm_apply {what}", arr, filters)
        if x_norm is not None:
            self._check_size("batchnorm_apply x_norm", x_norm, total)
        self._launch_rows("batchnorm_apply_kernel", batch * filters, spatial, self._ptr(x),
                          self._ptr(mean), self._ptr(variance), self._ptr(scales),
                          self._ptr(biases), int(batch * filters), int(filters), int(spatial),
                          -1.0 if eps is None else float(eps), self._activation_id(activation),
                          0 if x_norm is None else self._ptr(x_norm))

    def mean_delta(self, delta, variance, batch, filters, spatial, mean_delta):
        self._check_size("mean_delta variance", variance, filters)
        self._channel_reduce(_TERM_A, delta, None, None, batch, filters, spatial, _FINAL_MEAN_DELTA,
                             mean_delta, variance=variance)

    def variance_delta(self, x, delta, mean, variance, batch, filters, spatial, variance_delta):
        self._check_size("variance_delta mean", mean, filters)
        self._check_size("variance_delta variance", variance, filters)
        self._channel_reduce(_TERM_A_TIMES_B_MINUS_MEAN, delta, x, mean, batch, filters, spatial,
                             _FINAL_VARIANCE_DELTA, variance_delta, variance=variance)

    def _normalize_delta(self, x, mean, variance, mean_delta, variance_delta, scales,
                         batch, filters, spatial, delta, fork):
        for what, arr, need in (("x", x, batch * filters * spatial), ("delta", delta, batch * filters * spatial),
                                ("mean", mean, filters), ("variance", variance, filters),
                                ("mean_delta", mean_delta, filters), ("variance_delta", variance_delta, filters)):
            self._check_size(f"normalize_delta {what}", arr, need)
        self._launch_rows("normalize_delta_kernel", batch * filters, spatial,
                          self._ptr(x), self._ptr(mean), self._ptr(variance), self._ptr(mean_delta),
                          self._ptr(variance_delta), int(batch * filters), int(filters), int(spatial),
                          float(batch * spatial), 0 if scales is None else self._ptr(scales),
                          self._ptr(delta), int(bool(fork)))

    def normalize_delta(self, x, mean, variance, mean_delta, variance_delta,
                        batch, filters, spatial, delta, fork=False):
        self._normalize_delta(x, mean, variance, mean_delta, variance_delta, None,
                              batch, filters, spatial, delta, fork)

    def batchnorm_delta(self, x, mean, variance, scales, batch, filters, spatial, mean_delta,
                        variance_delta, delta, fork=False):
        """NumpyBackend.batchnorm_delta in two passes over delta instead of five: one
        reduction gives both sums of the unscaled delta (each then times the channel's
        scale), and normalize_delta scales delta as it reads it."""
        self._check_size("batchnorm_delta mean", mean, filters)
        self._channel_reduce(_TERM_A_TIMES_B_MINUS_MEAN, delta, x, mean, batch, filters, spatial,
                             _FINAL_VARIANCE_DELTA, variance_delta, variance=variance,
                             scales=scales, sum_a=(_FINAL_MEAN_DELTA, mean_delta))
        self._normalize_delta(x, mean, variance, mean_delta, variance_delta, scales,
                              batch, filters, spatial, delta, fork)

    # ---- activations ---------------------------------------------------------
    @staticmethod
    def _activation_id(activation):
        try:
            return activations.ACTIVATION_IDS[activation]
        except KeyError:
            raise ValueError(f"unknown activation '{activation}'") from None

    def activate(self, x, activation):
        act = self._activation_id(activation)
        if activation != "linear":
            self._launch("activate_array", self._grid1d(x.size), (_BLOCK,), self._ptr(x), x.size, act)

    def bias_activate(self, output, biases, batch, n, size, activation):
        """output = activation(output + biases per channel), in place, in one launch."""
        self._check_size("bias_activate output", output, batch * n * size)
        self._check_size("bias_activate biases", biases, n)
        self._launch_rows("bias_activate", batch * n, size, self._ptr(output), self._ptr(biases),
                          int(batch * n), int(n), int(size), self._activation_id(activation))

    def activate_strided(self, x, rows, row_stride, offset, width, activation):
        """Activate x[offset + r*row_stride : +width] for each r < rows, in one launch."""
        act = self._activation_id(activation)
        self._check_matrix("activate_strided", x, offset, rows, width, row_stride)
        if activation == "linear" or rows <= 0 or width <= 0:
            return
        self._launch_rows("activate_strided", rows, width, self._ptr(x) + 4 * int(offset),
                          int(rows), int(row_stride), int(width), act)

    def scale_add_strided(self, x, rows, row_stride, offset, width, scale, add):
        """x = x*scale + add over x[offset + r*row_stride : +width] for each r < rows."""
        self._check_matrix("scale_add_strided", x, offset, rows, width, row_stride)
        self._launch_rows("scale_add_strided", rows, width, self._ptr(x) + 4 * int(offset),
                          int(rows), int(row_stride), int(width), float(scale), float(add))

    def gradient(self, y, activation, delta):
        """delta *= activation'(.) computed from the output y."""
        act = self._activation_id(activation)
        if activation in activations.INPUT_GRADIENT:
            raise ValueError(f"the gradient of {activation} needs its input: gradient_from_input")
        self._sizes_match("gradient", y, delta)
        if activation != "linear":
            self._launch("gradient_array", self._grid1d(y.size), (_BLOCK,),
                         self._ptr(y), y.size, act, self._ptr(delta))

    def gradient_strided(self, y, rows, row_stride, offset, width, activation, delta):
        """delta *= activation'(y) over [offset + r*row_stride : +width] for each r < rows,
        in one launch."""
        act = self._activation_id(activation)
        if activation in activations.INPUT_GRADIENT:
            raise ValueError(f"the gradient of {activation} needs its input: gradient_from_input")
        for what, arr in (("y", y), ("delta", delta)):
            self._check_matrix(f"gradient_strided {what}", arr, offset, rows, width, row_stride)
        if activation == "linear" or rows <= 0 or width <= 0:
            return
        self._launch_rows("gradient_strided", rows, width, self._ptr(y) + 4 * int(offset),
                          int(rows), int(row_stride), int(width), act,
                          self._ptr(delta) + 4 * int(offset))

    def gradient_from_input(self, x, activation, delta):
        """delta *= activation'(x) from the input x (gelu, swish, mish, hard_mish)."""
        act = self._activation_id(activation)
        self._sizes_match("gradient_from_input", x, delta)
        self._launch("gradient_from_input_array", self._grid1d(x.size), (_BLOCK,),
                     self._ptr(x), x.size, act, self._ptr(delta))

    def _channel_kind(self, activation):
        try:
            return activations.CHANNEL_ACTIVATIONS.index(activation)
        except ValueError:
            raise ValueError(f"not a normalize_channels activation: '{activation}'") from None

    def normalize_channels(self, x, batch, channels, spatial, activation):
        """The fork's normalize_channels family in place on x (batch, channels, spatial)."""
        self._check_size("normalize_channels x", x, batch * channels * spatial)
        self._launch("normalize_channels_kernel", self._grid1d(batch * spatial), (_BLOCK,),
                     self._ptr(x), int(batch), int(channels), int(spatial),
                     self._channel_kind(activation))

    def normalize_channels_gradient(self, x, batch, channels, spatial, activation, delta):
        """delta <- its gradient through normalize_channels, from the input x."""
        for what, arr in (("x", x), ("delta", delta)):
            self._check_size(f"normalize_channels_gradient {what}", arr, batch * channels * spatial)
        self._launch("normalize_channels_gradient_kernel", self._grid1d(batch * spatial),
                     (_BLOCK,), self._ptr(x), int(batch), int(channels), int(spatial),
                     self._channel_kind(activation), self._ptr(delta))

    # ---- pooling -------------------------------------------------------------
    def maxpool_forward(self, x, batch, c, h, w, size, stride, padding, out, indexes):
        """Darknet maxpool; indexes (int32) get the flat argmax into x for backward, or are
        None in inference (the kernel then gets a null pointer and writes none)."""
        self.maxpool_forward_xy(x, batch, c, h, w, size, stride, stride, padding, out, indexes)

    def maxpool_forward_xy(self, x, batch, c, h, w, size, stride_x, stride_y, padding, out,
                           indexes):
        """maxpool_forward with the AlexeyAB fork's separate strides across and down."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        n_out = batch * c * out_h * out_w
        self._check_size("maxpool_forward x", x, batch * c * h * w)
        self._check_size("maxpool_forward out", out, n_out)
        if indexes is not None:
            if indexes.dtype != np.int32:
                raise TypeError("maxpool indexes must be an int32 array (backend.int_zeros)")
            self._check_size("maxpool_forward indexes", indexes, n_out)
        self._launch("maxpool_forward_kernel", self._grid1d(n_out), (_BLOCK,),
                     self._ptr(x), int(batch * c), int(h), int(w), int(size), int(stride_x),
                     int(stride_y), int(padding), int(out_h), int(out_w), self._ptr(out),
                     0 if indexes is None else self._ptr(indexes))

    def maxpool_backward(self, delta_out, indexes, n_out, delta_in):
        """delta_in[indexes[i]] += delta_out[i] for i < n_out."""
        if indexes.dtype != np.int32:
            raise TypeError("maxpool indexes must be an int32 array (backend.int_zeros)")
        self._check_size("maxpool_backward delta_out", delta_out, n_out)
        self._check_size("maxpool_backward indexes", indexes, n_out)
        self._launch("maxpool_backward_kernel", self._grid1d(n_out), (_BLOCK,),
                     self._ptr(delta_out), self._ptr(indexes), int(n_out), self._ptr(delta_in))

    def maxpool_depth_forward(self, x, batch, c, spatial, out_c, out, indexes):
        """The fork's maxpool_depth: the maximum over channels g, g+out_c, ... per position."""
        n_out = batch * out_c * spatial
        if indexes.dtype != np.int32:
            raise TypeError("maxpool indexes must be an int32 array (backend.int_zeros)")
        self._check_size("maxpool_depth x", x, batch * c * spatial)
        self._check_size("maxpool_depth out", out, n_out)
        self._check_size("maxpool_depth indexes", indexes, n_out)
        self._launch("maxpool_depth_kernel", self._grid1d(n_out), (_BLOCK,), self._ptr(x),
                     int(batch), int(c), int(spatial), int(out_c), self._ptr(out),
                     self._ptr(indexes))

    def local_avgpool(self, x, batch, c, h, w, size, stride_x, stride_y, padding, out,
                      forward=True):
        """The fork's [local_avgpool] (forward=False: its adjoint, added into x)."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        n_out = batch * c * out_h * out_w
        self._check_size("local_avgpool x", x, batch * c * h * w)
        self._check_size("local_avgpool out", out, n_out)
        self._launch("local_avgpool_forward_kernel" if forward else "local_avgpool_backward_kernel",
                     self._grid1d(n_out), (_BLOCK,), self._ptr(x), int(batch * c), int(h), int(w),
                     int(size), int(stride_x), int(stride_y), int(padding), int(out_h), int(out_w),
                     self._ptr(out))

    def avgpool_forward(self, x, batch, c, spatial, out):
        rows = batch * c
        self._check_size("avgpool_forward x", x, rows * spatial)
        self._check_size("avgpool_forward out", out, rows)
        self._launch("avgpool_forward_kernel", self._grid1d(32 * rows), (_BLOCK,),
                     self._ptr(x), int(rows), int(spatial), self._ptr(out))

    def avgpool_backward(self, delta_out, batch, c, spatial, delta_in):
        rows = batch * c
        self._check_size("avgpool_backward delta_out", delta_out, rows)
        self._check_size("avgpool_backward delta_in", delta_in, rows * spatial)
        self._launch("avgpool_backward_kernel", self._grid1d(rows * spatial), (_BLOCK,),
                     self._ptr(delta_out), int(rows), int(spatial), self._ptr(delta_in))

    # ---- softmax -------------------------------------------------------------
    def softmax(self, x, n, batch, batch_offset, groups, group_offset, stride, temp, out):
        """Darknet's softmax: batch*groups softmaxes of n elements spaced `stride` apart."""
        if n <= 0 or batch <= 0 or groups <= 0:
            return
        last = (batch - 1) * batch_offset + (groups - 1) * group_offset + (n - 1) * stride + 1
        self._check_size("softmax x", x, last)
        self._check_size("softmax out", out, last)
        self._launch("softmax_kernel", self._grid1d(32 * batch * groups), (_BLOCK,),
                     self._ptr(x), int(n), int(batch), int(batch_offset), int(groups),
                     int(group_offset), int(stride), float(temp), self._ptr(out))

    def softmax_tree(self, x, spatial, batch, stride, temp, group_offset, group_size, classes,
                     out):
        """A softmax over each group of a class tree of `classes` classes (see the NumPy
        backend); group_offset and group_size are int32 arrays (int_zeros)."""
        groups = group_size.size
        if group_offset.size != groups or group_offset.dtype != np.int32 \
                or group_size.dtype != np.int32:
            raise TypeError("softmax_tree groups must be two int32 arrays of one size")
        last = (batch - 1) * stride + spatial * classes
        self._check_size("softmax_tree x", x, last)
        self._check_size("softmax_tree out", out, last)
        self._launch("softmax_tree_kernel", self._grid1d(32 * batch * groups * spatial), (_BLOCK,),
                     self._ptr(x), int(spatial), int(batch), int(stride), float(temp),
                     self._ptr(group_offset), self._ptr(group_size), int(groups), self._ptr(out))

    def mask(self, x, truth, value):
        """x[i] = 0 wherever truth[i] == value."""
        self._check_size("mask truth", truth, x.size)
        self._launch("mask_kernel", self._grid1d(x.size), (_BLOCK,), x.size, self._ptr(x),
                     self._ptr(truth), float(value))

    def softmax_x_ent(self, pred, truth, delta, error):
        """Cross-entropy: error = -t*log(p) where t != 0; delta = t - p."""
        n = pred.size
        for what, arr in (("truth", truth), ("delta", delta), ("error", error)):
            self._check_size(f"softmax_x_ent {what}", arr, n)
        self._launch("softmax_x_ent_kernel", self._grid1d(n), (_BLOCK,), n, self._ptr(pred),
                     self._ptr(truth), self._ptr(delta), self._ptr(error))

    def l2(self, pred, truth, delta, error):
        """Sum-squared error: delta = t - p, error = (t - p)^2."""
        n = pred.size
        for what, arr in (("truth", truth), ("delta", delta), ("error", error)):
            self._check_size(f"l2 {what}", arr, n)
        self._launch("l2_kernel", self._grid1d(n), (_BLOCK,), n, self._ptr(pred),
                     self._ptr(truth), self._ptr(delta), self._ptr(error))

    def logistic_x_ent(self, pred, truth, delta, error):
        """Logistic cross-entropy: error = -t*log(p) - (1-t)*log(1-p); delta = t - p."""
        n = pred.size
        for what, arr in (("truth", truth), ("delta", delta), ("error", error)):
            self._check_size(f"logistic_x_ent {what}", arr, n)
        self._launch("logistic_x_ent_kernel", self._grid1d(n), (_BLOCK,), n, self._ptr(pred),
                     self._ptr(truth), self._ptr(delta), self._ptr(error))

    # ---- normalisations across channels ([l2norm], [lrn]) ----------------------------
    def l2normalize(self, x, batch, filters, spatial):
        self._check_size("l2normalize x", x, batch * filters * spatial)
        self._launch("l2normalize_kernel", self._grid1d(batch * spatial), (_BLOCK,),
                     self._ptr(x), int(batch), int(filters), int(spatial))

    def lrn_forward(self, x, batch, c, spatial, size, alpha, beta, kappa, norms, out):
        n = batch * c * spatial
        for what, arr in (("x", x), ("norms", norms), ("out", out)):
            self._check_size(f"lrn_forward {what}", arr, n)
        self._launch("lrn_forward_kernel", self._grid1d(batch * spatial), (_BLOCK,),
                     self._ptr(x), int(batch), int(c), int(spatial), int(size), float(alpha),
                     float(beta), float(kappa), self._ptr(norms), self._ptr(out))

    def lrn_backward(self, norms, delta, beta, delta_in):
        n = norms.size
        for what, arr in (("delta", delta), ("delta_in", delta_in)):
            self._check_size(f"lrn_backward {what}", arr, n)
        self._launch("lrn_backward_kernel", self._grid1d(n), (_BLOCK,), n, self._ptr(norms),
                     self._ptr(delta), float(beta), self._ptr(delta_in))

    # ---- binary convolutions (binary=1, xnor=1) ---------------------------------------
    def binarize_weights(self, weights, n, size, binary):
        for what, arr in (("weights", weights), ("binary", binary)):
            self._check_size(f"binarize_weights {what}", arr, n * size)
        self._launch("binarize_weights_kernel", self._grid1d(n, 64), (64,), self._ptr(weights),
                     int(n), int(size), self._ptr(binary))

    def binarize(self, x, binary):
        n = x.size
        self._check_size("binarize binary", binary, n)
        self._launch("binarize_kernel", self._grid1d(n), (_BLOCK,), n, self._ptr(x),
                     self._ptr(binary))

    # ---- detection losses --------------------------------------------------------
    def yolo_loss(self, spec, output, truth, delta, scalars):
        """The [yolo] head's training loss (kernels/yolo_loss.cu; losses/yolo.py is the
        reference): writes the whole delta and the yolo_loss.SCALARS into scalars, queued
        on the stream (no host sync)."""
        wh = spec.w * spec.h
        size = spec.batch * spec.n * (5 + spec.classes) * wh
        self._check_size("yolo_loss output", output, size)
        self._check_size("yolo_loss delta", delta, size)
        self._check_size("yolo_loss scalars", scalars, len(SCALARS))
        if truth.size % spec.batch:
            raise ValueError(f"yolo_loss truth: {truth.size} values for {spec.batch} images")
        args = self._ptr(self._yolo_loss_args(spec, truth.size // spec.batch))
        blocks = _ceil_div(spec.n * wh, _BLOCK)
        parts = blocks * spec.batch
        scratch = self._ptr(self._scratch_buffer("yolo_loss", 8 * (3 * parts
                                                                   + _YOLO_STATS * spec.batch)))
        stats = scratch + 8 * 3 * parts
        out, tr, d = self._ptr(output), self._ptr(truth), self._ptr(delta)
        self._launch("yolo_predictions", (blocks, spec.batch), (_BLOCK,), args, out, tr, d)
        self._launch("yolo_truths", (spec.batch,), (32,), args, out, tr, d, stats)
        self._launch("yolo_finish", (blocks, spec.batch), (_BLOCK,), args, out, d, scratch)
        self._launch("yolo_reduce", (1,), (_BLOCK,), args, scratch, parts, stats,
                     self._ptr(scalars))

    def _yolo_loss_args(self, spec, truth_stride):
        """The kernels' YoloArgs for spec on the device: uploaded once per distinct spec
        (a new input size brings a new one), so a training step copies nothing."""
        extra_anchors = spec.fork and spec.iou_thresh < 1
        ints = [spec.batch, spec.n, spec.classes, spec.h, spec.w, spec.total, spec.netw,
                spec.neth, spec.truth_fields, truth_stride, spec.max_boxes, spec.fork,
                spec.new_coords, IOU_LOSSES.index(spec.iou_loss),
                IOU_LOSSES.index(spec.iou_thresh_kind), spec.objectness_smooth,
                spec.class_multipliers is not None, spec.max_delta != FLT_MAX, extra_anchors]
        floats = [spec.ignore_thresh, spec.truth_thresh, spec.iou_normalizer,
                  spec.obj_normalizer, spec.cls_normalizer, spec.max_delta, spec.iou_thresh,
                  spec.smoothed(1), spec.smoothed(0)]
        multipliers = () if spec.class_multipliers is None else spec.class_multipliers
        words = np.concatenate([np.array(ints, dtype=np.int32).view(np.uint32),
                                np.array(floats, dtype=np.float32).view(np.uint32),
                                np.asarray(spec.biases, dtype=np.float32).view(np.uint32),
                                np.array(spec.mask, dtype=np.int32).view(np.uint32),
                                np.asarray(multipliers, dtype=np.float32).view(np.uint32)])
        key = words.tobytes()
        arr = self._yolo_args.get(key)
        if arr is None:
            arr = self._yolo_args[key] = self._new(words.size, np.uint32)
            drv.memcpy_htod_async(self._ptr(arr), words, self.stream)
        return arr

    # ---- shape ops -------------------------------------------------------------
    def upsample(self, x, w, h, c, batch, stride, forward, scale, out):
        """forward: out = scale * nearest(x); backward: x += scale * cell sums of out."""
        planes = batch * c
        self._check_size("upsample x", x, planes * h * w)
        self._check_size("upsample out", out, planes * h * w * stride * stride)
        if forward:
            self._launch("upsample_forward_kernel", self._grid1d(planes * h * w * stride * stride),
                         (_BLOCK,), self._ptr(x), int(planes), int(h), int(w), int(stride),
                         float(scale), self._ptr(out))
        else:
            self._launch("upsample_backward_kernel", self._grid1d(planes * h * w), (_BLOCK,),
                         self._ptr(x), int(planes), int(h), int(w), int(stride), float(scale),
                         self._ptr(out))

    def reorg(self, x, w, h, c, batch, stride, forward, out):
        """Darknet's reorg_cpu index mapping (its 'forward' flag is reversed in the layer)."""
        total = batch * c * h * w
        self._check_size("reorg x", x, total)
        self._check_size("reorg out", out, total)
        self._launch("reorg_kernel", self._grid1d(total), (_BLOCK,), self._ptr(x), int(w), int(h),
                     int(c), int(batch), int(stride), int(bool(forward)), self._ptr(out))

    def shortcut(self, batch, w1, h1, c1, add, w2, h2, c2, s1, s2, out):
        """Darknet's shortcut: out = s1*out + s2*add over the common shape."""
        stride = max(1, w1 // w2)
        sample = max(1, w2 // w1)
        minw, minh, minc = min(w1, w2), min(h1, h2), min(c1, c2)
        self._check_size("shortcut add", add, batch * c1 * h1 * w1)
        self._check_size("shortcut out", out, batch * c2 * h2 * w2)
        self._launch("shortcut_kernel", self._grid1d(batch * minc * minh * minw), (_BLOCK,),
                     int(batch), int(minw), int(minh), int(minc), int(stride), int(sample),
                     self._ptr(add), int(w1), int(h1), int(c1), self._ptr(out), int(w2), int(h2),
                     int(c2), float(s1), float(s2))

    def scale_channels(self, scale, src, batch, channels, spatial, scale_wh, out):
        """The fork's [scale_channels]: out = scale (per channel, or per position) * src."""
        n = batch * channels * spatial
        self._check_size("scale_channels scale", scale, batch * (spatial if scale_wh else channels))
        self._check_size("scale_channels src", src, n)
        self._check_size("scale_channels out", out, n)
        self._launch("scale_channels_kernel", self._grid1d(n), (_BLOCK,), self._ptr(scale),
                     self._ptr(src), int(batch), int(channels), int(spatial), int(bool(scale_wh)),
                     self._ptr(out))

    def scale_channels_backward(self, scale, src, delta, batch, channels, spatial, scale_wh,
                                scale_delta, src_delta):
        """The adjoint of scale_channels, added into scale_delta and src_delta (either may be
        None)."""
        n = batch * channels * spatial
        shape = (int(batch), int(channels), int(spatial), int(bool(scale_wh)))
        if src_delta is not None:
            self._check_size("scale_channels_backward src_delta", src_delta, n)
            self._launch("scale_channels_src_delta_kernel", self._grid1d(n), (_BLOCK,),
                         self._ptr(scale), self._ptr(delta), *shape, self._ptr(src_delta))
        if scale_delta is not None:
            m = batch * (spatial if scale_wh else channels)
            self._check_size("scale_channels_backward scale_delta", scale_delta, m)
            self._launch("scale_channels_scale_delta_kernel", self._grid1d(32 * m), (_BLOCK,),
                         self._ptr(src), self._ptr(delta), *shape, self._ptr(scale_delta))

    _NORMALIZATIONS = ("none", "relu", "softmax")

    def shortcut_weights(self, weights, inputs, channels, normalization, out):
        """The fork's weighted-shortcut weights normalised over the inputs per channel."""
        self._check_size("shortcut_weights weights", weights, inputs * channels)
        self._check_size("shortcut_weights out", out, inputs * channels)
        self._launch("shortcut_weights_kernel", self._grid1d(channels), (_BLOCK,),
                     self._ptr(weights), int(inputs), int(channels),
                     self._NORMALIZATIONS.index(normalization), self._ptr(out))

    def channel_weighted_add(self, src, src_stride, weights, step, width, batch, out,
                             out_stride):
        """out[b*out_stride + j] += weights[j // step] * src[b*src_stride + j], j < width."""
        self._check_matrix("channel_weighted_add src", src, 0, batch, width, src_stride)
        self._check_matrix("channel_weighted_add out", out, 0, batch, width, out_stride)
        self._check_size("channel_weighted_add weights", weights, _ceil_div(width, step))
        self._launch_rows("channel_weighted_add_kernel", batch, width, self._ptr(src),
                          int(src_stride), self._ptr(weights), int(step), int(width), int(batch),
                          self._ptr(out), int(out_stride))

    def channel_weighted_dot(self, a, a_stride, b, b_stride, step, width, batch, out):
        """out[c] += sum over images and j < width with j // step == c of a[.. j] * b[.. j]."""
        self._check_matrix("channel_weighted_dot a", a, 0, batch, width, a_stride)
        self._check_matrix("channel_weighted_dot b", b, 0, batch, width, b_stride)
        channels = _ceil_div(width, step)
        self._check_size("channel_weighted_dot out", out, channels)
        self._launch("channel_weighted_dot_kernel", (channels,), (_BLOCK,), self._ptr(a),
                     int(a_stride), self._ptr(b), int(b_stride), int(step), int(width), int(batch),
                     self._ptr(out))

    # ---- random ----------------------------------------------------------------
    def dropout(self, x, prob, scale, rand, step_seed, layer_seed):
        """Training dropout with draws.uniform_hash(seed, i) as the draw, seed =
        step_seed[0] + layer_seed mod 2^32 (step_seed: a one-element int array, read on
        the device)."""
        self._sizes_match("dropout", x, rand)
        if step_seed.dtype != np.int32:
            raise TypeError("dropout step_seed must be an int32 array (backend.int_zeros)")
        self._launch("dropout_forward_kernel", self._grid1d(rand.size), (_BLOCK,),
                     self._ptr(x), rand.size, float(prob), float(scale), self._ptr(step_seed),
                     int(layer_seed) & 0xFFFFFFFF, self._ptr(rand))

    def dropout_backward(self, rand, prob, scale, delta):
        self._sizes_match("dropout_backward", rand, delta)
        self._launch("dropout_backward_kernel", self._grid1d(rand.size), (_BLOCK,),
                     self._ptr(rand), rand.size, float(prob), float(scale), self._ptr(delta))

    def uniform(self, rand, seed):
        """rand[i] = draws.uniform_hash(seed, i)."""
        self._launch("uniform_kernel", self._grid1d(rand.size), (_BLOCK,), self._ptr(rand),
                     rand.size, (int(seed) * 0x9E3779B9) & 0xFFFFFFFF)

    # ---- detection losses ------------------------------------------------------------
    def region_loss(self, head, output, truth, truth_size, anchors, seen, delta, scalars,
                    classes=None):
        """[region]'s training loss (losses/region.py) for head (a RegionHead): every element
        of delta; the cost and statistics in scalars (region_loss.REGION_SCALARS). classes:
        the layer's RegionClasses (map= and tree=) or None."""
        batch, cells = head.batch, head.batch * head.n * head.h * head.w
        wh = head.h * head.w
        total = cells * head.entries
        for what, arr, need in (("output", output, total), ("delta", delta, total),
                                ("anchors", anchors, 2 * head.n),
                                ("scalars", scalars, len(REGION_SCALARS))):
            self._check_size(f"region_loss {what}", arr, need)
        truth_stride = truth.size // batch
        boxes = (self._ptr(output), self._ptr(truth), truth_stride, int(truth_size),
                 min(REGION_TRUTHS, truth_stride // truth_size), self._ptr(anchors), batch,
                 head.n, head.h, head.w, head.classes)
        self._launch("region_cells", self._grid1d(cells), (_BLOCK,), *boxes,
                     float(head.thresh), float(head.noobject_scale), int(seen < PRIOR_SEEN),
                     self._ptr(delta))
        stats = self._scratch_buffer("loss_stats", 8 * _LOSS_IMAGE_STATS * batch)
        self._launch("region_truths", (_ceil_div(batch, _IMAGE_THREADS),), (_IMAGE_THREADS,),
                     *boxes, int(head.softmax), int(head.bias_match), int(head.rescore),
                     float(head.coord_scale), float(head.object_scale), float(head.class_scale),
                     *self._region_class_pointers(classes), self._ptr(delta), stats.ptr)
        self._loss_figures(output, delta, total, head.entries * wh, 4 * wh, wh, stats, batch,
                           scalars)

    def _region_class_pointers(self, classes):
        """region_truths' class_map, parent, group, group_offset, group_size (null for
        what the layer lacks)."""
        tree = classes.tree if classes is not None else None
        arrays = [classes.class_map if classes is not None else None]
        arrays += [tree.parent, tree.group, tree.offset, tree.size] if tree else [None] * 4
        for arr in arrays:
            if arr is not None and arr.dtype != np.int32:
                raise TypeError("region_loss class arrays must be int32 (int_zeros)")
        return [0 if a is None else self._ptr(a) for a in arrays]  # 0: a null pointer

    def detection_grid_truth(self, truth, batch, truth_size, max_boxes, side, classes, grid):
        """[detection]'s grid truth from box rows (losses/detection.py): every element of grid."""
        cells = batch * side * side
        self._check_size("detection_grid_truth grid", grid, cells * (5 + classes))
        truth_stride = truth.size // batch
        self._launch("detection_grid", self._grid1d(cells), (_BLOCK,), self._ptr(truth),
                     truth_stride, int(truth_size), min(int(max_boxes), truth_stride // truth_size),
                     int(batch), int(side), int(classes), self._ptr(grid))

    def detection_loss(self, head, output, grid, draws, delta, scalars):
        """[detection]'s training loss (losses/detection.py) for head (a DetectionHead): every
        element of delta; the cost and statistics in scalars (DETECTION_SCALARS)."""
        batch, loc = head.batch, head.side * head.side
        total = batch * head.outputs
        for what, arr, need in (("output", output, total), ("delta", delta, total),
                                ("grid", grid, batch * loc * head.cell_truth),
                                ("draws", draws, batch * loc if draws is not None else 0),
                                ("scalars", scalars, len(DETECTION_SCALARS))):
            if arr is not None:
                self._check_size(f"detection_loss {what}", arr, need)
        p_begin, p_end = loc * head.classes, loc * (head.classes + head.n)
        self._launch("detection_base", self._grid1d(total), (_BLOCK,), self._ptr(output), total,
                     head.outputs, p_begin, p_end, float(head.noobject_scale), self._ptr(delta))
        stats = self._scratch_buffer("loss_stats", 8 * _LOSS_IMAGE_STATS * batch)
        self._launch("detection_objects", (_ceil_div(batch, _IMAGE_THREADS),), (_IMAGE_THREADS,),
                     self._ptr(output), self._ptr(grid), 0 if draws is None else self._ptr(draws),
                     batch, head.side, head.n, head.classes, int(head.sqrt), int(head.rescore),
                     int(head.forced), float(head.coord_scale), float(head.object_scale),
                     float(head.class_scale), self._ptr(delta), stats.ptr)
        self._loss_figures(output, delta, total, head.outputs, p_begin, p_end - p_begin, stats,
                           batch, scalars)

    def _loss_figures(self, output, delta, total, period, offset, width, stats, batch, scalars):
        """scalars = cost (sum of delta^2), the per-image stats summed, the objectness sum
        (output[i] where i % period lies in [offset, offset + width)): fixed-order sums,
        so repeated steps give the same bits."""
        blocks = self._grid1d(total)[0]
        partial = self._scratch_buffer("loss_partial", 16 * blocks)
        self._launch("loss_sums", (blocks,), (_BLOCK,), self._ptr(delta), self._ptr(output),
                     total, period, offset, width, partial.ptr)
        self._launch("loss_final", (1,), (_BLOCK,), partial.ptr, blocks, stats.ptr, batch,
                     _LOSS_IMAGE_STATS, self._ptr(scalars))
