"""One training step of the AlexeyAB fork (59596d78) on a slim yolov4-tiny: the shared fixture
../shared/fixtures-ab/a5_train_yolov4tiny, which the fork's CPU build made through its own API
(harness/abharness.c: parse_network_cfg, load_weights, one train_network, save_weights),
against darknet="alexeyab-cpu"; and its GPU-build twin (fork_train_gpu/a5_train_yolov4tiny.npz,
tests/fork_harness/make_gpu_fixtures.sh FORK_SRC BUILD_DIR a5_train_yolov4tiny) against the
default flavour.

Left to run freely, darknet-py's forward, loss and [yolo] deltas agree with the fork's (1.2e-5
of each layer's largest value), but its update does not (5e-3 in the weights), from
convolution 18 down. No rule differs: maxpool 25 meets a near-tie. In image 0, channel 21,
rows 2-3, columns 4-5 of route 24 (convolution 18's output there), the fork's two largest
values are 0.28815091 and 0.28814930, 1.6e-6 apart, less than the rounding differences of
two forwards that sum in other orders; darknet-py's largest is the other cell, and the max
pool's gradient (0.235) goes there. Convolution 18's scale gradient barely moves (the two
cells hold the same value), its weight gradient and the delta it passes down do.

So the update is checked with each layer run on the fork's inputs: after a layer's forward
its output is replaced by the fork's, and the max pools choose the fork's cells."""

from pathlib import Path

import numpy as np
import pytest

from darknet_py.backends import cuda_available
from darknet_py.network import load_network

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures-ab"
NAME = "a5_train_yolov4tiny"
CASE = SHARED / NAME
GPU_TWIN = Path(__file__).resolve().parent / "fixtures" / "fork_train_gpu" / f"{NAME}.npz"
LOSS_RTOL, WEIGHTS_ATOL = 1e-4, 1e-5  # the fixture README's tolerances
# The GPU-build twin (made on an H200, cuDNN 9 from the machine's PyTorch): the fork lets
# cuDNN pick each convolution's algorithm. With the max pools' inputs pinned, routes 16 and
# 24 and the heads' outputs are 4e-4 to 6e-4 (of the layer's largest value) off darknet-py's
# fp32 im2col GEMMs, route 8 (convolutions of 3 to 8 input channels) only 7e-7
# (test_fork_train.py's 1e-4 holds for its smaller nets); over the backward that makes
# 1.6e-3 in convolution 0's weights.
GPU_TWIN_OUTPUTS, GPU_TWIN_PARAMS = 2e-3, 5e-3


def rel_err(got, want):
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    return float(np.abs(got - want).max() / max(1e-6, float(np.abs(want).max())))


@pytest.fixture(scope="module")
def ref():
    if not CASE.is_dir():
        pytest.skip(f"{CASE} is absent (the shared fork fixtures)")
    return np.load(CASE / f"{NAME}.npz")


def pin_outputs(net, outputs, seen):
    """Make each layer i in `outputs` hand on outputs[i] (the fork's) instead of its own:
    its output is overwritten right after its forward; seen[i] gets what it computed."""
    for i, want in outputs.items():
        layer = net.layers[i]

        def forward(net_, layer=layer, run=layer.forward, i=i, want=want):
            run(net_)
            seen[i] = net.be.to_host(layer.output)
            net.be.write(layer.output, want)

        layer.forward = forward


def train_step(ref, device="cpu", darknet="alexeyab-cpu", pinned=None):
    """One train_iteration of the fixture's network on its input and truth: (net, loss, what
    each pinned layer computed). pinned: {layer: the fork's output}."""
    net = load_network(
        CASE / f"{NAME}.cfg",
        CASE / f"{NAME}.weights",
        device=device,
        darknet=darknet,
        engine="numpy",
    )
    net.graphs.enabled = False  # the pinning writes between layers: eager steps only
    seen = {}
    pin_outputs(net, pinned or {}, seen)
    loss = net.train_iteration(ref["input"], ref["truth"])
    return net, loss, seen


@pytest.fixture(scope="module")
def twin(ref):
    if not GPU_TWIN.exists():
        pytest.skip(
            f"no GPU-build twin {GPU_TWIN.name} (tests/fork_harness/make_gpu_fixtures.sh "
            f"FORK_SRC BUILD_DIR {NAME}, on a GPU machine)"
        )
    return np.load(GPU_TWIN)


def fork_outputs(ref):
    return {int(i): ref[f"train_layer_{i}"] for i in ref["stored_layers"]}


def updated_fork_network():
    """The fork's updated.weights, read into a network of the fixture's cfg (per layer)."""
    return load_network(
        CASE / f"{NAME}.cfg",
        CASE / f"{NAME}.updated.weights",
        darknet="alexeyab-cpu",
        engine="numpy",
    )


def parameter_errors(net, fork):
    """{(layer, parameter): max |net's - fork's|} over every parameter of every layer."""
    errors = {}
    for layer, fork_layer in zip(net.layers, fork.layers):
        for (name, arr), (fork_name, fork_arr) in zip(layer.params(), fork_layer.params()):
            assert name == fork_name
            got, want = net.be.to_host(arr), fork.be.to_host(fork_arr)
            errors[layer.index, name] = float(np.abs(got - want).max())
    return errors


def test_the_forward_loss_and_yolo_deltas_match_the_fork(ref):
    net, loss, _ = train_step(ref)
    assert loss == pytest.approx(float(ref["loss"]), rel=LOSS_RTOL)
    assert net.last_rate == pytest.approx(float(ref["rate"]), rel=1e-6)
    for i in ref["stored_layers"]:
        assert rel_err(net.layer_output(i), ref[f"train_layer_{i}"]) < 1e-4, i
    for i, cost in zip(ref["cost_layer_indices"], ref["cost_layer_values"]):
        assert net.layers[i].cost == pytest.approx(float(cost), rel=LOSS_RTOL)
        assert rel_err(net.layer_delta(i), ref[f"delta_{i}"]) < 1e-4, i


def test_each_layer_on_the_forks_inputs_gives_its_output(ref):
    _, loss, seen = train_step(ref, pinned=fork_outputs(ref))
    assert sorted(seen) == list(range(38))
    for i, got in seen.items():
        # convolutions: float sums in another order; routes, pools, upsample: exact
        limit = 1e-5 if ref["layer_types"][i] in ("convolutional", "yolo") else 0.0
        assert rel_err(got, ref[f"train_layer_{i}"]) <= limit, i
    assert loss == pytest.approx(float(ref["loss"]), rel=LOSS_RTOL)


def test_the_update_on_the_forks_inputs_is_the_forks(ref, tmp_path):
    net, _, _ = train_step(ref, pinned=fork_outputs(ref))
    errors = parameter_errors(net, updated_fork_network())
    assert len(errors) == 21 * 5 - 2 * 3  # 21 convolutions, two without batch norm
    worst = max(errors, key=errors.get)
    assert errors[worst] < WEIGHTS_ATOL, (worst, errors[worst])
    # The file as the fork writes it: header 0.2.5, seen = 1 iteration x 2 images.
    net.save_weights(tmp_path / "step.weights")
    ours = (tmp_path / "step.weights").read_bytes()
    fork = (CASE / f"{NAME}.updated.weights").read_bytes()
    assert ours[:20] == fork[:20]
    np.testing.assert_allclose(
        np.frombuffer(ours[20:], "<f4"), np.frombuffer(fork[20:], "<f4"), rtol=0, atol=WEIGHTS_ATOL
    )


def test_the_free_run_updates_the_layers_above_the_near_tie_as_the_fork(ref):
    """Without pinning: the near-tie's gradient reaches convolution 18 only (route 24 hands
    channel 21 to it), so everything above it (both heads, the upsample, the routes into
    convolutions 20, 21 and 23, whose backward clears their input's delta) is the fork's."""
    net, _, _ = train_step(ref)
    errors = parameter_errors(net, updated_fork_network())
    above = {key: e for key, e in errors.items() if key[0] > 18}
    assert len(above) == 10 * 5 - 2 * 3  # 10 convolutions, two without batch norm
    worst = max(above, key=above.get)
    assert above[worst] < WEIGHTS_ATOL, (worst, above[worst])


def test_the_default_flavour_trains_the_betas_the_cpu_build_leaves(ref):
    net, loss, _ = train_step(ref, darknet=None, pinned=fork_outputs(ref))
    assert loss == pytest.approx(float(ref["loss"]), rel=LOSS_RTOL)  # the same forward
    errors = parameter_errors(net, updated_fork_network())
    betas = [
        e for (i, name), e in errors.items() if name == "biases" and net.layers[i].batch_normalize
    ]
    assert len(betas) == 19 and min(betas) > 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs PyCUDA and a CUDA GPU")
def test_the_cuda_step_on_the_forks_inputs_is_the_forks(ref):
    net, loss, seen = train_step(ref, device="cuda", pinned=fork_outputs(ref))
    assert loss == pytest.approx(float(ref["loss"]), rel=LOSS_RTOL)
    for i, got in seen.items():
        assert rel_err(got, ref[f"train_layer_{i}"]) < 1e-5, i
    errors = parameter_errors(net, updated_fork_network())
    worst = max(errors, key=errors.get)
    assert errors[worst] < WEIGHTS_ATOL, (worst, errors[worst])


def gpu_build_errors(ref, twin, device, darknet):
    """A step with the outputs the GPU build's harness dumps (those of the layers without
    batch norm, the max pools' inputs among them) pinned: (loss, what the pinned layers
    computed, every parameter's error relative to max(1, its largest value), the [yolo]
    layers' (cost, relative delta error))."""
    pinned = {i: twin[f"layer_{i}_output"] for i in range(38) if f"layer_{i}_output" in twin.files}
    assert {8, 16, 24} <= set(pinned)  # what the max pools read
    net, loss, seen = train_step(ref, device=device, darknet=darknet, pinned=pinned)
    assert net.last_rate == pytest.approx(float(twin["rates"][0]), rel=1e-6)
    outputs = {i: rel_err(got, pinned[i]) for i, got in seen.items()}
    params, yolo = {}, {}
    for layer in net.layers:
        for name, arr in layer.params():
            want = twin[f"layer_{layer.index}_{name}"]
            params[layer.index, name] = float(
                np.abs(net.be.to_host(arr) - want).max() / max(1.0, np.abs(want).max())
            )
        if layer.cost is not None:
            yolo[layer.index] = (
                layer.cost,
                rel_err(net.layer_delta(layer.index), twin[f"layer_{layer.index}_delta"]),
            )
    return loss, outputs, params, yolo


def check_step_against_the_gpu_build(ref, twin, device):
    loss, outputs, params, yolo = gpu_build_errors(ref, twin, device, None)
    assert loss == pytest.approx(float(twin["losses"][0]), rel=LOSS_RTOL)
    assert len(outputs) == 10 and max(outputs.values()) < GPU_TWIN_OUTPUTS, outputs
    assert len(params) == 99
    worst = max(params, key=params.get)
    assert params[worst] < GPU_TWIN_PARAMS, (worst, params[worst])
    assert sorted(yolo) == [30, 37]
    for i, (cost, delta_error) in yolo.items():
        assert cost == pytest.approx(float(twin[f"layer_{i}_cost"][0]), rel=LOSS_RTOL)
        assert delta_error < GPU_TWIN_OUTPUTS, i


def test_the_default_flavour_steps_as_the_forks_gpu_build(ref, twin):
    check_step_against_the_gpu_build(ref, twin, "cpu")


def test_the_cpu_flavour_is_far_from_the_gpu_build_twin(ref, twin):
    """The twin's tolerances still tell the two builds apart (BN betas, rolling statistics:
    0.3 here)."""
    _, _, params, _ = gpu_build_errors(ref, twin, "cpu", "alexeyab-cpu")
    assert max(params.values()) > 30 * GPU_TWIN_PARAMS


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs PyCUDA and a CUDA GPU")
def test_the_default_flavour_steps_as_the_forks_gpu_build_on_cuda(ref, twin):
    check_step_against_the_gpu_build(ref, twin, "cuda")
