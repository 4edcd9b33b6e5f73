"""[convolutional]: im2col + GEMM per image and group, as Darknet does it; on a backend
that has them (the GPU) the backward's products run as implicit GEMMs where they measure
faster (ops/convolution/cuda_backward.py), with no im2col or col2im buffer.

Inference (not training) with batch normalisation runs on weights and biases with the
normalisation folded in, made once from the parameters (Network.fold_batchnorm switches
it off); training keeps Darknet's exact unfolded path."""

import math

import numpy as np

from .. import precision as precisions
from ..activations import CHANNEL_ACTIVATIONS
from ..shapes import conv_out_size, conv_strides
from . import nhwc_forward
from .base import (
    Layer,
    initial_param,
    momentum_update,
    parse_activation,
    refuse_options,
    source_layer,
)
from .batchnorm import (
    FORK_BN_EPS,
    bn_activation_backward,
    bn_allocate,
    bn_forward,
    bn_init_params,
    bn_init_updates,
    bn_params,
    product_into_x,
)

# The most floats of shared workspace a convolution takes for a chunk of images
# (512 MiB); a single image may need more, and then gets what it needs. Larger chunks
# mean fewer, larger GEMMs, whose tiles fill the GPU's SMs in more even waves (cifar's
# training step 32.3 -> 31.0 ms on an H100 against 128 MiB).
WORKSPACE_CAP_FLOATS = 1 << 27


class ConvolutionalLayer(Layer):
    type = "convolutional"
    fork_train = True
    short = "conv"
    # fp32: Darknet's im2col + SGEMM; tf32/fp16/bf16: implicit GEMM on the tensor cores
    # (precision.py; the network assigns it).
    precision = precisions.DEFAULT

    def parse(self, s, ctx):
        self.filters = s.get_int("filters", 1)
        self.size = s.get_int("size", 1)
        self.stride = s.get_int("stride", 1)
        self.groups = s.get_int("groups", 1)
        self.dilation = s.get_int("dilation", 1)
        pad = s.get_int("pad", 0)
        self.padding = s.get_int("padding", 0)
        if pad:  # Darknet: pad=1 means "same" padding, size/2 (scaled by dilation)
            self.padding = self.dilation * (self.size // 2)
        self.share = None  # the fork's share_index: the layer whose parameters this one uses
        # The fork's CPU col2im clears the image before folding into it: the deltas later
        # layers (a route, a shortcut) left for this convolution's input are lost. Its GPU
        # build (cudnnConvolutionBackwardData with beta=1) adds to them.
        self.clears_input_delta = self.fork_cpu
        if self.darknet == "alexeyab":
            self._fork_stride_and_dilation(s, pad)
            if s.has("share_index"):
                self.share = source_layer(self, s, ctx, "share_index")
        self.activation = parse_activation(s, "logistic", channels=True)
        self.batch_normalize = s.get_int("batch_normalize", 0)
        self._parse_binary(s)
        # The fork's antialiasing adds a blur after the convolution: refused, not warned, as
        # reading past it would give other outputs.
        refuse_options(s, "antialiasing")
        for key, v in (
            ("filters", self.filters),
            ("size", self.size),
            ("stride", min(conv_strides(self.stride))),
            ("groups", self.groups),
            ("dilation", self.dilation),
        ):
            if v < 1:
                raise s.error(f"must be at least 1, got {v}", key)
        if self.c % self.groups or self.filters % self.groups:
            raise s.error(
                f"groups={self.groups} must divide both the input channels "
                f"({self.c}) and filters ({self.filters})",
                "groups",
            )
        self.out_h, self.out_w = conv_out_size(
            self.h, self.w, self.size, self.stride, self.padding, self.dilation
        )
        if self.out_h < 1 or self.out_w < 1:
            raise s.error(
                f"a {self.size}x{self.size} kernel does not fit the {self.w}x{self.h} input", "size"
            )
        self.out_c = self.filters
        self.outputs = self.out_c * self.out_h * self.out_w
        self.nweights = self.c // self.groups * self.filters * self.size * self.size
        share = self.share
        if share is not None and (
            share.type != "convolutional"
            or (share.nweights, share.filters, share.batch_normalize)
            != (self.nweights, self.filters, self.batch_normalize)
        ):
            raise s.error(
                f"layer {share.index} must be a [convolutional] with the same "
                f"filters, weights and batch_normalize",
                "share_index",
            )
        m, k, n = self._gemm_dims()
        self.workspace_size = (k + m) * n  # per image; allocate() sizes it for a chunk
        self._folded = None  # (weights, biases) with batch norm folded in; see forward()

    def _parse_binary(self, s):
        """binary=1: the forward uses binarized weights (see binarize_weights); xnor=1: also
        the sign of the input (+1 where > 0, else -1). Backward and update work on the real
        weights and input, as Darknet's CPU code does. The fork turns groups off for xnor;
        its bin_output (a bit-packed output of its inference path) gives the same numbers."""
        self.binary = s.get_int("binary", 0)
        self.xnor = s.get_int("xnor", 0)
        if self.darknet == "alexeyab":
            s.get_int("bin_output", 0)
            if self.xnor:
                self.groups = 1

    def _fork_stride_and_dilation(self, s, pad):
        """The fork's rules: stride_x/stride_y override stride (self.stride becomes the pair
        (stride_y, stride_x) when they differ, as im2col takes it); a 1x1 kernel has no
        dilation; the output size ignores dilation while its im2col pads by
        padding*dilation (so only sizes where both agree are well defined)."""
        stride_x, stride_y = s.get_int("stride_x", -1), s.get_int("stride_y", -1)
        stride_x = stride_x if stride_x >= 1 else self.stride
        stride_y = stride_y if stride_y >= 1 else self.stride
        self.stride = stride_x if stride_x == stride_y else (stride_y, stride_x)
        if self.size == 1:
            self.dilation = 1
        if self.dilation > 1:
            padding = self.size // 2 if pad else s.get_int("padding", 0)
            self.padding = padding * self.dilation
            fork_h = (self.h + 2 * padding - self.size) // stride_y + 1
            if (
                fork_h
                != conv_out_size(
                    self.h, self.w, self.size, self.stride, self.padding, self.dilation
                )[0]
            ):
                raise s.error(
                    f"dilation={self.dilation} with padding={padding}: the fork's "
                    f"output size and its im2col disagree (use pad=1 and an odd "
                    f"size)",
                    "dilation",
                )

    @property
    def bflops(self):
        return (
            2.0
            * self.filters
            * self.size
            * self.size
            * self.c
            / self.groups
            * self.out_h
            * self.out_w
        ) / 1e9

    @property
    def fork_bflops(self):
        # The fork counts an xnor convolution's operations as 1/32 of a float one's.
        return self.bflops / 32 if self.xnor else self.bflops

    def describe(self):
        # Darknet's row ("conv  %5d %2d x%2d /%2d  %4d x..."); groups, which it does not
        # print, are shown only when there are some.
        groups = f" g{self.groups}" if self.groups > 1 else "  "
        sy, sx = conv_strides(self.stride)
        stride = f"{sx:2d}" if sx == sy else f"{sx}x{sy}"
        return (
            f"{self.filters:5d} {self.size:2d} x{self.size:2d} /{stride}{groups}"
            f"{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}  {self.bflops:5.3f} BFLOPs"
        )

    # ---- buffers ----------------------------------------------------------------
    _SHARED = ("weights", "biases", "scales", "rolling_mean", "rolling_variance")
    _SHARED_UPDATES = ("weight_updates", "bias_updates", "scale_updates")

    def init_params(self, be, rng):
        if self.share is not None:  # the same arrays: one set of parameters, trained once
            for name in self._SHARED[: 5 if self.batch_normalize else 2]:
                setattr(self, name, getattr(self.share, name))
            return
        scale = math.sqrt(2.0 / (self.size * self.size * self.c / self.groups))
        if self.darknet == "alexeyab" and self.activation.startswith("normalize_channels"):
            self.weights = initial_param(be, rng, self.nweights, kind="ones")
        else:
            # The fork draws scale * uniform(-1, 1) (std scale / sqrt 3), the original
            # scale * normal: a start of the fork's size trains as the fork's does.
            kind = "uniform" if self.darknet == "alexeyab" else "normal"
            self.weights = initial_param(be, rng, self.nweights, scale, kind)
        self.biases = be.zeros(self.filters)
        if self.batch_normalize:
            bn_init_params(self, be, rng, self.filters)

    def init_updates(self, be):
        self.weight_updates = be.zeros(self.nweights)
        self.bias_updates = be.zeros(self.filters)
        if self.batch_normalize:
            bn_init_updates(self, be, self.filters)
        if self.share is not None:  # gradients accumulate into the owner's updates
            for name in self._SHARED_UPDATES[: 3 if self.batch_normalize else 2]:
                setattr(self, name, getattr(self.share, name))

    def params(self):
        if self.share is not None:
            return []  # the fork stores shared parameters once, with their owner
        p = [("biases", self.biases)]
        if self.batch_normalize:
            p += bn_params(self)
        return p + [("weights", self.weights)]

    # ---- computation --------------------------------------------------------------
    # Images go through in chunks: im2col lays a chunk out as (k, chunk, positions), so
    # one GEMM per group covers the chunk instead of one per image (Darknet loops per
    # image; on a GPU that is thousands of small launches per batch). The chunk is as
    # large as the workspace cap allows.
    def _gemm_dims(self):
        m = self.filters // self.groups  # filters per group
        k = self.size * self.size * self.c // self.groups  # weights per filter
        n = self.out_h * self.out_w  # output positions
        return m, k, n

    def _chunk(self, batch):
        m, k, n = self._gemm_dims()
        return max(1, min(batch, WORKSPACE_CAP_FLOATS // ((k + m) * n)))

    def gemm_dims(self):
        """(filters, weights, positions) per group: the forward product's M, K and N."""
        return self._gemm_dims()

    def images_per_chunk(self, batch):
        """How many of `batch` images one GEMM per group covers (the workspace cap's)."""
        return self._chunk(batch)

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        if self.batch_normalize:
            bn_allocate(self, be, batch, train)
        m, k, n = self._gemm_dims()
        # The reduced-precision forward reads its input in place (implicit GEMM); only its
        # backward unfolds into the workspace.
        # Nor does its training when the backend runs the backward as implicit GEMMs.
        reduced = self.precision != precisions.DEFAULT
        no_workspace = reduced and (not train or all(self._implicit_backward(be, batch)))
        self.workspace_size = 0 if no_workspace else (k + m) * n * self._chunk(batch)
        if self.binary or self.xnor:
            self.binary_weights = be.zeros(self.nweights)
        self.binary_input = be.zeros(batch * self.inputs) if self.xnor else None

    def _chunks(self, be, net):
        """(first image, images, col buffer, product buffer) per chunk of the batch."""
        m, k, n = self._gemm_dims()
        step = self._chunk(self.batch)
        for b0 in range(0, self.batch, step):
            count = min(step, self.batch - b0)
            yield (
                b0,
                count,
                net.workspace[: k * count * n],
                net.workspace[k * count * n :][: m * count * n],
            )

    def _im2col(self, be, images, b0, count, group, col):
        cg = self.c // self.groups
        offset = b0 * self.c * self.h * self.w + group * cg * self.h * self.w
        be.im2col(
            images[offset:],
            cg,
            self.h,
            self.w,
            self.size,
            self.stride,
            self.padding,
            self.dilation,
            col,
            count,
            self.c * self.h * self.w,
        )

    def _move(self, be, grouped, batched, b0, count, group, to_batched):
        """Copy a (m, count, n) product to/from the (batch, filters, n) layout."""
        m, _, n = self._gemm_dims()
        offset = b0 * self.filters * n + group * m * n
        if to_batched:
            be.copy_blocks(
                grouped,
                0,
                count * n,
                batched,
                offset,
                n,
                n,
                m,
                planes=count,
                src_plane_stride=n,
                dst_plane_stride=self.filters * n,
            )
        else:
            be.copy_blocks(
                batched,
                offset,
                n,
                grouped,
                0,
                count * n,
                n,
                m,
                planes=count,
                src_plane_stride=self.filters * n,
                dst_plane_stride=n,
            )

    def params_changed(self):
        self._folded = None
        self._packed = None
        self._nhwc_weights = None  # nhwc_forward.nhwc_weights' 16-bit [cout, k, k, cx]

    def _fold_batchnorm(self, be):
        """Weights and biases that give in one GEMM + bias what conv + Darknet's inference
        batch norm gives: w * s and bias - mean * s, s = scale / (sqrt(var) + 1e-6), or the
        fork's scale / sqrt(var + 1e-5).
        The per-filter factors are worked out on the host in float64; the weights are
        scaled where they live (one multiply each, so folding adds one rounding)."""
        host = {
            name: be.to_host(getattr(self, name)).astype(np.float64)
            for name in ("scales", "rolling_variance", "rolling_mean", "biases")
        }
        if self.darknet == "alexeyab":
            factor = host["scales"] / np.sqrt(host["rolling_variance"] + FORK_BN_EPS)
        else:
            factor = host["scales"] / (np.sqrt(host["rolling_variance"]) + 1e-6)
        weights = be.empty(self.nweights)
        be.copy(self._binarized_weights(be), weights)
        be.scale_bias(weights, be.from_host(factor), 1, self.filters, self.nweights // self.filters)
        return weights, be.from_host(host["biases"] - host["rolling_mean"] * factor)

    def _binarized_weights(self, be):
        """The weights the forward multiplies by: binarized for binary=1 and xnor=1."""
        if not (self.binary or self.xnor):
            return self.weights
        be.binarize_weights(
            self.weights, self.filters, self.nweights // self.filters, self.binary_weights
        )
        return self.binary_weights

    def inference_params(self, be):
        """(weights, biases) as inference applies them: the weights binarized (binary=1,
        xnor=1), batch norm folded in where there is one (the same arrays forward uses;
        ONNX export reads them)."""
        if not self.batch_normalize:
            return self._binarized_weights(be), self.biases
        if self._folded is None:
            self._folded = self._fold_batchnorm(be)
        return self._folded

    def _forward_params(self, net):
        """(weights, biases) for this forward; biases None: batch norm runs unfolded."""
        if self.batch_normalize and (net.train or not net.fold_batchnorm):
            self._folded = None  # training moves the rolling statistics
            return self._binarized_weights(net.be), None
        return self.inference_params(net.be)

    def _image_col(self, be, images, b, group, col):
        """The (k, n) matrix of one image and group: the input itself for a 1x1, stride-1
        convolution without padding (nothing to unfold), else im2col into col."""
        if self.size == 1 and self.stride == 1 and self.padding == 0:
            cg = self.c // self.groups
            return images[b * self.c * self.h * self.w + group * cg * self.h * self.w :]
        self._im2col(be, images, b, 1, group, col)
        return col

    def forward(self, net):
        if nhwc_forward.is_nhwc(self):  # the layout plan's NHWC 16-bit output (issue 42)
            return nhwc_forward.forward(self, net)
        if self.precision != precisions.DEFAULT:
            return self._forward_reduced(net)
        be = net.be
        m, k, n = self._gemm_dims()
        weights, biases = self._forward_params(net)
        images = net.input
        if self.xnor:
            be.binarize(net.input[: self.batch * self.inputs], self.binary_input)
            images = self.binary_input
        # Bias (batch norm folded in) and activation in the GEMM's epilogue where they can
        # be: inference, or no batch norm, and an activation that needs neither its input
        # kept nor whole channels.
        epilogue = biases is not None and self._activation_fuses()
        for b0, count, col, product in self._chunks(be, net):
            for g in range(self.groups):
                group_biases = biases[g * m :] if epilogue else None
                if count == 1:  # one image: the GEMM writes straight into the output
                    self._forward_gemm(
                        be,
                        weights[g * m * k :],
                        self._image_col(be, images, b0, g, col),
                        n,
                        self.output[b0 * self.outputs + g * m * n :],
                        group_biases,
                    )
                    continue
                self._im2col(be, images, b0, count, g, col)
                self._forward_gemm(be, weights[g * m * k :], col, count * n, product, group_biases)
                self._move(be, product, self.output, b0, count, g, to_batched=True)
        if not epilogue:
            self._forward_tail(be, net, biases)

    def _forward_gemm(self, be, weights, col, width, out, biases):
        """out (m x width) = weights @ col, then biases and the activation (None: neither)."""
        m, k, _ = self._gemm_dims()
        if biases is None:
            be.gemm(False, False, m, width, k, 1.0, weights, k, col, width, 0.0, out, width)
        else:
            be.gemm_bias_activate(
                m, width, k, weights, k, col, width, out, width, biases, self.activation
            )

    def _activation_fuses(self):
        """Whether the activation may join the last pass over the output (it needs neither
        its input kept for backward nor whole channels)."""
        return self.activation_input is None and self.activation not in CHANNEL_ACTIVATIONS

    def _forward_tail(self, be, net, biases, from_x=False):
        """Bias (or batch norm) and activation after the product (from_x: batch norm's
        input is the product already in layer.x, bn_forward's from_x)."""
        spatial = self.out_h * self.out_w
        fused = self._activation_fuses()
        if biases is None:
            bn_forward(
                self,
                net,
                self.out_c,
                spatial,
                self.activation if fused else "linear",
                from_x=from_x,
            )
        elif fused:
            be.bias_activate(self.output, biases, self.batch, self.out_c, spatial, self.activation)
        else:
            be.add_bias(self.output, biases, self.batch, self.out_c, spatial)
        if not fused:
            self.activate_output(be)

    def _packed_weights(self, be, weights, train):
        """The groups' weights converted to this layer's precision: once in inference, at
        every forward in training (the fp32 master weights move)."""
        packed = None if train else getattr(self, "_packed", None)
        if packed is None:
            m, k, _ = self._gemm_dims()
            packed = [
                be.pack_weights(weights[g * m * k :], m, k, self.precision)
                for g in range(self.groups)
            ]
            self._packed = None if train else packed
        return packed

    def _forward_reduced(self, net):
        """One implicit-GEMM launch per group (no col buffer), bias and activation in its
        epilogue where they can be; batch norm (training) and other activations after."""
        be = net.be
        m, _, n = self._gemm_dims()
        weights, biases = self._forward_params(net)
        epilogue = (
            biases is not None
            and self.activation_input is None
            and self.activation in precisions.EPILOGUE_ACTIVATIONS
        )
        # Training batch norm on a 16-bit x: the product goes straight into x, rounded as
        # batchnorm_apply kept it, and batch norm reads it from there (half the bytes of
        # an fp32 output written, read for the statistics and again to normalise).
        x_at = product_into_x(self, net) if biases is None else None
        to_x = x_at is not None
        # Else into the output, fp32 or kept at 16 bits (output_storage.py: then the
        # epilogue applies the bias and activation).
        out, out_at = (self.x, x_at) if to_x else (self.output, be.storage_of(self.output))
        cg, hw = self.c // self.groups, self.h * self.w
        for g, packed in enumerate(self._packed_weights(be, weights, net.train)):
            be.conv_forward(
                packed,
                net.input[g * cg * hw :],
                cg,
                self.h,
                self.w,
                self.size,
                self.stride,
                self.padding,
                self.dilation,
                self.batch,
                self.c * hw,
                None if biases is None else biases[g * m :],
                self.activation if epilogue else "linear",
                out[g * m * n :],
                self.outputs,
                out_precision=out_at,
            )
        if biases is None:
            self._forward_tail(be, net, None, from_x=to_x)
        elif not epilogue:
            self.activate_output(be)

    def _gemm(self, be):
        """The backward's GEMM at this layer's precision."""
        if self.precision == precisions.DEFAULT:
            return be.gemm
        return lambda *args: be.gemm_lowp(self.precision, *args)

    def _implicit_backward(self, be, batch):
        """(weight gradient, data gradient): which products the backend runs as implicit
        GEMMs (conv_weight_grad, conv_data_grad: no im2col or col2im buffer)."""
        return be.conv_backward_implicit(
            self.precision,
            batch,
            self.c // self.groups,
            self.h,
            self.w,
            self.size,
            self.stride,
            self.padding,
            self.dilation,
            self.filters // self.groups,
        )

    def _backward_implicit(self, net, weights, data):
        """Per group: weight_updates += delta x input patches (weights); the input's delta
        gets weights^T x delta folded back (data), added, or written where the fork's
        col2im clears the image first."""
        be = net.be
        m, k, n = self._gemm_dims()
        cg, hw = self.c // self.groups, self.h * self.w
        geometry = (
            cg,
            self.h,
            self.w,
            self.size,
            self.stride,
            self.padding,
            self.dilation,
            self.batch,
        )
        for g in range(self.groups):
            if weights:
                be.conv_weight_grad(
                    self.precision,
                    self.delta[g * m * n :],
                    self.outputs,
                    net.input[g * cg * hw :],
                    self.inputs,
                    *geometry,
                    m,
                    self.weight_updates[g * m * k :],
                )
            if data and net.delta is not None:
                be.conv_data_grad(
                    self.precision,
                    self.weights[g * m * k :],
                    m,
                    self.delta[g * m * n :],
                    self.outputs,
                    *geometry,
                    net.delta[g * cg * hw :],
                    self.inputs,
                    not self.clears_input_delta,
                )

    def backward(self, net):
        be = net.be
        gemm = self._gemm(be)
        m, k, n = self._gemm_dims()
        spatial = self.out_h * self.out_w
        if self.batch_normalize:
            # The fork's CPU backward leaves a convolution's BN beta untrained (its GPU
            # build's cudnnBatchNormalizationBackward trains it).
            bn_activation_backward(self, net, self.out_c, spatial, train_beta=not self.fork_cpu)
        else:
            self.activation_gradient(be)
            be.backward_bias(self.bias_updates, self.delta, self.batch, self.out_c, spatial)
        implicit_weights, implicit_data = self._implicit_backward(be, self.batch)
        if net.delta is None:
            implicit_data = True  # no data gradient to compute
        # The products read the fp32 delta: batch norm's result left at 16 bits for them was
        # 3 ms slower on yolov4 (the weight gradient's tiles ran slower on a 16-bit delta).
        if implicit_weights or implicit_data:
            self._backward_implicit(net, implicit_weights, implicit_data)
        if implicit_weights and implicit_data:
            return
        if net.delta is not None and self.clears_input_delta and not implicit_data:
            be.fill(net.delta[: self.batch * self.inputs], 0.0)
        for b0, count, col, delta_out in self._chunks(be, net):
            for g in range(self.groups):
                self._move(be, delta_out, self.delta, b0, count, g, to_batched=False)
                if not implicit_weights:
                    # weight_updates += delta (m x count*n) @ im2col(input)^T (count*n x k)
                    cg = self.c // self.groups
                    offset = b0 * self.c * self.h * self.w + g * cg * self.h * self.w
                    be.conv_weight_grad_unfolded(
                        self.precision,
                        net.input[offset:],
                        cg,
                        self.h,
                        self.w,
                        self.size,
                        self.stride,
                        self.padding,
                        self.dilation,
                        count,
                        self.c * self.h * self.w,
                        delta_out,
                        m,
                        self.weight_updates[g * m * k :],
                        col,
                    )
                if not implicit_data:
                    # d(col) = weights^T (k x m) @ delta (m x count*n), folded back and
                    # added (Darknet's 1x1 path overwrites here, losing shortcut deltas).
                    gemm(
                        True,
                        False,
                        k,
                        count * n,
                        m,
                        1.0,
                        self.weights[g * m * k :],
                        k,
                        delta_out,
                        count * n,
                        0.0,
                        col,
                        count * n,
                    )
                    cg = self.c // self.groups
                    offset = b0 * self.c * self.h * self.w + g * cg * self.h * self.w
                    be.col2im(
                        col,
                        cg,
                        self.h,
                        self.w,
                        self.size,
                        self.stride,
                        self.padding,
                        self.dilation,
                        net.delta[offset:],
                        count,
                        self.c * self.h * self.w,
                    )

    def update(self, args):
        if self.share is not None:
            return  # the owner applies the accumulated update
        momentum_update(self.be, args, self.biases, self.bias_updates)
        if self.batch_normalize:
            momentum_update(self.be, args, self.scales, self.scale_updates)
        momentum_update(self.be, args, self.weights, self.weight_updates, weight_decay=True)
