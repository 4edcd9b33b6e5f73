"""The NumPy reference of the optimizer ops (mixed into NumpyBackend): Adam's update as
both Darknets' GPU builds run it (adam_update_gpu in src/blas_kernels.cu; see adam.py), and
the 16-bit gradient exchange's packing (distributed/buckets.py)."""

import numpy as np

from ... import precision as precisions


class NumpyOptimizerOps:
    def adam_update(self, w, d, m, v, step, b1, b2, eps, decay):
        """Darknet's adam_update_gpu on parameter w, its accumulated update d and moments m,
        v (all the same size), step = (learning rate, t) a two-element array read when the
        op runs, decay = decay * images per iteration:
            d += -decay * w; m = b1*m + (1-b1)*d; v = b2*v + (1-b2)*d*d;
            w += rate * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps); d = 0
        each step rounded to the array's dtype in Darknet's order (its kernels: scal m and
        v, axpy d, axpy m, d *= d, axpy v, adam_kernel, fill d)."""
        f = self.dtype.type
        one = f(1)
        b1, b2, eps = f(b1), f(b2), f(eps)
        rate, t = f(step[0]), f(step[1])
        m *= b1
        v *= b2
        d += f(-decay) * w
        m += (one - b1) * d
        np.multiply(d, d, out=d)
        v += (one - b2) * d
        mhat = m / (one - np.power(b1, t))
        vhat = v / (one - np.power(b2, t))
        w += rate * mhat / (np.sqrt(vhat) + eps)
        d[...] = 0

    def round_scaled(self, src, dst, scale):
        """dst <- src * scale (fp32 product) rounded to dst's 16 bits (storage_zeros' fp16 or
        bf16 array; nearest even, overflow to infinity): a gradient bucket packed for a
        16-bit exchange."""
        stored = self.storage_of(dst)
        if stored == precisions.DEFAULT:
            raise TypeError(
                f"round_scaled: dst kept at {stored}: takes a 16-bit array (storage_zeros)"
            )
        if src.size != dst.size:
            raise ValueError(f"round_scaled: src has {src.size} values, dst {dst.size}")
        with np.errstate(over="ignore", invalid="ignore"):
            dst[...] = precisions.round_to(src * self.dtype.type(scale), stored)

    def widen_scaled(self, src, dst, scale):
        """dst (fp32) <- the values of src (a 16-bit array, widened exactly) * scale: a
        summed 16-bit bucket back into its gradients."""
        if self.storage_of(src) == precisions.DEFAULT:
            raise TypeError(
                f"widen_scaled: src kept at {self.storage_of(src)}: takes a "
                f"16-bit array (storage_zeros)"
            )
        if src.size != dst.size:
            raise ValueError(f"widen_scaled: src has {src.size} values, dst {dst.size}")
        with np.errstate(over="ignore", invalid="ignore"):
            dst[...] = np.asarray(src, dtype=self.dtype) * self.dtype.type(scale)
