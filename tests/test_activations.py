"""Every Darknet activation and its gradient, against formulas written out from
Darknet's activations.h and against finite differences of the forward."""
import numpy as np
import pytest

from darknet_py import activations
from darknet_py.activations import ACTIVATIONS, SELU_ALPHA, SELU_LAMBDA


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
    "plse": lambda x: np.array([0.01 * (v + 4) if v < -4 else
                                0.01 * (v - 4) + 1 if v > 4 else 0.125 * v + 0.5 for v in x]),
    "leaky": lambda x: np.array([v if v > 0 else 0.1 * v for v in x]),
    "elu": lambda x: (x >= 0) * x + (x < 0) * (np.exp(x) - 1),
    "loggy": lambda x: 2.0 / (1.0 + np.exp(-x)) - 1,
    "stair": _stair,
    "hardtan": lambda x: np.array([-1.0 if v < -1 else 1.0 if v > 1 else v for v in x]),
    "lhtan": lambda x: np.array([0.001 * v if v < 0 else
                                 0.001 * (v - 1) + 1 if v > 1 else v for v in x]),
    "selu": lambda x: (x >= 0) * 1.0507 * x + (x < 0) * 1.0507 * 1.6732 * (np.exp(x) - 1),
}

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
}

# Where each function has a kink or a jump: finite differences stay away from these.
KINKS = {"relu": [0], "relie": [0], "ramp": [0], "leaky": [0], "elu": [0], "selu": [0],
         "plse": [-4, 4], "hardtan": [-1, 1], "lhtan": [0, 1], "stair": list(range(-8, 9))}


def test_every_darknet_activation_is_covered():
    assert set(ACTIVATIONS) == set(FORWARD) == set(GRADIENT)
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


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_gradient_matches_darknet_formula(name):
    # Includes outputs exactly at the kinks (y = 0, y = 1, integers for stair), where only
    # Darknet's written-out rule decides the value.
    y = activations.activate(_points(), name)
    np.testing.assert_allclose(activations.gradient(y, name), GRADIENT[name](y),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_gradient_matches_finite_differences(name):
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-7, 7, 600), rng.uniform(-1.5, 1.5, 200)])
    for k in KINKS.get(name, []):
        x = x[np.abs(x - k) > 1e-3]
    h = 1e-6
    fd = (activations.activate(x + h, name) - activations.activate(x - h, name)) / (2 * h)
    analytic = activations.gradient(activations.activate(x, name), name)
    np.testing.assert_allclose(analytic, fd, rtol=1e-6, atol=1e-7)
    if name != "stair":
        assert np.abs(fd).max() > 1e-3  # the comparison is not between two zero arrays
