"""The NumPy reference of the element-wise and shape ops (mixed into NumpyBackend): vector
ops (blas), activations, channel scaling and weighting, binarize, upsample, reorg, shortcut,
dropout. Inference's activations run in blocks split over the cores (cpu_threads)."""

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import activations
from ... import precision as precisions
from ...backends.cpu_threads import GRAIN_FLOATS, parallel
from ...draws import uniform_hash
from ..common.numpy import BLOCK_FLOATS, matrix, one_storage, scratch


class NumpyElementwise:
    """Vector ops, activations, shape ops, binarisation and dropout."""

    def copy_blocks(
        self,
        src,
        src_offset,
        src_stride,
        dst,
        dst_offset,
        dst_stride,
        width,
        rows,
        accumulate=False,
        planes=1,
        src_plane_stride=0,
        dst_plane_stride=0,
    ):
        """For p in planes, r in rows: dst[dst_offset + p*dst_plane_stride + r*dst_stride : +width]
        (+)= src[src_offset + p*src_plane_stride + r*src_stride : +width].

        Route layers use it to concatenate per-image blocks (and to route deltas back);
        convolutions use the planes to move between (filters, batch, positions) and
        (batch, filters, positions) layouts.
        """
        kept = one_storage("copy_blocks", self.storage_of, src=src, dst=dst)
        s = _blocks(src, src_offset, planes, rows, width, src_plane_stride, src_stride)
        d = _blocks(dst, dst_offset, planes, rows, width, dst_plane_stride, dst_stride)
        if accumulate and kept != precisions.DEFAULT:  # the fp32 sum, rounded once
            d[...] = precisions.round_to(np.asarray(d) + np.asarray(s), kept).reshape(d.shape)
        elif accumulate:
            d += s
        else:
            d[...] = s

    def axpy(self, alpha, x, y):
        """y += alpha * x"""
        y += self.dtype.type(alpha) * x

    def axpy_array(self, alpha, x, y):
        """y += alpha[0] * x, alpha a one-element array (a value the GPU reads when the
        kernel runs, so that a captured step sees the one written before each replay)."""
        y += alpha[0] * x

    def scal(self, alpha, x):
        """x *= alpha"""
        x *= self.dtype.type(alpha)

    def constrain(self, limit, x):
        """x = min(limit, max(-limit, x)) (element-wise; C's fminf/fmaxf: NaN gives a bound)"""
        np.fmin(limit, np.fmax(-limit, x), out=x)

    def mul(self, x, y):
        """y *= x (element-wise)"""
        y *= x

    def mul_add(self, a, b, y):
        """y += a * b (element-wise): the product rule of [sam]'s backward."""
        y += a * b

    def sum(self, x):
        """Sum of all elements as a Python float (a host sync on the GPU)."""
        return float(np.sum(x, dtype=np.float64))

    def sum_into(self, x, out):
        """out[0] = the sum of x (accumulated in double), without a host sync on the GPU."""
        out[0] = np.sum(x, dtype=np.float64)

    def bias_activate(self, output, biases, batch, n, size, activation):
        """output = activation(output + biases per channel), in place: the inference tail of
        a convolution. Done in blocks of about BLOCK_FLOATS so the second pass over each
        block hits the cache instead of memory."""
        rows = output[: batch * n * size].reshape(batch * n, size)
        bias = np.tile(biases[:n], batch).reshape(-1, 1)  # one per row
        step = max(1, BLOCK_FLOATS // size)

        def run(r_start, r_stop):
            for r0 in range(r_start, r_stop, step):
                block = rows[r0 : min(r0 + step, r_stop)]
                block += bias[r0 : r0 + block.shape[0]]
                _activate_inplace(
                    block, activation, scratch(block.size, rows.dtype).reshape(block.shape)
                )

        parallel(batch * n, run, max(1, GRAIN_FLOATS // size))

    def activate(self, x, activation):
        if activation == "linear":
            return
        if activation not in _IN_PLACE:
            x[...] = activations.activate(x, activation)
            return

        def run(b_start, b_stop):
            for i in range(
                b_start * BLOCK_FLOATS, min(b_stop * BLOCK_FLOATS, x.size), BLOCK_FLOATS
            ):
                block = x[i : i + BLOCK_FLOATS]
                _activate_inplace(block, activation, scratch(block.size, x.dtype))

        parallel(-(-x.size // BLOCK_FLOATS), run, GRAIN_FLOATS // BLOCK_FLOATS)

    def activate_strided(self, x, rows, row_stride, offset, width, activation):
        """Activate x[offset + r*row_stride : +width] for each r < rows (one launch on
        the GPU; YOLO and region layers use it for their logistic channels)."""
        v = matrix(x, offset, rows, width, row_stride)
        v[...] = activations.activate(v, activation)

    def scale_add_strided(self, x, rows, row_stride, offset, width, scale, add):
        """x = x*scale + add over x[offset + r*row_stride : +width] for each r < rows (the
        AlexeyAB fork's scal_add; its [yolo] scale_x_y moves x and y by it)."""
        v = matrix(x, offset, rows, width, row_stride)
        v[...] = v * self.dtype.type(scale) + self.dtype.type(add)

    def gradient(self, y, activation, delta):
        """delta *= activation'(.) computed from the output y."""
        if activation != "linear":
            delta *= activations.gradient(y, activation)

    def gradient_strided(self, y, rows, row_stride, offset, width, activation, delta):
        """delta *= activation'(y) over [offset + r*row_stride : +width] for each r < rows
        (one launch on the GPU; the region layer's backward)."""
        if activation != "linear":
            matrix(delta, offset, rows, width, row_stride)[...] *= activations.gradient(
                matrix(y, offset, rows, width, row_stride), activation
            )

    def gradient_from_input(self, x, activation, delta):
        """delta *= activation'(x) from the input x (gelu, swish, mish, hard_mish)."""
        delta *= activations.gradient_from_input(x, activation)

    def normalize_channels(self, x, batch, channels, spatial, activation):
        """The fork's normalize_channels family in place on x (batch, channels, spatial)."""
        v = x[: batch * channels * spatial].reshape(batch, channels, spatial)
        v[...] = activations.normalize_channels(v, activation)

    def normalize_channels_gradient(self, x, batch, channels, spatial, activation, delta):
        """delta <- its gradient through normalize_channels, from the input x."""
        d = delta[: batch * channels * spatial].reshape(batch, channels, spatial)
        d[...] = activations.normalize_channels_gradient(
            x[: batch * channels * spatial].reshape(batch, channels, spatial), activation, d
        )

    def scale_channels(self, scale, src, batch, channels, spatial, scale_wh, out):
        """The fork's [scale_channels]: out[b, c, p] = scale[b, c] * src[b, c, p]; scale_wh:
        out[b, c, p] = scale[b, p] * src[b, c, p]."""
        out[: batch * channels * spatial] = (
            self._broadcast_scale(scale, batch, channels, spatial, scale_wh)
            * src[: batch * channels * spatial].reshape(batch, channels, spatial)
        ).reshape(-1)

    def scale_channels_backward(
        self, scale, src, delta, batch, channels, spatial, scale_wh, scale_delta, src_delta
    ):
        """The adjoint of scale_channels, added into scale_delta and src_delta (either may be
        None)."""
        d = delta[: batch * channels * spatial].reshape(batch, channels, spatial)
        if src_delta is not None:
            src_delta[: batch * channels * spatial] += (
                self._broadcast_scale(scale, batch, channels, spatial, scale_wh) * d
            ).reshape(-1)
        if scale_delta is not None:
            prod = d * src[: batch * channels * spatial].reshape(batch, channels, spatial)
            n = spatial if scale_wh else channels
            scale_delta[: batch * n] += prod.sum(axis=1 if scale_wh else 2).reshape(-1)

    @staticmethod
    def _broadcast_scale(scale, batch, channels, spatial, scale_wh):
        if scale_wh:
            return scale[: batch * spatial].reshape(batch, 1, spatial)
        return scale[: batch * channels].reshape(batch, channels, 1)

    def shortcut_weights(self, weights, inputs, channels, normalization, out):
        """The fork's weighted-shortcut weights, (inputs x channels), normalised over the
        inputs per channel: none, relu (relu(w) / (1e-4 + sum relu)) or softmax
        (exp(w - max) / (1e-4 + sum exp(w - max)))."""
        w = weights[: inputs * channels].reshape(inputs, channels)
        if normalization == "relu":
            r = np.maximum(w, 0)
            w = r / (self.dtype.type(1e-4) + r.sum(axis=0))
        elif normalization == "softmax":
            e = np.exp(w - w.max(axis=0))
            w = e / (self.dtype.type(1e-4) + e.sum(axis=0))
        out[: inputs * channels] = w.reshape(-1)

    def channel_weighted_add(self, src, src_stride, weights, step, width, batch, out, out_stride):
        """out[b*out_stride + j] += weights[j // step] * src[b*src_stride + j], j < width."""
        s = matrix(src, 0, batch, width, src_stride)
        d = matrix(out, 0, batch, width, out_stride)
        d += np.repeat(weights[: -(-width // step)], step)[:width] * s

    def channel_weighted_dot(self, a, a_stride, b, b_stride, step, width, batch, out):
        """out[c] += sum over images and j < width with j // step == c of a[.. j] * b[.. j]."""
        prod = (matrix(a, 0, batch, width, a_stride) * matrix(b, 0, batch, width, b_stride)).sum(0)
        np.add.at(out, np.arange(width) // step, prod)

    def binarize_weights(self, weights, n, size, binary):
        """Per filter (n filters of `size` weights): binary = +mean where the weight is > 0,
        else -mean, mean = the filter's mean absolute weight (Darknet's binarize_weights)."""
        w = weights[: n * size].reshape(n, size)
        mean = np.abs(w).sum(axis=1, dtype=w.dtype) / self.dtype.type(size)
        binary[: n * size].reshape(n, size)[...] = np.where(w > 0, mean[:, None], -mean[:, None])

    def binarize(self, x, binary):
        """binary = +1 where x > 0, else -1 (Darknet's binarize_cpu: xnor's input)."""
        binary[: x.size] = np.where(x > 0, 1, -1)

    def upsample(self, x, w, h, c, batch, stride, forward, scale, out):
        """forward: out (w*stride x h*stride) = scale * nearest(x).
        backward (forward=False): x += scale * sum of out over each stride x stride cell.
        The forward takes x and out of one storage (16-bit: scaled in fp32, rounded once);
        the backward fp32 arrays only."""
        kept = one_storage(
            "upsample" if forward else "upsample (backward)",
            self.storage_of,
            None if forward else (precisions.DEFAULT,),
            x=x,
            out=out,
        )
        big = out.reshape(batch * c, h * stride, w * stride)
        small = x.reshape(batch * c, h, w)
        if forward:
            # Each input cell broadcast over its stride x stride block: one pass, no copies.
            cells = big.reshape(batch * c, h, stride, w, stride)
            cells[...] = small[:, :, None, :, None]
            if scale != 1:
                big *= self.dtype.type(scale)
                if kept != precisions.DEFAULT:
                    big[...] = precisions.round_to(big, kept).reshape(big.shape)
        else:
            small += scale * big.reshape(batch * c, h, stride, w, stride).sum(axis=(2, 4))

    def reorg(self, x, w, h, c, batch, stride, forward, out):
        """Darknet's reorg_cpu index mapping (its 'forward' flag is reversed in the layer)."""
        out_c = c // (stride * stride)
        b, k, j, i = np.meshgrid(
            np.arange(batch), np.arange(c), np.arange(h), np.arange(w), indexing="ij"
        )
        in_index = i + w * (j + h * (k + c * b))
        c2 = k % out_c
        offset = k // out_c
        w2 = i * stride + offset % stride
        h2 = j * stride + offset // stride
        out_index = w2 + w * stride * (h2 + h * stride * (c2 + out_c * b))
        if forward:
            out[out_index.reshape(-1)] = x[in_index.reshape(-1)]
        else:
            out[in_index.reshape(-1)] = x[out_index.reshape(-1)]

    def shortcut(self, batch, w1, h1, c1, add, w2, h2, c2, s1, s2, out):
        """Darknet's shortcut_cpu: out = s1*out + s2*add, over the common shape, with
        sampling strides when the two shapes differ. add and out of one storage (16-bit: the
        fp32 result rounded once)."""
        kept = one_storage("shortcut", self.storage_of, add=add, out=out)
        stride = max(1, w1 // w2)
        sample = max(1, w2 // w1)
        minw, minh, minc = min(w1, w2), min(h1, h2), min(c1, c2)
        src = add[: batch * c1 * h1 * w1].reshape(batch, c1, h1, w1)
        dst = out[: batch * c2 * h2 * w2].reshape(batch, c2, h2, w2)
        a = src[:, :minc, 0 : minh * stride : stride, 0 : minw * stride : stride]
        d = dst[:, :minc, 0 : minh * sample : sample, 0 : minw * sample : sample]
        value = s1 * np.asarray(d) + s2 * np.asarray(a)
        d[...] = (
            value
            if kept == precisions.DEFAULT
            else precisions.round_to(value, kept).reshape(value.shape)
        )

    def dropout(self, x, prob, scale, rand, step_seed, layer_seed):
        """Training dropout. rand[i] = uniform_hash(seed, i) with seed = step_seed[0] +
        layer_seed (step_seed: a one-element int array, written once per step), the same
        counter-based draw the CUDA kernel makes; x[rand < prob] = 0, the rest *= scale."""
        seed = (int(step_seed[0]) + int(layer_seed)) & 0xFFFFFFFF
        rand[...] = uniform_hash(seed, rand.size).astype(self.dtype)
        x[...] = np.where(rand < prob, 0, x * scale)

    def dropout_backward(self, rand, prob, scale, delta):
        delta[...] = np.where(rand < prob, 0, delta * scale)

    def uniform(self, rand, seed):
        """rand[i] = uniform_hash(seed, i): draws in [0, 1) the CUDA kernel makes alike."""
        rand[...] = uniform_hash(seed, rand.size).astype(self.dtype)


_IN_PLACE = ("linear", "leaky", "relu", "logistic")


def _activate_inplace(x, activation, scratch):
    """x = activation(x) without temporaries for the activations inference nets use
    (the same float32 values as activations.activate); the rest go through it.
    `scratch` is a buffer shaped like x."""
    if activation == "linear":
        return
    if activation == "leaky":  # max(x, .1x) is x for x > 0 and .1x otherwise
        np.multiply(x, x.dtype.type(0.1), out=scratch)
        np.maximum(x, scratch, out=x)
    elif activation == "relu":
        np.maximum(x, 0, out=x)
    elif activation == "logistic":
        with np.errstate(over="ignore"):  # exp overflows to inf: 1/(1+inf) = 0 is right
            np.negative(x, out=x)
            np.exp(x, out=x)
        x += 1
        np.reciprocal(x, out=x)
    else:
        x[...] = activations.activate(x, activation)


def _blocks(flat, offset, planes, rows, cols, plane_stride, ld):
    """A (planes x rows x cols) strided view of a flat array."""
    if planes <= 1:
        return matrix(flat, offset, rows, cols, ld)[None]
    if rows and cols and offset + (planes - 1) * plane_stride + (rows - 1) * ld + cols > flat.size:
        raise ValueError(f"{planes}x{rows}x{cols} blocks at {offset} exceed array of {flat.size}")
    isz = flat.itemsize
    return as_strided(flat[offset:], (planes, rows, cols), (plane_stride * isz, ld * isz, isz))
