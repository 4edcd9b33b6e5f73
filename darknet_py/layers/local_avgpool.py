"""[local_avgpool] ([local_avg]): the AlexeyAB fork's windowed average pooling.

The windows, strides and padding are [maxpool]'s; each output is the mean of its
window's cells inside the image (padding cells are not counted). Backward is the
exact adjoint (the fork divides by size*size there, also at the borders)."""

from .maxpool import MaxpoolLayer


class LocalAvgpoolLayer(MaxpoolLayer):
    type = "local_avgpool"
    short = "avg"
    reads_depth = False

    def allocate(self, be, batch, train):
        super(MaxpoolLayer, self).allocate(be, batch, train)  # no argmax indexes

    def _pool(self, be, x, out, forward):
        be.local_avgpool(
            x,
            self.batch,
            self.c,
            self.h,
            self.w,
            self.size,
            self.stride_x,
            self.stride_y,
            self.padding,
            out,
            forward,
        )

    def forward(self, net):
        self._pool(net.be, net.input, self.output, True)

    def backward(self, net):
        if net.delta is not None:
            self._pool(net.be, net.delta, self.delta, False)
