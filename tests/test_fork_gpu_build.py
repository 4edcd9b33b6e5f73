"""The fork's two builds as two flavours: "alexeyab" (the default for fork cfgs and weights)
trains as the fork's GPU build (GPU=1 CUDNN=1) does, "alexeyab-cpu" as its CPU build does
(docs/fork-training.md). On float64 networks: the default's backward is the exact gradient
of its training forward (cuDNN's batch norm, deltas added, never overwritten), the CPU
build's is not; loss_scale and delta_normalizer act as in the GPU build."""

import numpy as np
import pytest

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.network import DARKNET_FLAVOURS, Network, NetworkError, build_network

# conv 1 reads conv 0, and so does the route after it: the CPU build's col2im overwrites
# what the route left in conv 0's delta. The grouped route reads half of conv 3 and of conv 0.
BODY = """
[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=logistic

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=logistic

[route]
layers=-1,-2

[convolutional]
batch_normalize=1
filters=4
size=1
stride=1
activation=logistic

[route]
layers=-1,-4
groups=2
group_id=1

[convolutional]
filters=2
size=3
stride=1
pad=1
activation=linear
"""


def build(darknet, body=BODY, net_extra="", batch=2, size=5):
    text = (
        f"[net]\nbatch={batch}\nwidth={size}\nheight={size}\nchannels=2\n"
        f"learning_rate=0.1\nmomentum=0.9\ndecay=0.0005\n{net_extra}\n{body}"
    )
    return Network(
        parse_cfg_text(text), backend=NumpyBackend(dtype=np.float64), seed=3, darknet=darknet
    )


def weighted_output(net, x, d):
    """sum(d * the last layer's output) of a training forward (batch statistics)."""
    net.forward(x, train=True)
    return float((net.layer_output(len(net.layers) - 1).reshape(-1) * d).sum())


def gradients(net, x, d):
    """What backward leaves in the updates when d is the last layer's delta: Darknet's
    delta is minus the loss gradient, so these are d(sum(d * output)) / d(parameter)."""
    for layer in net.layers:
        for name in ("weight_updates", "bias_updates", "scale_updates"):
            if getattr(layer, name, None) is not None:
                getattr(layer, name)[...] = 0
    net.forward(x, train=True)
    net.layers[-1].delta[...] = d
    net.backward()
    return {
        (i, name): getattr(layer, name).copy()
        for i, layer in enumerate(net.layers)
        for name in ("weight_updates", "bias_updates", "scale_updates")
        if getattr(layer, name, None) is not None
    }


def numeric(net, x, d, i, param, k, h=1e-6):
    arr = getattr(net.layers[i], param)
    keep = arr[k]
    arr[k] = keep + h
    up = weighted_output(net, x, d)
    arr[k] = keep - h
    down = weighted_output(net, x, d)
    arr[k] = keep
    return (up - down) / (2 * h)


def setup(darknet):
    net = build(darknet)
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (net.batch,) + net.input_shape).astype(np.float32).astype(float)
    d = rng.uniform(-1, 1, net.batch * net.layers[-1].outputs)
    return net, x, d


PARAMS = {"weights": "weight_updates", "biases": "bias_updates", "scales": "scale_updates"}


@pytest.mark.parametrize("param", ["weights", "scales", "biases"])
def test_the_gpu_build_back_propagates_the_exact_gradient(param):
    net, x, d = setup("alexeyab")
    grads = gradients(net, x, d)
    for i in (0, 1, 3):  # conv 0 gets deltas from conv 1 and from both routes
        got = grads[(i, PARAMS[param])]
        for k in range(0, got.size, max(1, got.size // 7)):
            want = numeric(net, x, d, i, param, k)
            assert got[k] == pytest.approx(want, rel=1e-6, abs=1e-8), (i, param, k)


def test_the_cpu_build_loses_the_route_delta_and_trains_no_beta():
    net, x, d = setup("alexeyab-cpu")
    grads = gradients(net, x, d)
    assert not grads[(0, "bias_updates")].any()  # BN beta gets no gradient
    want = [numeric(net, x, d, 0, "weights", k) for k in range(6)]
    # conv 1's col2im overwrote what the route after it left in conv 0's delta
    assert np.abs(grads[(0, "weight_updates")][:6] - want).max() > 1e-3


def test_the_gpu_build_batch_norm_forward():
    net, x, _ = setup("alexeyab")
    conv = net.layers[0]
    conv.rolling_mean[...] = 0.5
    conv.rolling_variance[...] = 2.0
    net.forward(x, train=True)
    z = conv.x.reshape(net.batch, 4, 5, 5)
    mean, var = z.mean(axis=(0, 2, 3)), z.var(axis=(0, 2, 3))  # biased, as cuDNN
    unbiased = z.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(conv.rolling_mean, 0.99 * 0.5 + 0.01 * mean, rtol=1e-12)
    np.testing.assert_allclose(conv.rolling_variance, 0.99 * 2.0 + 0.01 * unbiased, rtol=1e-12)
    norm = (z - mean.reshape(1, 4, 1, 1)) / np.sqrt(var.reshape(1, 4, 1, 1) + 1e-5)
    want = 1 / (
        1 + np.exp(-(norm * conv.scales.reshape(1, 4, 1, 1) + conv.biases.reshape(1, 4, 1, 1)))
    )
    np.testing.assert_allclose(net.layer_output(0), want, rtol=1e-12)


YOLO_HEAD = """
[yolo]
mask=0,1,2
anchors=2,3, 4,5, 6,7
classes=3
num=3
iou_loss=ciou
{extra}
"""
YOLO_BODY = (
    """
[convolutional]
batch_normalize=1
filters=4
size=3
stride=2
pad=1
activation=leaky

[convolutional]
size=1
stride=1
filters=24
activation=linear
"""
    + YOLO_HEAD
)


def yolo_step(darknet, extra="", net_extra=""):
    net = build(darknet, YOLO_BODY.format(extra=extra), net_extra=net_extra, size=16)
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (2, 2, 16, 16))
    truth = np.zeros((2, 200 * 6))
    truth[:, :5] = [0.4, 0.5, 0.3, 0.4, 1]
    net.train_iteration(x, truth)
    return net


@pytest.mark.parametrize("darknet,factor", [("alexeyab", 0.5), ("alexeyab-cpu", 1.0)])
def test_delta_normalizer_scales_the_gpu_builds_gradient(darknet, factor):
    # momentum keeps the last iteration's updates: weight_updates = 0.9 * (g - decay * w)
    plain = yolo_step(darknet)
    scaled = yolo_step(darknet, "delta_normalizer=0.5")
    for a, b in zip(plain.layers[:2], scaled.layers[:2]):
        np.testing.assert_allclose(b.bias_updates, factor * a.bias_updates, rtol=1e-9)


def test_loss_scale_cancels_in_the_gpu_build():
    plain = yolo_step("alexeyab")
    scaled = yolo_step("alexeyab", net_extra="loss_scale=8")
    for a, b in zip(plain.layers[:2], scaled.layers[:2]):
        # the same step, but for the float32 rounding of rate / loss_scale
        np.testing.assert_allclose(b.weights, a.weights, rtol=1e-6)
        np.testing.assert_allclose(b.biases, a.biases, rtol=1e-6)
        # the gradient (and so the momentum it leaves) is loss_scale times larger
        np.testing.assert_allclose(b.bias_updates, 8 * a.bias_updates, rtol=1e-9)
    assert scaled.fork_loss_scale == 8
    assert yolo_step("alexeyab-cpu", net_extra="loss_scale=8").fork_loss_scale == 1


def test_flavour_names():
    assert DARKNET_FLAVOURS == ("original", "alexeyab", "alexeyab-cpu")
    detected = build(None, YOLO_BODY.format(extra="scale_x_y=1.05"), size=16)
    assert (detected.flavour, detected.darknet, detected.fork_cpu) == (
        "alexeyab",
        "alexeyab",
        False,
    )
    cpu = build("alexeyab-cpu")
    assert (cpu.flavour, cpu.darknet, cpu.fork_cpu) == ("alexeyab-cpu", "alexeyab", True)
    assert all(layer.fork_cpu for layer in cpu.layers)
    assert not any(layer.fork_cpu for layer in build("original").layers)
    with pytest.raises(NetworkError, match="alexeyab-cpu"):
        build("alexeyab-gpu")


def test_cli_accepts_both_fork_flavours(tmp_path):
    from click.testing import CliRunner

    from darknet_py.cli import cli

    cfg = tmp_path / "net.cfg"
    cfg.write_text("[net]\nwidth=8\nheight=8\nchannels=3\n" + YOLO_BODY.format(extra=""))
    for flavour in ("alexeyab", "alexeyab-cpu"):
        result = CliRunner().invoke(cli, ["info", str(cfg), "--darknet", flavour])
        assert result.exit_code == 0, result.output
        assert f"Darknet: {flavour} (chosen with --darknet" in result.output
    assert build_network(cfg, darknet="alexeyab-cpu").fork_cpu


@pytest.mark.gpu
@pytest.mark.parametrize("darknet", ["alexeyab", "alexeyab-cpu"])
def test_cuda_trains_both_fork_builds_as_numpy_does(darknet, tmp_path):
    from darknet_py.backends import cuda_available
    from darknet_py.network import load_network

    if not cuda_available():
        pytest.skip("needs PyCUDA and a CUDA GPU")
    cfg = tmp_path / "net.cfg"
    cfg.write_text(
        "[net]\nbatch=2\nwidth=16\nheight=16\nchannels=2\nlearning_rate=0.1\n"
        "momentum=0.9\ndecay=0.0005\nloss_scale=4\n"
        + BODY.replace("filters=2\nsize=3", "filters=24\nsize=1")
        + YOLO_HEAD.format(extra="delta_normalizer=0.5")
    )
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (2, 2, 16, 16)).astype(np.float32)
    truth = np.zeros((2, 200 * 6), np.float32)
    truth[:, :5] = [0.4, 0.5, 0.3, 0.4, 1]
    nets = [load_network(cfg, device=device, darknet=darknet, seed=4) for device in ("cpu", "cuda")]
    losses = [[net.train_iteration(x, truth) for _ in range(2)] for net in nets]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
    for a, b in zip(*(net.layers for net in nets)):
        for (name, pa), (_, pb) in zip(a.params(), b.params()):
            want, got = nets[0].be.to_host(pa), nets[1].be.to_host(pb)
            assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (a.index, name)
