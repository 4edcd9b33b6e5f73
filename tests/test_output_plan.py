"""Training outputs shared between layers by lifetime (output_plan.py): outputs nothing reads
in the backward (R2), and batch-normalised outputs made again from x before the backward
reads them (R3). The plan never puts two live outputs in one array, and training with it
gives the weights of training without it, bit for bit in fp32 (a backward that read a
shared output it did not make again would read another layer's values)."""

import numpy as np
import pytest
import test_delta_plan as delta_plan_tests
from test_delta_plan import FORK, GENERIC, MISC, MISC_FORK, NET, conv, head, stock

from darknet_py.backends import get_backend
from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network, NetworkError
from darknet_py.output_plan import (
    backward_time,
    plan_outputs,
    readers,
    reads_input_in_backward,
    reads_own_output,
    rebuildable,
)

# yolov4's patterns: CSP blocks of mish layers, a route of one layer, a shortcut, SPP's
# maxpools gathered by a route, and a head.
CSP = (
    NET
    + conv(8, activation="mish")
    + conv(16, stride=2, activation="mish")
    + conv(8, 1, activation="mish")
    + "[route]\nlayers=-2\n"
    + conv(8, 1, activation="mish")
    + conv(8, 1, activation="mish")
    + conv(8, activation="mish")
    + "[shortcut]\nfrom=-2\nactivation=linear\n"
    + conv(8, 1, activation="mish")
    + "[route]\nlayers=-1,-7\n"
    + conv(16, 1, activation="mish")
    + "[maxpool]\nsize=5\nstride=1\n"
    + "[route]\nlayers=-2\n"
    + "[maxpool]\nsize=9\nstride=1\n"
    + "[route]\nlayers=-1,-3,-4\n"
    + conv(16, 1)
    + head()
)
EXCERPTS = {"csp": CSP, "generic": GENERIC, "fork": FORK, "misc": MISC, "misc-fork": MISC_FORK}


def assert_sound(plan, layers):
    """No array holds two outputs live at once; a shared output lives from its layer's
    forward to its last reader's and, where the backward reads it, from its remaking right
    before the first backward step that reads it to the last."""
    read_by, count = readers(layers), len(layers)
    for number in range(len(plan.buffer_floats)):
        taken = sorted(t for i, b in plan.buffer_of.items() if b == number for t in plan.live[i])
        assert all(b < c for (_, b), (c, _) in zip(taken, taken[1:])), taken
    rebuilt = {i: step for step, made in plan.rebuild_before.items() for i in made}
    for i, intervals in plan.live.items():
        assert intervals[0] == (i, max(read_by[i]))
        assert plan.buffer_floats[plan.buffer_of[i]] >= plan.floats[i]
        needs = [r for r in read_by[i] if reads_input_in_backward(layers[r])]
        needs += [i] if reads_own_output(layers[i]) else []
        if len(intervals) == 1:
            assert not needs and i not in rebuilt
        else:
            assert rebuildable(layers[i]) and rebuilt[i] == max(needs)
            assert intervals[1] == (
                backward_time(max(needs), count),
                backward_time(min(needs), count),
            )
    for layer in layers:
        if layer.type in ("yolo", "region", "detection", "softmax", "cost") or layer.stepped:
            assert layer.index not in plan.buffer_of


@pytest.mark.parametrize("name", ["yolov3-tiny.cfg", "yolov4-tiny.cfg", "yolov4.cfg"])
def test_stock_cfg_plans_are_sound(tmp_path, name):
    net = stock(tmp_path, name)
    plan = plan_outputs(net.layers, net.output_index)
    assert_sound(plan, net.layers)
    assert plan.buffer_of and plan.saved_floats > 0
    assert plan_outputs(net.layers, net.output_index, share=False).buffer_of == {}


def test_csp_excerpt_shares_what_only_forwards_read():
    net = Network(parse_cfg_text(CSP), batch=1, allocate=False)
    plan = plan_outputs(net.layers, net.output_index)
    assert_sound(plan, net.layers)
    # Not read in the backward (R2): the mish layers only shortcuts and routes read (2
    # through the route view 3 and route 9), SPP's input and maxpools, the head's
    # convolution. Made again (R3): the batch-normalised layers convolutions read (their
    # weight gradient) and the leaky one (its gradient reads its output). Neither: the
    # shortcut a convolution reads, the views (their source holds the array), the head.
    assert sorted(plan.buffer_of) == [0, 1, 2, 4, 5, 6, 8, 10, 11, 13, 15, 16]
    assert plan.live[2] == ((2, 9),) and plan.live[10] == ((10, 14),)
    # Layer 15 (leaky) is read by its own backward and by 16's: made again before 16's.
    assert plan.rebuild_before[16] == [15] and plan.live[15] == ((15, 16), (19, 20))
    assert 7 not in plan.buffer_of and 17 not in plan.buffer_of


def test_the_networks_output_keeps_its_own_array_also_through_a_route():
    # predict reads the output layer after a pass; a cfg ending in a [route] of one layer
    # reads that layer's array.
    text = CSP.replace(
        "[route]\nlayers=-1,-3,-4\n" + conv(16, 1) + head(),
        "[route]\nlayers=-1,-3,-4\n"
        + conv(16, 1, activation="mish")
        + conv(8, 1, activation="mish")
        + "[route]\nlayers=-2\n",
    )
    net = Network(parse_cfg_text(text), batch=1, allocate=False)
    assert net.layers[-1].views_its_input() and net.layers[-1].sources[0].index == 15
    plan = plan_outputs(net.layers, net.output_index)
    assert_sound(plan, net.layers)
    assert 15 not in plan.buffer_of and 16 in plan.buffer_of


def test_yolov4_at_batch_32_saves_more_than_5_gb(tmp_path):
    net = stock(tmp_path, "yolov4.cfg")
    plan = plan_outputs(net.layers, net.output_index)
    saved = 4 * 32 * plan.saved_floats
    print(f"yolov4 b32 (416, 3 classes): shared outputs save {saved / 1e9:.2f} GB")
    assert saved > 5e9


def output_bytes(net):
    """Bytes of the distinct arrays holding the layers' outputs (views of one array count
    once, as their largest)."""
    arrays = {}
    for layer in net.layers:
        out = layer.output
        key = id(out if out.base is None else out.base)
        arrays[key] = max(arrays.get(key, 0), out.nbytes)
    return sum(arrays.values())


def trained(text, darknet, share, backend="cpu", iterations=2):
    return delta_plan_tests.trained(text, darknet, share, backend, iterations, "share_outputs")


def assert_same_training(text, darknet, backend="cpu"):
    return delta_plan_tests.assert_same_training(text, darknet, backend, "share_outputs")


@pytest.mark.parametrize(
    "text,darknet",
    [
        (CSP, "alexeyab"),
        (CSP, "original"),
        (CSP, "alexeyab-cpu"),
        (GENERIC, "original"),
        (GENERIC, "alexeyab"),
        (FORK, "alexeyab"),
        (MISC, "original"),
        (MISC_FORK, "alexeyab"),
    ],
)
def test_training_with_shared_outputs_gives_the_same_weights(text, darknet):
    """Two iterations of subdivisions=2: four passes, two updates."""
    private, shared = assert_same_training(text, darknet)
    plan = shared.output_plan
    if darknet == "alexeyab-cpu":
        assert plan.buffer_of == {} and output_bytes(shared) == output_bytes(private)
        return
    assert plan.buffer_of
    assert all(shared.layers[i].output is shared.layers[i].shared_output for i in plan.buffer_of)
    saved = 4 * shared.batch * plan.saved_floats
    assert output_bytes(private) - output_bytes(shared) == saved
    assert saved > 0 or text in (MISC, MISC_FORK)  # one shared output there: no saving
    # memory_bytes counts it
    assert (
        private.memory_bytes(shared.batch, True) - shared.memory_bytes(shared.batch, True) == saved
    )


# Under fp16/bf16 a remade output comes from x's 16 bits rather than the forward's fp32
# pre-norm values. Measured on test_bn_half_x's network (4 passes, NumPy emulation): loss
# within 1.2e-5 (fp16) and 5.3e-5 (bf16) of the run keeping its outputs, what the updates
# added within 1.0e-3 and 5.9e-2 of its largest element (the size of M3's 16-bit x).
REMADE_LOSS_TOL = {"fp16": 1e-4, "bf16": 1e-3}
REMADE_UPDATE_TOL = {"fp16": 5e-3, "bf16": 1e-1}


@pytest.mark.parametrize("darknet", ["original", "alexeyab"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_remade_outputs_under_half_precision_follow_the_kept_ones(precision, darknet):
    from test_bn_half_x import NET_CFG, relative, train_passes

    runs = {}
    for share in (False, True):
        net = Network(
            parse_cfg_text(NET_CFG),
            backend=get_backend("cpu"),
            seed=3,
            darknet=darknet,
            precision=precision,
        )
        start = [a.copy() for l in net.layers for _, a in l.params()]
        net.share_deltas, net.share_outputs = True, share
        costs = train_passes(net, 4)
        runs[share] = net, costs, [a.copy() for l in net.layers for _, a in l.params()], start
    (_, kept_costs, kept, start), (remade, costs, params, _) = runs[False], runs[True]
    assert remade.output_plan.rebuild_before
    assert relative(costs, kept_costs) < REMADE_LOSS_TOL[precision]
    for a, b, s in zip(params, kept, start):
        assert relative(a - s, b - s) < REMADE_UPDATE_TOL[precision]


def kept_bytes(net):
    """Bytes of the distinct arrays a network's layers (inner ones included) and workspace
    hold; views count once, as their array's largest."""
    arrays, seen = [net.workspace], {}
    for layer in net.layers:
        for owner in [layer] + [o for o in layer.param_owners() if o is not layer]:
            arrays += [v for v in vars(owner).values() if isinstance(v, np.ndarray)]
    for a in arrays:
        key = id(a if a.base is None else a.base)
        seen[key] = max(seen.get(key, 0), a.nbytes)
    return sum(seen.values())


@pytest.mark.parametrize(
    "text",
    [CSP, GENERIC, FORK, MISC, MISC_FORK],
    ids=["csp", "generic", "fork", "misc", "misc-fork"],
)
@pytest.mark.parametrize("share", [False, True])
def test_memory_estimate_is_within_8_percent_of_what_training_keeps(text, share):
    # `info`, the out-of-memory message and the host-memory check read memory_bytes: after
    # an iteration it is within 8% of the arrays NumPy holds (yolov4 at batch 2: 1.326
    # against 1.328 GiB; it counted 3 arrays a layer before, 1.52).
    net, _, _ = delta_plan_tests.trained(
        text,
        "alexeyab" if text in (CSP, FORK, MISC_FORK) else "original",
        share,
        iterations=1,
        switch="share_outputs",
    )
    assert abs(net.memory_bytes(net.batch, True) / kept_bytes(net) - 1) < 0.08


def test_layer_output_refuses_a_shared_output_and_reads_again_once_sharing_is_off():
    net, _, _ = trained(CSP, "alexeyab", True, iterations=1)
    with pytest.raises(NetworkError, match="share_outputs"):
        net.layer_output(2)
    with pytest.raises(NetworkError, match="share_outputs"):
        net.layer_output(12)  # a [route] viewing layer 10's shared output
    assert net.layer_output(7).shape == net.layers[7].output_shape(net.batch)
    net.share_outputs = False  # re-allocates: every output its own array
    assert net.output_plan.buffer_of == {}
    assert net.layer_output(2).shape == net.layers[2].output_shape(net.batch)


@pytest.mark.gpu
@pytest.mark.parametrize("text,darknet", [(CSP, "alexeyab"), (GENERIC, "original")])
def test_training_with_shared_outputs_gives_the_same_weights_on_cuda(cuda, text, darknet):
    private, shared = assert_same_training(text, darknet, backend=cuda)
    assert shared.output_plan.buffer_of
    assert shared.memory_bytes(shared.batch, True) < private.memory_bytes(shared.batch, True)
