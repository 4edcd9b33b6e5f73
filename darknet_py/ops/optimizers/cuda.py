"""The CUDA optimizer ops (mixed into CudaBackend): optimizer.cu's launchers, the
same contract as numpy.NumpyOptimizerOps beside it (Adam's update, the 16-bit gradient
exchange's packing). Kept out of cuda_backend.py so the update rules grow apart from the
layers' kernels; CudaBackend loads its KERNEL_FILES with its own."""

# The kernel file this family launches from (formats from its declarations,
# backends/kernel_signatures.py).
KERNEL_FILES = ("optimizer.cu",)

_BLOCK = 256
_SUFFIX = {"fp16": "f16", "bf16": "bf16"}


class CudaOptimizerOps:
    def adam_update(self, w, d, m, v, step, b1, b2, eps, decay):
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
