"""The NHWC inference path end to end on the GPU with the wgmma convolution (conv_nhwc.cu):
yolov3-tiny and yolov4-tiny under fp16 and bf16, replayed as CUDA graphs, against the same
network's NHWC run on NumPy (the reference convolution, tests/test_layout_plan.py's
run_nhwc) and against its own NCHW 16-bit run on the GPU."""

import numpy as np
import pytest
from test_layout_plan import HALF, photos, run_nhwc, text

from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network

# Largest difference in the heads' outputs as a share of their largest value: the two
# convolutions sum in other orders, so a 16-bit rounding goes either way at each layer
# (tests/test_layout_plan.py allows the same between the NHWC and the NCHW networks).
TOLERANCE = {"fp16": 1e-2, "bf16": 6e-2}


def relative_error(got, want):
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("name", ["yolov3-tiny", "yolov4-tiny"])
def test_nhwc_network_on_the_wgmma_convolution(cuda, name, precision):
    from darknet_py.ops.convolution import nhwc

    if nhwc.kernels(cuda) is None:
        pytest.skip("the NHWC convolution needs a GPU of compute capability 9.0")
    want_net, x, want = run_nhwc(name, precision)
    net = Network(
        parse_cfg_text(text(name, precision, size=64, batch=2)), batch=2, backend=cuda, seed=3
    )
    for mine, theirs in zip(net.layers, want_net.layers):  # the NumPy run's parameters
        if mine.type == "convolutional":
            for attr in ("weights", "biases", "scales", "rolling_mean", "rolling_variance"):
                if getattr(theirs, attr, None) is not None:
                    cuda.write(getattr(mine, attr), np.asarray(getattr(theirs, attr)))
    net.params_changed()
    net.nhwc = True
    assert any(layer.layout.nhwc for layer in net.layers)
    runs = [net.predict(x) for _ in range(3)]  # eager, recorded, replayed
    for got in runs:
        assert np.isfinite(got).all()
        assert relative_error(got, want) < TOLERANCE[precision]
    assert np.array_equal(runs[1], runs[2])  # a replay gives the recorded pass's bits
    assert net.graphs.replayed >= 1
    # photos letterboxed on the device into the NHWC input: predict on the letterboxed
    # float images gives the same bits
    from darknet_py.image import from_bgr, letterbox

    shots = photos(np.random.default_rng(4), 2)
    images = np.stack([letterbox(from_bgr(p, 3), 64, 64) for p in shots])
    assert np.array_equal(net.predict(shots), net.predict(images))
    # the same network with NCHW 16-bit outputs on the GPU
    net.nhwc = False
    nchw = net.predict(x)
    assert relative_error(runs[0], nchw) < TOLERANCE[precision]
