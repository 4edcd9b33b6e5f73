"""The CUDA optimizer ops (mixed into CudaBackend): kernels/optimizer.cu's launchers, the
same contract as numpy_optimizer.NumpyOptimizerOps. Kept out of cuda_backend.py so the
update rules grow apart from the layers' kernels; CudaBackend loads KERNELS with its own."""

# Kernel file -> {entry point: argument format} (struct codes as cuda_backend._KERNELS).
KERNELS = {
    "optimizer.cu": {
        "adam_update_kernel": "iPPPPPffff",
    },
}
_BLOCK = 256


class CudaOptimizerOps:
    def adam_update(self, w, d, m, v, step, b1, b2, eps, decay):
        """Darknet's adam_update_gpu, fused (see NumpyOptimizerOps.adam_update)."""
        for what, other in (("d", d), ("m", m), ("v", v)):
            self._sizes_match(f"adam_update {what}", w, other)
        self._check_size("adam_update step", step, 2)
        self._launch("adam_update_kernel", self._grid1d(w.size, _BLOCK), (_BLOCK,), w.size,
                     self._ptr(w), self._ptr(d), self._ptr(m), self._ptr(v), self._ptr(step),
                     float(b1), float(b2), float(eps), float(decay))
