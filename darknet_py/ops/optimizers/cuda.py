"""The CUDA optimizer ops (mixed into CudaBackend): optimizer.cu's and loss_scale.cu's
launchers, the same contract as numpy.NumpyOptimizerOps beside it (Adam's and SGD's
updates, fp16's loss scaler, the 16-bit gradient exchange's packing). Kept out of
cuda_backend.py so the update rules grow apart from the layers' kernels; CudaBackend loads
its KERNEL_FILES with its own."""

import numpy as np

from ...backends.errors import GraphCaptureError

# The kernel files this family launches from (formats from their declarations,
# backends/kernel_signatures.py).
KERNEL_FILES = ("optimizer.cu", "loss_scale.cu")

_BLOCK = 256
# Elements a block of the table kernels takes from one buffer (loss_scale.cu's
# CHUNK_PER_THREAD elements a thread).
_CHUNK = _BLOCK * 8
_SUFFIX = {"fp16": "f16", "bf16": "bf16"}


class ArrayTable:
    """A device table of arrays (array_table): (pointer, size, first block) int64 triples,
    and the blocks of _CHUNK elements that cover them. Holds the arrays, whose addresses
    it records."""

    def __init__(self, arrays, table, blocks):
        self.arrays, self.table, self.blocks = arrays, table, blocks

    def __len__(self):
        return len(self.arrays)


class CudaOptimizerOps:
    def _skip_ptr(self, skip):
        """The device address of a skip flag (an int array's first element), 0 for None."""
        if skip is None:
            return 0
        if skip.dtype != np.int32:
            raise TypeError(f"skip: takes an int array (int_zeros), got {skip.dtype}")
        return self._ptr(skip)

    def adam_update(self, w, d, m, v, step, b1, b2, eps, decay, skip=None):
        """Darknet's adam_update_gpu, fused (see NumpyOptimizerOps.adam_update)."""
        for what, other in (("d", d), ("m", m), ("v", v)):
            self._sizes_match(f"adam_update {what}", w, other)
        self._check_size("adam_update step", step, 2)
        self._launch(
            "adam_update_kernel",
            self._grid1d(w.size, _BLOCK),
            (_BLOCK,),
            w.size,
            self._ptr(w),
            self._ptr(d),
            self._ptr(m),
            self._ptr(v),
            self._ptr(step),
            float(b1),
            float(b2),
            float(eps),
            float(decay),
            self._skip_ptr(skip),
        )

    def sgd_update(self, w, d, rate, decay, momentum, skip=None, weight_decay=True):
        """NumpyOptimizerOps.sgd_update: Darknet's SGD step as one kernel."""
        self._sizes_match("sgd_update", w, d)
        self._check_size("sgd_update rate", rate, 1)
        self._launch(
            "sgd_update_kernel",
            self._grid1d(w.size, _BLOCK),
            (_BLOCK,),
            w.size,
            self._ptr(w),
            self._ptr(d),
            self._ptr(rate),
            float(decay),
            int(bool(weight_decay)),
            float(momentum),
            self._skip_ptr(skip),
        )

    # ---- fp16's loss scaler (precision.LossScaler; loss_scale.cu) ----------------------------
    def array_table(self, arrays):
        """NumpyOptimizerOps.array_table: the arrays as one device table, for the kernels
        that go over all of them in one launch. Made outside a recorded step (it uploads)."""
        if self._capture_keep is not None:  # its upload cannot be recorded
            raise GraphCaptureError("array_table while capturing")
        arrays = list(arrays)
        for a in arrays:
            if a.dtype != np.float32:
                raise TypeError(f"array_table: takes float32 arrays, got {a.dtype}")
        host = np.zeros((max(1, len(arrays)), 3), dtype=np.int64)
        blocks = 0
        for k, a in enumerate(arrays):
            host[k] = (a.ptr if a.size else 0, a.size, blocks)
            blocks += (a.size + _CHUNK - 1) // _CHUNK
        table = self._new(host.size, np.int64)
        self._htod(table, host.reshape(-1))
        return ArrayTable(arrays, table, blocks)

    def _table_launch(self, name, table, scales, counts):
        if not isinstance(table, ArrayTable):
            raise TypeError(f"{name}: takes an array_table, got {type(table).__name__}")
        self._check_size(f"{name} scales", scales, 2)
        self._check_size(f"{name} counts", counts, 3)
        self._launch(
            name,
            (table.blocks,),
            (_BLOCK,),
            self._ptr(table.table),
            max(1, len(table)),
            _CHUNK,
            self._ptr(scales),
            self._ptr(counts),
        )

    def scale_by(self, factor, x):
        """NumpyOptimizerOps.scale_by: x *= factor[0], read on the device."""
        self._check_size("scale_by factor", factor, 1)
        self._launch(
            "scale_by_kernel",
            self._grid1d(x.size),
            (_BLOCK,),
            x.size,
            self._ptr(factor),
            self._ptr(x),
        )

    def unscale_check(self, table, scales, counts):
        """NumpyOptimizerOps.unscale_check, one launch over the table."""
        self._table_launch("unscale_check_kernel", table, scales, counts)

    def rescale_or_zero(self, table, scales, counts):
        """NumpyOptimizerOps.rescale_or_zero, one launch over the table."""
        self._table_launch("rescale_or_zero_kernel", table, scales, counts)

    def loss_scale_step(self, scales, counts, dynamic, growth_interval):
        """NumpyOptimizerOps.loss_scale_step, one thread on the device."""
        self._check_size("loss_scale_step scales", scales, 2)
        self._check_size("loss_scale_step counts", counts, 3)
        self._launch(
            "loss_scale_step_kernel",
            (1,),
            (1,),
            self._ptr(scales),
            self._ptr(counts),
            int(bool(dynamic)),
            int(growth_interval),
        )

    def _exchange_suffix(self, op, half, src, dst):
        suffix = _SUFFIX.get(self.storage_of(half))
        if suffix is None:
            raise TypeError(
                f"{op}: takes a 16-bit array (storage_zeros), got one kept at "
                f"{self.storage_of(half)}"
            )
        self._sizes_match(op, src, dst)
        return suffix

    def round_scaled(self, src, dst, scale):
        """NumpyOptimizerOps.round_scaled: dst (16 bits) <- src * scale, rounded once."""
        suffix = self._exchange_suffix("round_scaled", dst, src, dst)
        if src.size:
            self._launch(
                f"round_scaled_{suffix}",
                self._grid1d(src.size, _BLOCK),
                (_BLOCK,),
                self._ptr(src),
                self._ptr(dst),
                int(src.size),
                float(scale),
            )

    def widen_scaled(self, src, dst, scale):
        """NumpyOptimizerOps.widen_scaled: dst (fp32) <- src (16 bits) widened * scale."""
        suffix = self._exchange_suffix("widen_scaled", src, src, dst)
        if src.size:
            self._launch(
                f"widen_scaled_{suffix}",
                self._grid1d(src.size, _BLOCK),
                (_BLOCK,),
                self._ptr(src),
                self._ptr(dst),
                int(src.size),
                float(scale),
            )
