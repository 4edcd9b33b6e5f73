"""Network.infer: predict's forward with every output left on the backend (no copy back)."""

from pathlib import Path

import numpy as np
import pytest

import darknet_py as dn
from darknet_py.network import NetworkError

CFG = Path(__file__).resolve().parents[1] / "cfg" / "digits-classifier.cfg"


def test_infer_leaves_what_predict_returns_on_the_backend():
    net = dn.load_network(CFG, batch=2, device="cpu")
    with pytest.raises(NetworkError, match="no input was staged"):
        net.infer()
    x = np.random.default_rng(0).random((2,) + net.input_shape, dtype=np.float32)
    expected = net.predict(x)
    assert net.output_index == len(net.layers) - 1 and expected.shape == (2, 10)
    net.infer(np.zeros_like(x))
    assert not np.array_equal(net.layer_output(net.output_index), expected)
    net.infer(x)
    np.testing.assert_array_equal(net.layer_output(net.output_index), expected)
    net.infer()  # again on the staged input
    np.testing.assert_array_equal(net.layer_output(net.output_index), expected)


def test_predict_in_parts_returns_what_predict_returns():
    net = dn.load_network(CFG, batch=6, device="cpu")
    x = np.random.default_rng(1).random((6,) + net.input_shape, dtype=np.float32)
    whole = net.predict(x)
    parts = net.predict_in_parts(x, 2)
    assert parts.shape == whole.shape == (6, 10) and net.batch == 2
    np.testing.assert_allclose(parts, whole, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(net.layer_output(net.output_index), net.predict(x[4:]))
    with pytest.raises(ValueError, match="6 images do not split into parts of 4"):
        net.predict_in_parts(x, 4)
