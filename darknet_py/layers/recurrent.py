"""What Darknet's recurrent layers share: inner layers run one time step at a time.

A recurrent layer ([rnn], [gru], [lstm], [crnn], [conv_lstm]) is made of ordinary
[connected] or [convolutional] layers (Darknet's input_layer, self_layer, wf, uz, ...).
The network's batch holds `steps` time steps of batch / steps sequences, step-major
(step t's rows are [t * batch/steps, (t + 1) * batch/steps)). Each inner layer owns
buffers for every step; for step t its output, delta and batch-norm arrays are pointed at
that step's rows (Darknet's increment_layer), and it runs with batch / steps images.
"""

from types import SimpleNamespace

from ..cfg import Option, Section
from .base import BuildContext, Layer

# The per-image arrays an inner layer keeps for each step.
_STEP_ARRAYS = ("output", "delta", "x", "x_norm", "activation_input")


def inner_section(parent, type_, **options):
    """A cfg section for an inner layer: the parent's place in the file, these options."""
    s = Section(type_, type_, parent.path, parent.line)
    for key, value in options.items():
        s.options[key] = Option(key, str(value), parent.line)
    return s


class Inner:
    """One inner layer of a recurrent layer, with its step views."""

    def __init__(self, name, layer):
        self.name = name
        self.layer = layer
        layer.stepped = True  # keeps x_norm and the activation's input per step
        self.full = {}

    def allocate(self, be, batch, steps, train):
        self.layer.allocate(be, batch, train)
        self.full = {key: getattr(self.layer, key, None) for key in _STEP_ARRAYS}
        self.step_batch = batch // steps
        self.at(0)

    def at(self, step):
        """Point the layer at time step `step` (its rows of every per-image array)."""
        n = self.step_batch * self.layer.outputs
        for key, full in self.full.items():
            if full is not None:
                setattr(self.layer, key, full[step * n : (step + 1) * n])
        self.layer.batch = self.step_batch
        return self.layer

    def step_delta(self, step):
        n = self.step_batch * self.layer.outputs
        return self.full["delta"][step * n : (step + 1) * n]

    def step_output(self, step):
        n = self.step_batch * self.layer.outputs
        return self.full["output"][step * n : (step + 1) * n]


def step_state(net, input, delta=None):
    """The network state an inner layer sees for one step (Darknet's `network s`)."""
    return SimpleNamespace(
        be=net.be,
        input=input,
        delta=delta,
        train=net.train,
        workspace=net.workspace,
        fold_batchnorm=False,
        truth=None,
    )


class RecurrentLayer(Layer):
    """Shared plumbing: `self.inner` lists the Inner layers in the weights file's order."""

    image_shaped = True
    # The Darknets whose update never moves this layer's weights. The fork's update_network
    # skips layers whose `train` flag is unset (Layer.fork_train; the network skips them),
    # and only its convolution-based layers ([crnn], [conv_lstm]) set it: its [rnn], [gru]
    # and [lstm] keep their weights however long they train (CPU and GPU alike). The
    # original's [crnn] convolutions have a learning-rate scale of 0 (only its parser sets
    # the scale, for top-level layers).
    frozen_flavours = ("alexeyab",)

    # Convolution-based ([crnn], [conv_lstm]): the layer table shows image shapes.
    convolutional_steps = False

    @property
    def frozen(self):
        """True where this layer's Darknet never updates its weights."""
        return self.darknet in self.frozen_flavours

    def describe(self):
        """Darknet's layer-table row: inputs -> outputs, or the image shapes of the
        convolution-based layers, and the time steps."""
        if self.convolutional_steps:
            return (
                f"{'':24s}{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
                f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}  ({self.steps} steps)"
            )
        return f"{'':28s}{self.inputs:4d}  ->  {self.outputs:4d}  ({self.steps} steps)"

    def connected_gates(self, s, ctx, output, order):
        """[gru]'s and [lstm]'s gates: an inner [connected] layer each, in the weights
        file's `order`; the "u" gates read the input, the "w" gates the hidden state."""
        section = inner_section(
            s, "connected", output=output, activation="linear", batch_normalize=self.batch_normalize
        )
        self.gates = {}
        for name in order:
            n_in = self.inputs if name[0] == "u" else output
            self.gates[name] = self.make_inner(name, ctx, section, n_in, 1, 1, n_in)
        self.inner = [self.gates[name] for name in order]
        self.out_c, self.out_h, self.out_w = output, 1, 1
        self.outputs = output

    def read_steps(self, s, ctx):
        self.steps = max(1, ctx.net.time_steps)
        self.step_batch = ctx.batch // self.steps

    def make_inner(self, name, ctx, section, c, h, w, inputs):
        from . import layer_class

        inner_ctx = BuildContext(
            layers=ctx.layers,
            net=ctx.net,
            batch=ctx.batch,
            darknet=ctx.darknet,
            fork_cpu=ctx.fork_cpu,
        )
        layer = layer_class(section.type)(self.index, section, c, h, w, inputs, inner_ctx)
        return Inner(name, layer)

    def check_batch(self, batch):
        if batch % self.steps:
            raise ValueError(
                f"layer {self.index} [{self.type}]: a batch of {batch} does not "
                f"split into time_steps={self.steps}"
            )

    @property
    def bflops(self):
        return sum(i.layer.bflops for i in self.inner)

    # ---- buffers ------------------------------------------------------------------
    def init_params(self, be, rng):
        for i in self.inner:
            i.layer.init_params(be, rng)

    def init_updates(self, be):
        for i in self.inner:
            i.layer.init_updates(be)

    def allocate_inner(self, be, batch, train):
        self.check_batch(batch)
        self.be = be
        self.batch = batch
        self.step_batch = batch // self.steps
        for i in self.inner:
            i.allocate(be, batch, self.steps, train)
        self.workspace_size = max(i.layer.workspace_size for i in self.inner)

    def params(self):
        return [(name, array) for i in self.inner for name, array in i.layer.params()]

    def param_owners(self):
        return [i.layer for i in self.inner]

    def update(self, args):
        if self.frozen:
            return
        for i in self.inner:
            i.layer.update(args)

    def params_changed(self):
        for i in self.inner:
            i.layer.params_changed()

    def zero_inner_deltas(self, be):
        for i in self.inner:
            if i.full.get("delta") is not None:
                be.fill(i.full["delta"], 0.0)

    def reset_state(self):
        """Forget the hidden state carried between inference calls (a new sequence)."""
        for array in self.carried_state():
            self.be.fill(array, 0.0)

    def carried_state(self):
        return []

    def keep_carried_state(self, old):
        """After re-allocation: the state carried before it (arrays `old`, the previous
        carried_state()), where the sizes still match. Darknet's buffers never move, so
        an inference call followed by a training pass continues the same state."""
        for before, now in zip(old, self.carried_state()):
            if before is not None and before.size == now.size:
                self.be.copy(before, now)


class CellStateLayer(RecurrentLayer):
    """What [lstm] and the fork's [conv_lstm] share: the hidden and cell state (h_t, c_t)
    and the C backward's leftovers carried across calls, per-step gate scratch, and a
    step's rows of a buffer."""

    _SCRATCH = ("f", "i", "g", "o", "temp", "temp2", "temp3")

    def allocate(self, be, batch, train):
        old = self.carried_state() if getattr(self, "h_t", None) is not None else []
        self.allocate_inner(be, batch, train)
        n = self.step_batch * self.outputs
        self.output = be.zeros(batch * self.outputs)
        self.delta = be.zeros(batch * self.outputs) if train else None
        self.cell = be.zeros(batch * self.outputs)
        self.activation_input = None
        self.h_t, self.c_t, self.prev_state, self.prev_cell, self.dc = (
            be.zeros(n) for _ in range(5)
        )
        for name in self._SCRATCH:
            setattr(self, name, be.zeros(n))
        self.keep_carried_state(old)

    def carried_state(self):
        # prev_state, prev_cell and dc too: the C backward reads what the last one left.
        return [self.h_t, self.c_t, self.prev_state, self.prev_cell, self.dc]

    def _rows(self, array, t):
        n = self.step_batch * self.outputs
        return array[t * n : (t + 1) * n]

    def _cell_and_output_deltas(self, be, t):
        """Step t's backward through h = o * tanh(c): temp3 <- d(h); temp2 <- the cell's
        delta, d(h) * o * tanh'(c) plus the carried dc; temp <- the output gate's delta,
        tanh(c) * d(h) * o's logistic gradient."""
        be.copy(self._rows(self.delta, t), self.temp3)
        be.copy(self.c_t, self.temp)
        be.activate(self.temp, "tanh")
        be.copy(self.temp3, self.temp2)
        be.mul(self.o, self.temp2)
        be.gradient(self.temp, "tanh", self.temp2)
        be.axpy(1.0, self.dc, self.temp2)
        be.mul(self.temp3, self.temp)
        be.gradient(self.o, "logistic", self.temp)
