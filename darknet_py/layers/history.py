"""[history]: the AlexeyAB fork's history layer (make_history_layer in conv_lstm_layer.c).

Each image's output stacks its input with the previous time step's output, shifted:
output = [x_t, first (history_size - 1) inputs' worth of output_(t-1)], history_size times
the input's channels. Step 0 continues from the last step of the previous call (the state
carries across calls). Backward hands each image's first `inputs` deltas back to the input.

As the fork's CPU code does with time_steps=1: the output's first batch * inputs values are
the input (not image by image; the rest keeps what it held) and backward adds the first
batch * inputs deltas back.
"""

from .base import Layer


class HistoryLayer(Layer):
    type = "history"
    short = "history"
    fork_train = True  # the fork's make_history_layer sets l.train

    def parse(self, s, ctx):
        if self.darknet != "alexeyab":
            raise s.error("[history] is the AlexeyAB fork's layer: use --darknet alexeyab")
        self.history_size = s.get_int("history_size", 4)
        if self.history_size < 1:
            raise s.error(f"must be at least 1, got {self.history_size}", "history_size")
        self.steps = max(1, ctx.net.time_steps)
        self.out_c, self.out_h, self.out_w = self.c * self.history_size, self.h, self.w
        self.outputs = self.inputs * self.history_size

    def describe(self):
        return (
            f"{self.history_size:5d} x{self.steps:3d} steps{'':10s}{self.w:4d} x{self.h:4d}"
            f" x{self.c:4d}   ->  {self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    def allocate(self, be, batch, train):
        if batch % self.steps:
            raise ValueError(
                f"layer {self.index} [history]: a batch of {batch} does not split "
                f"into time_steps={self.steps}"
            )
        old = getattr(self, "prev_state", None)
        super().allocate(be, batch, train)
        self.step_batch = batch // self.steps
        self.prev_state = be.zeros(self.step_batch * self.outputs)
        if old is not None and old.size == self.prev_state.size:
            be.copy(old, self.prev_state)

    def reset_state(self):
        self.be.fill(self.prev_state, 0.0)

    def forward(self, net):
        be, n = net.be, self.step_batch
        if self.steps == 1:
            be.copy(net.input[: self.batch * self.inputs], self.output[: self.batch * self.inputs])
            return
        shift = self.inputs * (self.history_size - 1)
        prev = self.prev_state
        for t in range(self.steps):
            out = self.output[t * n * self.outputs : (t + 1) * n * self.outputs]
            if shift:
                be.copy_blocks(prev, 0, self.outputs, out, self.inputs, self.outputs, shift, n)
            be.copy_blocks(
                net.input, t * n * self.inputs, self.inputs, out, 0, self.outputs, self.inputs, n
            )
            prev = out
        be.copy(prev, self.prev_state)

    def backward(self, net):
        if net.delta is None:
            return
        if self.steps == 1:
            n = self.batch * self.inputs
            net.be.axpy(1.0, self.delta[:n], net.delta[:n])
            return
        net.be.copy_blocks(
            self.delta,
            0,
            self.outputs,
            net.delta,
            0,
            self.inputs,
            self.inputs,
            self.batch,
            accumulate=True,
        )
