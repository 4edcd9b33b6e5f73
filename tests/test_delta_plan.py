"""Training deltas shared between layers whose lifetimes do not meet (delta_plan.py): the
plan on real cfgs never puts two live deltas in one array, and training with it gives the
weights of training without it, bit for bit, in every flavour."""

import numpy as np
import pytest
from helpers import data_file, write_classifier_cfg

from darknet_py.architectures import cfg_text
from darknet_py.backends import get_backend
from darknet_py.cfg import parse_cfg, parse_cfg_text
from darknet_py.delta_plan import first_writers, overlapping_users, plan_deltas
from darknet_py.network import Network, NetworkError, load_network
from darknet_py.training.plan import plan_training


def stock(tmp_path, name, classes=3, size=416):
    """A network of a stock fork detector's shape (darknet_py.architectures writes its cfg)
    with `classes` classes at size x size."""
    path = tmp_path / name
    path.write_text(cfg_text(name.removesuffix(".cfg"), classes=classes, size=size))
    return Network(parse_cfg(path), path, batch=1, allocate=False)


def head(classes=2, mask="0,1,2"):
    return (
        f"[convolutional]\nfilters={3 * (classes + 5)}\nsize=1\nactivation=linear\n"
        f"[yolo]\nmask={mask}\nanchors=6,6, 9,9, 12,12, 16,16, 20,20, 24,24\n"
        f"classes={classes}\nnum=6\njitter=0\nrandom=0\n"
    )


def conv(filters, size=3, stride=1, bn=1, activation="leaky"):
    return (
        f"[convolutional]\nbatch_normalize={bn}\nfilters={filters}\nsize={size}\n"
        f"stride={stride}\npad=1\nactivation={activation}\n"
    )


NET = (
    "[net]\nbatch=4\nsubdivisions=2\nwidth=32\nheight=32\nchannels=3\nlearning_rate=0.01\n"
    "momentum=0.9\ndecay=0.0005\nburn_in=0\nmax_batches=100\npolicy=constant\n"
)
# Both Darknets: shortcuts, routes of one and two layers, upsample, dropout, two heads.
GENERIC = (
    NET
    + conv(8)
    + conv(16, stride=2)
    + conv(8, 1)
    + conv(16)
    + "[shortcut]\nfrom=-3\nactivation=linear\n"
    + "[dropout]\nprobability=0.2\n"
    + conv(16, stride=2)
    + head(mask="3,4,5")
    + "[route]\nlayers=-3\n"
    + conv(8, 1)
    + "[upsample]\nstride=2\n"
    + "[route]\nlayers=-1,-8\n"
    + conv(16)
    + head()
)
# The fork's sections: a route with groups, mish, sam, scale_channels, maxpool, a
# weighted shortcut of two sources.
FORK = (
    NET
    + conv(8, activation="mish")
    + conv(16, stride=2)
    + "[route]\nlayers=-1\ngroups=2\ngroup_id=1\n"
    + conv(8)
    + conv(8)
    + "[route]\nlayers=-1,-2\n"
    + conv(16, 1, bn=0, activation="logistic")
    + "[sam]\nfrom=-2\n"
    + "[avgpool]\n"
    + conv(16, 1, bn=0, activation="logistic")
    + "[scale_channels]\nfrom=-3\n"
    + "[shortcut]\nfrom=-10,-1\nweights_type=per_channel\nactivation=linear\n"
    + "[maxpool]\nsize=2\nstride=2\n"
    + head(mask="3,4,5")
    + "[route]\nlayers=-4\n"
    + conv(16)
    + head()
)
# Classifiers: every other type SHARED_TYPES lists.
CLASSIFIER = NET.replace("width=32\nheight=32", "width=16\nheight=16")
MISC = (
    CLASSIFIER
    + conv(8)
    + "[batchnorm]\n"
    + "[activation]\nactivation=tanh\n"
    + "[l2norm]\n"
    + "[reorg]\nstride=2\n"
    + "[local]\nsize=3\nfilters=4\nstride=1\npad=1\nactivation=leaky\n"
    + "[normalization]\n"
    + "[deconvolutional]\nfilters=4\nsize=2\nstride=2\nactivation=leaky\n"
    + "[maxpool]\nsize=2\nstride=2\n"
    + "[connected]\noutput=6\nactivation=leaky\n"
    + "[dropout]\nprobability=0.3\n"
    + "[connected]\noutput=3\nactivation=linear\n"
    + "[softmax]\n"
)
MISC_FORK = (
    CLASSIFIER
    + conv(8, activation="mish")
    + "[batchnorm]\n"
    + "[local_avgpool]\nsize=2\nstride=2\n"
    + "[reorg3d]\nstride=2\n"
    + "[empty]\n"
    + "[implicit]\nfilters=32\n"
    + "[scale_channels]\nfrom=-2\n"
    + "[connected]\noutput=3\nactivation=linear\n"
    + "[softmax]\n"
)


def assert_sound(plan, layers):
    """No array holds two deltas live at once; every shared delta's interval is its own
    backward up to its first writer's, zeroed right before that one."""
    assert overlapping_users(plan) == []
    first = first_writers(layers)
    for i, (low, high) in plan.live.items():
        assert (low, high) == (i, first[i])
        assert i in plan.zero_before[high]
        assert plan.buffer_floats[plan.buffer_of[i]] >= plan.floats[i]
    for layer in layers:
        if layer.type in ("yolo", "region", "detection", "softmax", "cost"):
            assert layer.index in plan.private


@pytest.mark.parametrize("name", ["yolov3-tiny.cfg", "yolov4-tiny.cfg", "yolov4.cfg"])
def test_stock_cfg_plans_never_share_live_deltas(tmp_path, name):
    net = stock(tmp_path, name)
    plan = plan_deltas(net.layers)
    assert_sound(plan, net.layers)
    assert plan.buffer_of and plan.saved_floats > 0
    # Read off the layers themselves: a shared delta lives from its next layer's backward
    # and from that of every [route]/[shortcut] naming it (yolov4-tiny's groups=2 routes
    # read half of a layer) down to its own.
    for layer in net.layers:
        writes = getattr(layer, "sources", []) + net.layers[layer.index - 1 : layer.index]
        for target in writes:
            if target.index in plan.live:
                low, high = plan.live[target.index]
                assert low == target.index < layer.index <= high


@pytest.mark.parametrize(
    "text", [GENERIC, FORK, MISC, MISC_FORK], ids=["generic", "fork", "misc", "misc-fork"]
)
def test_excerpt_plans_are_sound_and_the_fork_cpu_flavour_shares_nothing(text):
    net = Network(parse_cfg_text(text), batch=1, allocate=False)
    assert_sound(plan_deltas(net.layers), net.layers)
    assert plan_deltas(net.layers, share=False).buffer_of == {}
    cpu = Network(parse_cfg_text(text), batch=1, allocate=False, darknet="alexeyab-cpu")
    cpu.share_deltas = True
    assert cpu.memory_bytes(1, True) == Network(
        parse_cfg_text(text), batch=1, allocate=False
    ).memory_bytes(1, True)


def test_layers_below_a_stopbackward_and_before_an_unknown_consumer_keep_their_own():
    text = GENERIC.replace("[dropout]\n", "[dropout]\nstopbackward=1\n")
    net = Network(parse_cfg_text(text), batch=1, allocate=False)
    stop = next(l.index for l in net.layers if l.stopbackward)
    plan = plan_deltas(net.layers)
    assert all(i in plan.private for i in range(stop + 1))
    connected = "[connected]\noutput=8\nactivation=leaky\n"
    text = (
        NET.replace("width=32\nheight=32\nchannels=3", "inputs=8")
        + connected * 2
        + "[rnn]\noutput=8\nhidden=8\nactivation=leaky\n"
        + connected * 2
    )
    plan = plan_deltas(Network(parse_cfg_text(text), batch=1, allocate=False).layers)
    assert plan.private == [1, 2] and sorted(plan.buffer_of) == [0, 3, 4]


def test_yolov4_at_batch_32_saves_more_than_5_gb(tmp_path):
    plan = plan_deltas(stock(tmp_path, "yolov4.cfg").layers)
    total, saved = 4 * 32 * sum(plan.floats), 4 * 32 * plan.saved_floats
    print(
        f"yolov4 b32 (416, 3 classes): deltas {total / 1e9:.2f} GB, shared saves "
        f"{saved / 1e9:.2f} GB"
    )
    assert saved > 5e9


def delta_bytes(net):
    """Bytes of the distinct arrays holding the layers' deltas: views of one array (NumPy's
    and the CUDA backend's name it as their base) count once, as their largest (an array
    is its largest user's size)."""
    arrays = {}
    for layer in net.layers:
        delta = layer.delta
        if delta is not None:
            key = id(delta if delta.base is None else delta.base)
            arrays[key] = max(arrays.get(key, 0), delta.nbytes)
    return sum(arrays.values())


def data(net, count, seed=0):
    rng = np.random.default_rng(seed)
    n = net.images_per_pass * net.subdivisions
    for _ in range(count):
        x = rng.random((n,) + net.input_shape, dtype=np.float32)
        if net.layers[-1].type == "softmax":
            yield x, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]
            continue
        truth = np.zeros((n, 90 * 5), dtype=np.float32)
        for b in range(n):
            for k in range(2):
                w, h = rng.uniform(0.15, 0.5, 2)
                truth[b, 5 * k : 5 * k + 5] = (*rng.uniform(0.3, 0.7, 2), w, h, rng.integers(2))
        yield x, truth


def trained(text, darknet, share, backend="cpu", iterations=2, switch="share_deltas"):
    """A network trained `iterations` iterations with the plan `switch` names on or off
    (test_output_plan's: share_outputs, deltas shared as training shares them)."""
    backend = get_backend(backend) if isinstance(backend, str) else backend
    net = Network(parse_cfg_text(text), backend=backend, seed=5, darknet=darknet)
    net.share_deltas = True
    setattr(net, switch, share)
    losses = [net.train_iteration(x, truth) for x, truth in data(net, iterations)]
    params = [net.be.to_host(a) for l in net.layers for _, a in l.params()]
    return net, losses, params


def assert_same_training(text, darknet, backend="cpu", switch="share_deltas"):
    """Train with private and with shared deltas (or the plan `switch` names); the losses
    and weights are the same."""
    private, losses, params = trained(text, darknet, False, backend, switch=switch)
    shared, shared_losses, shared_params = trained(text, darknet, True, backend, switch=switch)
    assert np.all(np.isfinite(losses)) and shared_losses == losses
    assert len(shared_params) == len(params)
    for i, (a, b) in enumerate(zip(shared_params, params)):
        np.testing.assert_array_equal(a, b, err_msg=f"parameter array {i}")
    return private, shared


@pytest.mark.parametrize(
    "text,darknet",
    [
        (GENERIC, "original"),
        (GENERIC, "alexeyab"),
        (GENERIC, "alexeyab-cpu"),
        (FORK, "alexeyab"),
        (FORK, "alexeyab-cpu"),
        (MISC, "original"),
        (MISC, "alexeyab"),
        (MISC_FORK, "alexeyab"),
    ],
)
def test_training_with_shared_deltas_gives_the_same_weights(text, darknet):
    """Two iterations of subdivisions=2: four passes, two updates."""
    private, shared = assert_same_training(text, darknet)
    if darknet == "alexeyab-cpu":
        assert shared.delta_plan.buffer_of == {}
        assert delta_bytes(shared) == delta_bytes(private)
    else:
        plan = shared.delta_plan
        assert plan.buffer_of and overlapping_users(plan) == []
        assert all(shared.layers[i].delta is shared.layers[i].shared_delta for i in plan.buffer_of)
        saved = 4 * shared.batch * plan.saved_floats
        assert delta_bytes(private) - delta_bytes(shared) == saved > 0


def test_layer_delta_refuses_a_shared_delta_and_reads_again_once_sharing_is_off():
    net, _, _ = trained(GENERIC, "alexeyab", True, iterations=1)
    i = next(iter(net.delta_plan.buffer_of))
    with pytest.raises(NetworkError, match="share_deltas"):
        net.layer_delta(i)
    private = next(j for j in net.delta_plan.private if net.layers[j].delta is not None)
    assert net.layer_delta(private).size
    net.share_deltas = False  # re-allocates: every delta its own array
    assert net.delta_plan.buffer_of == {}
    assert net.layer_delta(i).shape == net.layers[i].output_shape(net.batch)


def test_load_network_does_not_share_and_training_plans_do(bars, tmp_path):
    path = tmp_path / "net.cfg"
    path.write_text(GENERIC)
    net = load_network(path)
    assert net.share_deltas is False and net.share_outputs is False  # (output_plan.py)
    cfg = write_classifier_cfg(tmp_path)
    (tmp_path / "backup").mkdir()
    plan = plan_training(cfg, data_file(bars, tmp_path / "backup"), device="cpu")
    assert plan.net.share_deltas is True and plan.net.share_outputs is True


@pytest.mark.gpu
@pytest.mark.parametrize("text,darknet", [(GENERIC, "original"), (FORK, "alexeyab")])
def test_training_with_shared_deltas_gives_the_same_weights_on_cuda(cuda, text, darknet):
    private, shared = assert_same_training(text, darknet, backend=cuda)
    plan = shared.delta_plan
    assert plan.buffer_of and overlapping_users(plan) == []
    saved = 4 * shared.batch * plan.saved_floats
    assert delta_bytes(private) - delta_bytes(shared) == saved > 0


@pytest.mark.parametrize(
    "switch, plan", [("share_deltas", "delta_plan"), ("share_outputs", "output_plan")]
)
def test_replayed_training_with_shared_arrays_equals_eager_private_training(switch, plan):
    """The fills a shared delta gets and the outputs made again in the backward
    (output_plan.py) are part of the recorded step (a NumPy backend that records steps as
    CUDA graphs do: test_cuda_graphs)."""
    from test_cuda_graphs import RecordingBackend

    replayed, losses, params = trained(GENERIC, "alexeyab", True, RecordingBackend(), 3, switch)
    _, eager_losses, eager_params = trained(GENERIC, "alexeyab", False, iterations=3, switch=switch)
    assert getattr(replayed, plan).buffer_of and replayed.graphs.replayed > 0
    if plan == "output_plan":
        assert replayed.output_plan.rebuild_before
    assert losses == eager_losses
    for a, b in zip(params, eager_params):
        np.testing.assert_array_equal(a, b)
