"""Outputs shared between layers whose lifetimes do not overlap (training memory: yolov4's
fp32 peak at batch 32 19.3 -> 14.1 GB).

A layer's output is written by its forward and read by the forward of its readers: the next
layer (net.input) and the layers that name it ([route], [shortcut], ...). Most outputs are
also read in the backward: a convolution's weight gradient reads its input, an activation's
gradient its own output. An output that nothing reads in the backward is live only from
its own forward step to its last reader's. A batch-normalised convolution's output
that the backward does read is made again from what its layer keeps anyway (x and the
pass's statistics, batchnorm.bn_rebuild_output) right before the first backward step that
reads it, and lives from there to the last one, instead of from the forward to the
backward. Time runs through the forward's steps and then the backward's, so outputs whose
intervals do not meet can live in one array (each a view of its first batch * outputs
floats). Every layer computes from the same values as with a private output, so training
is the same bit for bit; under fp16/bf16 a rebuilt output is made from x's 16 bits (the
values batch norm's backward reads), within the formats' rounding of the forward's.

Only what is known to hold is shared; anything else keeps a private output:
  * a layer of a type outside SHARED_TYPES, a stepped (recurrent) layer, the network's
    output layer, and everything in the fork's CPU flavour;
  * an output read in the backward: by its own layer (reads_own_output) or by a reader
    that reads its input values there (reads_input_in_backward);
  * an output a [route] of one whole input takes as its own (route.views_its_input) is
    planned with that route's readers as its own.
"""

from dataclasses import dataclass, field

from . import precision as precisions
from .activations import CHANNEL_ACTIVATIONS, INPUT_GRADIENT
from .delta_plan import give_views, place_in_arrays, referred_layers
from .layers.base import keeps_activation_input

# Layers whose forward writes every float of Layer.allocate's output before reading it.
SHARED_TYPES = frozenset({"convolutional", "shortcut", "route", "maxpool", "upsample"})


@dataclass
class OutputPlan:
    """Which layers share which output array. Indices are layer indices; sizes are floats
    per image (times the batch on the backend)."""

    floats: list  # each layer's output, per image
    live: dict = field(default_factory=dict)  # shared layer -> its time intervals
    buffer_of: dict = field(default_factory=dict)  # shared layer -> its array's number
    buffer_floats: list = field(default_factory=list)  # each array's size, per image
    buffer_storage: list = field(default_factory=list)  # each array's values' storage
    rebuild_before: dict = field(default_factory=dict)  # backward step -> layers made again

    @property
    def saved_floats(self):
        """Floats per image the sharing saves against a private output for every layer."""
        return sum(self.floats[i] for i in self.buffer_of) - sum(self.buffer_floats)


def reads_input_in_backward(layer):
    """Whether a layer's backward reads the values of its inputs (conservatively yes for
    every type not listed): [route], [upsample], [maxpool] (its kept indexes) and [yolo]
    pass deltas only; a [shortcut] reads its inputs only for the fork's weights."""
    if layer.type in ("route", "upsample", "maxpool", "yolo"):
        return False
    if layer.type == "shortcut":
        return getattr(layer, "weights_type", "none") != "none"
    return True


def reads_own_output(layer):
    """Whether a layer's backward reads its own output (conservatively yes for every type
    not listed): an activation's gradient from the output (leaky, logistic, ...) does; a
    batch-normalised layer's gradient for mish/swish-like activations is recomputed from x
    (batchnorm.bn_activation_backward), as is every activation's where x is kept at 16
    bits (fp16/bf16), and a linear one reads nothing."""
    if layer.type in ("route", "upsample", "maxpool"):
        return False
    activation = getattr(layer, "activation", None)
    if layer.type == "shortcut":
        return activation != "linear"
    if layer.type == "convolutional":
        if activation == "linear":
            return False
        from_x = (
            layer.batch_normalize and not layer.stepped and activation not in CHANNEL_ACTIVATIONS
        )
        # A 16-bit x's backward recomputes every activation's gradient from x.
        return not (
            from_x
            and (
                activation in INPUT_GRADIENT
                or precisions.storage(getattr(layer, "precision", precisions.DEFAULT))
                in precisions.HALF_STORAGE
            )
        )
    return True


def readers(layers):
    """For each layer, the layers whose forward reads its output: the next layer and those
    that name it; a [route] that views its one input passes on its own readers."""
    found = [set() for _ in layers]
    for layer in layers:
        if layer.index + 1 < len(layers):
            found[layer.index].add(layer.index + 1)
        for named in referred_layers(layer):
            found[named.index].add(layer.index)
    for layer in reversed(layers):  # a view's readers, through chains of views
        if layer.views_its_input():
            found[layer.sources[0].index] |= found[layer.index]
    return found


def rebuildable(layer):
    """Whether a layer's output can be made again from what its training keeps: a
    batch-normalised convolution, not stepped, whose forward ends in batchnorm_apply with
    its activation (none that mixes channels, no activation input kept)."""
    return (
        layer.type == "convolutional"
        and layer.batch_normalize
        and not layer.stepped
        and layer.activation not in CHANNEL_ACTIVATIONS
        and not keeps_activation_input(layer)
    )


def backward_time(step, count):
    """The backward's steps after the forward's on one time line (the backward runs from
    the last layer down)."""
    return 2 * count - 1 - step


def plan_outputs(layers, output_index, share=True, storage=None):
    """The OutputPlan of `layers` (a Network's, in order). share=False: every output private.
    Arrays are coloured as the deltas' are (delta_plan.place_in_arrays), apart for each
    output storage (`storage`: per layer; None: the layers' output_precision)."""
    if storage is None:
        storage = [getattr(l, "output_precision", "fp32") for l in layers]
    plan = OutputPlan(floats=[l.outputs for l in layers])
    if not share:
        return plan
    read_by = readers(layers)
    count = len(layers)
    network_output = array_owner(layers[output_index])  # read after every pass: its own
    intervals = {}  # layer -> the times its output is live
    for layer in layers:
        i = layer.index
        if (
            layer.type not in SHARED_TYPES
            or layer.stepped
            or layer is network_output
            or layer.views_its_input()
            or not read_by[i]
        ):
            continue
        needs = [r for r in read_by[i] if reads_input_in_backward(layers[r])]
        if reads_own_output(layer):
            needs.append(i)
        forward = (i, max(read_by[i]))
        if not needs:
            intervals[i] = (forward,)
        elif rebuildable(layer):
            first, last = max(needs), min(needs)
            intervals[i] = (forward, (backward_time(first, count), backward_time(last, count)))
            plan.rebuild_before.setdefault(first, []).append(i)
    # Arrays hold one storage: outputs kept at 16 bits (output_storage.py) and fp32 ones
    # are placed apart.
    for stored in sorted({storage[i] for i in intervals}):
        group = {i: v for i, v in intervals.items() if storage[i] == stored}
        buffer_of, buffer_floats = place_in_arrays(group, plan.floats)
        first = len(plan.buffer_floats)
        plan.buffer_of.update({i: first + number for i, number in buffer_of.items()})
        plan.buffer_floats += buffer_floats
        plan.buffer_storage += [stored] * len(buffer_floats)
    plan.live = intervals
    return plan


def share_output_arrays(layers, be, batch, share, output_index):
    """The OutputPlan of `layers` (share=False: every output private), its arrays made on
    `be` for `batch` images, each shared layer given its view as Layer.shared_output (its
    allocate takes it as its output)."""
    plan = plan_outputs(layers, output_index, share)
    give_views(layers, be, batch, plan, "shared_output")
    return plan


def array_owner(layer):
    """The layer whose output array `layer`'s output is: itself, or the source of a
    [route] viewing one (through chains of them)."""
    while layer.views_its_input():
        layer = layer.sources[0]
    return layer


def output_is_shared(layer):
    """Whether a layer's output array is shared with other layers' (directly, or as a
    [route] viewing such an output)."""
    return array_owner(layer).shared_output is not None
