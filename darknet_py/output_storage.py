"""Which layer outputs are stored at 16 bits under fp16/bf16 (half the bytes between layers;
yolov4's fp16 training peak at batch 32 10.9 -> 9.0 GB).

A layer's output under a 16-bit precision P is kept as P (the backend's storage_zeros array:
half the bytes written and read) when the layer can write it so and every layer that reads
it takes a P input; else it stays fp32. The bits a reader sees change only where a value is
rounded that was not before:
  * a convolution at P rounds its input to P anyway, so its products are the same;
  * a batch-normalised convolution's output is made from its 16-bit x (batchnorm_rebuild)
    or, folded for inference, by the convolution's epilogue, rounded once at the store; its
    backward recomputes the activation's gradient from x, not from the output;
  * [route], [maxpool] and [upsample] (scale 1) move values, exact at P;
  * [shortcut] rounds its sum once (the residual stream at P, as PyTorch AMP keeps it).

Writers (a layer whose output may be P):
  * a convolution at P, not binary/xnor nor stepped, whose activation its epilogue or
    batchnorm_rebuild applies (precision.EPILOGUE_ACTIVATIONS, no activation input kept);
    training needs batch norm (the output is made from x: output_plan.rebuildable), and
    inference needs batch norm folded or none (Network.fold_batchnorm);
  * a [route] (not a view), a linear [shortcut] without the fork's weights, a 2-D
    [maxpool] and an [upsample] (not reverse), whose every input is P.
Readers that take a P input: a convolution at P (not xnor), and the writers above when their
own output is P. A [route] that views its one input is its input's array. The network's
output layer keeps fp32 (read on the host), and so does anything feeding another type
(heads, [scale_channels], [sam], ...). The choice is the largest set that satisfies these
rules: start from every writer and drop those whose inputs or readers do not fit, until
none is dropped.
"""

from . import precision as precisions
from .activations import CHANNEL_ACTIVATIONS
from .delta_plan import referred_layers
from .layers import batchnorm
from .layers.base import keeps_activation_input

MOVERS = ("route", "shortcut", "maxpool", "upsample")


def input_layers(layer, layers):
    """The layers whose outputs a layer's forward reads: the previous one (net.input) and
    the ones it names ([route]'s layers=, [shortcut]'s from=); None where it reads the
    network's input."""
    named = referred_layers(layer)
    if layer.type == "route":
        return named
    if not layer.index:
        return None  # the network's input: fp32 images
    previous = layers[layer.index - 1]
    return [previous] + [l for l in named if l is not previous]


def _convolution_writes(layer, precision, train, fold_batchnorm):
    """Whether a convolution can write its output at `precision` (see the module's
    docstring)."""
    if (
        layer.stepped
        or getattr(layer, "binary", 0)
        or getattr(layer, "xnor", 0)
        or layer.activation not in precisions.EPILOGUE_ACTIVATIONS
        or layer.activation in CHANNEL_ACTIVATIONS
        or keeps_activation_input(layer)
    ):
        return False
    if train:  # the output made from x, kept at the same 16 bits
        return bool(layer.batch_normalize) and batchnorm.x_precision(layer) == precision
    return fold_batchnorm or not layer.batch_normalize


def _mover_writes(layer):
    """Whether a [route]/[shortcut]/[maxpool]/[upsample] keeps its values' precision."""
    if layer.type == "shortcut":
        return layer.activation == "linear" and getattr(layer, "weights_type", "none") == "none"
    if layer.type == "maxpool":
        return not layer.depth and layer.stride_x == layer.stride_y
    if layer.type == "upsample":
        return not layer.reverse and layer.scale == 1.0
    return layer.type == "route"


def _takes(reader, precision, chosen):
    """Whether `reader` can read an input stored at `precision`."""
    if reader.type == "convolutional":
        return reader.precision == precision and not getattr(reader, "xnor", 0)
    if reader.type == "route" and reader.views_its_input():
        return True  # its readers are its input's (output_plan.readers)
    return reader.index in chosen


def plan_output_storage(layers, output_index, precision, train, fold_batchnorm=True):
    """Each layer's output storage: `precision` (fp16/bf16) where the rules above allow,
    else fp32; a list by layer index. Any other precision: fp32 everywhere."""
    storage = [precisions.DEFAULT] * len(layers)
    if precision not in precisions.HALF_STORAGE:
        return storage
    from .output_plan import array_owner, readers

    read_by = readers(layers)
    network_output = array_owner(layers[output_index])
    chosen = set()
    for layer in layers:
        if layer is network_output or layer.views_its_input() or not read_by[layer.index]:
            continue
        if layer.type == "convolutional":
            if layer.precision == precision and _convolution_writes(
                layer, precision, train, fold_batchnorm
            ):
                chosen.add(layer.index)
        elif layer.type in MOVERS and not layer.stepped and _mover_writes(layer):
            chosen.add(layer.index)
    dropped = True
    while dropped:
        dropped = False
        for i in sorted(chosen):
            layer = layers[i]
            sources = input_layers(layer, layers)
            inputs_fit = layer.type == "convolutional" or (
                sources is not None and all(array_owner(src).index in chosen for src in sources)
            )
            if not inputs_fit or not all(_takes(layers[r], precision, chosen) for r in read_by[i]):
                chosen.discard(i)
                dropped = True
    for i in chosen:
        storage[i] = precision
    for layer in layers:  # a viewing [route] is its input's array
        if layer.views_its_input():
            storage[layer.index] = storage[array_owner(layer).index]
    return storage


def assign_output_storage(layers, output_index, precision, train, fold_batchnorm=True, on=True):
    """Set each layer's output_precision (plan_output_storage; on=False: fp32 for all)."""
    storage = (
        plan_output_storage(layers, output_index, precision, train, fold_batchnorm)
        if on
        else [precisions.DEFAULT] * len(layers)
    )
    for layer, stored in zip(layers, storage):
        layer.output_precision = stored
    return storage
