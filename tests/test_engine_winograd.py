"""The CPU engine's Winograd convolutions (export/winograd.py): the engine's graph against
darknet-py's NumPy forward, the choice of layers on yolov3-tiny, the fallback to plain
Conv when the Winograd form misses the check, and `darknet-py export` still writing
plain Conv."""

from pathlib import Path

import numpy as np
import pytest

import darknet_py
from darknet_py.export import cache as cache_module
from darknet_py.export import engine as engine_module
from darknet_py.export import winograd
from darknet_py.export.check import CHECK_TOLERANCE, compare, relative_difference, session
from darknet_py.export.model import export_model

onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install onnx onnxruntime)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

from helpers import unit_rolling_variance  # noqa: E402
from test_cli import run_in_process  # noqa: E402
from test_onnx_export import network_from_text, randomize  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
TINY_CFG = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
TINY_WEIGHTS = SHARED / "weights" / "yolov3-tiny.weights"
PHOTOS = sorted((SHARED / "images").glob("*.jpg"))

# Measured on yolov3-tiny's real weights and the four photos of ../shared/images: the
# engine's Winograd graph differs from NumPy's forward by at most 5.5e-6 of each head's
# largest value (the plain graph: ~1e-6); the check's tolerance is 1e-4.
REAL_WEIGHTS_TOLERANCE = 2e-5

# 3x3 stride-1 layers of several shapes (maps 13 and 7 are not whole 4x4 tiles, 3 input
# channels, 40 filters), with batch norm and without, between layers it must not touch
# (a 3x3 stride 2, a 1x1, a 3x3 with groups).
MIXED_CFG = """[net]
width=26
height=26
channels=3

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=40
size=3
stride=1
pad=1
activation=linear

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=24
size=3
stride=1
pad=1
activation=mish

[convolutional]
batch_normalize=1
filters=32
size=3
stride=2
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=16
size=1
stride=1
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
groups=2
activation=leaky

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=logistic
"""


def ops(model):
    return [node.op_type for node in model.graph.node]


def conv_kernels(model):
    """The kernel_shape of every Conv node."""
    return [
        tuple(next(a.ints for a in node.attribute if a.name == "kernel_shape"))
        for node in model.graph.node
        if node.op_type == "Conv"
    ]


def test_the_transform_matrices_compute_a_3x3_correlation():
    rng = np.random.default_rng(0)
    tile, kernel = rng.standard_normal((6, 6)), rng.standard_normal((3, 3))
    direct = np.array(
        [[np.sum(tile[i : i + 3, j : j + 3] * kernel) for j in range(4)] for i in range(4)]
    )
    v = winograd.input_kernels().reshape(36, 36) @ tile.reshape(36)
    u = winograd.transformed_weights(kernel[None, None], np.float64).reshape(36)
    assert np.allclose((winograd.output_matrix() @ (u * v)).reshape(4, 4), direct, atol=1e-12)
    # the biases, added to the products at one position, reach each output exactly once
    b = winograd.transformed_biases(np.array([0.25]))
    assert np.array_equal(winograd.output_matrix() @ b, np.full(16, 0.25))


def test_every_eligible_layer_as_winograd_agrees_with_numpy_on_a_batch():
    net = network_from_text(MIXED_CFG, batch=2)
    randomize(net, np.random.default_rng(5))
    eligible = [l.index for l in net.layers if l.type == "convolutional" and winograd.eligible(l)]
    assert eligible == [0, 1, 3, 7]  # not the stride-2, the 1x1 or the grouped one
    model = export_model(net, batch=None, winograd="all")
    onnx.checker.check_model(model)
    assert ops(model).count("ConvTranspose") == len(eligible)
    assert conv_kernels(model).count((3, 3)) == 2  # the stride-2 and the grouped layer
    x = np.random.default_rng(6).random((2,) + net.input_shape, dtype=np.float32)
    served = session(model.SerializeToString())
    assert compare(net, served, x)["output"] < CHECK_TOLERANCE
    plain = session(export_model(net, batch=None).SerializeToString())
    # another arithmetic than the plain graph's, not the plain graph under another name
    assert not np.array_equal(served.run(None, {"input": x})[0], plain.run(None, {"input": x})[0])


def test_the_cost_model_leaves_small_layers_direct():
    net = network_from_text(MIXED_CFG)
    assert not any(winograd.chosen(l, "auto") for l in net.layers if l.type == "convolutional")
    model = export_model(net, batch=None, winograd="auto")
    assert "ConvTranspose" not in ops(model)
    # the large layers of a 13x13 and a 26x26 map pay; a 3-channel 416x416 one does not
    direct, fast = winograd.predicted_seconds(512, 1024, 13, 13)
    assert fast < 0.8 * direct
    direct, fast = winograd.predicted_seconds(3, 16, 416, 416)
    assert fast > direct


def test_darknet_py_export_still_writes_plain_conv(tmp_path):
    cfg = tmp_path / "mixed.cfg"
    cfg.write_text(MIXED_CFG)
    net = darknet_py.load_network(str(cfg), seed=3)
    unit_rolling_variance(net)
    weights = tmp_path / "mixed.weights"
    net.save_weights(str(weights))
    out = tmp_path / "mixed.onnx"
    r = run_in_process(["export", cfg, weights, out])
    assert r.code == 0, r
    model = onnx.load(str(out))
    assert not {"ConvTranspose", "Transpose"} & set(ops(model))
    convs = [l for l in net.layers if l.type == "convolutional"]
    assert conv_kernels(model) == [(l.size, l.size) for l in convs]
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    conv_weights = [shapes[n.input[1]] for n in model.graph.node if n.op_type == "Conv"]
    assert conv_weights == [(l.out_c, l.c // l.groups, l.size, l.size) for l in convs]


def test_the_engine_falls_back_to_plain_conv_when_winograd_misses_the_check(tmp_path, monkeypatch):
    monkeypatch.setenv("DARKNET_ONNX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(engine_module, "ENGINE_GRAPH_FORMS", ("all", None))
    wrong = winograd.output_matrix() * 1.01  # a broken transform: 1% off everywhere
    monkeypatch.setattr(winograd, "output_matrix", lambda: wrong)
    cfg = tmp_path / "mixed.cfg"
    cfg.write_text(MIXED_CFG)
    net = darknet_py.load_network(str(cfg), seed=3)
    unit_rolling_variance(net)
    weights = tmp_path / "mixed.weights"
    net.save_weights(str(weights))
    served = darknet_py.load_network(str(cfg), str(weights), device="cpu")
    reference = darknet_py.load_network(str(cfg), str(weights), device="cpu", engine="numpy")
    x = np.random.default_rng(2).random((1,) + served.input_shape, dtype=np.float32)
    assert relative_difference(served.predict(x), reference.predict(x)) < CHECK_TOLERANCE
    assert served.engine == "onnxruntime"
    (entry,) = (tmp_path / "cache").glob("*.onnx")
    assert "ConvTranspose" not in ops(onnx.load(str(entry)))
    # the Winograd graph's bytes, written while it was checked, were dropped with it
    assert not [p.name for p in (tmp_path / "cache").rglob(".tmp-*")]


def test_the_cache_key_follows_the_winograd_source(monkeypatch):
    before = cache_module._exporter_digest()
    real = Path.read_bytes

    def edited(path):
        data = real(path)
        return data + b"\n# edited\n" if path.name == "winograd.py" else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    assert cache_module._exporter_digest() != before


@pytest.mark.skipif(not TINY_WEIGHTS.is_file(), reason=f"no real weights at {TINY_WEIGHTS}")
def test_real_yolov3_tiny_engine_graph_agrees_with_numpy():
    net = darknet_py.load_network(TINY_CFG, TINY_WEIGHTS, batch=1, device="cpu", engine="numpy")
    chosen = [l.index for l in net.layers if winograd.chosen(l, "auto")]
    assert chosen == [12, 21]  # 512->1024 at 13x13 and 384->256 at 26x26
    model = export_model(net, batch=None, winograd="auto")
    assert ops(model).count("ConvTranspose") == 2
    sess = session(model.SerializeToString())
    c, h, w = net.input_shape
    worst = 0.0
    for path in PHOTOS:
        x = darknet_py.letterbox(darknet_py.load_image(str(path)), w, h)[None]
        worst = max(worst, *compare(net, sess, x).values())
    assert worst < REAL_WEIGHTS_TOLERANCE
