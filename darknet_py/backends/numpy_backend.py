"""The NumPy backend: the reference implementation of every op a layer uses.

Contract shared with the CUDA backend (backends/cuda_backend.py):
  * Every array is 1-D and contiguous (NumPy ndarray here, GPUArray there);
    a flat slice ``a[i:j]`` is a view on both. Layers keep their shapes as ints.
  * Ops work in place on the arrays they are given and return nothing,
    unless documented otherwise. Names and arguments follow Darknet's
    blas.h / im2col.h / gemm.h so a Darknet reader finds their way.
  * ``delta`` arrays hold Darknet's delta: minus the gradient of the loss.
  * Where Darknet's numbers depend on its order of operations or on a quirk of its CPU code
    (lrn_forward's running window sum, binarize's ``> 0``, logistic_x_ent without an
    epsilon), the op's docstring here says so and both backends follow it.
  * On the CPU, GEMMs (in fixed tiles of single-threaded BLAS calls, so that their bits do
    not depend on the thread count) and the element-wise and copy work of inference
    (im2col, bias + activation, maxpool) are split over the cores by cpu_threads.parallel.
"""

import time

import numpy as np

from .. import precision as precisions
from ..ops.common.numpy import one_storage
from ..ops.convolution.nhwc_numpy import NumpyConvNhwc
from ..ops.convolution.numpy import NumpyConv, NumpyConvBackward
from ..ops.elementwise.numpy import NumpyElementwise
from ..ops.images.numpy import NumpyImages
from ..ops.losses.numpy import NumpyLosses
from ..ops.nhwc.numpy import NumpyNhwc
from ..ops.normalization.numpy import NumpyNorm
from ..ops.optimizers.numpy import NumpyOptimizerOps
from ..ops.pooling.numpy import NumpyPooling
from .pinning import unpin_nothing


class NumpyBackend(
    NumpyConv,
    NumpyConvBackward,
    NumpyConvNhwc,
    NumpyNorm,
    NumpyElementwise,
    NumpyPooling,
    NumpyLosses,
    NumpyImages,
    NumpyOptimizerOps,
    NumpyNhwc,
):
    """The backend core (arrays, copies, transfers, capture, timing) here; the ops in
    their families' mixins, ops/<family>/numpy.py, as CudaBackend's in ops/<family>/cuda.py."""

    name = "cpu"

    def __init__(self, dtype=np.float32, seed=0):
        # dtype=float64 is used by the gradient-check tests.
        self.dtype = np.dtype(dtype)
        self.rng = np.random.default_rng(seed)

    def zeros(self, n):
        return np.zeros(int(n), dtype=self.dtype)

    def empty(self, n):
        return np.empty(int(n), dtype=self.dtype)

    def int_zeros(self, n):
        """An integer array (maxpool argmax indexes); int32 on the GPU."""
        return np.zeros(int(n), dtype=np.int64)

    def from_host(self, host):
        """A new backend array holding a copy of `host` (flattened)."""
        return np.array(host, dtype=self.dtype).reshape(-1)

    def to_host(self, arr):
        """A NumPy copy of `arr` (an integer array stays integer: int64)."""
        return np.array(arr, dtype=self.dtype if arr.dtype.kind == "f" else np.int64)

    def download_async(self, arr, out):
        """Start copying `arr` into host array `out` (contiguous, arr.size elements of
        arr's dtype) after the work queued so far; finish_download(the returned handle)
        returns once out holds the values. Here the copy is made at once."""
        if out.size != arr.size or out.dtype != arr.dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"download_async: {out.size} {out.dtype} for an array of {arr.size} {arr.dtype}"
            )
        out.reshape(-1)[...] = arr.reshape(-1)

    def finish_download(self, download):
        """Return once the download_async `download` has filled its host array."""

    def upload_from(self, arr, host):
        """Queue the copy of host array `host` (contiguous, arr.size elements of arr's
        dtype, page-locked by pin() on a GPU) into `arr`, reading `host` when the copy runs:
        a graph captured around it reads the host memory's values at each replay."""
        arr[...] = host.reshape(-1)

    def download_into(self, arr, out):
        """Queue the copy of `arr` into host array `out` (contiguous, arr.size elements of
        arr's dtype, page-locked by pin() on a GPU); it has landed once the work queued so
        far is done (synchronize). A graph captured around it replays the copy."""
        out.reshape(-1)[...] = arr

    def write(self, arr, host):
        """Copy host data (any shape, arr.size elements) into an existing array (cast to
        the array's dtype: an int_zeros array stays integer)."""
        arr[...] = np.asarray(host, dtype=arr.dtype).reshape(-1)

    # Asynchronous uploads: the CUDA backend copies a coming batch on a copy stream while
    # the current one computes. Here the CPU reads host memory itself: nothing to pin, and
    # an "upload" is the host array, copied once where the network takes its input.
    def pin(self, host):
        """Page-lock the memory of host array `host` so uploads from it run asynchronously
        at full speed; returns a function that unpins it (call it before the memory goes)."""
        return unpin_nothing

    def upload_async(self, host):
        """(array, upload): a backend array that receives host's values (flattened), and
        the upload filling it, which starts after the work queued so far. Ops queued after
        wait_upload(upload) see the values; `host` must stay unchanged until
        finish_upload(upload) returns. Here the array is a view of `host`, not a copy."""
        return np.asarray(host, dtype=self.dtype).reshape(-1), None

    def wait_upload(self, upload):
        """Ops queued from now on run after `upload` has landed (no wait on the host)."""

    def finish_upload(self, upload):
        """Return once `upload` has read its host memory (which may then change)."""

    def synchronize(self):
        pass

    def capture(self, fn):
        """A callable doing fn's work at each call. The CUDA backend records fn's kernels
        once as a graph and replays them; here there is nothing to record, so fn runs each
        time. Either way fn must queue the same work whenever it runs, and what it does on
        the host (Python state) happens once on the GPU, at capture."""
        return fn

    def timer(self):
        """A stopwatch for benchmarks: start(), then stop() returns the seconds between,
        all queued work included (the wall clock here; CUDA events on the GPU)."""
        return _WallTimer()

    @property
    def peak_allocated_bytes(self):
        """Peak bytes of device memory; None: the NumPy backend has no device memory."""
        return None

    def reset_peak_allocated(self):
        """Start peak_allocated_bytes again from the bytes live now: nothing to do here."""

    def fill(self, arr, value):
        """Every element set to value (a 16-bit StoredArray: value rounded to its storage)."""
        kept = self.storage_of(arr)
        arr.fill(
            value
            if kept == precisions.DEFAULT
            else precisions.round_to(np.float32([value]), kept)[0]
        )

    def copy(self, src, dst):
        """dst <- src, arrays of one storage (storage_of; ValueError naming both otherwise, as
        the CUDA backend's byte copy): into a 16-bit StoredArray the values stored rounded
        (already so when src is one; copy_rounded rounds fp32 values into one)."""
        kept = one_storage("copy", self.storage_of, src=src, dst=dst)
        _store(dst, src, kept)


class _WallTimer:
    def start(self):
        self._t0 = time.perf_counter()

    def stop(self):
        return time.perf_counter() - self._t0


def _store(dst, values, kept):
    """dst[...] = values, rounded to kept (storage_of dst) when 16-bit."""
    if kept == precisions.DEFAULT:
        dst[...] = values
    else:
        dst[...] = precisions.round_to(np.asarray(values), kept).reshape(np.shape(dst))
