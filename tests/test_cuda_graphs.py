"""Steps replayed as graphs (backend.capture, graphs.StepGraphs) against eager steps.

On the GPU a captured step is a CUDA graph. On the CPU, RecordingBackend plays one: while
capturing it records each op with the arguments it got instead of running it, and a replay
repeats the recorded calls without running the step's Python again, so a value baked into
a recorded call (a learning rate, a seed) shows up as a difference from the eager network.
"""

import functools
import inspect

import numpy as np
import pytest
from test_detection import REGION_TRAIN
from test_head_losses import DETECTION_RANDOM

from darknet_py.backends import GraphCaptureError, cuda_available
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network

CFG = """[net]
batch=8
subdivisions={subdivisions}
width=12
height=12
channels=3
learning_rate=0.1
momentum=0.9
decay=0.0005
policy=poly
power=2
burn_in=2
max_batches=10

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
filters=6
size=3
stride=1
pad=1
activation=mish

[dropout]
probability=0.3

[connected]
output=5
activation=linear

[softmax]
"""

# Ops that hand data to or from the host: a graph cannot record them (the CUDA backend's
# capture fails on the synchronisation they need).
_HOST_OPS = {"to_host", "from_host", "write", "sum", "synchronize", "array_table"}
# Not recorded: capture itself, and what answers a question rather than doing work.
_NOT_OPS = {"capture", "timer", "conv_backward_implicit", "storage_of"}


class RecordingBackend(NumpyBackend):
    """NumpyBackend whose capture records ops like a CUDA graph (see the module text)."""

    recording = None

    def capture(self, fn):
        self.recording = []
        try:
            fn()
        finally:
            calls, self.recording = self.recording, None
        return lambda: [op(*args, **kwargs) for op, args, kwargs in calls]


def _recorded(name):
    op = getattr(NumpyBackend, name)

    @functools.wraps(op)
    def call(self, *args, **kwargs):
        if self.recording is None or name in ("zeros", "empty", "int_zeros"):
            result = op(self, *args, **kwargs)
            if self.recording is not None and name != "empty":
                self.recording.append((self.fill, (result, 0), {}))  # a recorded memset
            return result
        if name in _HOST_OPS:
            raise GraphCaptureError(f"{name} while capturing")
        if name == "pack_weights":  # made once; the recorded kernel refills it (fp16, bf16)
            packed = op(self, *args, **kwargs)

            def refill(*a, **k):
                packed.data[...] = op(self, *a, **k).data

            self.recording.append((refill, args, kwargs))
            return packed
        self.recording.append((functools.partial(op, self), args, kwargs))
        return None

    return call


# Every op, its mixins' (ops/normalization/numpy.py, ...) included.
for _name, _value in inspect.getmembers(NumpyBackend, inspect.isfunction):
    if not _name.startswith("_") and _name not in _NOT_OPS:
        setattr(RecordingBackend, _name, _recorded(_name))


def make_backend(kind):
    if kind == "cuda":
        if not cuda_available():
            pytest.skip("needs PyCUDA and a CUDA GPU")
        from darknet_py.backends.cuda_backend import CudaBackend

        return CudaBackend(0)
    return RecordingBackend()


def eager_backend(kind):
    return make_backend(kind) if kind == "cuda" else NumpyBackend()


BACKENDS = ["recording", pytest.param("cuda", marks=pytest.mark.gpu)]


def network(be, subdivisions=1, graphs=True, cfg=CFG, precision=None):
    net = Network(
        parse_cfg_text(cfg.format(subdivisions=subdivisions)),
        backend=be,
        seed=3,
        precision=precision,
    )
    net.graphs.enabled = graphs
    return net


def batches(net, count, seed=0):
    rng = np.random.default_rng(seed)
    n = net.images_per_pass
    for _ in range(count):
        x = rng.random((n,) + net.input_shape, dtype=np.float32)
        yield x, np.eye(5, dtype=np.float32)[rng.integers(0, 5, n)]


def state(net):
    """Every layer's output and every parameter and accumulated update, on the host."""
    arrays = [net.be.to_host(l.output) for l in net.layers]
    for layer in net.layers:
        arrays += [net.be.to_host(a) for _, a in layer.params()]
        arrays += [
            net.be.to_host(getattr(layer, n))
            for n in ("weight_updates", "bias_updates")
            if getattr(layer, n, None) is not None
        ]
    return arrays


def assert_same(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(x, y, err_msg=f"array {i}")


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("subdivisions", [1, 2])
def test_replayed_training_equals_eager_bit_for_bit(kind, subdivisions):
    """Each step kind runs eagerly, is captured, then replayed; the learning rate changes
    every iteration (burn_in, poly) and dropout draws a new mask every pass."""
    replayed = network(make_backend(kind), subdivisions)
    eager = network(eager_backend(kind), subdivisions, graphs=False)
    rates = []
    for x, truth in batches(eager, 4 * subdivisions):
        costs = [net.train_pass(x, truth) for net in (replayed, eager)]
        assert costs[0] == costs[1]
        assert_same(state(replayed), state(eager))
        rates.append(eager.last_rate)
    assert len(set(r for r in rates if r is not None)) == 4
    # per step kind (with and without the update): eager, captured, then replays
    assert replayed.graphs.captured == subdivisions
    assert replayed.graphs.replayed == 3 * subdivisions
    assert eager.graphs.replayed == 0


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("subdivisions", [1, 2])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the forced overflows' inf and NaN
def test_fp16_steps_replay_while_the_loss_scale_moves(kind, subdivisions):
    """fp16 training's loss scaler (its update inside the recorded step): the scale set
    by hand to overflow fp16 (a skipped update, the scale halved), then low enough to grow
    (growth_interval=2); the replayed network equals the eager one bit for bit, its scale
    and skipped count too, with one recording per kind of pass."""
    from darknet_py.precision import LossScaler

    replayed = network(make_backend(kind), subdivisions, precision="fp16")
    eager = network(eager_backend(kind), subdivisions, graphs=False, precision="fp16")
    for net in (replayed, eager):
        net.loss_scaler = LossScaler(growth_interval=2)
    scales_at = {2: 2.0**100, 4: 16.0}
    history = []
    for i, (x, truth) in enumerate(batches(eager, 8 * subdivisions)):
        iteration = i // subdivisions
        if i % subdivisions == 0 and iteration in scales_at:
            for net in (replayed, eager):
                net.loss_scaler.scale = scales_at[iteration]
        costs = [net.train_pass(x, truth) for net in (replayed, eager)]
        assert costs[0] == costs[1] or np.isnan(costs).all()
        assert_same(state(replayed), state(eager))
        figures = [(net.loss_scaler.scale, net.loss_scaler.skipped) for net in (replayed, eager)]
        assert figures[0] == figures[1]
        if i % subdivisions == subdivisions - 1:
            history.append(figures[0])
    # 2: 2^100 overflows, skipped and halved; 3: 2^99 still overflows; 4: set to 16, clean;
    # 5: the second clean update in a row doubles it; 7: again.
    assert history == [
        (4096, 0),
        (8192, 0),
        (2.0**99, 1),
        (2.0**98, 2),
        (16, 2),
        (32, 2),
        (32, 2),
        (64, 2),
    ]
    assert replayed.graphs.captured == subdivisions
    assert replayed.graphs.replayed == 7 * subdivisions


@pytest.mark.parametrize("kind", BACKENDS)
def test_replayed_predict_follows_training_and_batch_changes(kind):
    replayed = network(make_backend(kind))
    eager = network(eager_backend(kind), graphs=False)
    data = list(batches(eager, 3))
    for rounds in range(3):
        for x, _ in data:
            outs = [net.predict(x) for net in (replayed, eager)]
            np.testing.assert_array_equal(outs[0], outs[1])
        # the update moves the parameters: recorded forwards read the old folded weights
        for net in (replayed, eager):
            net.train_pass(*data[rounds])
    # per round, predict: eager, captured (and replayed), replayed; training from round 1
    assert replayed.graphs.replayed == 3 * 2 + 2
    one = data[0][0][:1]
    np.testing.assert_array_equal(replayed.predict(one), eager.predict(one))  # batch 1


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_step_that_cannot_be_captured_runs_eagerly(kind, capsys):
    """A layer that reads the device inside forward though it claims otherwise: the
    capture fails, the step runs eagerly, and so do the next ones."""
    replayed = network(make_backend(kind))
    eager = network(eager_backend(kind), graphs=False)
    conv = replayed.layers[0]
    forward = conv.forward

    def forward_reading_the_device(net):
        forward(net)
        net.be.to_host(conv.output)

    conv.forward = forward_reading_the_device
    for x, truth in batches(eager, 4):
        assert replayed.train_pass(x, truth) == eager.train_pass(x, truth)
        assert_same(state(replayed), state(eager))
    assert replayed.graphs.captured == 0 and replayed.graphs.replayed == 0
    assert replayed.graphs.fallback  # why, as the notice said it
    assert capsys.readouterr().err.count("running steps without CUDA graphs") == 1


@pytest.mark.parametrize("kind", BACKENDS)
def test_layers_working_on_the_host_are_never_captured(kind):
    """[crop] draws its window from the host RNG: no capture is tried."""
    cfg = CFG.replace(
        "[convolutional]", "[crop]\ncrop_width=10\ncrop_height=10\n\n[convolutional]", 1
    )
    net = network(make_backend(kind), cfg=cfg)
    assert not net.capturable
    for x, truth in batches(net, 3):
        net.train_pass(x, truth)
    assert net.graphs.captured == 0


def test_graphs_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("DARKNET_CUDA_GRAPHS", "0")
    net = Network(parse_cfg_text(CFG.format(subdivisions=1)), backend=RecordingBackend())
    assert not net.graphs.enabled and not net.capturable
    for x, truth in batches(net, 3):
        net.train_pass(x, truth)
    assert net.graphs.captured == 0


def test_numpy_backend_capture_runs_the_function_at_each_call():
    be = NumpyBackend()
    calls = []
    replay = be.capture(lambda: calls.append(1))
    assert calls == []
    replay()
    replay()
    assert calls == [1, 1]


@pytest.mark.gpu
def test_cuda_capture_records_without_running_and_keeps_its_arrays():
    be = make_backend("cuda")
    n = 1000
    x, y = be.from_host(np.ones(n)), be.zeros(n)

    def step():
        tmp = be.zeros(n)  # made while capturing: the graph must keep it
        be.axpy(1.0, x, tmp)
        be.axpy(2.0, tmp, y)

    replay = be.capture(step)
    assert not be.to_host(y).any()  # recorded, not run
    others = [be.from_host(np.full(n, 7.0)) for _ in range(4)]  # would reuse a freed tmp
    for _ in range(3):
        replay()
    np.testing.assert_array_equal(be.to_host(y), np.full(n, 6.0))
    for a in others:
        np.testing.assert_array_equal(be.to_host(a), np.full(n, 7.0))
    with pytest.raises(GraphCaptureError):
        be.capture(lambda: be.sum(x))  # waits on the device
    np.testing.assert_array_equal(be.to_host(y), np.full(n, 6.0))  # the stream works on


YOLO_CFG = """[net]
batch=4
subdivisions={subdivisions}
width=32
height=32
channels=3
learning_rate=0.01
momentum=0.9
decay=0.0005
burn_in=3
max_batches=100
policy=poly
power=2

[convolutional]
batch_normalize=1
filters=8
size=3
stride=2
pad=1
activation=leaky

[convolutional]
filters=24
size=1
stride=1
activation=linear

[yolo]
mask=0,1,2
anchors=4,5, 8,10, 16,12
classes=3
num=3
"""


def yolo_batches(net, count, seed=0):
    rng = np.random.default_rng(seed)
    n = net.images_per_pass
    for _ in range(count):
        x = rng.random((n,) + net.input_shape, dtype=np.float32)
        truth = np.zeros((n, net.truth_size * net.max_boxes), dtype=np.float32)
        for b in range(n):
            for j in range(1 + b % 3):
                w, h = rng.uniform(0.1, 0.5, 2)
                truth[b, 5 * j : 5 * j + 5] = (*rng.uniform(0.25, 0.75, 2), w, h, rng.integers(3))
        yield x, truth


@pytest.mark.parametrize("kind", BACKENDS)
def test_yolo_detector_steps_replay_bit_for_bit(kind):
    """The [yolo] loss runs on the backend, so a detector's step is captured and replayed,
    and its cost and deltas equal an eager network's."""
    replayed = network(make_backend(kind), cfg=YOLO_CFG)
    eager = network(eager_backend(kind), graphs=False, cfg=YOLO_CFG)
    for x, truth in yolo_batches(eager, 4):
        costs = [net.train_pass(x, truth) for net in (replayed, eager)]
        assert costs[0] == costs[1]
        assert replayed.layers[-1].stats_line == eager.layers[-1].stats_line
        assert_same(state(replayed), state(eager))
    assert replayed.graphs.replayed == 3  # step 2 is captured, then replayed like 3 and 4


def test_a_bad_class_id_is_refused_before_a_replayed_step_runs():
    net = network(RecordingBackend(), cfg=YOLO_CFG)
    batches = list(yolo_batches(net, 3))
    for x, truth in batches[:2]:
        net.train_pass(x, truth)  # eager, then captured: the next one would replay
    x, truth = batches[2]
    truth[1, 4] = 3  # classes=3: ids 0..2
    with pytest.raises(ValueError, match=r"class 3 but \[yolo\] layer 2 has classes=3"):
        net.train_pass(x, truth)
    assert net.graphs.replayed == 1


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize(
    "cfg,threshold",
    [(REGION_TRAIN.format(softmax=1), 12800), (DETECTION_RANDOM, 64000)],
    ids=["region", "detection"],
)
def test_region_and_detection_steps_replay_once_their_early_phase_is_over(kind, cfg, threshold):
    """[region] pulls boxes towards the anchors, and [detection] random=1 draws the
    responsible box, until `seen` passes a threshold: a launch argument a recording would
    keep, so those steps run eagerly; after it the steps are recorded and replayed, equal
    to an eager network's bit for bit."""
    replayed = network(make_backend(kind), cfg=cfg)
    eager = network(eager_backend(kind), graphs=False, cfg=cfg)
    for net in (replayed, eager):
        net.seen = threshold - 3 * net.images_per_pass  # steps 0, 1 below it, 2 reaches it
    for step, (x, truth) in enumerate(yolo_batches(eager, 7)):
        costs = [net.train_pass(x, truth) for net in (replayed, eager)]
        assert costs[0] == costs[1]
        assert replayed.layers[-1].stats_line == eager.layers[-1].stats_line
        assert_same(state(replayed), state(eager))
        assert replayed.graphs.captured == (step >= 3)
    assert replayed.graphs.replayed == 4  # step 2 eager, 3 captured and replayed, then 4-6


@pytest.mark.parametrize("kind", BACKENDS)
def test_small_predict_replays_its_copies_with_the_layers(kind, monkeypatch):
    """predict() of a small float batch is one recorded step: the input's copy from
    page-locked memory, the layers, the output's copy back. Each replay reads the new
    input and gives the eager network's output; a batch over the size limit takes the
    staged path (no whole-call buffers)."""
    from darknet_py.network import inference

    replayed = network(make_backend(kind))
    eager = network(eager_backend(kind), graphs=False)
    rng = np.random.default_rng(5)
    for _ in range(4):
        x = rng.random((2,) + replayed.input_shape, dtype=np.float32)
        got = replayed.predict(x)
        np.testing.assert_array_equal(got, eager.predict(x))
        assert got.shape == eager.predict(x).shape
    assert replayed._whole_call is not None and replayed._whole_call.host_in.shape[0] == 2
    assert replayed.graphs.replayed == 3  # eager, captured and replayed, replayed twice
    monkeypatch.setattr(inference, "WHOLE_CALL_MAX_BYTES", 0)
    x = rng.random((3,) + replayed.input_shape, dtype=np.float32)
    np.testing.assert_array_equal(replayed.predict(x), eager.predict(x))
    assert replayed._whole_call.host_in.shape[0] == 2  # not used for that one
