"""The pooling ops on the device: maxpool (Darknet's, the fork's separate strides and
maxpool_depth), local and global average pooling (pooling.cu). A mixin of CudaBackend."""

import numpy as np

from ...backends.cuda_core import _BLOCK
from ..common.numpy import one_storage
from ..elementwise.cuda import _STORAGE_SUFFIX

# The kernel file this family launches from (formats from its declarations,
# backends/kernel_signatures.py).
KERNEL_FILES = ("pooling.cu",)


class CudaPooling:
    """CudaBackend's pooling ops."""

    def maxpool_forward(self, x, batch, c, h, w, size, stride, padding, out, indexes):
        """Darknet maxpool; indexes (int32) get the flat argmax into x for backward, or are
        None in inference (the kernel then gets a null pointer and writes none)."""
        self.maxpool_forward_xy(x, batch, c, h, w, size, stride, stride, padding, out, indexes)

    def maxpool_forward_xy(
        self, x, batch, c, h, w, size, stride_x, stride_y, padding, out, indexes
    ):
        """maxpool_forward with the AlexeyAB fork's separate strides across and down. x and
        out of one storage (fp32, or both 16-bit: the winner's bits copied)."""
        suffix = _STORAGE_SUFFIX[one_storage("maxpool_forward", self.storage_of, x=x, out=out)]
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        n_out = batch * c * out_h * out_w
        self._check_size("maxpool_forward x", x, batch * c * h * w)
        self._check_size("maxpool_forward out", out, n_out)
        if indexes is not None:
            if indexes.dtype != np.int32:
                raise TypeError("maxpool indexes must be an int32 array (backend.int_zeros)")
            self._check_size("maxpool_forward indexes", indexes, n_out)
        self._launch(
            "maxpool_forward_kernel" + suffix,
            self._grid1d(n_out),
            (_BLOCK,),
            self._ptr(x),
            int(batch * c),
            int(h),
            int(w),
            int(size),
            int(stride_x),
            int(stride_y),
            int(padding),
            int(out_h),
            int(out_w),
            self._ptr(out),
            0 if indexes is None else self._ptr(indexes),
        )

    def maxpool_backward(self, delta_out, indexes, n_out, delta_in):
        """delta_in[indexes[i]] += delta_out[i] for i < n_out."""
        if indexes.dtype != np.int32:
            raise TypeError("maxpool indexes must be an int32 array (backend.int_zeros)")
        self._check_size("maxpool_backward delta_out", delta_out, n_out)
        self._check_size("maxpool_backward indexes", indexes, n_out)
        self._launch(
            "maxpool_backward_kernel",
            self._grid1d(n_out),
            (_BLOCK,),
            self._ptr(delta_out),
            self._ptr(indexes),
            int(n_out),
            self._ptr(delta_in),
        )

    def maxpool_backward_xy(
        self, delta_out, indexes, batch, c, h, w, size, stride_x, stride_y, padding, delta_in
    ):
        """maxpool_backward of a spatial maxpool, deterministic: where windows overlap each
        input cell gathers its windows' deltas in output order (the same floats as adding
        in that order); where they do not, no two outputs route to one cell and the scatter
        (four times fewer threads and bytes) adds once per cell."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        if size <= stride_x and size <= stride_y:
            self.maxpool_backward(delta_out, indexes, batch * c * out_h * out_w, delta_in)
            return
        if indexes.dtype != np.int32:
            raise TypeError("maxpool indexes must be an int32 array (backend.int_zeros)")
        self._check_size("maxpool_backward delta_out", delta_out, batch * c * out_h * out_w)
        self._check_size("maxpool_backward indexes", indexes, batch * c * out_h * out_w)
        self._check_size("maxpool_backward delta_in", delta_in, batch * c * h * w)
        self._launch(
            "maxpool_backward_gather_kernel",
            self._grid1d(batch * c * h * w),
            (_BLOCK,),
            self._ptr(delta_out),
            self._ptr(indexes),
            int(batch * c),
            int(h),
            int(w),
            int(size),
            int(stride_x),
            int(stride_y),
            int(padding),
            int(out_h),
            int(out_w),
            self._ptr(delta_in),
        )

    def maxpool_depth_forward(self, x, batch, c, spatial, out_c, out, indexes):
        """The fork's maxpool_depth: the maximum over channels g, g+out_c, ... per position."""
        n_out = batch * out_c * spatial
        if indexes.dtype != np.int32:
            raise TypeError("maxpool indexes must be an int32 array (backend.int_zeros)")
        self._check_size("maxpool_depth x", x, batch * c * spatial)
        self._check_size("maxpool_depth out", out, n_out)
        self._check_size("maxpool_depth indexes", indexes, n_out)
        self._launch(
            "maxpool_depth_kernel",
            self._grid1d(n_out),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(c),
            int(spatial),
            int(out_c),
            self._ptr(out),
            self._ptr(indexes),
        )

    def local_avgpool(
        self, x, batch, c, h, w, size, stride_x, stride_y, padding, out, forward=True
    ):
        """The fork's [local_avgpool] (forward=False: its adjoint, added into x)."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        n_out = batch * c * out_h * out_w
        self._check_size("local_avgpool x", x, batch * c * h * w)
        self._check_size("local_avgpool out", out, n_out)
        self._launch(
            "local_avgpool_forward_kernel" if forward else "local_avgpool_backward_kernel",
            self._grid1d(n_out),
            (_BLOCK,),
            self._ptr(x),
            int(batch * c),
            int(h),
            int(w),
            int(size),
            int(stride_x),
            int(stride_y),
            int(padding),
            int(out_h),
            int(out_w),
            self._ptr(out),
        )

    def avgpool_forward(self, x, batch, c, spatial, out):
        rows = batch * c
        self._check_size("avgpool_forward x", x, rows * spatial)
        self._check_size("avgpool_forward out", out, rows)
        self._launch(
            "avgpool_forward_kernel",
            self._grid1d(32 * rows),
            (_BLOCK,),
            self._ptr(x),
            int(rows),
            int(spatial),
            self._ptr(out),
        )

    def avgpool_backward(self, delta_out, batch, c, spatial, delta_in):
        rows = batch * c
        self._check_size("avgpool_backward delta_out", delta_out, rows)
        self._check_size("avgpool_backward delta_in", delta_in, rows * spatial)
        self._launch(
            "avgpool_backward_kernel",
            self._grid1d(rows * spatial),
            (_BLOCK,),
            self._ptr(delta_out),
            int(rows),
            int(spatial),
            self._ptr(delta_in),
        )
