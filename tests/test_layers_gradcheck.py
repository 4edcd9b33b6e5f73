"""Gradient checks: every layer's backward against central finite differences, in float64.

Each case is a tiny network built from cfg text. The loss is either
L = sum(output * R) for a fixed random R (the last layer's delta is set to -R:
Darknet's delta is minus the gradient) or, for layers with their own loss
(softmax with a truth, [cost]), that loss as Darknet defines its delta. After
backward, the delta reaching the network input must equal -dL/dx and every
accumulated update (bias_updates, weight_updates, scale_updates) must equal
-dL/dparameter, both measured by finite differences.

Batch normalisation: Darknet's backward formulas are the exact gradient of BN
with the biased variance and 1/sqrt(var + 1e-5); its forward uses the unbiased
variance and 1/(sqrt(var) + 1e-6). The finite differences here therefore run on
a backend whose forward is the one the backward differentiates (ExactBNBackend);
the quirky forward itself is checked in test_layers.py.
"""

import numpy as np
import pytest

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.layers.route import RouteLayer
from darknet_py.network import Network

EPS = 1e-5  # finite-difference step
TOL = 1e-6  # max |analytic - numeric| relative to max |numeric|
SAMPLES = 24  # coordinates checked per array (all of them when fewer)


class ExactBNBackend(NumpyBackend):
    """NumPy backend whose BN forward is the function Darknet's BN backward differentiates."""

    def variance(self, x, mean, batch, filters, spatial, variance):
        d = x.reshape(batch, filters, spatial) - mean[:filters].reshape(1, filters, 1)
        variance[:filters] = (d * d).mean(axis=(0, 2))

    def normalize_delta(
        self,
        x,
        mean,
        variance,
        mean_delta,
        variance_delta,
        batch,
        filters,
        spatial,
        delta,
        fork=False,
    ):
        """The gradient's divisor sqrt(var + 1e-5), also where the fork's CPU backward
        divides by sqrt(var) + 1e-5 (test_fork_train checks that one against the fork)."""
        super().normalize_delta(
            x,
            mean,
            variance,
            mean_delta,
            variance_delta,
            batch,
            filters,
            spatial,
            delta,
            fork=False,
        )

    def normalize(self, x, mean, variance, batch, filters, spatial):
        v = x.reshape(batch, filters, spatial)
        v -= mean[:filters].reshape(1, filters, 1)
        v /= np.sqrt(variance[:filters] + 1e-5).reshape(1, filters, 1)


def net_text(width, height, channels, body, batch=2):
    return f"[net]\nbatch={batch}\nwidth={width}\nheight={height}\nchannels={channels}\n\n" + body


class GradCheck:
    """A tiny network in training mode with a scalar loss and its finite differences."""

    def __init__(
        self, cfg, truth=None, loss="linear", loss_scale=1.0, seed=0, input_range=(-1.0, 1.0)
    ):
        self.be = be = ExactBNBackend(dtype=np.float64)
        self.net = net = Network(parse_cfg_text(cfg), backend=be, seed=seed)
        rng = np.random.default_rng(seed + 101)
        for layer in net.layers:
            # The fork's convolutions drop the deltas others left for their input: not a
            # gradient (test_fork_train checks it against the fork).
            layer.clears_input_delta = False
        # Random parameters (biases and BN scales included), never zeros.
        for layer in net.layers:
            for name, arr in layer.params():
                if name in ("rolling_mean", "rolling_variance"):
                    continue
                low, high = (0.5, 1.5) if name == "scales" else (-0.6, 0.6)
                be.write(arr, rng.uniform(low, high, arr.size))
        x = rng.uniform(*input_range, size=(net.batch,) + net.input_shape)
        # One Network.forward allocates the training buffers; after that the input lives in
        # a float64 buffer of our own (Network.forward would round it to float32).
        net.forward(x.astype(np.float32), train=True)
        self.x = be.from_host(x)
        self.dx = be.zeros(self.x.size)
        self.truth = None if truth is None else be.from_host(truth)
        self.loss_kind, self.loss_scale = loss, loss_scale
        last = net.layers[-1]
        self.R = be.from_host(rng.uniform(-1, 1, net.batch * last.outputs))

    # ---- the loss -------------------------------------------------------------------
    def forward(self):
        """Darknet's training forward: each layer's delta zeroed before it runs."""
        net, be = self.net, self.be
        net.train, net.truth, net.input, net.delta = True, self.truth, self.x, None
        for layer in net.layers:
            if layer.delta is not None:
                be.fill(layer.delta, 0.0)
            layer.forward(net)
            net.input = layer.output
        net.collect_costs()

    def loss(self):
        self.forward()
        last = self.net.layers[-1]
        if self.loss_kind == "linear":
            return float(np.dot(self.be.to_host(last.output), self.be.to_host(self.R)))
        return self.loss_scale * last.cost

    def analytic(self):
        """Run forward and backward; return {name: -delta or -update} as gradients of L."""
        net, be = self.net, self.be
        self.forward()
        layers = net.layers
        if self.loss_kind == "linear":
            be.copy(self.R, layers[-1].delta)
            be.scal(-1.0, layers[-1].delta)
        for layer in layers:
            for name in ("bias_updates", "weight_updates", "scale_updates"):
                if getattr(layer, name, None) is not None:
                    be.fill(getattr(layer, name), 0.0)
        be.fill(self.dx, 0.0)
        for i in range(len(layers) - 1, -1, -1):
            if i == 0:
                net.input, net.delta = self.x, self.dx
            else:
                net.input, net.delta = layers[i - 1].output, layers[i - 1].delta
            layers[i].backward(net)
        grads = {"input": -be.to_host(self.dx)}
        for layer in layers:
            for update, param in (
                ("bias_updates", "biases"),
                ("weight_updates", "weights"),
                ("scale_updates", "scales"),
            ):
                if getattr(layer, update, None) is not None:
                    grads[f"{layer.index}.{param}"] = -be.to_host(getattr(layer, update))
        return grads

    def _array(self, key):
        if key == "input":
            return self.x
        index, param = key.split(".")
        return getattr(self.net.layers[int(index)], param)

    def numeric(self, key, coords):
        arr = self._array(key)
        out = np.empty(len(coords))
        for n, i in enumerate(coords):
            v = float(arr[i])
            arr[i] = v + EPS
            plus = self.loss()
            arr[i] = v - EPS
            minus = self.loss()
            arr[i] = v
            out[n] = (plus - minus) / (2 * EPS)
        return out

    def check(self, expect=None):
        """Compare every gradient; `expect` lists keys that must be among them."""
        grads = self.analytic()
        if expect:
            missing = set(expect) - set(grads)
            assert not missing, f"no gradient for {sorted(missing)}"
        rng = np.random.default_rng(5)
        for key, g in grads.items():
            coords = (
                np.arange(g.size)
                if g.size <= SAMPLES
                else np.sort(rng.choice(g.size, SAMPLES, replace=False))
            )
            numeric = self.numeric(key, coords)
            scale = np.abs(numeric).max()
            if expect and key in expect:
                assert scale > 1e-6, f"{key}: the loss does not depend on it (test is vacuous)"
            # (A parameter may truly not matter, e.g. conv biases before a [batchnorm].)
            err = np.abs(g[coords] - numeric).max() / max(scale, 1e-4)
            assert err < TOL, (
                f"{key}: relative error {err:.2e}\nanalytic {g[coords]}\nnumeric  {numeric}"
            )
        return grads


# ---- convolutional -------------------------------------------------------------------
CONV_STACK = """
[convolutional]
filters=4
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=4
size=3
stride=2
pad=1
groups=2
activation=logistic

[convolutional]
filters=2
size=3
stride=1
pad=1
dilation=2
activation=tanh

[convolutional]
filters=3
size=1
stride=1
activation=linear
"""


def test_conv_groups_stride_dilation_padding():
    GradCheck(net_text(7, 6, 2, CONV_STACK)).check(
        expect=["input", "0.weights", "1.weights", "2.weights", "3.weights", "3.biases"]
    )


def test_conv_1x1_first_layer_and_explicit_padding():
    # A 1x1 first layer takes the no-im2col path, including its delta to the input.
    body = """
[convolutional]
filters=3
size=1
stride=1
activation=leaky

[convolutional]
filters=2
size=2
stride=2
padding=1
activation=linear
"""
    GradCheck(net_text(5, 5, 2, body)).check(expect=["input", "0.weights", "1.weights"])


def test_conv_batch_normalize():
    body = """
[convolutional]
batch_normalize=1
filters=3
size=3
stride=1
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=2
size=1
stride=1
activation=linear
"""
    GradCheck(net_text(4, 4, 2, body, batch=3)).check(
        expect=["input", "0.scales", "0.biases", "0.weights", "1.scales", "1.weights"]
    )


# ---- connected, batchnorm ------------------------------------------------------------
def test_connected():
    body = """
[connected]
output=5
activation=leaky

[connected]
output=4
activation=logistic
"""
    GradCheck(net_text(3, 2, 2, body, batch=3)).check(
        expect=["input", "0.weights", "0.biases", "1.weights", "1.biases"]
    )


def test_connected_batch_normalize():
    body = """
[connected]
output=5
batch_normalize=1
activation=tanh

[connected]
output=3
batch_normalize=1
activation=linear
"""
    GradCheck(net_text(3, 2, 2, body, batch=4)).check(
        expect=["input", "0.scales", "0.biases", "0.weights", "1.scales", "1.weights"]
    )


def test_batchnorm_layer():
    body = """
[convolutional]
filters=3
size=3
stride=1
pad=1
activation=linear

[batchnorm]
"""
    GradCheck(net_text(4, 3, 2, body, batch=2)).check(
        expect=["input", "0.weights", "1.scales", "1.biases"]
    )


# ---- pooling ---------------------------------------------------------------------------
def test_maxpool():
    body = """
[maxpool]
size=2
stride=2

[convolutional]
filters=2
size=1
stride=1
activation=linear

[maxpool]
size=3
stride=1
"""
    # Continuous random inputs: no two values of a window tie.
    GradCheck(net_text(6, 6, 2, body)).check(expect=["input", "1.weights"])


def test_avgpool():
    body = """
[convolutional]
filters=3
size=3
stride=1
pad=1
activation=leaky

[avgpool]
"""
    GradCheck(net_text(4, 5, 2, body)).check(expect=["input", "0.weights"])


# ---- losses ------------------------------------------------------------------------------
def test_softmax_cross_entropy():
    body = """
[connected]
output=6
activation=linear

[softmax]
groups=2
"""
    # One-hot truth per group: Darknet's delta t - p is minus the gradient of -sum t log p.
    truth = np.zeros((2, 6))
    truth[0, [1, 4]] = 1
    truth[1, [0, 5]] = 1
    GradCheck(net_text(2, 2, 3, body), truth=truth, loss="cost").check(
        expect=["input", "0.weights", "0.biases"]
    )


@pytest.mark.parametrize(
    "kind,scale,loss_scale",
    [
        ("sse", 0.7, 0.35),  # delta = t - p = -(1/2) d(sum (t-p)^2)/dp, times scale
        ("seg", 1.0, 0.5),
        ("masked", 1.0, 0.5),
        ("L1", 1.5, 1.5),  # delta = sign(t - p) = -d(sum |t-p|)/dp
        ("smooth", 1.0, 0.5),  # both branches: delta = -(1/2) d(error)/dp
    ],
)
def test_cost(kind, scale, loss_scale):
    body = f"""
[connected]
output=8
activation=linear

[cost]
type={kind}
scale={scale}
"""
    rng = np.random.default_rng(3)
    # Truths far from and near the predictions, so smooth L1 runs both branches.
    truth = rng.uniform(-3, 3, (2, 8))
    if kind == "masked":
        truth[0, [1, 5]] = -1234.0  # Darknet's "no truth here"
    check = GradCheck(net_text(2, 2, 2, body), truth=truth, loss="cost", loss_scale=loss_scale)
    check.check(expect=["input", "0.weights", "0.biases"])
    if kind == "smooth":
        diff = np.abs(truth.reshape(-1) - check.be.to_host(check.net.layers[0].output))
        assert (diff < 1).any() and (diff > 1).any()


# ---- routing -----------------------------------------------------------------------------
def test_route():
    body = """
[convolutional]
filters=2
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=3
size=1
stride=1
activation=logistic

[route]
layers=-1,-2

[convolutional]
filters=2
size=1
stride=1
activation=linear
"""
    GradCheck(net_text(4, 4, 2, body)).check(expect=["input", "0.weights", "1.weights"])


def test_route_of_one_input_is_that_inputs_output(monkeypatch):
    # yolov3's and yolov4's [route] layers=-N of one whole input: the route's output is its
    # input's array (no copy, no second buffer); the gradient still flows through it.
    body = """
[convolutional]
filters=3
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=3
size=1
stride=1
activation=logistic

[route]
layers=-2

[shortcut]
from=-2
activation=linear

[convolutional]
filters=2
size=1
stride=1
activation=linear
"""
    check = GradCheck(net_text(4, 4, 2, body))
    check.check(expect=["input", "0.weights", "1.weights", "4.weights"])
    route = check.net.layers[2]
    assert route.is_view and route.output is check.net.layers[0].output
    # The estimate counts its output once: 48 floats an image fewer than a copy's.
    viewed = Network(parse_cfg_text(net_text(4, 4, 2, body))).memory_bytes(2, True)
    monkeypatch.setattr(RouteLayer, "views_its_input", lambda layer: False)
    copied = Network(parse_cfg_text(net_text(4, 4, 2, body)))
    assert not copied.layers[2].is_view
    assert copied.memory_bytes(2, True) - viewed == 4 * 2 * 48


def test_shortcut_same_shape():
    body = """
[convolutional]
filters=3
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=3
size=1
stride=1
activation=linear

[shortcut]
from=-2
alpha=0.7
beta=1.3
activation=leaky
"""
    GradCheck(net_text(4, 4, 2, body)).check(expect=["input", "0.weights", "1.weights"])


def test_shortcut_from_larger_layer():
    # `from` is 6x6x4, the stream 3x3x2: Darknet samples every second cell, 2 channels.
    body = """
[convolutional]
filters=4
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=2
size=3
stride=2
pad=1
activation=linear

[shortcut]
from=0
beta=0.8
activation=logistic
"""
    GradCheck(net_text(6, 6, 2, body)).check(expect=["input", "0.weights", "1.weights"])


def test_shortcut_from_smaller_layer():
    # `from` is 3x3x2, the stream 6x6x4: added to every second cell of 2 channels.
    body = """
[convolutional]
filters=2
size=3
stride=2
pad=1
activation=leaky

[upsample]
stride=2

[convolutional]
filters=4
size=3
stride=1
pad=1
activation=linear

[shortcut]
from=0
beta=1.2
activation=leaky
"""
    GradCheck(net_text(6, 6, 2, body)).check(expect=["input", "0.weights", "2.weights"])


# ---- shape layers ------------------------------------------------------------------------
@pytest.mark.parametrize("stride", [2, -2])
def test_upsample(stride):
    body = f"""
[convolutional]
filters=2
size=1
stride=1
activation=leaky

[upsample]
stride={stride}
scale=0.5
"""
    GradCheck(net_text(4, 4, 2, body)).check(expect=["input", "0.weights"])


@pytest.mark.parametrize(
    "options,channels",
    [
        ("stride=2", 4),
        ("stride=2\nreverse=1", 8),
        ("flatten=1", 3),
        ("flatten=1\nreverse=1", 3),
        ("extra=3", 2),
    ],
)
def test_reorg(options, channels):
    body = f"""
[convolutional]
filters={channels}
size=1
stride=1
activation=leaky

[reorg]
{options}
"""
    GradCheck(net_text(4, 4, 2, body)).check(expect=["input", "0.weights"])


def test_dropout_fixed_mask():
    body = """
[connected]
output=20
activation=leaky

[dropout]
probability=0.4

[connected]
output=3
activation=linear
"""
    check = GradCheck(net_text(2, 2, 2, body))
    check.check(expect=["input", "0.weights", "2.weights"])
    # The mask is the same on every forward of a step and really drops values.
    rand = check.be.to_host(check.net.layers[1].rand)
    assert 0 < (rand < 0.4).sum() < rand.size


@pytest.mark.parametrize(
    "options,size", [("size=3\nstride=1\npad=1", 5), ("size=2\nstride=2\npad=0", 6)]
)
def test_local(options, size):
    body = f"""
[local]
filters=3
{options}
activation=leaky

[local]
filters=2
size=1
stride=1
pad=0
activation=linear
"""
    GradCheck(net_text(size, size, 2, body)).check(
        expect=["input", "0.weights", "0.biases", "1.weights"]
    )


# ---- issue 23's layers (lrn and l2norm keep Darknet's approximate gradients: their numbers
# are checked against the C code in test_layers_c_fixtures.py) ---------------------------
def test_deconvolutional():
    body = """
[deconvolutional]
filters=3
size=4
stride=2
pad=1
activation=leaky

[deconv]
batch_normalize=1
filters=2
size=3
stride=1
padding=1
activation=linear
"""
    GradCheck(net_text(3, 4, 2, body, batch=3)).check(
        expect=["input", "0.weights", "0.biases", "1.weights", "1.scales", "1.biases"]
    )


def test_activation_layer():
    body = (
        "[convolutional]\nfilters=3\nsize=1\nactivation=linear\n\n"
        "[activation]\nactivation=tanh\n\n[activation]\nactivation=mish\n"
    )
    GradCheck(net_text(3, 3, 2, body)).check(expect=["input", "0.weights"])


def test_logistic_cross_entropy():
    rng = np.random.default_rng(9)
    truth = rng.uniform(0, 1, (2, 18))
    GradCheck(net_text(3, 3, 2, "[logistic]\n"), truth=truth, loss="cost").check(expect=["input"])
