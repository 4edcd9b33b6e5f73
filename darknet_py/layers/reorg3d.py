"""[reorg3d]: the AlexeyAB fork's reorg (its [reorg] is the original's, layers/reorg.py).

Space to depth: (w, h, c) -> (w/stride, h/stride, c*stride^2), placed by reorg_cpu
run over the *output* shape with forward=0 (the original runs it over the input
shape). reverse=1 is refused: the fork's version of it divides the channels twice."""

from .base import Layer, refuse_options


class Reorg3dLayer(Layer):
    type = "reorg3d"
    short = "reorg"

    def parse(self, s, ctx):
        self.stride = s.get_int("stride", 1)
        refuse_options(s, "reverse")
        st = self.stride
        if st < 1:
            raise s.error(f"must be at least 1, got {st}", "stride")
        if not (self.w and self.h and self.c) or self.w % st or self.h % st:
            raise s.error(f"stride={st} must divide the {self.w}x{self.h} input", "stride")
        self.out_w, self.out_h, self.out_c = self.w // st, self.h // st, self.c * st * st
        self.outputs = self.inputs

    def describe(self):
        return (
            f"{'':13s}/{self.stride:2d}  {self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        # the permuted delta, built before being added to the previous layer's
        self.delta_in = be.zeros(batch * self.inputs) if train else None

    def forward(self, net):
        net.be.reorg(
            net.input[: self.batch * self.inputs],
            self.out_w,
            self.out_h,
            self.out_c,
            self.batch,
            self.stride,
            False,
            self.output,
        )

    def backward(self, net):
        if net.delta is None:
            return
        net.be.reorg(
            self.delta,
            self.out_w,
            self.out_h,
            self.out_c,
            self.batch,
            self.stride,
            True,
            self.delta_in,
        )
        net.be.axpy(1.0, self.delta_in, net.delta[: self.batch * self.inputs])
