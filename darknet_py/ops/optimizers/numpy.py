"""The NumPy reference of the optimizer ops (mixed into NumpyBackend): Adam's update as
both Darknets' GPU builds run it (adam_update_gpu in src/blas_kernels.cu; see adam.py),
Darknet's SGD step, fp16's loss scaler kept on the backend (precision.LossScaler), and the
16-bit gradient exchange's packing (distributed/buckets.py).

`skip`: None, or a one-element int array (the loss scaler's found-inf flag) that, when
nonzero as the op runs, makes an update do nothing: read on the device on the GPU, so that
a recorded training step skips an overflowing update with no look from the host."""

import numpy as np

from ... import precision as precisions


class NumpyOptimizerOps:
    def adam_update(self, w, d, m, v, step, b1, b2, eps, decay, skip=None):
        """Darknet's adam_update_gpu on parameter w, its accumulated update d and moments m,
        v (all the same size), step = (learning rate, t) a two-element array read when the
        op runs, decay = decay * images per iteration:
            d += -decay * w; m = b1*m + (1-b1)*d; v = b2*v + (1-b2)*d*d;
            w += rate * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps); d = 0
        each step rounded to the array's dtype in Darknet's order (its kernels: scal m and
        v, axpy d, axpy m, d *= d, axpy v, adam_kernel, fill d). Nothing when skip says so."""
        if _skipped(skip):
            return
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

    def sgd_update(self, w, d, rate, decay, momentum, skip=None, weight_decay=True):
        """Darknet's SGD step on parameter w and its accumulated update d (layers/base.py
        momentum_update), rate a one-element array read when the op runs, decay =
        -decay * batch (the factor of w added into d):
            weight_decay: d += decay * w;   w += rate[0] * d;   d *= momentum
        each step rounded as axpy, axpy_array and scal round it. Nothing when skip says so."""
        if w.size != d.size:
            raise ValueError(f"sgd_update: arrays of {w.size} and {d.size} elements")
        if _skipped(skip):
            return
        if weight_decay:
            self.axpy(decay, w, d)
        self.axpy_array(rate, d, w)
        self.scal(momentum, d)

    # ---- fp16's loss scaler: scales = (scale, 1/scale), counts = (found_inf, clean, skipped)
    def array_table(self, arrays):
        """The arrays that unscale_check and rescale_or_zero go over, as one table (on the
        GPU a device table of their addresses and sizes: one launch for all of them)."""
        return tuple(arrays)

    def scale_by(self, factor, x):
        """x *= factor[0], factor a one-element array read when the op runs (the loss
        scale, which a recorded step reads as it replays)."""
        x *= factor[0]

    def unscale_check(self, table, scales, counts):
        """counts[0] = 1 if any array of the table holds an inf or a NaN (left as it was
        otherwise: the caller zeroes it first); every array multiplied by scales[1]."""
        inverse = scales[1]
        for a in table:
            if not np.isfinite(a).all():
                counts[0] = 1
            with np.errstate(over="ignore", invalid="ignore"):
                a *= inverse

    def rescale_or_zero(self, table, scales, counts):
        """Every array of the table zeroed if counts[0] (a skipped step), else multiplied
        by scales[0]."""
        for a in table:
            if counts[0]:
                a[...] = 0
            else:
                with np.errstate(over="ignore", invalid="ignore"):
                    a *= scales[0]

    def loss_scale_step(self, scales, counts, dynamic, growth_interval):
        """The loss scaler's bookkeeping after an update: when counts[0] (found inf) the
        skipped count counts[2] goes up, the clean run counts[1] restarts at 0 and a dynamic
        scale halves, at least 1; otherwise counts[1] goes up and a dynamic scale doubles at
        every growth_interval-th clean update in a row. scales[1] follows a dynamic scale
        (1/scale in the array's float type; a static one's was written with it)."""
        f = scales.dtype.type
        scale = scales[0]
        if counts[0]:
            counts[2] += 1
            counts[1] = 0
            if dynamic:
                scale = max(f(1), scale * f(0.5))
        else:
            counts[1] += 1
            if dynamic and counts[1] % growth_interval == 0:
                scale = scale * f(2)
        if dynamic and scale != scales[0]:
            scales[0] = scale
            scales[1] = f(1) / scale

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


def _skipped(skip):
    return skip is not None and bool(skip[0])
