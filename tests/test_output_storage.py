"""Layer outputs kept at 16 bits under fp16/bf16 (output_storage.py, bench/NOTES.md M4): which
outputs the plan keeps so, that the arrays are made so, and that training with them gives
what training with fp32 outputs gives: bit for bit where only convolutions (which round
their input to the precision anyway), routes, maxpools and upsamples read them; within the
rounding of a [shortcut]'s sum where one adds."""

import numpy as np
import pytest
from test_delta_plan import FORK, GENERIC, NET, conv, data, head, stock
from test_output_plan import CSP

from darknet_py import precision as precisions
from darknet_py.backends import get_backend
from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network
from darknet_py.output_storage import plan_output_storage

HALF = ("fp16", "bf16")


@pytest.fixture(autouse=True)
def _no_precision_from_the_environment(monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)


def at(text, precision):
    """A cfg text whose [net] asks for `precision`."""
    return text.replace("[net]\n", f"[net]\nprecision={precision}\n", 1)


def kept_half(net, precision, train=True, fold=True):
    storage = plan_output_storage(net.layers, net.output_index, precision, train, fold)
    return sorted(i for i, s in enumerate(storage) if s == precision)


@pytest.mark.parametrize("precision", HALF)
def test_csp_excerpt_keeps_all_but_the_heads_input_at_16_bits(precision):
    net = Network(parse_cfg_text(at(CSP, precision)), batch=1, allocate=False)
    # 15 (leaky) feeds the head's convolution, which runs at fp32 (precision.HEAD_TYPES);
    # 16 feeds [yolo] and is the output. Routes 3 and 12 view 1 and 10.
    assert kept_half(net, precision) == list(range(15))
    assert kept_half(net, precision, train=False) == list(range(15))
    # Unfolded inference has no x to make a 16-bit output from: every output fp32.
    assert kept_half(net, precision, train=False, fold=False) == []
    other = "bf16" if precision == "fp16" else "fp16"
    assert kept_half(net, other) == []  # the layers run at `precision`
    for name in ("fp32", "tf32"):
        assert plan_output_storage(net.layers, net.output_index, name, True) == ["fp32"] * len(
            net.layers
        )


def test_a_reader_that_takes_no_16_bit_input_keeps_its_inputs_fp32():
    # GENERIC: dropout reads the shortcut; a shortcut with an activation keeps its output
    # fp32, so its inputs stay fp32 too (it adds them in one op).
    net = Network(parse_cfg_text(at(GENERIC, "fp16")), batch=1, allocate=False)
    types = [l.type for l in net.layers]
    half = kept_half(net, "fp16")
    dropout = types.index("dropout")
    assert dropout - 1 not in half and dropout not in half  # the shortcut dropout reads
    assert 0 in half and types[0] == "convolutional"
    leaky = at(
        CSP.replace(
            "[shortcut]\nfrom=-2\nactivation=linear\n", "[shortcut]\nfrom=-2\nactivation=leaky\n"
        ),
        "fp16",
    )
    net = Network(parse_cfg_text(leaky), batch=1, allocate=False)
    half = kept_half(net, "fp16")
    assert 7 not in half and 5 not in half and 6 not in half and 4 in half


def test_fork_layers_outside_the_list_keep_fp32():
    # [sam], [avgpool], [scale_channels] read their inputs as fp32: those inputs stay fp32.
    net = Network(parse_cfg_text(at(FORK, "bf16")), batch=1, allocate=False, darknet="alexeyab")
    half = kept_half(net, "bf16")
    for layer in net.layers:
        if layer.type in ("sam", "avgpool", "scale_channels"):
            assert layer.index not in half
            assert layer.index - 1 not in half


@pytest.mark.parametrize(
    "name,share", [("yolov4.cfg", 0.95), ("yolov4-tiny.cfg", 0.9), ("yolov3-tiny.cfg", 0.9)]
)
def test_stock_detectors_keep_most_of_their_output_floats_at_16_bits(tmp_path, name, share):
    net = stock(tmp_path, name)
    precisions.assign(net.layers, "fp16")  # as a network built at fp16 assigns
    half = set(kept_half(net, "fp16"))
    floats = sum(l.outputs for l in net.layers)
    kept = sum(net.layers[i].outputs for i in half)
    print(
        f"{name}: {len(half)} of {len(net.layers)} outputs, {kept / floats:.3f} of the "
        f"floats at 16 bits"
    )
    assert kept / floats > share
    for layer in net.layers:
        if layer.type in precisions.HEAD_TYPES:
            assert layer.index not in half and layer.index - 1 not in half


def trained(text, precision, half_outputs, darknet="alexeyab", iterations=2):
    net = Network(
        parse_cfg_text(at(text, precision)), backend=get_backend("cpu"), seed=5, darknet=darknet
    )
    net.share_deltas = net.share_outputs = True
    net.half_outputs = half_outputs
    losses = [net.train_iteration(x, truth) for x, truth in data(net, iterations)]
    return net, losses, [net.be.to_host(a) for l in net.layers for _, a in l.params()]


# yolov3-tiny's and yolov4-tiny's patterns: maxpools, a route with groups, a route of two,
# an upsample. STRIDED: the same with stride-2 convolutions in the maxpools' place.
TINY = (
    NET
    + conv(8)
    + "[maxpool]\nsize=2\nstride=2\n"
    + conv(16)
    + "[route]\nlayers=-1\ngroups=2\ngroup_id=1\n"
    + conv(8)
    + conv(8)
    + "[route]\nlayers=-1,-2\n"
    + conv(16, 1)
    + "[route]\nlayers=-6,-1\n"
    + "[maxpool]\nsize=2\nstride=2\n"
    + conv(16)
    + head(mask="3,4,5")
    + "[route]\nlayers=-3\n"
    + conv(8, 1)
    + "[upsample]\nstride=2\n"
    + "[route]\nlayers=-1,-9\n"
    + conv(16)
    + head()
)
STRIDED = (
    NET
    + conv(8)
    + conv(16, stride=2)
    + "[route]\nlayers=-1\ngroups=2\ngroup_id=1\n"
    + conv(8)
    + conv(8)
    + "[route]\nlayers=-1,-2\n"
    + conv(16, 1)
    + "[route]\nlayers=-6,-1\n"
    + conv(16, stride=2)
    + head(mask="3,4,5")
    + "[route]\nlayers=-3\n"
    + conv(8, 1)
    + "[upsample]\nstride=2\n"
    + "[route]\nlayers=-1,-9\n"
    + conv(16)
    + head()
)


@pytest.mark.parametrize("precision", HALF)
def test_training_with_16_bit_outputs_gives_the_same_weights_without_a_sum_or_a_maximum(precision):
    """Convolutions, routes and upsamples read the 16-bit outputs: what they compute is
    what they computed from fp32 outputs, bit for bit."""
    full, full_losses, full_params = trained(STRIDED, precision, False)
    half, losses, params = trained(STRIDED, precision, True)
    stored = [l.index for l in half.layers if half.be.storage_of(l.output) == precision]
    assert len(stored) >= 10
    assert all(half.be.storage_of(l.output) == "fp32" for l in full.layers)
    for i in stored:  # the values are the precision's
        values = half.layers[i].output
        np.testing.assert_array_equal(values, precisions.round_to(values, precision))
    assert np.all(np.isfinite(losses)) and losses == full_losses
    for i, (a, b) in enumerate(zip(params, full_params)):
        np.testing.assert_array_equal(a, b, err_msg=f"parameter array {i}")


def distance(run, reference, initial):
    """(the largest relative loss difference, the mean over parameter arrays of the largest
    difference of what training added, relative to the reference's largest)."""
    loss = max(abs(a - b) / abs(b) for a, b in zip(run[1], reference[1]))
    updates = [
        float(np.max(np.abs((a - s) - (b - s))) / max(np.max(np.abs(b - s)), 1e-30))
        for a, b, s in zip(run[2], reference[2], initial)
    ]
    return loss, float(np.mean(updates))


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("text", [CSP, TINY], ids=["csp", "tiny"])
def test_16_bit_sums_and_maximums_move_training_no_further_from_fp32(text, precision):
    """A [shortcut] rounds its sum once more, and a [maxpool] of rounded values can meet
    ties the fp32 values did not have (its gradient then goes to the first). Measured
    against an fp32 run (2 iterations, NumPy), the 16-bit outputs are as close as fp32
    outputs at the same precision: CSP fp16 loss 3.6e-3 against 1.6e-2, mean update
    distance 0.347 against 0.347; bf16 2.7e-3 / 3.6e-2, 0.137 / 0.142; TINY fp16 8.9e-3 /
    8.9e-3, 0.055 / 0.055; bf16 2.2e-2 / 2.3e-2, 0.129 / 0.127."""
    reference = trained(text, "fp32", False)
    start = Network(parse_cfg_text(text), backend=get_backend("cpu"), seed=5, darknet="alexeyab")
    initial = [start.be.to_host(a) for l in start.layers for _, a in l.params()]
    full = trained(text, precision, False)
    half = trained(text, precision, True)
    adders = [l for l in half[0].layers if l.type in ("shortcut", "maxpool")]
    assert adders and all(half[0].be.storage_of(l.output) == precision for l in adders)
    (loss, update), (full_loss, full_update) = (
        distance(half, reference, initial),
        distance(full, reference, initial),
    )
    print(
        f"{precision}: 16-bit outputs loss {loss:.2e} update {update:.3f}; "
        f"fp32 outputs {full_loss:.2e} {full_update:.3f}"
    )
    assert loss < 1.5 * full_loss + 1e-3
    assert update < 1.1 * full_update


def test_half_outputs_off_and_fold_switches_reallocate():
    net = Network(parse_cfg_text(at(TINY, "fp16")), backend=get_backend("cpu"), seed=5)
    be = net.be
    assert be.storage_of(net.layers[0].output) == "fp16"
    net.fold_batchnorm = False  # inference-only arrays: the BN outputs become fp32
    assert be.storage_of(net.layers[0].output) == "fp32"
    net.fold_batchnorm = True
    assert be.storage_of(net.layers[0].output) == "fp16"
    net.half_outputs = False
    assert all(be.storage_of(l.output) == "fp32" for l in net.layers)


@pytest.mark.parametrize("fold", [True, False])
def test_inference_with_16_bit_outputs_follows_fp32_outputs(fold):
    x = np.random.default_rng(3).random((2, 3, 32, 32), dtype=np.float32)
    outs = {}
    for half in (False, True):
        net = Network(parse_cfg_text(at(TINY, "fp16")), backend=get_backend("cpu"), seed=5, batch=2)
        for layer in net.layers:  # statistics a trained network could have
            if getattr(layer, "batch_normalize", 0):
                layer.rolling_variance[...] = 0.5
                layer.rolling_mean[...] = 0.1
                layer.params_changed()
        net.half_outputs = half
        net.fold_batchnorm = fold
        outs[half] = net.predict(x).copy()
    # Convolutions round their inputs to fp16 anyway: the same outputs.
    assert np.all(np.isfinite(outs[True]))
    np.testing.assert_array_equal(outs[True], outs[False])


def test_memory_estimate_counts_16_bit_outputs_at_2_bytes():
    net = Network(parse_cfg_text(at(TINY, "fp16")), backend=get_backend("cpu"), seed=5)
    with_half = net.memory_bytes(8, True)
    net.half_outputs = False
    without = net.memory_bytes(8, True)
    half = [net.layers[i] for i in kept_half(net, "fp16")]
    assert without - with_half == 2 * 8 * sum(l.outputs for l in half if not l.views_its_input())
