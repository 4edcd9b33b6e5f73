"""The C Darknet's own numbers (../shared/fixtures, see its README.md): every stored layer
output, the layer types and shapes, and one SGD step (loss, rate, seen, deltas, weights)."""

import struct
from pathlib import Path

import numpy as np
import pytest

import darknet_py

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
TOLERANCE = 1e-4  # relative: max|a - r| / max|r|

pytestmark = pytest.mark.skipif(
    not (FIXTURES / "README.md").is_file(),
    reason=f"Darknet reference fixtures not found at {FIXTURES} (shared/fixtures beside the repo)",
)

# Darknet's get_layer_string has no name for upsample: it prints "none".
DARKNET_TYPE_NAMES = {"upsample": "none"}


def rel_error(actual, ref):
    actual = np.asarray(actual, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert actual.shape == ref.shape, f"shape {actual.shape} != Darknet's {ref.shape}"
    scale = np.abs(ref).max()
    return float(np.abs(actual - ref).max() / (scale if scale else 1.0))


def load(name, cfg_name=None):
    d = FIXTURES / name
    ref = np.load(d / f"{name}.npz")
    net = darknet_py.load_network(
        d / f"{cfg_name or name}.cfg", d / f"{name}.weights", device="cpu", engine="numpy"
    )
    return net, ref


def check_structure(net, ref):
    n = len(ref["layer_types"])
    assert len(net.layers) == n
    for i, layer in enumerate(net.layers):
        assert DARKNET_TYPE_NAMES.get(layer.type, layer.type) == ref["layer_types"][i], i
        assert (layer.out_c, layer.out_h, layer.out_w) == tuple(ref["layer_shapes"][i]), i
        assert layer.outputs == ref["layer_outputs"][i], i


@pytest.mark.parametrize("name", ["p1_classifier", "p2_tinyyolo"])
def test_inference_matches_darknet(name):
    net, ref = load(name)
    check_structure(net, ref)
    assert int(ref["batch"]) == ref["input"].shape[0]
    net.predict(ref["input"])
    errors = {
        int(i): rel_error(net.layer_output(int(i)), ref[f"layer_{int(i)}"])
        for i in ref["stored_layers"]
    }
    assert len(errors) == len(net.layers)
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOLERANCE, f"layer {worst} ({net.layers[worst].type}): {errors}"


def test_p2_yolo_heads_are_image_shaped():
    net, ref = load("p2_tinyyolo")
    heads = [l for l in net.layers if l.type == "yolo"]
    assert [l.index for l in heads] == [16, 23]
    for layer in heads:
        shape = ref[f"layer_{layer.index}"].shape
        assert layer.output_shape(1) == (1, 24, layer.h, layer.w) == shape


def test_p3_one_training_step_matches_darknet(tmp_path):
    net, ref = load("p3_train_classifier")
    check_structure(net, ref)
    assert net.batch == 4
    loss = net.train_pass(ref["input"], ref["truth"])

    assert rel_error(loss, ref["loss"]) < TOLERANCE
    assert rel_error(net.last_rate, ref["rate"]) < TOLERANCE
    assert net.seen == int(ref["seen_after"])
    assert net.iteration == int(ref["current_batch_at_update"])
    for i, cost in zip(ref["cost_layer_indices"], ref["cost_layer_values"]):
        assert rel_error(net.layers[int(i)].cost, cost) < TOLERANCE
    for i in range(len(net.layers)):
        err = rel_error(net.layer_output(i), ref[f"train_layer_{i}"])
        assert err < TOLERANCE, f"training-mode output of layer {i}: {err}"
    assert rel_error(net.layer_delta(5), ref["delta_5"]) < TOLERANCE

    out = tmp_path / "updated.weights"
    net.save_weights(out)
    raw = out.read_bytes()
    assert struct.unpack("<Q", raw[12:20])[0] == int(ref["updated_seen_header"][0])
    floats = np.frombuffer(raw[20:], dtype="<f4")
    assert rel_error(floats, ref["updated_weights_flat"]) < TOLERANCE
    # The step changed the weights: a test of the update, not of the loader.
    assert rel_error(ref["initial_weights_flat"], ref["updated_weights_flat"]) > 100 * TOLERANCE
