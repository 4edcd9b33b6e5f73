"""The C Darknets' own numbers for the layers of issue 23: per fixture a tiny network (its cfg
in the npz), the C code's initial weights, an inference forward, and one training step
(every layer's output and delta, the cost, the updated weights). Made by
tests/c_harness/make_fixtures.py from the CPU builds of both Darknets."""

import struct
from pathlib import Path

import numpy as np
import pytest

import darknet_py

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "layers"
TOLERANCE = 1e-4  # relative: max|a - r| / max|r|
NAMES = [
    "activation",
    "logistic",
    "l2norm",
    "lrn",
    "deconv",
    "xnor",
    "activation_ab",
    "lrn_ab",
    "xnor_ab",
]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def rel_error(actual, ref):
    actual = np.asarray(actual, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    assert actual.shape == ref.shape, f"shape {actual.shape} != Darknet's {ref.shape}"
    scale = np.abs(ref).max()
    return float(np.abs(actual - ref).max() / (scale if scale else 1.0))


def load_fixture(name, device, tmp_path):
    if device == "cuda":
        pytest.importorskip("pycuda.driver")
        from darknet_py.backends import cuda_available

        if not cuda_available():
            pytest.skip("no CUDA GPU")
    ref = dict(np.load(FIXTURES / f"{name}.npz"))
    cfg, weights = tmp_path / f"{name}.cfg", tmp_path / f"{name}.weights"
    cfg.write_text(str(ref["cfg"]))
    weights.write_bytes(ref["weights0"].tobytes())
    # the fork's fixtures (_ab) come from its CPU build: the "alexeyab-cpu" rules
    darknet = "alexeyab-cpu" if name.endswith("_ab") else None
    return darknet_py.load_network(
        cfg, weights, device=device, engine="numpy", darknet=darknet
    ), ref


def header_size(raw):
    major, minor = struct.unpack("<ii", raw[:8])
    return 20 if major * 10 + minor >= 2 else 16


def check_layers(net, ref, prefix, what):
    for i in range(len(net.layers)):
        key = f"{prefix}_{i}"
        if key in ref:
            err = rel_error(what(i), ref[key])
            assert err < TOLERANCE, f"{key} ([{net.layers[i].type}]): {err}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_layer_matches_c_darknet(name, device, tmp_path):
    net, ref = load_fixture(name, device, tmp_path)
    x, truth = ref["input"], ref["truth"].reshape(len(ref["input"]), -1)
    net.forward(x, truth)
    check_layers(net, ref, "infer", net.layer_output)

    cost = net.train_pass(x, truth)
    assert rel_error(cost, ref["cost"]) < TOLERANCE
    check_layers(net, ref, "out", net.layer_output)
    check_layers(net, ref, "delta", net.layer_delta)
    assert sum(k.startswith("delta_") for k in ref) == len(net.layers)

    out = tmp_path / "updated.weights"
    net.save_weights(out)
    raw, c_raw = out.read_bytes(), ref["weights1"].tobytes()
    assert len(raw) == len(c_raw)
    floats = np.frombuffer(raw[header_size(raw) :], "<f4")
    updated = np.frombuffer(c_raw[header_size(c_raw) :], "<f4")
    initial = np.frombuffer(ref["weights0"].tobytes()[header_size(c_raw) :], "<f4")
    assert rel_error(floats, updated) < TOLERANCE
    assert rel_error(initial, updated) > 100 * TOLERANCE  # the step moved the weights


@pytest.mark.parametrize("name", NAMES)
def test_weights_load_and_save_byte_identical(name, tmp_path):
    net, ref = load_fixture(name, "cpu", tmp_path)
    out = tmp_path / "again.weights"
    net.save_weights(out)
    assert out.read_bytes() == ref["weights0"].tobytes()
