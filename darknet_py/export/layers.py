"""One function per layer class: (graph, layer, input tensor) -> output tensor, as the
layer's forward computes it in inference (darknet-py's forward is the reference).

A layer reads the previous layer's output as its own (c, h, w) (or flat) input, as
Darknet's network state hands it over; the model walk (model.py) reshapes each result
to the layer's output shape. The heads' functions are in heads.py."""

import numpy as np

from ..layers import layer_class
from ..layers.batchnorm import FORK_BN_EPS
from ..shapes import conv_strides
from . import ExportError, winograd
from .activations import activate

EXPORTERS = {}  # layer class -> function


def exports(*types):
    """Register a function as the exporter of the layer classes of these section types."""

    def register(fn):
        for t in types:
            EXPORTERS[layer_class(t)] = fn
        return fn

    return register


def input_image(g, layer, x):
    return g.image(x, layer.c, layer.h, layer.w)


def output_image(layer):
    return (layer.out_c, layer.out_h, layer.out_w)


def layer_activation(g, layer, y):
    return activate(g, y, layer.activation, layer.out_c)


def bn_affine(layer, host):
    """(factor, offset) per output of Darknet's inference batch norm followed by the biases:
    scale / (sqrt(var) + 1e-6), or the fork's scale / sqrt(var + 1e-5), in float64."""
    scales, mean, var, biases = (
        host(getattr(layer, n)).astype(np.float64)
        for n in ("scales", "rolling_mean", "rolling_variance", "biases")
    )
    if layer.darknet == "alexeyab":
        factor = scales / np.sqrt(var + FORK_BN_EPS)
    else:
        factor = scales / (np.sqrt(var) + 1e-6)
    return factor, biases - mean * factor


# ---- computing layers ----------------------------------------------------------------------
@exports("convolutional")
def convolutional(g, layer, x):
    weights, biases = layer.inference_params(g.net.be)  # batch norm folded as forward folds it
    w = g.host(weights).reshape(layer.filters, layer.c // layer.groups, layer.size, layer.size)
    sy, sx = conv_strides(layer.stride)
    p, d = layer.padding, layer.dilation
    image = input_image(g, layer, x)
    if layer.xnor:  # the input binarized as the backend's binarize does: +1 where > 0, else -1
        shape = g.shapes[image]
        positive = g.op("Greater", [image, g.scalar(0.0)], shape)
        image = g.op("Where", [positive, g.scalar(1.0), g.scalar(-1.0)], shape)
    if g.dtype == np.float32 and winograd.chosen(layer, g.winograd):
        y = winograd.convolution(
            g, image, w, g.host(biases), layer.c, layer.out_c, layer.h, layer.w
        )
        return layer_activation(g, layer, y)
    y = g.op(
        "Conv",
        [image, g.const(w, "weights"), g.const(g.host(biases), "biases")],
        output_image(layer),
        kernel_shape=[layer.size] * 2,
        strides=[sy, sx],
        pads=[p] * 4,
        dilations=[d] * 2,
        group=layer.groups,
    )
    return layer_activation(g, layer, y)


@exports("deconvolutional")
def deconvolutional(g, layer, x):
    """ConvTranspose: Darknet's deconvolution weights are (c, filters, size, size), ONNX's
    layout; batch norm (or the biases) after it, per output channel."""
    w = g.host(layer.weights).reshape(layer.c, layer.filters, layer.size, layer.size)
    shape = output_image(layer)
    y = g.op(
        "ConvTranspose",
        [input_image(g, layer, x), g.const(w, "weights")],
        shape,
        kernel_shape=[layer.size] * 2,
        strides=[layer.stride] * 2,
        pads=[layer.padding] * 4,
    )
    if layer.batch_normalize:
        factor, offset = bn_affine(layer, g.host)
    else:
        factor, offset = np.ones(layer.filters), g.host(layer.biases).astype(np.float64)
    y = g.op("Mul", [y, g.const(factor.reshape(-1, 1, 1))], shape)
    y = g.op("Add", [y, g.const(offset.reshape(-1, 1, 1))], shape)
    return layer_activation(g, layer, y)


@exports("connected")
def connected(g, layer, x):
    w = g.host(layer.weights).astype(np.float64).reshape(layer.outputs, layer.inputs)
    b = g.host(layer.biases).astype(np.float64)
    if layer.batch_normalize:
        factor, b = bn_affine(layer, g.host)
        w = w * factor[:, None]
    y = g.op(
        "Gemm", [g.flat(x), g.const(w, "weights"), g.const(b, "biases")], (layer.outputs,), transB=1
    )
    return layer_activation(g, layer, y)


@exports("batchnorm")
def batchnorm(g, layer, x):
    factor, offset = bn_affine(layer, g.host)
    shape = (layer.out_c, 1, 1)
    y = g.op("Mul", [input_image(g, layer, x), g.const(factor.reshape(shape))], output_image(layer))
    return g.op("Add", [y, g.const(offset.reshape(shape))], output_image(layer))


@exports("local")
def local(g, layer, x):
    """Darknet's im2col as a convolution with one-hot kernels, then one (filters x k)
    matrix per output position."""
    k, f, size = layer.ksize, layer.filters, layer.size
    unfold = np.eye(k, dtype=np.float32).reshape(k, layer.c, size, size)
    cols = g.op(
        "Conv",
        [input_image(g, layer, x), g.const(unfold, "unfold")],
        (k, layer.out_h, layer.out_w),
        kernel_shape=[size] * 2,
        strides=[layer.stride] * 2,
        pads=[layer.pad] * 4,
    )
    cols = g.reshape(cols, (k, layer.locations))
    w = g.host(layer.weights).reshape(layer.locations, f, k)
    y = g.op("Einsum", [cols, g.const(w, "weights")], (f, layer.locations), equation="bkl,lfk->bfl")
    y = g.op(
        "Add",
        [y, g.const(g.host(layer.biases).reshape(f, layer.locations), "biases")],
        (f, layer.locations),
    )
    return layer_activation(g, layer, g.reshape(y, output_image(layer)))


# ---- pooling ---------------------------------------------------------------------------------
def _window_pads(g, layer, x, fill):
    """Darknet's windows start at -padding/2 and the output size takes `padding` in all:
    ONNX pads (begin padding/2, end the rest), or an explicit Pad of `fill` where a pad
    would reach a whole window (which ONNX's pooling refuses)."""
    top = layer.padding // 2
    bottom = layer.padding - top
    if max(top, bottom) < layer.size:
        return x, [top, top, bottom, bottom]
    if fill is None:
        raise ExportError(
            f"layer {layer.index} [{layer.type}]: padding={layer.padding} "
            f"reaches a whole {layer.size}x{layer.size} window, which ONNX's "
            f"pooling cannot express"
        )
    c, h, w = layer.c, layer.h, layer.w
    padded = g.op(
        "Pad",
        [x, g.ints([0, 0, top, top, 0, 0, bottom, bottom]), g.scalar(fill)],
        (c, h + layer.padding, w + layer.padding),
    )
    return padded, [0, 0, 0, 0]


@exports("maxpool")
def maxpool(g, layer, x):
    x = input_image(g, layer, x)
    if layer.depth:
        return _maxpool_depth(g, layer, x)
    x, pads = _window_pads(g, layer, x, -np.inf)
    return g.op(
        "MaxPool",
        [x],
        output_image(layer),
        kernel_shape=[layer.size] * 2,
        strides=[layer.stride_y, layer.stride_x],
        pads=pads,
    )


def _maxpool_depth(g, layer, x):
    """The fork's maxpool_depth: output channel j is the maximum of channels j, j+K, ...:
    channels padded with -inf to a multiple of K, then a maximum over the groups of K."""
    k, c, hw = layer.out_c, layer.c, layer.h * layer.w
    groups = -(-c // k)
    if groups * k != c:
        x = g.op(
            "Pad",
            [x, g.ints([0, 0, 0, 0, 0, groups * k - c, 0, 0]), g.scalar(-np.inf)],
            (groups * k, layer.h, layer.w),
        )
    y = g.reduce("ReduceMax", g.reshape(x, (groups, k, hw)), [1], (1, k, hw))
    return g.reshape(y, output_image(layer))


@exports("local_avgpool")
def local_avgpool(g, layer, x):
    x, pads = _window_pads(g, layer, input_image(g, layer, x), None)
    return g.op(
        "AveragePool",
        [x],
        output_image(layer),
        kernel_shape=[layer.size] * 2,
        strides=[layer.stride_y, layer.stride_x],
        pads=pads,
        count_include_pad=0,
    )


@exports("avgpool")
def avgpool(g, layer, x):
    return g.op("GlobalAveragePool", [input_image(g, layer, x)], output_image(layer))


# ---- moving values ---------------------------------------------------------------------------
def _image_shaped(layer):
    return layer.image_shaped and layer.out_c * layer.out_h * layer.out_w == layer.outputs


@exports("route")
def route(g, layer, x):
    groups, gid = layer.groups, layer.group_id
    images = all(_image_shaped(src) for src in layer.sources)
    parts = []
    for src in layer.sources:
        t = g.outputs[src.index]
        if images:  # a group of the flat per-image output is a group of its channels
            t = g.image(t, src.out_c, src.out_h, src.out_w)
            part = src.out_c // groups
            shape = (part, src.out_h, src.out_w)
        else:
            t = g.flat(t)
            part = src.outputs // groups
            shape = (part,)
        if groups > 1:
            t = g.slice(t, 1, gid * part, (gid + 1) * part, shape=shape)
        parts.append(t)
    shape = output_image(layer) if images else (layer.outputs,)
    return g.concat(parts, 1, shape)


def _fit_channels(g, t, c_from, c_to, h, w):
    """t (c_from, h, w) cut or zero-padded to c_to channels."""
    if c_from > c_to:
        return g.slice(t, 1, 0, c_to, shape=(c_to, h, w))
    if c_from < c_to:
        return g.op(
            "Pad", [t, g.ints([0, 0, 0, 0, 0, c_to - c_from, 0, 0]), g.scalar(0.0)], (c_to, h, w)
        )
    return t


@exports("shortcut")
def shortcut(g, layer, x):
    x = input_image(g, layer, x)
    if layer.darknet != "alexeyab":
        y = _shortcut_original(g, layer, x)
    elif layer.weights_type == "none":
        y = x
        for src in layer.sources:
            t = g.image(g.outputs[src.index], src.out_c, src.out_h, src.out_w)
            y = g.op(
                "Add",
                [y, _fit_channels(g, t, src.out_c, layer.c, layer.h, layer.w)],
                output_image(layer),
            )
    else:
        y = _shortcut_weighted(g, layer, x)
    return layer_activation(g, layer, y)


def _shortcut_weighted(g, layer, x):
    """The fork's weighted sum, its weights normalised as forward normalises them."""
    be, n, wc = g.net.be, len(layer.sources) + 1, layer.weight_channels
    normalized = be.zeros(n * wc)
    be.shortcut_weights(layer.weights, n, wc, layer.normalization, normalized)
    weights = g.host(normalized).reshape(n, wc)
    inputs = [x] + [g.image(g.outputs[s.index], s.out_c, s.out_h, s.out_w) for s in layer.sources]
    channels = [layer.c] + [s.out_c for s in layer.sources]
    y = None
    for t, c, w in zip(inputs, channels, weights):
        t = _fit_channels(g, t, c, layer.c, layer.h, layer.w)
        term = g.op(
            "Mul", [t, g.const(w.reshape(-1, 1, 1), "shortcut_weight")], output_image(layer)
        )
        y = term if y is None else g.op("Add", [y, term], output_image(layer))
    return y


def _shortcut_original(g, layer, x):
    """shortcut_cpu: over the channels and cells both have, out = alpha*out + beta*from,
    `from` sampled with a stride when larger, added to every sample-th cell when smaller."""
    src = layer.source
    c, h, w = layer.c, layer.h, layer.w
    stride, sample = max(1, src.out_w // w), max(1, w // src.out_w)
    minc, minh, minw = min(c, src.out_c), min(h, src.out_h), min(w, src.out_w)
    a = g.image(g.outputs[src.index], src.out_c, src.out_h, src.out_w)
    if stride > 1 or minc < src.out_c:
        a = g.op(
            "Slice",
            [
                a,
                g.ints([0, 0, 0]),
                g.ints([minc, minh * stride, minw * stride]),
                g.ints([1, 2, 3]),
                g.ints([1, stride, stride]),
            ],
            (minc, minh, minw),
        )
    if sample > 1:  # spread onto every sample-th cell, zeros between, then to h x w
        a = g.reshape(a, (minc, minh, 1, minw, 1))
        a = g.op(
            "Pad",
            [a, g.ints([0] * 6 + [0, 0, 0, sample - 1, 0, sample - 1]), g.scalar(0.0)],
            (minc, minh, sample, minw, sample),
        )
        a = g.reshape(a, (minc, minh * sample, minw * sample))
        a = g.op(
            "Pad",
            [a, g.ints([0] * 4 + [0, 0, h - minh * sample, w - minw * sample]), g.scalar(0.0)],
            (minc, h, w),
        )
    head = g.slice(x, 1, 0, minc, shape=(minc, h, w)) if minc < c else x
    mask = np.zeros((1, h, w))
    mask[:, 0 : minh * sample : sample, 0 : minw * sample : sample] = 1
    if layer.alpha == 1 and sample == 1:
        summed = head
    else:  # alpha applies only where a value is added
        scale = 1 + (layer.alpha - 1) * mask
        summed = g.op("Mul", [head, g.const(scale, "alpha")], (minc, h, w))
    beta = a if layer.beta == 1 else g.mul(a, float(layer.beta))
    summed = g.op("Add", [summed, beta], (minc, h, w))
    if minc < c:
        summed = g.concat([summed, g.slice(x, 1, minc, c, shape=(c - minc, h, w))], 1, (c, h, w))
    return summed


@exports("upsample")
def upsample(g, layer, x):
    x = input_image(g, layer, x)
    s = layer.stride
    if layer.reverse:  # the adjoint of upsampling: each s x s cell summed, times scale
        y = g.op("AveragePool", [x], output_image(layer), kernel_shape=[s, s], strides=[s, s])
        factor = s * s * layer.scale
    else:
        scales = g.const(np.array([1, 1, s, s], dtype=np.float32), "scales", np.float32)
        y = g.op(
            "Resize",
            [x, "", scales],
            output_image(layer),
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )
        factor = layer.scale
    return y if factor == 1 else g.mul(y, float(factor))


def _reorg(g, x, w, h, c, s, forward):
    """The backend's reorg (Darknet's reorg_cpu with this w, h, c and forward flag) on the
    flat per-image x: a transpose between the (s, s, c/s², h, w) and (c/s², h, s, w, s)
    layouts of the same values."""
    oc = c // (s * s)
    if forward:
        t = g.reshape(x, (s, s, oc, h, w))
        t = g.op("Transpose", [t], (oc, h, s, w, s), perm=[0, 3, 4, 1, 5, 2])
    else:
        t = g.reshape(x, (oc, h, s, w, s))
        t = g.op("Transpose", [t], (s, s, oc, h, w), perm=[0, 3, 5, 1, 2, 4])
    return g.flat(t)


@exports("reorg")
def reorg(g, layer, x):
    if layer.extra:  # the values, then `extra` zeros
        return g.op(
            "Pad", [g.flat(x), g.ints([0, 0, 0, layer.extra]), g.scalar(0.0)], (layer.outputs,)
        )
    if layer.flatten:  # CHW <-> HWC per image
        if layer.reverse:
            t = g.reshape(x, (layer.h, layer.w, layer.c))
            return g.op("Transpose", [t], (layer.c, layer.h, layer.w), perm=[0, 3, 1, 2])
        t = input_image(g, layer, x)
        return g.op("Transpose", [t], (layer.h, layer.w, layer.c), perm=[0, 2, 3, 1])
    return _reorg(g, g.flat(x), layer.w, layer.h, layer.c, layer.stride, bool(layer.reverse))


@exports("reorg3d")
def reorg3d(g, layer, x):
    return _reorg(g, g.flat(x), layer.out_w, layer.out_h, layer.out_c, layer.stride, False)


@exports("crop")
def crop(g, layer, x):
    x = input_image(g, layer, x)
    dh, dw = (layer.h - layer.out_h) // 2, (layer.w - layer.out_w) // 2
    y = g.op(
        "Slice",
        [x, g.ints([dh, dw]), g.ints([dh + layer.out_h, dw + layer.out_w]), g.ints([2, 3])],
        output_image(layer),
    )
    return y if layer.noadjust else g.add(g.mul(y, float(layer.scale)), float(layer.trans))


@exports("dropout", "empty", "cost")
def identity(g, layer, x):
    """Dropout passes its input in inference; [empty] always; a [cost] layer's output is an
    error that inference does not compute (predict returns the layer before it)."""
    return g.reshape(x, (layer.inputs,)) if layer.type == "cost" else x


@exports("activation")
def activation(g, layer, x):
    return layer_activation(g, layer, input_image(g, layer, x))


@exports("logistic")
def logistic(g, layer, x):  # its cost needs a truth: inference is the logistic alone
    return g.op("Sigmoid", [input_image(g, layer, x)], output_image(layer))


@exports("l2norm")
def l2norm(g, layer, x):
    """x / sqrt(the sum over the channels of x^2), per position."""
    image = input_image(g, layer, x)
    shape = output_image(layer)
    squares = g.op("Mul", [image, image], shape)
    total = g.reduce("ReduceSum", squares, [1], (1, layer.out_h, layer.out_w))
    return g.op("Div", [image, g.op("Sqrt", [total], (1, layer.out_h, layer.out_w))], shape)


@exports("normalization")
def normalization(g, layer, x):
    """Darknet's LRN as a 1x1 convolution of x^2: its running window sum is a fixed linear
    map over the channels (lrn_forward's counts: channel size/2 never enters and is later
    subtracted), then kappa added, ^-beta, times x."""
    c = layer.c
    counts, window = np.zeros((c, c)), np.zeros(c)
    window[: min(layer.size // 2, c)] = 1
    counts[0] = window
    for k in range(1, c):
        prev, nxt = k - (layer.size - 1) // 2 - 1, k + layer.size // 2
        if prev >= 0:
            window[prev] -= 1
        if nxt < c:
            window[nxt] += 1
        counts[k] = window
    image = input_image(g, layer, x)
    shape = output_image(layer)
    squares = g.op("Mul", [image, image], shape)
    weights = (layer.alpha * counts).reshape(c, c, 1, 1)
    norms = g.op(
        "Conv",
        [squares, g.const(weights, "lrn_window"), g.const(np.full(c, layer.kappa), "kappa")],
        shape,
        kernel_shape=[1, 1],
    )
    return g.op("Mul", [g.op("Pow", [norms, g.scalar(-layer.beta)], shape), image], shape)


@exports("softmax")
def softmax(g, layer, x):
    if layer.hierarchy is not None:
        t = g.reshape(x, (layer.inputs, 1))
        if layer.temperature != 1:
            t = g.op("Div", [t, g.scalar(layer.temperature)], (layer.inputs, 1))
        return g.flat(tree_softmax(g, t, layer.hierarchy, (1,)))
    n = layer.inputs // layer.groups
    t = g.reshape(x, (layer.groups, n))
    if layer.temperature != 1:
        t = g.op("Div", [t, g.scalar(layer.temperature)], (layer.groups, n))
    return g.flat(g.op("Softmax", [t], (layer.groups, n), axis=-1))


def tree_softmax(g, t, hier, rest):
    """A softmax over each sibling group of a class tree (tree.py), along the per-image
    axis 0 of t, shaped (classes, *rest): one Slice and Softmax a group, concatenated."""
    parts = []
    for first, size in zip(hier.group_offset.tolist(), hier.group_size.tolist()):
        group = g.slice(t, 1, first, first + size, shape=(size, *rest))
        parts.append(g.op("Softmax", [group], (size, *rest), axis=1))
    return g.concat(parts, 1, (hier.n, *rest))


# ---- the fork's attention layers ---------------------------------------------------------------
@exports("sam")
def sam(g, layer, x):
    src = g.image(g.outputs[layer.source.index], layer.c, layer.h, layer.w)
    y = g.op("Mul", [input_image(g, layer, x), src], output_image(layer))
    return layer_activation(g, layer, y)


@exports("scale_channels")
def scale_channels(g, layer, x):
    src = layer.source
    t = g.image(g.outputs[src.index], src.out_c, src.out_h, src.out_w)
    y = g.op("Mul", [input_image(g, layer, x), t], output_image(layer))
    return layer_activation(g, layer, y)
