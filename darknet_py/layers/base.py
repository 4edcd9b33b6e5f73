"""What every layer is: cfg section -> options -> output shape -> forward/backward.

A layer is built in two steps, like Darknet's make_*_layer split from its
buffers: ``__init__`` reads the options and works out shapes and BFLOPs (enough
for ``darknet-py info``), ``allocate`` creates its arrays on a backend. Forward
and backward receive the network, which carries Darknet's network state:
``net.input`` (the previous layer's output), ``net.delta`` (the previous layer's
delta, or None), ``net.truth`` (and its host copy ``net.truth_host``), ``net.train``,
``net.workspace`` and ``net.be``.
"""

from dataclasses import dataclass

import numpy as np

from ..activations import ACTIVATIONS, CHANNEL_ACTIVATIONS, INPUT_GRADIENT


@dataclass
class UpdateArgs:
    """Darknet's update_args: what update() needs from the network."""

    rate: object  # one-element backend array: learning rate / batch, written before each
    # update (read on the device, so a captured update follows the policy)
    momentum: float
    decay: float
    batch: int  # images per update: batch * subdivisions
    adam: object = None  # adam.Adam where this layer's Darknet updates it with Adam
    # fp16's loss scaler's found-inf flag (a one-element int backend array): the update
    # does nothing when it is set, read on the device (precision.LossScaler). None: no scaler.
    skip: object = None


@dataclass
class BuildContext:
    """What a layer may look at while it is being built."""

    layers: list  # the layers built so far (route/shortcut refer to them)
    net: object  # NetOptions of the [net] section
    batch: int
    darknet: str = "original"  # which Darknet's arithmetic (network.DARKNET_FLAVOURS)
    fork_cpu: bool = False  # the fork trained as its CPU build does ("alexeyab-cpu")


class Layer:
    type = ""  # Darknet's section name, e.g. "convolutional"
    image_shaped = True  # False where Darknet reports a 0x0x0 shape (softmax, cost, ...)
    # False where forward or backward works on the host (reads the device, draws from the
    # host RNG): such a step cannot be recorded once as a graph and replayed.
    capturable = True
    # The fork's l.train, which only its convolutional, batchnorm, maxpool (local_avgpool)
    # and shortcut makers set: its CPU training clears only these layers' deltas before a
    # pass (the others keep adding to theirs within an iteration; darknet-py zeroes them
    # when an iteration starts, see Network._clear_fork_deltas; its GPU build clears every
    # delta) and both its builds update only these.
    fork_train = False
    # An inner layer of a recurrent layer (recurrent.Inner sets it): its per-image arrays
    # are pointed at one time step's rows, its batch-norm statistics are the last step's.
    stepped = False
    # How the output's values are stored: fp32, or a 16-bit precision's storage under
    # fp16/bf16 (output_storage.py, set by the network before allocate).
    output_precision = "fp32"
    # Where the network shares delta arrays between layers (network.share_deltas): this
    # layer's view of one, which allocate takes as its delta; None: a delta of its own.
    shared_delta = None
    shared_output = None  # a view of an array other layers' outputs use too (output_plan.py)

    def __getattr__(self, name):
        # Reached only when the attribute is missing: a parameter load_network left
        # pending (weights.PendingParameters) is written, with all the others, on its
        # first read.
        pending = self.__dict__.get("pending_parameters")
        if pending is not None and name in pending.names.get(id(self), ()):
            pending.write()
        if name in self.__dict__:  # written now, or by another thread since the lookup
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __init__(self, index, section, c, h, w, inputs, ctx):
        self.index = index
        self.section = section
        self.c, self.h, self.w = c, h, w
        self.inputs = inputs
        self.out_c, self.out_h, self.out_w = c, h, w
        self.outputs = inputs
        self.batch = ctx.batch
        self.darknet = ctx.darknet
        # The fork's CPU-build rules ("alexeyab-cpu"); else its GPU build's (or the original).
        self.fork_cpu = ctx.darknet == "alexeyab" and ctx.fork_cpu
        self.workspace_size = 0  # floats of the shared workspace this layer needs
        self.cost = None  # set by layers that compute a loss
        # A loss computed on the backend leaves its figures in `scalars` (a small device
        # array, cost first) and sets `pending`; the network reads them all after the step
        # (collect), so no forward or backward waits on the device.
        self.scalars = None
        self.pending = False
        self.stopbackward = False
        self.be = None
        self.output = None
        self.delta = None
        self.parse(section, ctx)

    # ---- description ----------------------------------------------------------
    def parse(self, section, ctx):
        """Read options from the cfg section and set out_c/out_h/out_w/outputs."""
        raise NotImplementedError

    @property
    def bflops(self):
        return 0.0

    @property
    def fork_bflops(self):
        """BFLOPs as the AlexeyAB fork counts them; the same as bflops unless a layer says."""
        return self.bflops

    def describe(self):
        """The middle of Darknet's layer-table row (after the index and type)."""
        return (
            f"{'':24s}{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    def output_shape(self, batch):
        if self.image_shaped and self.out_c * self.out_h * self.out_w == self.outputs:
            return (batch, self.out_c, self.out_h, self.out_w)
        return (batch, self.outputs)

    # ---- buffers ------------------------------------------------------------
    def allocate(self, be, batch, train):
        """Create output (and delta, when training) for `batch` images. Parameters
        are created once by init_params and survive re-allocation."""
        self.be = be
        self.batch = batch
        self.output = self.new_output(be, batch)
        if not train:
            self.delta = None
        elif self.shared_delta is not None:
            self.delta = self.shared_delta
        else:
            self.delta = be.zeros(batch * self.outputs)
        # The input of an activation whose gradient needs it (see activations.py).
        self.activation_input = (
            be.zeros(batch * self.outputs) if train and keeps_activation_input(self) else None
        )

    def views_its_input(self):
        """Whether the layer's output is an earlier layer's output array (new_output): a
        [route] of one whole input."""
        return False

    def new_output(self, be, batch):
        """The array the layer's output lives in: one of its own unless the network's
        output plan shares one (output_plan.py) or a layer type takes an earlier layer's
        (a [route] of one whole input)."""
        if self.shared_output is not None:
            return self.shared_output
        return be.storage_zeros(batch * self.outputs, self.output_precision)

    def check_truth(self, net, truth_host):
        """Refuse a step's truth (host array, one row per image) this layer cannot train on,
        before anything runs; by default every truth is fine."""

    def collect(self, values):
        """Take the host copy of `scalars` after a training step: by default the cost is
        values[0]. Loss layers with statistics override this to keep and report them."""
        self.cost = float(values[0])

    def init_params(self, be, rng):
        """Create parameter arrays with Darknet's random initialisation (once per
        network; they survive re-allocation). Layers without parameters do nothing."""

    def init_updates(self, be):
        """Create the buffers training needs besides output/delta (accumulated
        updates, batch statistics). Called once, on the first training step."""

    def params(self):
        """[(name, array)] in the order Darknet's .weights file stores them."""
        return []

    def param_owners(self):
        """The layers holding this layer's parameters and their update buffers (a recurrent
        layer's inner layers; itself for the others)."""
        return [self]

    # ---- computation ----------------------------------------------------------
    def forward(self, net):
        raise NotImplementedError

    def backward(self, net):
        raise NotImplementedError(f"backward of [{self.type}] is not implemented")

    def update(self, args):
        pass

    def params_changed(self):
        """The parameters were rewritten (loaded or updated): drop anything derived from
        them (a convolution's folded batch norm)."""

    # ---- activation -------------------------------------------------------------
    def _channels_spatial(self):
        return self.out_c, self.outputs // self.out_c

    def activate_output(self, be):
        """Apply self.activation to self.output (keeping its input when backward needs it)."""
        if self.activation_input is not None:
            be.copy(self.output, self.activation_input)
        if self.activation in CHANNEL_ACTIVATIONS:
            be.normalize_channels(
                self.output, self.batch, *self._channels_spatial(), self.activation
            )
        else:
            be.activate(self.output, self.activation)

    def activation_gradient(self, be):
        """self.delta *= the activation's derivative (through the kept input where needed)."""
        if self.activation in CHANNEL_ACTIVATIONS:
            be.normalize_channels_gradient(
                self.activation_input,
                self.batch,
                *self._channels_spatial(),
                self.activation,
                self.delta,
            )
        elif self.activation in INPUT_GRADIENT:
            be.gradient_from_input(self.activation_input, self.activation, self.delta)
        else:
            be.gradient(self.output, self.activation, self.delta)


def filter_row(layer):
    """The layer-table row of a layer with filters over windows (convolution's layout):
    filters, window / stride, input -> output shapes."""
    return (
        f"{layer.filters:5d} {layer.size:2d} x{layer.size:2d} /{layer.stride:2d}  "
        f"{layer.w:4d} x{layer.h:4d} x{layer.c:4d}   ->  "
        f"{layer.out_w:4d} x{layer.out_h:4d} x{layer.out_c:4d}"
    )


def keeps_activation_input(layer):
    """Whether training keeps the activation's input for the backward. A batch-normalised
    layer recomputes it from x (batchnorm.bn_activation_backward) unless it is stepped
    (its backward reads the last step's statistics, not those that made each step's input)
    or its activation mixes channels."""
    activation = getattr(layer, "activation", "linear")
    if activation in CHANNEL_ACTIVATIONS:
        return True
    return activation in INPUT_GRADIENT and (
        layer.stepped or not getattr(layer, "batch_normalize", 0)
    )


def host_param(rng, n, scale=0.0, kind="zeros"):
    """Host-side initial values for a parameter, as float64 for exact casting later.
    rng None: no random draw (zeros), for parameters a weights file is about to fill."""
    if rng is None and kind in ("normal", "uniform"):
        return np.zeros(n)
    if kind == "normal":
        return scale * rng.standard_normal(n)
    if kind == "uniform":
        return scale * rng.uniform(-1.0, 1.0, n)
    if kind == "ones":
        return np.ones(n)
    return np.zeros(n)


def initial_param(be, rng, n, scale=0.0, kind="zeros"):
    """A backend array holding a parameter's first values (host_param's). Zeros, and the
    draws a weights file is about to replace (rng None), are the backend's own zeros: no
    host array to make and copy (for yolov3-tiny's weights that copy cost 18 ms)."""
    if kind == "zeros" or (rng is None and kind in ("normal", "uniform")):
        return be.zeros(n)
    return be.from_host(host_param(rng, n, scale, kind))


def momentum_update(be, args, param, update, weight_decay=False):
    """Darknet's SGD step for one parameter array and its accumulated update:
    (weights only) update -= decay*batch*param; param += lr/batch*update; update *= momentum.
    With adam=1, Adam's step instead (adam.py: every parameter decays, the update is zeroed).
    Under a loss scaler (args.skip) the step is one op that the device's flag may skip."""
    if args.adam is not None:
        args.adam.update(be, args, param, update)
        return
    if args.skip is not None:
        be.sgd_update(
            param,
            update,
            args.rate,
            -args.decay * args.batch,
            args.momentum,
            skip=args.skip,
            weight_decay=weight_decay,
        )
        return
    if weight_decay:
        be.axpy(-args.decay * args.batch, param, update)
    be.axpy_array(args.rate, update, param)
    be.scal(args.momentum, update)


def parse_activation(section, default, key="activation", channels=False):
    """Read an activation name; an unknown one is an error (Darknet silently used relu).
    channels: the layer also takes the normalize_channels family."""
    known = ACTIVATIONS + (CHANNEL_ACTIVATIONS if channels else ())
    name = section.get_str(key, default)
    if name not in known:
        raise section.error(f"unknown activation '{name}' (known: {', '.join(known)})", key)
    return name


def _earlier_layer(layer, section, ctx, key, ref):
    index = ref if ref >= 0 else layer.index + ref
    if not 0 <= index < layer.index:
        raise section.error(
            f"layer {ref} is out of range: [{section.header}] at layer "
            f"{layer.index} can use layers 0..{layer.index - 1} or "
            f"-1..-{layer.index}",
            key,
        )
    return ctx.layers[index]


def source_layer(layer, section, ctx, key):
    """The earlier layer an option names (negative: relative to this one), checked."""
    return _earlier_layer(layer, section, ctx, key, section.get_int(key))


def source_layers(layer, section, ctx, key):
    """The earlier layers a list option names (at least one), checked."""
    refs = section.get_int_list(key)
    if not refs:
        raise section.error(f"needs {key}=<index>[,<index>...]", key)
    return [_earlier_layer(layer, section, ctx, key, ref) for ref in refs]


def refuse_options(section, *keys):
    """Darknet options darknet-py does not implement: an error when set to non-zero."""
    for key in keys:
        if section.has(key) and section.get_str(key) not in ("0", "0.0"):
            raise section.error("option is not supported by darknet-py", key)
