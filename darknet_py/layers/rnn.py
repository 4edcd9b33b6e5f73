"""[rnn]: Darknet's vanilla recurrent layer (rnn_layer.c), three [connected] layers.

For each step t: state_t = [shortcut: state_(t-1)] + input_layer(x_t) + self_layer(state_(t-1)),
y_t = output_layer(state_t). As both Darknets do on the CPU, a training forward starts its
sequences from a zero state and keeps every step's state for backward; inference carries
the state from call to call (rnn generate feeds one character at a time). Backward follows
the C code's quirks: it recomputes state_t as input + self (without the shortcut term), and
the input layer's delta is the self layer's delta after the self layer's own activation
gradient. The original sizes the hidden state by `output`; the fork has `hidden` (state
size) apart from `output`, and `logistic=1|2` for a logistic/loggy self layer.
"""

from .base import parse_activation
from .recurrent import RecurrentLayer, inner_section, step_state


class RnnLayer(RecurrentLayer):
    type = "rnn"
    short = "rnn"

    def parse(self, s, ctx):
        self.read_steps(s, ctx)
        output = s.get_int("output", 1)
        self.activation_name = parse_activation(s, "logistic")
        self.batch_normalize = s.get_int("batch_normalize", 0)
        self.shortcut = s.get_int("shortcut", 0)
        self_activation = self.activation_name
        if self.darknet == "alexeyab":
            self.hidden = s.get_int("hidden", 1)
            log = s.get_int("logistic", 0)
            self_activation = {1: "logistic", 2: "loggy"}.get(log, self.activation_name)
        else:
            self.hidden = output
            if s.has("hidden") and s.get_int("hidden") != output:
                s.warn(
                    f"the original Darknet ignores hidden= (its state has output={output} "
                    f"values); use --darknet alexeyab for the fork's hidden size",
                    "hidden",
                )
        for key, v in (("output", output), ("hidden", self.hidden)):
            if v < 1:
                raise s.error(f"must be at least 1, got {v}", key)
        if self.inputs < 1:
            raise s.error("the layer before [rnn] has no outputs")

        def connected(n_out, activation):
            return inner_section(
                s,
                "connected",
                output=n_out,
                activation=activation,
                batch_normalize=self.batch_normalize,
            )

        self.inner = [
            self.make_inner(
                "input_layer",
                ctx,
                connected(self.hidden, self.activation_name),
                self.inputs,
                1,
                1,
                self.inputs,
            ),
            self.make_inner(
                "self_layer",
                ctx,
                connected(self.hidden, self_activation),
                self.hidden,
                1,
                1,
                self.hidden,
            ),
            self.make_inner(
                "output_layer",
                ctx,
                connected(output, self.activation_name),
                self.hidden,
                1,
                1,
                self.hidden,
            ),
        ]
        self.out_c, self.out_h, self.out_w = output, 1, 1
        self.outputs = output

    def allocate(self, be, batch, train):
        old = self.carried_state() if getattr(self, "state", None) is not None else []
        self.allocate_inner(be, batch, train)
        out = self.inner[2]
        self.output, self.delta = out.full["output"], out.full["delta"]
        self.activation_input = None
        # Slot 0: the state before the first step (carried at inference); slot t + 1:
        # the state after step t (training keeps them all for backward).
        self.state = be.zeros((self.steps + 1) * self.step_batch * self.hidden)
        self.keep_carried_state(old)

    def carried_state(self):
        return [self.slot(0)]

    def slot(self, t):
        n = self.step_batch * self.hidden
        return self.state[t * n : (t + 1) * n]

    def forward(self, net):
        be = net.be
        inp, slf, out = self.inner
        if net.train:
            self.zero_inner_deltas(be)
            be.fill(self.slot(0), 0.0)
        n_in = self.step_batch * self.inputs
        for t in range(self.steps):
            x = net.input[t * n_in : (t + 1) * n_in]
            inp.at(t).forward(step_state(net, x))
            prev = self.slot(t if net.train else 0)
            slf.at(t).forward(step_state(net, prev))
            state = self.slot(t + 1) if net.train else prev
            if not self.shortcut:
                be.fill(state, 0.0)
            elif state is not prev:
                be.copy(prev, state)
            be.axpy(1.0, inp.layer.output, state)
            be.axpy(1.0, slf.layer.output, state)
            out.at(t).forward(step_state(net, state))

    def backward(self, net):
        be = net.be
        inp, slf, out = self.inner
        n_in = self.step_batch * self.inputs
        for t in range(self.steps - 1, -1, -1):
            state = self.slot(t + 1)
            be.copy(inp.step_output(t), state)
            be.axpy(1.0, slf.step_output(t), state)
            out.at(t).backward(step_state(net, state, slf.step_delta(t)))
            slf.at(t).backward(
                step_state(net, self.slot(t), slf.step_delta(t - 1) if t > 0 else None)
            )
            be.copy(slf.step_delta(t), inp.step_delta(t))
            if t > 0 and self.shortcut:
                be.axpy(1.0, slf.step_delta(t), slf.step_delta(t - 1))
            delta = net.delta[t * n_in : (t + 1) * n_in] if net.delta is not None else None
            inp.at(t).backward(step_state(net, net.input[t * n_in : (t + 1) * n_in], delta))
