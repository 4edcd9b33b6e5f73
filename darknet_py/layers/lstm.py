"""[lstm]: Darknet's long short-term memory layer (lstm_layer.c), eight linear [connected].

For each step: f = logistic(wf(h) + uf(x)), i = logistic(wi(h) + ui(x)),
g = tanh(wg(h) + ug(x)), o = logistic(wo(h) + uo(x)); c = f * c + i * g; h = o * tanh(c),
the output. The w* layers read the hidden state h, the u* layers the input. The cell c and
h are carried across every call (training passes included), from zeros.

Backward is the C code's backward_lstm_layer (the same in both Darknets; the original
never hooks it up on the CPU and neither allocates the CPU delta, so both crash when
training on the CPU: the fixtures come from a harness that makes them trainable), with its
quirks kept: it rewrites the carried c and h with step by step values, ending at step 0's;
step 0 reads the previous state the step-1 iteration left (not the state before the pass)
and passes no delta further back; the cell delta carries over from one backward to the next.
The fork stores wf, wi, wg, wo, uf, ui, ug, uo, the original wi, wf, wo, wg, ui, uf, uo, ug;
the fork never updates them (recurrent.RecurrentLayer.frozen_flavours).
"""

from .recurrent import CellStateLayer, step_state

ORIGINAL_ORDER = ("wi", "wf", "wo", "wg", "ui", "uf", "uo", "ug")
FORK_ORDER = ("wf", "wi", "wg", "wo", "uf", "ui", "ug", "uo")
GATE_ACTIVATION = {"f": "logistic", "i": "logistic", "g": "tanh", "o": "logistic"}


class LstmLayer(CellStateLayer):
    type = "lstm"
    short = "lstm"

    def parse(self, s, ctx):
        self.read_steps(s, ctx)
        output = s.get_int("output", 1)
        self.batch_normalize = s.get_int("batch_normalize", 0)
        if output < 1:
            raise s.error(f"must be at least 1, got {output}", "output")
        if self.inputs < 1:
            raise s.error("the layer before [lstm] has no outputs")
        self.hidden = output
        self.connected_gates(
            s, ctx, output, FORK_ORDER if self.darknet == "alexeyab" else ORIGINAL_ORDER
        )

    def _gates(self, be, t):
        """f, i, g, o of step t from the inner layers' outputs."""
        for inner in self.inner:
            inner.at(t)
        for gate, activation in GATE_ACTIVATION.items():
            out = getattr(self, gate)
            be.copy(self.gates["w" + gate].layer.output, out)
            be.axpy(1.0, self.gates["u" + gate].layer.output, out)
            be.activate(out, activation)

    def forward(self, net):
        be, g = net.be, self.gates
        self.zero_inner_deltas(be)
        if net.train:  # its C forward clears its delta (the fork's network does not)
            be.fill(self.delta, 0.0)
        n_in = self.step_batch * self.inputs
        for t in range(self.steps):
            x = net.input[t * n_in : (t + 1) * n_in]
            for gate in "figo":
                g["w" + gate].at(t).forward(step_state(net, self.h_t))
            for gate in "figo":
                g["u" + gate].at(t).forward(step_state(net, x))
            self._gates(be, t)
            be.copy(self.i, self.temp)
            be.mul(self.g, self.temp)
            be.mul(self.f, self.c_t)
            be.axpy(1.0, self.temp, self.c_t)
            be.copy(self.c_t, self.h_t)
            be.activate(self.h_t, "tanh")
            be.mul(self.o, self.h_t)
            be.copy(self.c_t, self._rows(self.cell, t))
            be.copy(self.h_t, self._rows(self.output, t))

    def _gate_backward(self, net, t, gate, x, dh, delta_in):
        """The delta in self.temp goes to step t's w<gate> (to h) and u<gate> (to x)."""
        w, u = self.gates["w" + gate], self.gates["u" + gate]
        net.be.copy(self.temp, w.step_delta(t))
        w.layer.backward(step_state(net, self.prev_state, dh))
        net.be.copy(self.temp, u.step_delta(t))
        u.layer.backward(step_state(net, x, delta_in))

    def backward(self, net):
        be = net.be
        n_in = self.step_batch * self.inputs
        for t in range(self.steps - 1, -1, -1):
            if t:
                be.copy(self._rows(self.cell, t - 1), self.prev_cell)
                be.copy(self._rows(self.output, t - 1), self.prev_state)
            be.copy(self._rows(self.cell, t), self.c_t)
            be.copy(self._rows(self.output, t), self.h_t)
            dh = self._rows(self.delta, t - 1) if t else None
            x = net.input[t * n_in : (t + 1) * n_in]
            delta_in = net.delta[t * n_in : (t + 1) * n_in] if net.delta is not None else None
            self._gates(be, t)
            self._cell_and_output_deltas(be, t)
            self._gate_backward(net, t, "o", x, dh, delta_in)
            for gate, factor in (("g", self.i), ("i", self.g), ("f", self.prev_cell)):
                be.copy(self.temp2, self.temp)
                be.mul(factor, self.temp)
                be.gradient(getattr(self, gate), GATE_ACTIVATION[gate], self.temp)
                self._gate_backward(net, t, gate, x, dh, delta_in)
            be.copy(self.temp2, self.dc)
            be.mul(self.f, self.dc)
