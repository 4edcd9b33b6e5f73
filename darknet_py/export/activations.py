"""Every activation of darknet_py/activations.py as ONNX operators, formula for formula
(leaky's 0.1, the fork's thresholded softplus in mish, its tanh-approximated gelu, ...).

activate(g, x, name) returns the activated tensor; x keeps its shape. The
normalize_channels family works over axis 1 of (batch, channels, positions)."""

import numpy as np

from ..activations import CHANNEL_EPS, GELU_A, GELU_B, MISH_THRESHOLD, SELU_ALPHA, SELU_LAMBDA


def _where(g, cond, a, b, x):
    return g.op("Where", [cond, a, b], g.shapes[x])


def _cmp(g, op, x, value):
    return g.op(op, [x, g.scalar(value)])


def _stair(g, x):
    n = g.op("Floor", [x], g.shapes[x])
    odd = g.op("Not", [g.op("Equal", [g.op("Mod", [n, g.scalar(2.0)], fmod=1), g.scalar(0.0)])])
    half = g.op("Floor", [g.mul(x, 0.5)], g.shapes[x])
    frac = g.op("Sub", [x, n], g.shapes[x])
    return _where(g, odd, g.op("Add", [frac, half], g.shapes[x]), half, x)


def _plse(g, x):
    low = g.mul(g.add(x, 4.0), 0.01)
    high = g.add(g.mul(g.add(x, -4.0), 0.01), 1.0)
    mid = g.add(g.mul(x, 0.125), 0.5)
    return _where(
        g, _cmp(g, "Less", x, -4.0), low, _where(g, _cmp(g, "Greater", x, 4.0), high, mid, x), x
    )


def _lhtan(g, x):
    return _where(
        g,
        _cmp(g, "Less", x, 0.0),
        g.mul(x, 0.001),
        _where(g, _cmp(g, "Greater", x, 1.0), g.add(g.mul(g.add(x, -1.0), 0.001), 1.0), x, x),
        x,
    )


def _softplus(g, x):
    """The fork's softplus: x above the threshold, exp(x) below minus it, else log1p(exp(x))."""
    exp = g.op("Exp", [x], g.shapes[x])
    log1p = g.op("Log", [g.add(exp, 1.0)], g.shapes[x])
    return _where(
        g,
        _cmp(g, "Greater", x, MISH_THRESHOLD),
        x,
        _where(g, _cmp(g, "Less", x, -MISH_THRESHOLD), exp, log1p, x),
        x,
    )


def _gelu(g, x):
    cube = g.op("Mul", [g.op("Mul", [x, x]), x], g.shapes[x])
    t = g.op("Tanh", [g.op("Add", [g.mul(x, GELU_A), g.mul(cube, GELU_B)])], g.shapes[x])
    return g.op("Mul", [g.mul(x, 0.5), g.add(t, 1.0)], g.shapes[x])


def _hard_mish(g, x):
    quad = g.op("Add", [g.mul(g.op("Mul", [x, x]), 0.5), x], g.shapes[x])
    return _where(
        g,
        _cmp(g, "Greater", x, 0.0),
        x,
        _where(g, _cmp(g, "Greater", x, -2.0), quad, g.mul(x, 0.0), x),
        x,
    )


def _unary(op, **attrs):
    return lambda g, x: g.op(op, [x], g.shapes[x], **attrs)


_EXPORT = {
    "logistic": _unary("Sigmoid"),
    "relu": _unary("Relu"),
    "relie": _unary("LeakyRelu", alpha=0.01),
    "linear": lambda g, x: x,
    "ramp": lambda g, x: g.op("Add", [g.op("Relu", [x]), g.mul(x, 0.1)], g.shapes[x]),
    "tanh": _unary("Tanh"),
    "plse": _plse,
    "leaky": _unary("LeakyRelu", alpha=0.1),
    "elu": _unary("Elu", alpha=1.0),
    "loggy": lambda g, x: g.add(g.mul(g.op("Sigmoid", [x], g.shapes[x]), 2.0), -1.0),
    "stair": _stair,
    "hardtan": lambda g, x: g.op("Clip", [x, g.scalar(-1.0), g.scalar(1.0)], g.shapes[x]),
    "lhtan": _lhtan,
    "selu": _unary("Selu", alpha=SELU_ALPHA, gamma=SELU_LAMBDA),
    "relu6": lambda g, x: g.op("Clip", [x, g.scalar(0.0), g.scalar(6.0)], g.shapes[x]),
    "revleaky": _unary("LeakyRelu", alpha=0.1),  # the fork's CPU: leaky
    "gelu": _gelu,
    "swish": lambda g, x: g.op("Mul", [x, g.op("Sigmoid", [x])], g.shapes[x]),
    "mish": lambda g, x: g.op("Mul", [x, g.op("Tanh", [_softplus(g, x)])], g.shapes[x]),
    "hard_mish": _hard_mish,
}


def _normalize_channels(g, x, name, channels):
    """relu(x)/(eps + sum relu(x)) or exp(x - m)/(eps + sum exp(x - m)) over the channels of
    each position (m: the channels' maximum for *_maxval, else 0)."""
    shape = g.shapes[x]
    v = g.reshape(x, (channels, int(np.prod(shape)) // channels))
    if name == "normalize_channels":
        e = g.op("Relu", [v], g.shapes[v])
    else:
        if name.endswith("_maxval"):
            v = g.op("Sub", [v, g.reduce("ReduceMax", v, [1])], g.shapes[v])
        e = g.op("Exp", [v], g.shapes[v])
    total = g.add(g.reduce("ReduceSum", e, [1]), CHANNEL_EPS)
    return g.reshape(g.op("Div", [e, total], g.shapes[v]), shape)


def activate(g, x, name, channels=None):
    """x activated by Darknet's activation `name`; channels: the layer's output channels,
    for the normalize_channels family."""
    if name.startswith("normalize_channels"):
        return _normalize_channels(g, x, name, channels)
    return _EXPORT[name](g, x)
