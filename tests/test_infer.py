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
    net.infer()   # again on the staged input
    np.testing.assert_array_equal(net.layer_output(net.output_index), expected)
