"""Every Darknet activation and its gradient, against formulas written out from
Darknet's activations.h (and the AlexeyAB fork's activations.c) and against finite
differences of the forward."""

import math

import numpy as np
import pytest

from darknet_py import activations
from darknet_py.activations import (
    ACTIVATIONS,
    CHANNEL_ACTIVATIONS,
    INPUT_GRADIENT,
    SELU_ALPHA,
    SELU_LAMBDA,
)


def _stair(x):
    out = np.empty_like(x)
    for i, v in enumerate(x):
        n = int(np.floor(v))
        out[i] = np.floor(v / 2.0) if n % 2 == 0 else (v - n) + np.floor(v / 2.0)
    return out


# Darknet's *_activate, one element at a time where it branches.
FORWARD = {
    "logistic": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: x * (x > 0),
    "relie": lambda x: np.array([v if v > 0 else 0.01 * v for v in x]),
    "linear": lambda x: x,
    "ramp": lambda x: x * (x > 0) + 0.1 * x,
    "tanh": lambda x: (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1),
    "plse": lambda x: np.array(
        [0.01 * (v + 4) if v < -4 else 0.01 * (v - 4) + 1 if v > 4 else 0.125 * v + 0.5 for v in x]
    ),
    "leaky": lambda x: np.array([v if v > 0 else 0.1 * v for v in x]),
    "elu": lambda x: (x >= 0) * x + (x < 0) * (np.exp(x) - 1),
    "loggy": lambda x: 2.0 / (1.0 + np.exp(-x)) - 1,
    "stair": _stair,
    "hardtan": lambda x: np.array([-1.0 if v < -1 else 1.0 if v > 1 else v for v in x]),
    "lhtan": lambda x: np.array(
        [0.001 * v if v < 0 else 0.001 * (v - 1) + 1 if v > 1 else v for v in x]
    ),
    "selu": lambda x: (x >= 0) * 1.0507 * x + (x < 0) * 1.0507 * 1.6732 * (np.exp(x) - 1),
}


def _fork_softplus(v):
    return v if v > 20 else math.exp(v) if v < -20 else math.log(math.exp(v) + 1)


# The fork's activations, one element at a time (activations.c / activations.h).
FORWARD.update(
    {
        "relu6": lambda x: np.array([min(max(v, 0.0), 6.0) for v in x]),
        "revleaky": lambda x: np.array([v if v > 0 else 0.1 * v for v in x]),
        "gelu": lambda x: np.array(
            [0.5 * v * (1 + math.tanh(0.797885 * v + 0.035677 * v**3)) for v in x]
        ),
        "swish": lambda x: np.array([v / (1 + math.exp(-v)) for v in x]),
        "mish": lambda x: np.array([v * math.tanh(_fork_softplus(v)) for v in x]),
        "hard_mish": lambda x: np.array(
            [v if v > 0 else v * v / 2 + v if v > -2 else 0.0 for v in x]
        ),
    }
)

# Darknet's *_gradient, each a function of the activation's output y.
GRADIENT = {
    "logistic": lambda y: (1 - y) * y,
    "relu": lambda y: (y > 0) * 1.0,
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
    "selu": lambda y: (y >= 0) * 1.0507 + (y < 0) * (y + 1.0507 * 1.6732),
    "relu6": lambda y: ((y > 0) & (y < 6)) * 1.0,
    "revleaky": lambda y: np.where(y > 0, 1.0, 0.1),
}

# Where each function has a kink or a jump: finite differences stay away from these.
KINKS = {
    "relu": [0],
    "relie": [0],
    "ramp": [0],
    "leaky": [0],
    "elu": [0],
    "selu": [0],
    "plse": [-4, 4],
    "hardtan": [-1, 1],
    "lhtan": [0, 1],
    "stair": list(range(-8, 9)),
    "relu6": [0, 6],
    "revleaky": [0],
    "hard_mish": [-2, 0],
    "mish": [-20, 20],
}


def _gradient(x, name):
    """The analytic gradient at x, through the output or the input as the activation needs."""
    if name in INPUT_GRADIENT:
        return activations.gradient_from_input(x, name)
    return activations.gradient(activations.activate(x, name), name)


def test_every_darknet_activation_is_covered():
    assert set(ACTIVATIONS) == set(FORWARD) == set(GRADIENT) | set(INPUT_GRADIENT)
    assert (SELU_LAMBDA, SELU_ALPHA) == (1.0507, 1.6732)


def _points():
    # A grid with both signs, the kinks themselves, and random points.
    rng = np.random.default_rng(7)
    grid = np.linspace(-7.5, 7.5, 301)
    kinks = np.array([-4.0, -1.0, 0.0, 1.0, 4.0, -2.0, 2.0, 3.0])
    return np.concatenate([grid, kinks, rng.uniform(-10, 10, 400)])


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_forward_matches_darknet_formula(name):
    x = _points()
    got = activations.activate(x.copy(), name)
    np.testing.assert_allclose(got, FORWARD[name](x), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_forward_keeps_float32(name):
    x = _points().astype(np.float32)
    got = activations.activate(x, name)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, FORWARD[name](x.astype(np.float64)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name", sorted(GRADIENT))
def test_gradient_matches_darknet_formula(name):
    # Includes outputs exactly at the kinks (y = 0, y = 1, integers for stair), where only
    # Darknet's written-out rule decides the value.
    y = activations.activate(_points(), name)
    np.testing.assert_allclose(
        activations.gradient(y, name), GRADIENT[name](y), rtol=1e-12, atol=1e-15
    )


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_gradient_matches_finite_differences(name):
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-7, 7, 600), rng.uniform(-1.5, 1.5, 200)])
    for k in KINKS.get(name, []):
        x = x[np.abs(x - k) > 1e-3]
    h = 1e-6
    fd = (activations.activate(x + h, name) - activations.activate(x - h, name)) / (2 * h)
    analytic = _gradient(x, name)
    np.testing.assert_allclose(analytic, fd, rtol=1e-6, atol=1e-7)
    if name != "stair":
        assert np.abs(fd).max() > 1e-3  # the comparison is not between two zero arrays


def test_relu6_is_computed_not_zeroed():
    # The fork's CPU build outputs 0 for relu6 (no case in its activate()); its GPU build,
    # and darknet-py on every device, compute min(max(x, 0), 6).
    x = np.array([-3.0, 0.5, 5.0, 9.0])
    np.testing.assert_array_equal(activations.activate(x, "relu6"), [0.0, 0.5, 5.0, 6.0])


# ---- the normalize_channels family -----------------------------------------------------------
def _normalize_channels_loops(x, name):
    """The fork's activate_array_normalize_channels(_softmax), one position at a time."""
    batch, channels, positions = x.shape
    out = np.zeros_like(x)
    for b in range(batch):
        for p in range(positions):
            column = [float(x[b, k, p]) for k in range(channels)]
            if name == "normalize_channels":
                total = 1e-4 + sum(v for v in column if v > 0)
                out[b, :, p] = [v / total if v > 0 else 0.0 for v in column]
                continue
            top = max(column) if name.endswith("_maxval") else 0.0
            total = 1e-4 + sum(math.exp(v - top) for v in column)
            out[b, :, p] = [math.exp(v - top) / total for v in column]
    return out


@pytest.mark.parametrize("name", CHANNEL_ACTIVATIONS)
def test_normalize_channels_matches_the_forks_loops(name):
    x = np.random.default_rng(5).uniform(-3, 3, (2, 5, 7))
    np.testing.assert_allclose(
        activations.normalize_channels(x, name),
        _normalize_channels_loops(x, name),
        rtol=1e-12,
        atol=1e-15,
    )


@pytest.mark.parametrize("name", CHANNEL_ACTIVATIONS)
def test_normalize_channels_gradient_matches_finite_differences(name):
    rng = np.random.default_rng(6)
    x = rng.uniform(-3, 3, (2, 4, 3))
    x[np.abs(x) < 0.05] = 0.5  # away from relu's kink
    g = rng.uniform(-1, 1, x.shape)
    analytic = activations.normalize_channels_gradient(x, name, g)
    numeric = np.zeros_like(x)
    h = 1e-6
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (
            (activations.normalize_channels(up, name) * g).sum()
            - (activations.normalize_channels(down, name) * g).sum()
        ) / (2 * h)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)
    assert np.abs(numeric).max() > 1e-2
