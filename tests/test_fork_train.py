"""The AlexeyAB fork's training step against its own C code (CPU build, 59596d78, so the
flavour "alexeyab-cpu"): the
fixtures in tests/fixtures/fork_train were dumped by tests/fork_harness (a harness linked
against the fork's objects, see make_fixtures.py for the cases). Each runs a few iterations
of train_network from the fork's own random start and compares the losses, the learning
rates, every parameter after the last update, and the outputs and deltas of the [yolo]
layers (and of small layers) of the last pass. The gpu test runs the same on CUDA."""

from pathlib import Path

import numpy as np
import pytest

from darknet_py.backends import cuda_available
from darknet_py.network import load_network

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "fork_train"


def own_cases(folder):
    """The fixtures of the harness's own cases in `folder`; a shared case's (shared_case:
    its cfg, weights, input and truth are in ../shared) is test_fork_train_a5.py's."""
    return sorted(p.stem for p in folder.glob("*.npz") if "shared_case" not in np.load(p).files)


CASES = own_cases(FIXTURES)
# The same steps from the fork's GPU build (GPU=1 CUDNN=1, fork_harness/make_gpu_fixtures.sh),
# which the default flavour "alexeyab" follows. cuDNN sums in its own order: not to 1e-5.
GPU_FIXTURES = FIXTURES.parent / "fork_train_gpu"
GPU_CASES = own_cases(GPU_FIXTURES)
GPU_BUILD_TOLERANCE = 1e-4


def rel_err(got, want):
    return float(np.abs(got - want).max() / max(1e-6, float(np.abs(want).max())))


def train_like_the_fixture(name, tmp_path, device, fixtures=FIXTURES, darknet="alexeyab-cpu"):
    ref = np.load(fixtures / f"{name}.npz")
    (tmp_path / "net.cfg").write_text(str(ref["cfg"]))
    (tmp_path / "init.weights").write_bytes(ref["init_weights"].tobytes())
    net = load_network(
        tmp_path / "net.cfg",
        tmp_path / "init.weights",
        device=device,
        darknet=darknet,
        engine="numpy",
    )
    x = (ref["pixels"].astype(np.float32) / np.float32(255)).astype(np.float32)
    losses, rates = [], []
    for _ in range(int(ref["iterations"])):
        losses.append(net.train_iteration(x, ref["truth"]))
        rates.append(net.last_rate)
    return net, ref, losses, rates


def check_against_fork(net, ref, losses, rates, tolerance=1e-5):
    np.testing.assert_allclose(losses, ref["losses"], rtol=tolerance)
    np.testing.assert_allclose(rates, ref["rates"], rtol=1e-6)
    checked = 0
    for i, layer in enumerate(net.layers):
        for name, arr in layer.params():
            key = f"layer_{i}_{name}"
            if key in ref.files:
                got = net.be.to_host(arr).reshape(-1)
                error = np.abs(got - ref[key]).max()
                assert error < tolerance * max(1.0, np.abs(ref[key]).max()), (key, error)
                checked += 1
        for kind, get in (("output", net.layer_output), ("delta", net.layer_delta)):
            key = f"layer_{i}_{kind}"
            if key in ref.files:
                assert rel_err(get(i).reshape(-1), ref[key]) < 10 * tolerance, key
                checked += 1
        if f"layer_{i}_cost" in ref.files:
            assert layer.cost == pytest.approx(float(ref[f"layer_{i}_cost"][0]), rel=tolerance)
    assert checked > 10


@pytest.mark.parametrize("name", CASES)
def test_training_iterations_match_the_fork(name, tmp_path):
    check_against_fork(*train_like_the_fixture(name, tmp_path, "cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs PyCUDA and a CUDA GPU")
@pytest.mark.parametrize("name", CASES)
def test_training_iterations_match_the_fork_on_cuda(name, tmp_path):
    check_against_fork(*train_like_the_fixture(name, tmp_path, "cuda"))


@pytest.mark.skipif(not GPU_CASES, reason="no GPU-build fixtures")
@pytest.mark.parametrize("name", GPU_CASES)
def test_the_default_flavour_trains_as_the_forks_gpu_build(name, tmp_path):
    check_against_fork(
        *train_like_the_fixture(name, tmp_path, "cpu", GPU_FIXTURES, None),
        tolerance=GPU_BUILD_TOLERANCE,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs PyCUDA and a CUDA GPU")
@pytest.mark.parametrize("name", GPU_CASES)
def test_the_default_flavour_trains_as_the_forks_gpu_build_on_cuda(name, tmp_path):
    check_against_fork(
        *train_like_the_fixture(name, tmp_path, "cuda", GPU_FIXTURES, None),
        tolerance=GPU_BUILD_TOLERANCE,
    )


def test_fixtures_cover_the_fork_training_options():
    cfgs = "\n".join(str(np.load(FIXTURES / f"{name}.npz")["cfg"]) for name in CASES)
    for option in (
        "iou_loss=mse",
        "iou_loss=iou",
        "iou_loss=giou",
        "iou_loss=diou",
        "iou_loss=ciou",
        "iou_normalizer",
        "cls_normalizer",
        "obj_normalizer",
        "delta_normalizer",
        "max_delta",
        "scale_x_y",
        "new_coords=1",
        "label_smooth_eps",
        "objectness_smooth",
        "iou_thresh",
        "loss_scale",
        "policy=sgdr",
        "power=",
        "burn_in",
        "subdivisions=2",
        "mosaic=0",
    ):
        assert option in cfgs, option
    assert all((FIXTURES / f"{name}.npz").stat().st_size < 1 << 20 for name in CASES)
