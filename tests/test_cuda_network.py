"""Whole networks on the CUDA backend against the NumPy backend and the C Darknet fixtures.

Run with `make gpu-test` on a machine with a GPU and PyCUDA; skipped elsewhere.
"""

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import adopt_forward_state, assert_same_update, param_arrays, random_batch_norm

import darknet_py as dn
from darknet_py.backends import cuda_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs PyCUDA and a CUDA GPU"),
]

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FIXTURES = SHARED / "fixtures"
needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(), reason=f"Darknet fixtures not found at {FIXTURES}"
)


def rel_err(a, ref):
    return float(np.max(np.abs(a - ref)) / max(np.max(np.abs(ref)), 1e-12))


def fixture(name):
    d = FIXTURES / name
    return d / f"{name}.cfg", d / f"{name}.weights", np.load(d / f"{name}.npz")


@needs_fixtures
@pytest.mark.parametrize("name", ["p1_classifier", "p2_tinyyolo"])
def test_forward_matches_darknet_and_numpy(name):
    cfg, weights, ref = fixture(name)
    gpu = dn.load_network(cfg, weights, device="cuda")
    cpu = dn.load_network(cfg, weights, device="cpu", engine="numpy")
    gpu.predict(ref["input"])
    cpu.predict(ref["input"])
    for i in ref["stored_layers"]:
        out = gpu.layer_output(int(i))
        assert rel_err(out, ref[f"layer_{i}"]) < 1e-4, f"layer {i} vs Darknet"
        assert rel_err(out, cpu.layer_output(int(i))) < 1e-5, f"layer {i} vs NumPy"


@needs_fixtures
def test_training_step_matches_darknet():
    cfg, weights, ref = fixture("p3_train_classifier")
    net = dn.load_network(cfg, weights, batch=4, device="cuda")
    loss = net.train_pass(ref["input"], ref["truth"])
    assert loss == pytest.approx(float(ref["loss"]), rel=1e-4)
    assert net.seen == int(ref["seen_after"]) and net.iteration == 1
    assert net.last_rate == pytest.approx(float(ref["rate"]))
    for i in range(len(net.layers)):
        assert rel_err(net.layer_output(i), ref[f"train_layer_{i}"]) < 1e-4, f"layer {i}"
    assert rel_err(net.layer_delta(5), ref["delta_5"]) < 1e-4
    updated = np.concatenate(param_arrays(net))
    change = np.max(np.abs(ref["updated_weights_flat"] - ref["initial_weights_flat"]))
    assert np.max(np.abs(updated - ref["updated_weights_flat"])) < 1e-4 * change


TRAIN_CFG = """[net]
batch=8
subdivisions=2
width=24
height=24
channels=3
learning_rate=0.05
momentum=0.9
decay=0.0005
policy=steps
steps=60
scales=.1
burn_in=10
max_batches=100

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[route]
layers=-1,-2

[convolutional]
filters=5
size=1
stride=1
pad=1
activation=linear

[avgpool]

[softmax]
"""


def run_training(device, steps=100):
    """A deterministic 100-iteration run on fixed synthetic data (5 classes told apart
    by which colour channel is brightest), returning the loss of every iteration."""
    rng = np.random.default_rng(7)
    net = dn.Network(
        dn.cfg.parse_cfg_text(TRAIN_CFG, "train.cfg"),
        "train.cfg",
        backend=dn.backends.get_backend(device),
        seed=3,
    )
    losses = []
    for _ in range(steps * net.subdivisions):
        labels = rng.integers(0, 5, net.batch)
        x = rng.random((net.batch, 3, 24, 24), dtype=np.float32) * 0.5
        for k, label in enumerate(labels):
            x[k, label % 3] += 0.4 * (1 + label // 3)
        truth = np.eye(5, dtype=np.float32)[labels]
        losses.append(net.train_pass(x, truth) / net.batch)
    per_iteration = np.asarray(losses).reshape(steps, net.subdivisions).mean(axis=1)
    return per_iteration


def test_100_iteration_loss_curve_matches_cpu():
    cpu = run_training("cpu")
    gpu = run_training("cuda")
    # Same data, same initial weights: the curves agree to float32 rounding, which grows
    # slowly over 100 updates. Tolerance: 1e-3 relative at every iteration.
    assert np.all(np.abs(gpu - cpu) <= 1e-3 * np.abs(cpu) + 1e-5), np.abs(gpu - cpu).max()
    assert cpu[-10:].mean() < 0.5 * cpu[:10].mean()  # it did learn


@needs_fixtures
def test_detect_on_gpu_equals_cpu():
    cfg, weights, _ = fixture("p2_tinyyolo")
    image = SHARED / "images" / "dog.jpg"
    gpu = dn.load_network(cfg, weights, device="cuda").detect(str(image), thresh=0.3)
    cpu = dn.load_network(cfg, weights, device="cpu", engine="numpy").detect(str(image), thresh=0.3)
    assert len(gpu) == len(cpu)
    for g, c in zip(gpu, cpu):
        assert g.class_id == c.class_id
        assert g.prob == pytest.approx(c.prob, rel=1e-4)
        np.testing.assert_allclose(g.box, c.box, rtol=1e-4, atol=1e-6)


# Real cfgs covering every layer type: shortcut (resnet18), reorg + region (yolov2),
# local + detection (yolov1), crop (strided), dropout + connected (alexnet, cifar),
# upsample + route + yolo (yolov3-tiny), softmax everywhere.
STOCK_CFGS = ["yolov3-tiny", "yolov2", "yolov1", "resnet18", "strided", "alexnet", "cifar"]


@pytest.mark.parametrize("name", STOCK_CFGS)
def test_stock_cfg_forward_matches_numpy(tmp_path, name):
    cfg = SHARED / "darknet-cfg" / f"{name}.cfg"
    if not cfg.exists():
        pytest.skip(f"{cfg} not found")
    cpu = dn.load_network(cfg, batch=1, device="cpu", seed=5)
    # Fresh networks have zero rolling variance (as in Darknet), which inference divides by:
    # give batch norm plausible statistics so every layer carries real values.
    random_batch_norm(cpu, np.random.default_rng(1), scales=True)
    weights = tmp_path / f"{name}-random.weights"
    cpu.save_weights(weights)
    gpu = dn.load_network(cfg, weights, batch=1, device="cuda")
    x = np.random.default_rng(0).random((1,) + cpu.input_shape, dtype=np.float32)
    gpu.predict(x)
    cpu.predict(x)
    for i, layer in enumerate(cpu.layers):
        out = cpu.layer_output(i)
        assert np.all(np.isfinite(out)), f"layer {i} not finite on the CPU"
        assert rel_err(gpu.layer_output(i), out) < 1e-4, f"layer {i} {layer.type}"


# (cfg, input size to shrink to or None): each loss and most layers train on both backends.
TRAIN_CFGS = [
    ("yolov3-tiny", 160),
    ("yolov2-tiny", 160),
    ("yolov1-tiny", None),
    ("resnet18", 64),
    ("cifar", None),
]


@pytest.mark.parametrize("name,size", TRAIN_CFGS)
def test_stock_cfg_training_step_matches_numpy(name, size):
    cfg = SHARED / "darknet-cfg" / f"{name}.cfg"
    if not cfg.exists():
        pytest.skip(f"{cfg} not found")
    rng = np.random.default_rng(3)
    nets = []
    for device in ("cpu", "cuda"):
        net = dn.load_network(cfg, batch=2, device=device, seed=11)
        if size:
            net.resize(size, size)
        for layer in net.layers:
            layer.verbose = False
        nets.append(net)
    cpu, gpu = nets
    x = rng.random((2,) + cpu.input_shape, dtype=np.float32)
    last = cpu.layers[-1]
    if last.type in ("yolo", "region", "detection"):
        truth = np.zeros((2, 90 * 5), dtype=np.float32)
        truth[:, :10] = [0.4, 0.5, 0.3, 0.4, 1, 0.7, 0.3, 0.2, 0.2, 2]
    else:
        truth = np.eye(last.outputs, dtype=np.float32)[rng.integers(0, last.outputs, 2)]
    before = param_arrays(cpu)
    # The CPU's backward starts from the GPU's forward state (helpers.adopt_forward_state):
    # the forwards are compared by the losses here and layer by layer in the tests above.
    cpu_backward = cpu.backward

    def backward_from_the_gpus_activations():
        adopt_forward_state(cpu, gpu)
        cpu_backward()

    cpu.backward = backward_from_the_gpus_activations
    passes = max(1, cpu.subdivisions)  # make sure an update happened on both
    for _ in range(passes):
        losses = [gpu.train_pass(x, truth), cpu.train_pass(x, truth)][::-1]
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)
    assert_same_update(before, cpu, gpu)


def test_out_of_memory_says_what_the_network_needs():
    cfg = SHARED / "darknet-cfg" / "yolov3.cfg"
    if not cfg.exists():
        pytest.skip(f"{cfg} not found")
    # Layer 0 alone at batch 2000 is 94 GB, more than the device has.
    with pytest.raises(dn.network.NetworkError) as info:
        dn.load_network(cfg, batch=2000, device="cuda")
    msg = str(info.value)
    assert "out of GPU memory" in msg and "MiB at batch 2000" in msg and "subdivisions" in msg


@needs_fixtures
def test_cli_detect_gpu_prints_what_the_cpu_prints(tmp_path):
    from click.testing import CliRunner

    from darknet_py.cli import cli

    cfg, weights, _ = fixture("p2_tinyyolo")
    image = SHARED / "images" / "dog.jpg"
    outputs = {}
    for device in ("--gpu=0", "--device=cpu"):
        result = CliRunner().invoke(
            cli,
            [
                "detect",
                str(cfg),
                str(weights),
                str(image),
                "--thresh",
                "0.3",
                device,
                "--out",
                str(tmp_path / f"{device[2:5]}.png"),
            ],
        )
        assert result.exit_code == 0, result.output
        # "name: P%  left=L top=T width=W height=H" lines, as numbers
        outputs[device] = [
            [int(v) for v in re.findall(r"-?\d+", line)]
            for line in result.output.splitlines()
            if "left=" in line
        ]
    gpu, cpu = outputs["--gpu=0"], outputs["--device=cpu"]
    assert gpu and len(gpu) == len(cpu)
    # equal up to rounding of values that differ by float32 noise (one unit at most)
    assert np.abs(np.array(gpu) - np.array(cpu)).max() <= 1
