"""[conv_lstm]: the AlexeyAB fork's convolutional LSTM (conv_lstm_layer.c), on its CPU path.

[lstm] with convolutions: u* read the input, w* the hidden state h, and with peephole=1 v*
read the cell (vf, vi the previous cell, vo the new one). For each step:
f = logistic(wf(h) + uf(x) [+ vf(c)]), i = logistic(wi(h) + ui(x) [+ vi(c)]),
g = tanh(wg(h) + ug(x)), c = f * c + i * g, o = logistic(wo(h) + uo(x) [+ vo(c)]),
h = o * tanh(c) (the output), then c is clamped to +-state_constrain (default
32 * time_steps). h and c carry across calls. The convolutions take size, stride, dilation,
pad/padding, groups, activation (default linear) and batch_normalize; the state must keep
its size through them.

Backward is the fork's backward_conv_lstm_layer with its quirks (see lstm.py for those it
shares): no delta flows back through h (the w* and v* convolutions pass theirs into whatever
delta the previous call left, as the C code's reused `s.delta`, and the fork's convolution
backward replaces the delta it writes). Only the CPU's semantics are followed: the fork's
GPU-only options (lstm_activation other than tanh, shortcut, time_normalizer) are warned
about, bottleneck=1 is refused.
"""

from .base import parse_activation, refuse_options
from .recurrent import CellStateLayer, inner_section, step_state

GATES = "figo"


class ConvLstmLayer(CellStateLayer):
    type = "conv_lstm"
    short = "convlstm"
    frozen_flavours = ()
    fork_train = True  # the fork's make_conv_lstm_layer sets l.train
    convolutional_steps = True

    def parse(self, s, ctx):
        if self.darknet != "alexeyab":
            raise s.error("[conv_lstm] is the AlexeyAB fork's layer: use --darknet alexeyab")
        self.read_steps(s, ctx)
        size, stride = s.get_int("size", 3), s.get_int("stride", 1)
        dilation, groups = s.get_int("dilation", 1), s.get_int("groups", 1)
        padding = s.get_int("padding", 0)
        if s.get_int("pad", 0):
            padding = size // 2
        output = s.get_int("output", 1)
        activation = parse_activation(s, "linear")
        self.batch_normalize = s.get_int("batch_normalize", 0)
        self.peephole = s.get_int("peephole", 0)
        refuse_options(s, "xnor", "bottleneck")
        self.state_constrain = s.get_float("state_constrain", self.steps * 32)
        self._warn_gpu_only(s)
        if self.c < 1 or self.h < 1 or self.w < 1:
            raise s.error("[conv_lstm] needs an image-shaped input (width, height, channels)")
        conv = inner_section(
            s,
            "convolutional",
            filters=output,
            size=size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            activation=activation,
            batch_normalize=self.batch_normalize,
        )
        order = (["vf", "vi", "vo"] if self.peephole else []) + [p + g for p in "wu" for g in GATES]
        self.gates = {}
        for name in order:
            c = self.c if name[0] == "u" else output
            self.gates[name] = self.make_inner(
                name, ctx, conv, c, self.h, self.w, c * self.h * self.w
            )
        self.inner = [self.gates[name] for name in order]
        uo = self.gates["uo"].layer
        if (uo.out_h, uo.out_w) != (self.h, self.w):
            raise s.error(
                f"the state ({uo.out_w}x{uo.out_h}x{output}) must keep the input's "
                f"{self.w}x{self.h} size through the convolutions: use stride=1 and "
                f"pad=1",
                "stride",
            )
        self.out_c, self.out_h, self.out_w = output, uo.out_h, uo.out_w
        self.outputs = self.hidden = uo.outputs

    def _warn_gpu_only(self, s):
        if s.get_str("lstm_activation", "tanh") != "tanh":
            s.warn(
                "the fork's CPU code uses tanh whatever this says (only its GPU code "
                "reads it); darknet-py follows the CPU",
                "lstm_activation",
            )
        if s.get_int("shortcut", 0):
            s.warn(
                "only the fork's GPU code adds the shortcut; darknet-py follows its CPU "
                "code, which has none",
                "shortcut",
            )
        if s.get_float("time_normalizer", 1.0) != 1.0:
            s.warn(
                "only the fork's GPU code scales by it; darknet-py follows its CPU code",
                "time_normalizer",
            )

    @property
    def fork_bflops(self):
        return self.bflops + (12 if self.peephole else 9) * self.outputs * self.step_batch / 1e9

    def _sum_gate(self, be, gate, activation):
        out = getattr(self, gate)
        be.copy(self.gates["w" + gate].layer.output, out)
        be.axpy(1.0, self.gates["u" + gate].layer.output, out)
        if self.peephole and gate != "g":
            be.axpy(1.0, self.gates["v" + gate].layer.output, out)
        be.activate(out, activation)

    def _constrain(self, be, x):
        """x = min(a, max(-a, x)), a = state_constrain (hardtan clamps to +-1)."""
        if self.state_constrain:
            be.scal(1.0 / self.state_constrain, x)
            be.activate(x, "hardtan")
            be.scal(self.state_constrain, x)

    def forward(self, net):
        be, g = net.be, self.gates
        if net.train:
            self.zero_inner_deltas(be)
            be.fill(self.delta, 0.0)  # as its C forward (the fork's network does not)
        n_in = self.step_batch * self.inputs
        for t in range(self.steps):
            x = net.input[t * n_in : (t + 1) * n_in]
            for inner in self.inner:
                inner.at(t)
            if self.peephole:
                for name in ("vf", "vi"):
                    g[name].layer.forward(step_state(net, self.c_t))
            for gate in GATES:
                g["w" + gate].layer.forward(step_state(net, self.h_t))
            for gate in GATES:
                g["u" + gate].layer.forward(step_state(net, x))
            for gate, activation in (("f", "logistic"), ("i", "logistic"), ("g", "tanh")):
                self._sum_gate(be, gate, activation)
            be.copy(self.i, self.temp)
            be.mul(self.g, self.temp)
            be.mul(self.f, self.c_t)
            be.axpy(1.0, self.temp, self.c_t)
            if self.peephole:
                g["vo"].layer.forward(step_state(net, self.c_t))
            self._sum_gate(be, "o", "logistic")
            be.copy(self.c_t, self.h_t)
            be.activate(self.h_t, "tanh")
            be.mul(self.o, self.h_t)
            self._constrain(be, self.c_t)
            be.copy(self.c_t, self._rows(self.cell, t))
            be.copy(self.h_t, self._rows(self.output, t))

    def _inner_backward(self, net, name, t, source, delta):
        """Step t's gate `name` gets self.temp as its delta and runs backward on `source`.
        The C code's stale `s.delta` only fits where the gate reads as many values as the
        layer's input (its C overruns the buffer otherwise): elsewhere no delta is passed."""
        gate = self.gates[name]
        net.be.copy(self.temp, gate.step_delta(t))
        if delta is not None and delta.size < gate.layer.batch * gate.layer.inputs:
            delta = None
        gate.layer.backward(step_state(net, source, delta))

    def _gate_deltas(self, net, t, x, delta_in):
        """Back through o, g, i and f (self.temp2: the cell's delta), in the C order."""
        be = net.be
        peep = self.peephole
        for gate, factor, activation in (
            ("o", None, "logistic"),
            ("g", self.i, "tanh"),
            ("i", self.g, "logistic"),
            ("f", self.prev_cell, "logistic"),
        ):
            if factor is not None:
                be.copy(self.temp2, self.temp)
                be.mul(factor, self.temp)
                be.gradient(getattr(self, gate), activation, self.temp)
            if peep and gate != "g":
                self._inner_backward(
                    net,
                    "v" + gate,
                    t,
                    self._rows(self.cell, t) if gate == "o" else self.prev_cell,
                    self.stale_delta,
                )
            self._inner_backward(net, "w" + gate, t, self.prev_state, self.stale_delta)
            self.stale_delta = delta_in
            self._inner_backward(net, "u" + gate, t, x, delta_in)

    def backward(self, net):
        be = net.be
        n_in = self.step_batch * self.inputs
        self.stale_delta = None  # the C backward's `s.delta`, reused from gate to gate
        for t in range(self.steps - 1, -1, -1):
            if t:
                be.copy(self._rows(self.cell, t - 1), self.prev_cell)
                be.copy(self._rows(self.output, t - 1), self.prev_state)
            be.copy(self._rows(self.cell, t), self.c_t)
            be.copy(self._rows(self.output, t), self.h_t)
            x = net.input[t * n_in : (t + 1) * n_in]
            delta_in = net.delta[t * n_in :] if net.delta is not None else None
            for inner in self.inner:
                inner.at(t)
            for gate, activation in (
                ("f", "logistic"),
                ("i", "logistic"),
                ("g", "tanh"),
                ("o", "logistic"),
            ):
                self._sum_gate(be, gate, activation)
            self._cell_and_output_deltas(be, t)
            self._gate_deltas(net, t, x, delta_in)
            be.copy(self.temp2, self.dc)
            be.mul(self.f, self.dc)
