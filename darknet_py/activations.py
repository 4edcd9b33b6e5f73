"""Darknet's activation functions and their gradients, as NumPy formulas.

Most gradients are functions of the activation's *output* (as in Darknet's
activations.h), because Darknet only keeps the output around for backward. The
AlexeyAB fork's smooth activations (gelu, swish, mish, hard_mish) cannot be
differentiated from their output; layers keep their input for them
(INPUT_GRADIENT). The normalize_channels family normalises across the channels
of each position, so it is not element-wise (CHANNEL_ACTIVATIONS, with their own
backend ops). These are the reference the CUDA kernels are tested against.

relu6 is min(max(x, 0), 6) on every device, as the fork's GPU build computes it;
the fork's CPU build has no case for it in its generic activate() and outputs 0.
That CPU result is a bug of the build, not a definition, so it is not reproduced.
"""

import numpy as np

# Order matters: the index is the activation's id, passed to the CUDA kernels
# (ops/common/activations.cuh has the same switch).
ACTIVATIONS = (
    "logistic",
    "relu",
    "relie",
    "linear",
    "ramp",
    "tanh",
    "plse",
    "leaky",
    "elu",
    "loggy",
    "stair",
    "hardtan",
    "lhtan",
    "selu",
    # the AlexeyAB fork's
    "relu6",
    "revleaky",
    "gelu",
    "swish",
    "mish",
    "hard_mish",
)
ACTIVATION_IDS = {name: i for i, name in enumerate(ACTIVATIONS)}

SELU_LAMBDA = 1.0507
SELU_ALPHA = 1.6732
MISH_THRESHOLD = 20.0
GELU_A, GELU_B = 0.797885, 0.035677  # the fork's tanh approximation constants

# Activations whose gradient needs the input (the layer keeps it while training).
INPUT_GRADIENT = ("gelu", "swish", "mish", "hard_mish")
# The fork's per-position normalisations over channels (NormalizeChannels in its source).
CHANNEL_ACTIVATIONS = (
    "normalize_channels",
    "normalize_channels_softmax",
    "normalize_channels_softmax_maxval",
)
CHANNEL_EPS = 1e-4


def _stair(x):
    n = np.floor(x)
    odd = (n.astype(np.int64) % 2) != 0
    return np.where(odd, (x - n) + np.floor(x / 2.0), np.floor(x / 2.0))


def _softplus(x):
    """The fork's softplus: x above the threshold, exp(x) below minus it, else log1p(exp(x))."""
    with np.errstate(over="ignore"):
        return np.where(
            x > MISH_THRESHOLD, x, np.where(x < -MISH_THRESHOLD, np.exp(x), np.log1p(np.exp(x)))
        )


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _gelu_tanh(x):
    return np.tanh(GELU_A * x + GELU_B * x * x * x)


_FORWARD = {
    "logistic": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: x * (x > 0),
    "relie": lambda x: np.where(x > 0, x, 0.01 * x),
    "linear": lambda x: x,
    "ramp": lambda x: x * (x > 0) + 0.1 * x,
    "tanh": lambda x: np.tanh(x),
    "plse": lambda x: np.where(
        x < -4, 0.01 * (x + 4), np.where(x > 4, 0.01 * (x - 4) + 1, 0.125 * x + 0.5)
    ),
    "leaky": lambda x: np.where(x > 0, x, 0.1 * x),
    "elu": lambda x: np.where(x >= 0, x, np.expm1(np.minimum(x, 0))),
    "loggy": lambda x: 2.0 / (1.0 + np.exp(-x)) - 1.0,
    "stair": _stair,
    "hardtan": lambda x: np.clip(x, -1.0, 1.0),
    "lhtan": lambda x: np.where(x < 0, 0.001 * x, np.where(x > 1, 0.001 * (x - 1) + 1, x)),
    "selu": lambda x: np.where(
        x >= 0, SELU_LAMBDA * x, SELU_LAMBDA * SELU_ALPHA * np.expm1(np.minimum(x, 0))
    ),
    "relu6": lambda x: np.clip(x, 0.0, 6.0),
    "revleaky": lambda x: np.where(x > 0, x, 0.1 * x),  # the fork's CPU: leaky
    "gelu": lambda x: 0.5 * x * (1.0 + _gelu_tanh(x)),
    "swish": lambda x: x * _sigmoid(x),
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "hard_mish": lambda x: np.where(x > 0, x, np.where(x > -2, 0.5 * x * x + x, 0.0)),
}

_GRADIENT = {  # y is the activation's output
    "logistic": lambda y: (1 - y) * y,
    "relu": lambda y: (y > 0).astype(y.dtype),
    "relie": lambda y: np.where(y > 0, 1.0, 0.01),
    "linear": lambda y: np.ones_like(y),
    "ramp": lambda y: (y > 0) + 0.1,
    "tanh": lambda y: 1 - y * y,
    "plse": lambda y: np.where((y < 0) | (y > 1), 0.01, 0.125),
    "leaky": lambda y: np.where(y > 0, 1.0, 0.1),
    "elu": lambda y: (y >= 0) + (y < 0) * (y + 1),
    "loggy": lambda y: 2 * (1 - (y + 1) / 2) * ((y + 1) / 2),
    "stair": lambda y: np.where(np.floor(y) == y, 0.0, 1.0),
    "hardtan": lambda y: np.where((y > -1) & (y < 1), 1.0, 0.0),
    "lhtan": lambda y: np.where((y > 0) & (y < 1), 1.0, 0.001),
    "selu": lambda y: np.where(y >= 0, SELU_LAMBDA, y + SELU_LAMBDA * SELU_ALPHA),
    "relu6": lambda y: np.where((y > 0) & (y < 6), 1.0, 0.0),
    "revleaky": lambda y: np.where(y > 0, 1.0, 0.1),
}


def _gelu_gradient(x):
    t = _gelu_tanh(x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (GELU_A + 3.0 * GELU_B * x * x)


def _mish_gradient(x):
    sp = _softplus(x)
    tsp = np.tanh(sp)
    return tsp + x * (1.0 - tsp * tsp) * (1.0 - np.exp(-sp))  # d softplus/dx = 1 - exp(-sp)


_INPUT_GRADIENT = {  # x is the activation's input
    "gelu": _gelu_gradient,
    "swish": lambda x: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x))),
    "mish": _mish_gradient,
    "hard_mish": lambda x: np.where(x > 0, 1.0, np.where(x > -2, x + 1.0, 0.0)),
}


def activate(x, name):
    """Return activation `name` applied to array x (same dtype)."""
    # exp() overflows to inf for large negative inputs; 1/(1+inf) is the right limit (0).
    with np.errstate(over="ignore"):
        return _FORWARD[name](x).astype(x.dtype, copy=False)


def gradient(y, name):
    """Return d(activation)/dx expressed through the output y (same dtype)."""
    return np.asarray(_GRADIENT[name](y)).astype(y.dtype, copy=False)


def gradient_from_input(x, name):
    """d(activation)/dx for the INPUT_GRADIENT activations, from the input x."""
    with np.errstate(over="ignore"):
        return np.asarray(_INPUT_GRADIENT[name](x)).astype(x.dtype, copy=False)


def normalize_channels(x, name):
    """The fork's normalize_channels family on x (batch, channels, positions): per image and
    position, relu(x)/(eps + sum relu(x)) or exp(x - m)/(eps + sum exp(x - m)) over the
    channels, with m the channels' maximum for *_maxval and 0 otherwise."""
    if name == "normalize_channels":
        r = np.maximum(x, 0)
        return (r / (CHANNEL_EPS + r.sum(axis=1, keepdims=True))).astype(x.dtype, copy=False)
    m = x.max(axis=1, keepdims=True) if name.endswith("_maxval") else 0
    with np.errstate(over="ignore"):
        e = np.exp(x - m)
    return (e / (CHANNEL_EPS + e.sum(axis=1, keepdims=True))).astype(x.dtype, copy=False)


def normalize_channels_gradient(x, name, grad_out):
    """dL/dx of normalize_channels for dL/dy = grad_out, both (batch, channels, positions).

    The exact derivative (the fork's backward multiplies by sum(y * delta) instead, which is
    not the derivative of its forward). For *_maxval the maximum's own derivative through
    the eps term is included, so finite differences agree."""
    y = normalize_channels(x, name)
    gy = (grad_out * y).sum(axis=1, keepdims=True)
    if name == "normalize_channels":
        s = CHANNEL_EPS + np.maximum(x, 0).sum(axis=1, keepdims=True)
        return np.where(x > 0, (grad_out - gy) / s, 0.0).astype(x.dtype, copy=False)
    out = y * (grad_out - gy)
    if name.endswith("_maxval"):
        m = x.max(axis=1, keepdims=True)
        s = CHANNEL_EPS + np.exp(x - m).sum(axis=1, keepdims=True)
        first = np.argmax(x, axis=1)[:, None, :]  # the fork takes the first maximum
        np.put_along_axis(out, first, np.take_along_axis(out, first, 1) - CHANNEL_EPS / s * gy, 1)
    return out.astype(x.dtype, copy=False)
