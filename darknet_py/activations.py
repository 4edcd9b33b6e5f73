"""Darknet's activation functions and their gradients, as NumPy formulas.

The gradients are functions of the activation's *output* (as in Darknet's
activations.h), because Darknet only keeps the output around for backward.
These are the reference the CUDA kernels are tested against.
"""
import numpy as np

# Order matters: the index is the activation's id, passed to the CUDA kernels
# (kernels/activations.cu has the same switch).
ACTIVATIONS = ("logistic", "relu", "relie", "linear", "ramp", "tanh", "plse",
               "leaky", "elu", "loggy", "stair", "hardtan", "lhtan", "selu")
ACTIVATION_IDS = {name: i for i, name in enumerate(ACTIVATIONS)}

SELU_LAMBDA = 1.0507
SELU_ALPHA = 1.6732


def _stair(x):
    n = np.floor(x)
    odd = (n.astype(np.int64) % 2) != 0
    return np.where(odd, (x - n) + np.floor(x / 2.0), np.floor(x / 2.0))


_FORWARD = {
    "logistic": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: x * (x > 0),
    "relie": lambda x: np.where(x > 0, x, 0.01 * x),
    "linear": lambda x: x,
    "ramp": lambda x: x * (x > 0) + 0.1 * x,
    "tanh": lambda x: np.tanh(x),
    "plse": lambda x: np.where(x < -4, 0.01 * (x + 4),
                               np.where(x > 4, 0.01 * (x - 4) + 1, 0.125 * x + 0.5)),
    "leaky": lambda x: np.where(x > 0, x, 0.1 * x),
    "elu": lambda x: np.where(x >= 0, x, np.expm1(np.minimum(x, 0))),
    "loggy": lambda x: 2.0 / (1.0 + np.exp(-x)) - 1.0,
    "stair": _stair,
    "hardtan": lambda x: np.clip(x, -1.0, 1.0),
    "lhtan": lambda x: np.where(x < 0, 0.001 * x, np.where(x > 1, 0.001 * (x - 1) + 1, x)),
    "selu": lambda x: np.where(x >= 0, SELU_LAMBDA * x,
                               SELU_LAMBDA * SELU_ALPHA * np.expm1(np.minimum(x, 0))),
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
}


def activate(x, name):
    """Return activation `name` applied to array x (same dtype)."""
    # exp() overflows to inf for large negative inputs; 1/(1+inf) is the right limit (0).
    with np.errstate(over="ignore"):
        return _FORWARD[name](x).astype(x.dtype, copy=False)


def gradient(y, name):
    """Return d(activation)/dx expressed through the output y (same dtype)."""
    return np.asarray(_GRADIENT[name](y)).astype(y.dtype, copy=False)
