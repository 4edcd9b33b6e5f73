"""[cost]: a loss on the previous layer's output against net.truth (Darknet's cost_layer.c).

Like Darknet, the layer's output holds the per-element error, its delta holds
the per-element delta computed in forward (truth - prediction for sse), the
cost is the sum of the error, and backward adds scale * delta to the previous
layer's delta. The types other than sse are composed from the backend's
elementwise ops (activations and their gradients supply the masks), so the
CUDA backend needs no extra kernels for them.
"""

from .base import Layer

COST_TYPES = ("sse", "masked", "smooth", "L1", "seg")
SECRET_NUM = -1234.0  # Darknet's marker for "no truth here" in masked costs


class CostLayer(Layer):
    type = "cost"
    short = "cost"
    image_shaped = False  # Darknet reports 0 x 0 x 0

    def parse(self, s, ctx):
        self.cost_type = s.get_str("type", "sse")
        if self.cost_type not in COST_TYPES:
            # Darknet falls back to sse with a message; a typo should not train silently.
            raise s.error(
                f"unknown cost type '{self.cost_type}' (known: {', '.join(COST_TYPES)})", "type"
            )
        self.scale = s.get_float("scale", 1.0)
        # Darknet's GPU path reads ratio but then overrides its threshold with 0, so it
        # never changes a delta: accepted and ignored.
        s.get_float("ratio", 0.0)
        if s.get_float("thresh", 0.0) != 0.0:
            raise s.error(
                "thresh (a GPU-only delta suppression in Darknet) is not supported by darknet-py",
                "thresh",
            )
        if s.get_float("noobj", 1.0) != 1.0:
            raise s.error(
                "noobj (a GPU-only seg scaling in Darknet) is not supported by darknet-py", "noobj"
            )
        self.out_c = self.out_h = self.out_w = 0
        self.outputs = self.inputs

    def describe(self):
        return f"{'':41s}{self.inputs:4d}"

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        n = batch * self.inputs
        # delta is where forward writes the loss gradient, so it exists at inference too.
        if self.delta is None:
            self.delta = be.zeros(n)
        if self.cost_type in ("smooth", "L1", "masked"):
            self.ones = be.zeros(n)
            be.fill(self.ones, 1.0)
            self.tmp = [be.zeros(n) for _ in range(3)]  # scratch for the composed formulas
        self.scalars = be.zeros(1)

    def forward(self, net):
        if net.truth is None:
            # Darknet returns without touching anything when there is no truth.
            self.cost = None
            return
        be = net.be
        n = self.batch * self.inputs
        pred, truth = net.input[:n], net.truth[:n]
        error, delta = self.output, self.delta
        if self.cost_type == "smooth":
            self._smooth_l1(be, pred, truth, delta, error)
        elif self.cost_type == "L1":
            self._l1(be, pred, truth, delta, error)
        else:
            be.l2(pred, truth, delta, error)  # sse, and seg (the same on Darknet's CPU)
            if self.cost_type == "masked":
                self._mask_secret(be, truth, delta, error)
        be.sum_into(error, self.scalars)
        self.pending = True
        self.cost = None

    @staticmethod
    def _abs_inplace(be, x, tmp):
        """x = |x| as relu(x) + relu(-x) (exact: one of the two terms is zero)."""
        be.copy(x, tmp)
        be.scal(-1.0, tmp)
        be.activate(tmp, "relu")
        be.activate(x, "relu")
        be.axpy(1.0, tmp, x)

    def _l1(self, be, pred, truth, delta, error):
        # diff = truth - pred (l2 writes it to delta); error = |diff|;
        # delta = 1 where diff > 0 else -1 (Darknet's l1_cpu).
        be.l2(pred, truth, delta, error)
        be.copy(delta, error)
        self._abs_inplace(be, error, self.tmp[0])
        positive = self.tmp[0]
        be.fill(positive, 1.0)
        be.gradient(delta, "relu", positive)  # 1 where diff > 0, else 0
        be.copy(positive, delta)
        be.scal(2.0, delta)
        be.axpy(-1.0, self.ones, delta)

    def _smooth_l1(self, be, pred, truth, delta, error):
        # Darknet's smooth L1: |diff| < 1: error diff^2, delta diff; else error 2|diff| - 1,
        # delta sign(diff). (Darknet's CPU code flips that sign, its GPU kernel does not;
        # the GPU kernel is what Darknet trains with, and the sign that descends.)
        be.l2(pred, truth, delta, error)  # delta = diff, error = diff^2
        inside, outer, tmp = self.tmp
        be.activate(delta, "hardtan")  # clip(diff, -1, 1): the delta in both cases
        be.fill(inside, 1.0)
        be.gradient(delta, "hardtan", inside)  # 1 where |diff| < 1, else 0
        be.mul(inside, error)  # diff^2 inside, 0 outside
        # outer = (2|diff| - 1) * (1 - inside); |diff| is rebuilt from diff = truth - pred.
        be.copy(truth, outer)
        be.axpy(-1.0, pred, outer)
        self._abs_inplace(be, outer, tmp)
        be.scal(2.0, outer)
        be.axpy(-1.0, self.ones, outer)
        be.scal(-1.0, inside)
        be.axpy(1.0, self.ones, inside)  # inside := 1 - inside
        be.mul(inside, outer)
        be.axpy(1.0, outer, error)

    def _mask_secret(self, be, truth, delta, error):
        # Darknet sets the prediction to SECRET_NUM where the truth is SECRET_NUM, so the
        # delta and error there are 0. keep = 1 where truth != SECRET_NUM: (t - s) > 0 or < 0.
        offset, keep, below = self.tmp
        be.copy(truth, offset)
        be.axpy(-SECRET_NUM, self.ones, offset)  # truth + 1234: exactly 0 at the marker
        be.fill(keep, 1.0)
        be.gradient(offset, "relu", keep)  # 1 where truth > marker
        be.scal(-1.0, offset)
        be.fill(below, 1.0)
        be.gradient(offset, "relu", below)  # 1 where truth < marker
        be.axpy(1.0, below, keep)
        be.mul(keep, delta)
        be.copy(delta, error)
        be.mul(delta, error)

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(self.scale, self.delta, net.delta[: self.batch * self.inputs])
