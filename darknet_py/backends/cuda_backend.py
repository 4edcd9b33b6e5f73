"""The CUDA backend: NumpyBackend's ops as hand-written kernels (ops/*/*.cu) via PyCUDA.

Arrays are 1-D float32 ``DeviceArray``s (int32 for maxpool indexes): a pointer
into a pool allocation and a length. A flat slice ``a[i:j]`` is a view, and kernels
get raw pointers, so views work everywhere. Every op is asynchronous on the backend's one
stream except those that hand data to the host (to_host, sum, synchronize).

The ops live in one mixin per family, each family's kernel files named beside its launchers:
cuda_core here (device, arrays, launches, sync, copies, graph capture), and in the
families' folders ops/<family>/: convolution/cuda.py (GEMMs, tensor-core convolution,
im2col/col2im), convolution/cuda_backward.py (the convolution backward as implicit GEMMs),
convolution/nhwc.py (the channels-last 16-bit forward on Hopper: wgmma fed by TMA im2col),
normalization/cuda.py (bias/scale, batch norm, channel reductions, l2norm, lrn),
elementwise/cuda.py (vector ops, activations, shape ops, dropout), pooling/cuda.py,
losses/cuda.py (softmax, costs, yolo/region/detection losses), images/cuda.py (photos
uploaded as uint8, letterboxed on the device), optimizers/cuda.py (Adam's and SGD's
updates, fp16's loss scaler), nhwc/cuda.py (the NHWC 16-bit layer outputs' ops).

Design:
  * The device's primary context is retained and pushed at start, popped at exit.
  * One stream, one thread; one DeviceMemoryPool for every array and scratch buffer.
  * The ops/*/*.cu files come prebuilt in the wheel (prebuilt.py) for the common
    architectures; otherwise nvcc compiles them in parallel on a first start and their
    cubins are cached on disk (kernel_cache.py); later starts load them from there. Kernels
    are launched with prepared_async_call.
  * A failed launch raises CudaError naming the kernel and its grid/block. Errors
    that surface later (a kernel's illegal access shows at the next sync) name the
    recent launches; DARKNET_CUDA_SYNC=1 synchronizes after every launch to pin
    them to one kernel.
  * Running out of device memory raises DeviceOutOfMemory.

This module imports PyCUDA at the top on purpose (through cuda_core): backends.get_backend
imports it only when a CUDA device is asked for and turns the ImportError into a clear
message.
"""

import collections
import os

import numpy as np

# Names other modules import from here: CudaBackend, DeviceArray, CudaError, and for the
# benches _TC_TILES, _KERNELS, _KERNEL_OPTIONS.
from ..ops.convolution.cuda import _TC_TILES, CudaConv  # noqa: F401
from ..ops.convolution.cuda import KERNEL_FILES as _CONV_FILES
from ..ops.convolution.cuda_backward import KERNEL_FILES as _CONV_BACKWARD_FILES
from ..ops.convolution.cuda_backward import CudaConvBackward
from ..ops.convolution.nhwc import CudaConvNhwc
from ..ops.elementwise.cuda import KERNEL_FILES as _ELEMENTWISE_FILES
from ..ops.elementwise.cuda import CudaElementwise
from ..ops.images.cuda import KERNEL_FILES as _IMAGE_FILES
from ..ops.images.cuda import CudaImages
from ..ops.losses.cuda import KERNEL_FILES as _LOSS_FILES
from ..ops.losses.cuda import CudaLosses
from ..ops.nhwc.cuda import KERNEL_FILES as _NHWC_FILES
from ..ops.nhwc.cuda import CudaNhwc
from ..ops.normalization.cuda import KERNEL_FILES as _NORM_FILES
from ..ops.normalization.cuda import CudaNorm
from ..ops.optimizers.cuda import KERNEL_FILES as _OPTIMIZER_FILES
from ..ops.optimizers.cuda import CudaOptimizerOps
from ..ops.pooling.cuda import KERNEL_FILES as _POOLING_FILES
from ..ops.pooling.cuda import CudaPooling
from . import kernel_signatures
from .cuda_core import (  # noqa: F401
    _KERNEL_OPTIONS,
    CudaCore,
    CudaError,
    DeviceArray,
    _Device,
)

# {kernel file: {entry point: argument format}} of the files the families launch from, each
# format read from the kernel's declaration (kernel_signatures): a launch names its kernel
# and passes its arguments, nothing else.
_KERNELS = kernel_signatures.kernel_table(
    _CONV_FILES
    + _CONV_BACKWARD_FILES
    + _NORM_FILES
    + _ELEMENTWISE_FILES
    + _POOLING_FILES
    + _LOSS_FILES
    + _IMAGE_FILES
    + _OPTIMIZER_FILES
    + _NHWC_FILES
)


class CudaBackend(
    CudaCore,
    CudaConv,
    CudaConvBackward,
    CudaConvNhwc,
    CudaNorm,
    CudaElementwise,
    CudaPooling,
    CudaLosses,
    CudaImages,
    CudaOptimizerOps,
    CudaNhwc,
):
    """NumpyBackend's op contract on one CUDA device (float32)."""

    name = "cuda"
    dtype = np.dtype(np.float32)

    def __init__(self, device_index=0, seed=0):
        self._dev = _Device.get(int(device_index), _KERNELS)
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
        self._yolo_args = {}  # packed YoloArgs bytes -> their device copy
        self._max_blocks = self.sm_count * 8  # one full wave of 256-thread blocks
        # Forced gemm plan (tile name, splits) for benchmarks and tests; None = heuristic.
        self.gemm_override = None
        # Forced tensor-core plan (tile name, splits) for benchmarks and tests; None = heuristic.
        self.tc_override = None
        self._copy_stream = None  # uploads' stream, made at the first upload_async
        self._transfers = self._dev.transfers
        # While a graph is being captured: every array allocated (or scratch buffer
        # replaced) meanwhile, kept alive with the graph, whose kernels hold their addresses.
        self._capture_keep = None
