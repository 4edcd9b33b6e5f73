"""[gru]: Darknet's gated recurrent unit (gru_layer.c), six linear [connected] layers.

For each step: z = logistic(uz(x) + wz(s)), r = logistic(ur(x) + wr(s)),
h = act(uh(x) + wh(r * s)) with act logistic (the original's tanh=1: tanh),
output = s = z * s + (1 - z) * h. The u* layers read the input, the w* layers the state.
Unlike [rnn], the state is carried across every call, training passes included (both
Darknets); a training pass keeps the state it started from for backward.

Both Darknets' CPU backward_gru_layer is empty; darknet-py runs the backward of the
original's GPU code (backward_gru_layer_gpu), a true gradient of the forward above, on
both backends. The weights file stores the original's wz, wr, wh, uz, ur, uh and the fork's
input_z, input_r, input_h, state_z, state_r, state_h (uz, ur, uh, wz, wr, wh); the fork
never updates them (see recurrent.RecurrentLayer.frozen_flavours).
"""

from .recurrent import RecurrentLayer, step_state

ORIGINAL_ORDER = ("wz", "wr", "wh", "uz", "ur", "uh")
FORK_ORDER = ("uz", "ur", "uh", "wz", "wr", "wh")


class GruLayer(RecurrentLayer):
    type = "gru"
    short = "gru"

    def parse(self, s, ctx):
        self.read_steps(s, ctx)
        output = s.get_int("output", 1)
        self.batch_normalize = s.get_int("batch_normalize", 0)
        # The fork picks logistic or tanh when it is compiled (USET); its cfgs have no key.
        self.tanh = s.get_int("tanh", 0) if self.darknet == "original" else 0
        if output < 1:
            raise s.error(f"must be at least 1, got {output}", "output")
        if self.inputs < 1:
            raise s.error("the layer before [gru] has no outputs")
        self.hidden = output
        self.connected_gates(
            s, ctx, output, FORK_ORDER if self.darknet == "alexeyab" else ORIGINAL_ORDER
        )

    def allocate(self, be, batch, train):
        old = self.carried_state() if getattr(self, "state", None) is not None else []
        self.allocate_inner(be, batch, train)
        n = self.step_batch * self.outputs
        self.output = be.zeros(batch * self.outputs)
        self.delta = be.zeros(batch * self.outputs) if train else None
        self.activation_input = None
        self.state = be.zeros(n)
        self.prev_state = be.zeros(n)
        self.z, self.r, self.h, self.forgot, self.forgot_delta, self.scratch = (
            be.zeros(n) for _ in range(6)
        )
        self.keep_carried_state(old)

    def carried_state(self):
        return [self.state]

    def _rows(self, array, t):
        n = self.step_batch * self.outputs
        return array[t * n : (t + 1) * n]

    def _gate(self, be, out, u, w, activation):
        be.copy(u.layer.output, out)
        be.axpy(1.0, w.layer.output, out)
        be.activate(out, activation)

    def _weighted_sum(self, be, a, b, s, out):
        """out = s * a + (1 - s) * b, as b + s * (a - b)."""
        be.copy(a, self.scratch)
        be.axpy(-1.0, b, self.scratch)
        be.copy(b, out)
        be.mul_add(s, self.scratch, out)

    @property
    def h_activation(self):
        return "tanh" if self.tanh else "logistic"

    def _gates_at(self, net, t, x, state):
        """Run (forward) or re-read (backward) step t's z, r and h."""
        be, g = net.be, self.gates
        for inner in self.inner:
            inner.at(t)
        self._gate(be, self.z, g["uz"], g["wz"], "logistic")
        self._gate(be, self.r, g["ur"], g["wr"], "logistic")
        be.copy(state, self.forgot)
        be.mul(self.r, self.forgot)

    def forward(self, net):
        be, g = net.be, self.gates
        self.zero_inner_deltas(be)
        if net.train:  # its C forward clears its delta (the fork's network does not)
            be.fill(self.delta, 0.0)
            be.copy(self.state, self.prev_state)
        n_in = self.step_batch * self.inputs
        for t in range(self.steps):
            x = net.input[t * n_in : (t + 1) * n_in]
            for name in ("wz", "wr"):
                g[name].at(t).forward(step_state(net, self.state))
            for name in ("uz", "ur", "uh"):
                g[name].at(t).forward(step_state(net, x))
            self._gates_at(net, t, x, self.state)
            g["wh"].layer.forward(step_state(net, self.forgot))
            self._gate(be, self.h, g["uh"], g["wh"], self.h_activation)
            out = self._rows(self.output, t)
            self._weighted_sum(be, self.state, self.h, self.z, out)
            be.copy(out, self.state)

    def backward(self, net):
        be, g = net.be, self.gates
        n_in = self.step_batch * self.inputs
        for t in range(self.steps - 1, -1, -1):
            x = net.input[t * n_in : (t + 1) * n_in]
            prev = self._rows(self.output, t - 1) if t > 0 else self.prev_state
            prev_delta = self._rows(self.delta, t - 1) if t > 0 else None
            delta = self._rows(self.delta, t)
            self._gates_at(net, t, x, prev)
            self._gate(be, self.h, g["uh"], g["wh"], self.h_activation)
            uz_d, ur_d, uh_d = (g[name].step_delta(t) for name in ("uz", "ur", "uh"))
            # weighted_delta: d(prev) += d * z, d(h) += d * (1 - z), d(z) += d * (prev - h)
            if prev_delta is not None:
                be.mul_add(delta, self.z, prev_delta)
            be.fill(self.scratch, 1.0)
            be.axpy(-1.0, self.z, self.scratch)
            be.mul_add(delta, self.scratch, uh_d)
            be.copy(prev, self.scratch)
            be.axpy(-1.0, self.h, self.scratch)
            be.mul_add(delta, self.scratch, uz_d)
            be.gradient(self.h, self.h_activation, uh_d)
            be.copy(uh_d, g["wh"].step_delta(t))
            be.fill(self.forgot_delta, 0.0)
            g["wh"].layer.backward(step_state(net, self.forgot, self.forgot_delta))
            if prev_delta is not None:
                be.mul_add(self.forgot_delta, self.r, prev_delta)
            be.mul_add(self.forgot_delta, prev, ur_d)
            be.gradient(self.r, "logistic", ur_d)
            be.copy(ur_d, g["wr"].step_delta(t))
            be.gradient(self.z, "logistic", uz_d)
            be.copy(uz_d, g["wz"].step_delta(t))
            for name in ("wr", "wz"):
                g[name].layer.backward(step_state(net, prev, prev_delta))
            delta_in = net.delta[t * n_in : (t + 1) * n_in] if net.delta is not None else None
            for name in ("uh", "ur", "uz"):
                g[name].layer.backward(step_state(net, x, delta_in))
