"""The NumPy reference of batch normalisation's ops (mixed into NumpyBackend): Darknet's CPU
formulas, quirks included (the forward divides by sqrt(var) + 1e-6, the backward uses
sqrt(var + 1e-5), the variance is unbiased), and the AlexeyAB fork's sqrt(var + eps).

A BN layer's x kept at 16 bits under fp16/bf16 (precision.HALF_STORAGE) is emulated here:
float values rounded with precision.round_to (storage_zeros, copy_rounded); the ops that
read x take its x_precision and do their usual math on those values, as the CUDA kernels
do on the widened 16-bit values."""

import numpy as np

from ... import activations
from ... import precision as precisions
from ..common.numpy import one_storage  # noqa: F401  (its home before ops/common)


def delta_sums_given(delta_sum, delta_x_norm_sum):
    """Whether batchnorm_activation_backward writes its sums: both arrays or neither."""
    if (delta_sum is None) != (delta_x_norm_sum is None):
        raise ValueError("delta_sum and delta_x_norm_sum: both or neither")
    return delta_sum is not None


class StoredArray(np.ndarray):
    """A float array whose values are kept at `precision` (storage_zeros' fp16/bf16 arrays:
    a BN layer's x, a 16-bit layer output). The values are float32, already rounded; the
    ops that write into one round what they store (storage_of tells them), as the CUDA
    kernels' 16-bit stores do. Slices and reshapes keep the precision."""

    precision = precisions.DEFAULT

    def __array_finalize__(self, obj):
        self.precision = getattr(obj, "precision", precisions.DEFAULT)


def rebuild_storage(storage_of, x_precision, out):
    """How batchnorm_rebuild stores out: fp32, or x_precision's 16 bits when out is a
    16-bit array (which must be x's storage: ValueError otherwise)."""
    kept = storage_of(out)
    x_storage = precisions.storage(x_precision)
    if kept != precisions.DEFAULT and kept != x_storage:
        raise ValueError(
            f"batchnorm_rebuild: x kept at {x_storage}, out kept at {kept}: a "
            f"16-bit out takes x's own storage"
        )
    return kept


class NumpyNorm:
    """NumpyBackend's normalisation ops: bias and scale, batch norm, l2norm, lrn."""

    def add_bias(self, output, biases, batch, n, size):
        output.reshape(batch, n, size)[...] += biases[:n].reshape(1, n, 1)

    def scale_bias(self, output, scales, batch, n, size):
        output.reshape(batch, n, size)[...] *= scales[:n].reshape(1, n, 1)

    def backward_bias(self, bias_updates, delta, batch, n, size):
        """bias_updates += sum of delta over batch and space."""
        bias_updates[:n] += delta.reshape(batch, n, size).sum(axis=(0, 2))

    def backward_scale(self, x_norm, delta, batch, n, size, scale_updates):
        scale_updates[:n] += (delta.reshape(batch, n, size) * x_norm.reshape(batch, n, size)).sum(
            axis=(0, 2)
        )

    def bias_scale_updates(self, delta, x_norm, batch, n, size, bias_updates, scale_updates):
        """Batch norm's parameter gradients: backward_bias (skipped when bias_updates is
        None) and backward_scale."""
        if bias_updates is not None:
            self.backward_bias(bias_updates, delta, batch, n, size)
        self.backward_scale(x_norm, delta, batch, n, size, scale_updates)

    def l2normalize(self, x, batch, filters, spatial):
        """x /= sqrt(sum over the filters of x^2), per image and position (Darknet's
        l2normalize_cpu, without its unused gradient output)."""
        v = x.reshape(batch, filters, spatial)
        total = np.zeros((batch, spatial), dtype=x.dtype)
        for f in range(filters):  # Darknet's order of additions
            total += v[:, f] * v[:, f]
        v /= np.sqrt(total)[:, None, :]

    def lrn_forward(self, x, batch, c, spatial, size, alpha, beta, kappa, norms, out):
        """Darknet's local response normalisation: norms = kappa + alpha * the sum of x^2
        over each channel's window, built as its running sum (channel 0 adds channels
        [0, size/2); channel k starts from k-1's, subtracts k-(size-1)/2-1 and adds
        k+size/2: channel size/2 never enters, as in Darknet); out = x * norms^-beta."""
        v = x.reshape(batch, c, spatial)
        n = norms.reshape(batch, c, spatial)
        alpha = self.dtype.type(alpha)
        squared = v * v
        norm = np.full((batch, spatial), kappa, dtype=x.dtype)
        for k in range(min(size // 2, c)):
            norm += alpha * squared[:, k]
        n[:, 0] = norm
        for k in range(1, c):
            prev, nxt = k - (size - 1) // 2 - 1, k + size // 2
            if prev >= 0:
                norm += -alpha * squared[:, prev]
            if nxt < c:
                norm += alpha * squared[:, nxt]
            n[:, k] = norm
        out[...] = np.power(norms, -self.dtype.type(beta)) * x

    def lrn_backward(self, norms, delta, beta, delta_in):
        """Darknet's approximate LRN gradient: delta_in += norms^-beta * delta."""
        delta_in += np.power(norms, -self.dtype.type(beta)) * delta

    def mean(self, x, batch, filters, spatial, mean):
        mean[:filters] = x.reshape(batch, filters, spatial).mean(axis=(0, 2))

    def variance(self, x, mean, batch, filters, spatial, variance):
        # Darknet divides by (batch*spatial - 1).
        d = x.reshape(batch, filters, spatial) - mean[:filters].reshape(1, filters, 1)
        variance[:filters] = (d * d).sum(axis=(0, 2)) / (batch * spatial - 1)

    def mean_variance(self, x, batch, filters, spatial, mean, variance, x_precision="fp32"):
        """mean's and variance's statistics from one read of x (tf32/fp16/bf16 layers):
        per-channel float64 sums S of x and Q of x^2; the mean S / n rounded to the
        backend's float m, and Darknet's unbiased variance around it, sum (x - m)^2 =
        Q - 2 m S + n m^2, / (n - 1), clamped at 0 (rounding may take a constant channel's
        below). Against the two passes: within 2e-7 relative, for means up to 100 standard
        deviations. x_precision: how x is kept (storage_zeros' array: the statistics of a
        16-bit x, as a convolution writes it); here its values are
        already the rounded ones, read as they are."""
        precisions.storage(x_precision)  # a known precision, as on CUDA
        n = batch * spatial
        v = x[: batch * filters * spatial].reshape(batch, filters, spatial).astype(np.float64)
        s, q = v.sum(axis=(0, 2)), (v * v).sum(axis=(0, 2))
        m = (s / n).astype(self.dtype).astype(np.float64)
        mean[:filters] = m
        variance[:filters] = np.maximum((q - 2.0 * m * s + n * m * m) / (n - 1), 0.0)

    def normalize(self, x, mean, variance, batch, filters, spatial):
        # Darknet's CPU forward divides by sqrt(var) + 1e-6 (its backward uses sqrt(var + 1e-5)).
        v = x.reshape(batch, filters, spatial)
        v -= mean[:filters].reshape(1, filters, 1)
        v /= (np.sqrt(variance[:filters]) + self.dtype.type(1e-6)).reshape(1, filters, 1)

    def normalize_sqrt_eps(self, x, mean, variance, batch, filters, spatial, eps):
        """x = (x - mean) / sqrt(variance + eps) per channel (the AlexeyAB fork's forward)."""
        v = x.reshape(batch, filters, spatial)
        v -= mean[:filters].reshape(1, filters, 1)
        v /= np.sqrt(variance[:filters] + self.dtype.type(eps)).reshape(1, filters, 1)

    def storage_zeros(self, n, precision):
        """An array for n values kept at precision.storage(precision) (a BN layer's x): here
        the backend's float array (fp16/bf16 hold values rounded by copy_rounded); on CUDA
        16-bit storage for fp16/bf16."""
        stored = precisions.storage(precision)
        a = self.zeros(n)
        if stored == precisions.DEFAULT:
            return a
        a = a.view(StoredArray)
        a.precision = stored
        return a

    def storage_of(self, a):
        """The precision an array's values are kept at: fp16/bf16 for storage_zeros'
        16-bit arrays (and their slices), else fp32. (A method, not a staticmethod: a
        backend that wraps every op, as test_cuda_graphs' RecordingBackend, calls it with
        self.)"""
        return getattr(a, "precision", precisions.DEFAULT)

    def copy_rounded(self, src, dst, precision):
        """dst <- src rounded to precision.storage(precision) (round_to: fp16, bf16 to
        nearest even; fp32 and tf32: a plain copy, the bits unchanged)."""
        stored = precisions.storage(precision)
        if stored == precisions.DEFAULT:
            self.copy(src, dst)
        else:
            dst[...] = precisions.round_to(src, stored)

    def batchnorm_rebuild(
        self,
        x,
        out,
        mean,
        variance,
        scales,
        biases,
        batch,
        filters,
        spatial,
        eps,
        activation,
        x_precision="fp32",
    ):
        """out <- what batchnorm_apply made of x in training (keep=x, no x_norm), made again
        from the kept x alone (storage_zeros(n, x_precision)'s array; here its values are
        already the rounded ones): fp32 bit for bit; fp16/bf16 from x's 16 bits. out: fp32,
        or (issue 26: a 16-bit layer output) storage_zeros(n, x_precision)'s array, which
        gets the same fp32 values rounded once."""
        stored = rebuild_storage(self.storage_of, x_precision, out)
        total = batch * filters * spatial
        value = np.array(x[:total], dtype=self.dtype)  # plain floats: the fp32 arithmetic
        self.batchnorm_apply(
            value, mean, variance, scales, biases, batch, filters, spatial, eps, activation, None
        )
        out[:total] = value if stored == precisions.DEFAULT else precisions.round_to(value, stored)

    def batchnorm_apply(
        self,
        x,
        mean,
        variance,
        scales,
        biases,
        batch,
        filters,
        spatial,
        eps,
        activation,
        x_norm,
        keep=None,
        keep_precision="fp32",
    ):
        """Batch norm's forward after its statistics, in place on x: copy x into keep
        unless it is None, as copy_rounded(x, keep, keep_precision) would (keep:
        storage_zeros' array; the x a training layer keeps), normalize (eps None:
        Darknet's / (sqrt(var) + 1e-6); else the fork's / sqrt(var + eps)), copy the result
        into x_norm unless it is None, scale, add biases, then the activation."""
        if keep is not None:
            total = batch * filters * spatial
            self.copy_rounded(x[:total], keep[:total], keep_precision)
        if eps is None:
            self.normalize(x, mean, variance, batch, filters, spatial)
        else:
            self.normalize_sqrt_eps(x, mean, variance, batch, filters, spatial, eps)
        if x_norm is not None:
            self.copy(x, x_norm)
        self.scale_bias(x, scales, batch, filters, spatial)
        self.add_bias(x, biases, batch, filters, spatial)
        self.activate(x, activation)

    def batchnorm_activation_backward(
        self,
        x,
        mean,
        variance,
        scales,
        biases,
        output,
        batch,
        filters,
        spatial,
        eps,
        activation,
        delta,
        bias_updates,
        scale_updates,
        x_precision="fp32",
        delta_sum=None,
        delta_x_norm_sum=None,
    ):
        """delta *= the activation's gradient, then bias_scale_updates, with x_norm and the
        activation's input recomputed from x as batchnorm_apply computed them (same bits):
        a BN layer's backward keeps x only. Gradient from the output, or from the input for
        INPUT_GRADIENT; not the normalize_channels family (mixes channels).
        x_precision: how x is kept (storage_zeros / copy_rounded's precision); here its
        values are already the rounded ones, read as they are. A 16-bit x never reads
        `output` (None or any array: ignored): the gradients from the output take it as
        batchnorm_rebuild makes it from x in fp32 (the same bits), so a layer's output may
        itself be kept at 16 bits (issue 26); an fp32 x reads output, Darknet's way. delta_sum and
        delta_x_norm_sum (both or neither): set to this pass's sums of delta and of
        delta * x_norm per channel (not accumulated; batchnorm_delta_from_sums reads them)."""
        precisions.storage(x_precision)  # a known precision, as on CUDA
        sums = delta_sums_given(delta_sum, delta_x_norm_sum)
        if activation in activations.CHANNEL_ACTIVATIONS:
            raise ValueError(f"{activation} mixes channels: normalize_channels_gradient first")
        total = batch * filters * spatial
        x_norm = np.array(x[:total], dtype=self.dtype)  # plain floats, not x's StoredArray
        if eps is None:
            self.normalize(x_norm, mean, variance, batch, filters, spatial)
        else:
            self.normalize_sqrt_eps(x_norm, mean, variance, batch, filters, spatial, eps)
        if activation in activations.INPUT_GRADIENT:
            activation_input = x_norm.copy()
            self.scale_bias(activation_input, scales, batch, filters, spatial)
            self.add_bias(activation_input, biases, batch, filters, spatial)
            self.gradient_from_input(activation_input, activation, delta[:total])
        elif precisions.storage(x_precision) != precisions.DEFAULT:
            if activation != "linear":  # the output batchnorm_rebuild makes of x, in fp32
                rebuilt = x_norm.copy()
                self.scale_bias(rebuilt, scales, batch, filters, spatial)
                self.add_bias(rebuilt, biases, batch, filters, spatial)
                self.activate(rebuilt, activation)
                self.gradient(rebuilt, activation, delta[:total])
        else:
            self.gradient(output[:total], activation, delta[:total])
        if not sums:
            self.bias_scale_updates(
                delta[:total], x_norm, batch, filters, spatial, bias_updates, scale_updates
            )
            return
        delta_sum[:filters] = 0
        delta_x_norm_sum[:filters] = 0
        self.bias_scale_updates(
            delta[:total], x_norm, batch, filters, spatial, delta_sum, delta_x_norm_sum
        )
        if bias_updates is not None:  # the same sums added: bias_scale_updates' bits
            bias_updates[:filters] += delta_sum[:filters]
        scale_updates[:filters] += delta_x_norm_sum[:filters]

    def mean_delta(self, delta, variance, batch, filters, spatial, mean_delta):
        d = delta.reshape(batch, filters, spatial).sum(axis=(0, 2))
        mean_delta[:filters] = d * (-1.0 / np.sqrt(variance[:filters] + 1e-5))

    def variance_delta(self, x, delta, mean, variance, batch, filters, spatial, variance_delta):
        xc = x.reshape(batch, filters, spatial) - mean[:filters].reshape(1, filters, 1)
        s = (delta.reshape(batch, filters, spatial) * xc).sum(axis=(0, 2))
        variance_delta[:filters] = s * -0.5 * np.power(variance[:filters] + 1e-5, -1.5)

    def normalize_delta(
        self,
        x,
        mean,
        variance,
        mean_delta,
        variance_delta,
        batch,
        filters,
        spatial,
        delta,
        fork=False,
    ):
        """delta / sqrt(var + 1e-5) + the mean and variance terms; fork: the AlexeyAB fork's
        CPU divisor sqrt(var) + 1e-5 (its forward and other terms keep sqrt(var + 1e-5))."""
        shape = (1, filters, 1)
        n = batch * spatial
        xc = x.reshape(batch, filters, spatial) - mean[:filters].reshape(shape)
        d = delta.reshape(batch, filters, spatial)
        if fork:
            divisor = (np.sqrt(variance[:filters]) + self.dtype.type(1e-5)).reshape(shape)
        else:
            divisor = np.sqrt(variance[:filters] + 1e-5).reshape(shape)
        d[...] = (
            d / divisor
            + variance_delta[:filters].reshape(shape) * 2.0 * xc / n
            + mean_delta[:filters].reshape(shape) / n
        )

    def batchnorm_delta_from_sums(
        self,
        x,
        mean,
        variance,
        scales,
        batch,
        filters,
        spatial,
        eps,
        delta_sum,
        delta_x_norm_sum,
        mean_delta,
        variance_delta,
        delta,
        fork=False,
        x_precision="fp32",
    ):
        """batchnorm_delta without its pass over delta for the sums: mean_delta and
        variance_delta from the per-channel sums of delta (g, not yet scaled) and of
        g * x_norm that batchnorm_activation_backward left in delta_sum and
        delta_x_norm_sum, then delta *= scales and normalize_delta. eps: the forward's
        (batchnorm_apply's: its divisor D). The identity (batchnorm.cu,
        batchnorm_delta_factors): sum d (x - m) = scale * D * sum g x_norm, so the results
        are batchnorm_delta's up to each x_norm's rounding (7e-7 of the largest in float32)."""
        precisions.storage(x_precision)
        v = np.asarray(variance[:filters], np.float64) + 1e-5
        scale = np.asarray(scales[:filters], np.float64)
        vf = variance[:filters]  # the forward's divisor, rounded as normalize rounded it
        divisor = (
            np.sqrt(vf) + self.dtype.type(1e-6)
            if eps is None
            else np.sqrt(vf + self.dtype.type(eps))
        ).astype(np.float64)
        mean_delta[:filters] = delta_sum[:filters] * scale * (-1.0 / np.sqrt(v))
        variance_delta[:filters] = (
            delta_x_norm_sum[:filters] * scale * divisor * -0.5 * np.power(v, -1.5)
        )
        self.scale_bias(delta, scales, batch, filters, spatial)
        self.normalize_delta(
            x, mean, variance, mean_delta, variance_delta, batch, filters, spatial, delta, fork
        )

    def batchnorm_delta(
        self,
        x,
        mean,
        variance,
        scales,
        batch,
        filters,
        spatial,
        mean_delta,
        variance_delta,
        delta,
        fork=False,
        x_precision="fp32",
    ):
        """Batch norm's backward from its scaled output to its input, in place on delta:
        delta *= scales, then mean_delta, variance_delta and normalize_delta (fork: see
        normalize_delta). x_precision: as batchnorm_activation_backward's."""
        precisions.storage(x_precision)
        self.scale_bias(delta, scales, batch, filters, spatial)
        self.mean_delta(delta, variance, batch, filters, spatial, mean_delta)
        self.variance_delta(x, delta, mean, variance, batch, filters, spatial, variance_delta)
        self.normalize_delta(
            x, mean, variance, mean_delta, variance_delta, batch, filters, spatial, delta, fork
        )
