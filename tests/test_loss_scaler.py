"""fp16 training's loss scaler kept on the backend (precision.LossScaler, issue 42).

On the NumPy backend: training with it gives the weights, the scale's history and the
skipped count of the host-side scaler it replaced (HostLossScaler below: that scaler's logic
as it was, commit a538619), with overflows forced by a huge delta injected into the head;
the training pass is recorded once however the scale moves; its ops against their
definitions. On the GPU (marked gpu): its kernels against the NumPy reference (arrays
poisoned with NaN where the kernel must write), and an fp16 training run against the
host-side scaler's on the same device.
"""

import numpy as np
import pytest

from darknet_py import precision as precisions
from darknet_py.backends import cuda_available
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network

gpu = pytest.mark.gpu
# The forced overflows' inf and NaN pass through NumPy's arithmetic, which warns of them.
OVERFLOWS = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CFG = """[net]
batch=4
subdivisions={subdivisions}
width=12
height=12
channels=3
learning_rate=0.05
momentum=0.9
decay=0.0005
policy=poly
power=2
burn_in=2
max_batches=40
{net_extra}

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

[connected]
output=5
activation=linear

[softmax]
"""


class HostLossScaler:
    """precision.LossScaler as it was before issue 42 (commit a538619), kept as the
    reference: its state on the host, a sum of each update buffer downloaded to find
    inf/NaN, the unscale, the layers' update and the rescale as eager ops. The network
    calls it where it calls LossScaler; graph_key holds the scale as that version's key
    did, so each new scale is a new recorded step."""

    def __init__(self, scale=None, growth_interval=1000):
        self.dynamic = scale is None
        self.scale = float(2.0**12 if scale is None else scale)
        self.growth_interval = growth_interval
        self.skipped = 0
        self._clean = 0
        self._sums = None

    def graph_key(self):
        return (self, self.scale)

    def scale_deltas(self, net):
        for layer in net.layers:
            if layer.type in precisions.HEAD_TYPES and getattr(layer, "delta", None) is not None:
                net.be.scal(self.scale, layer.delta)

    def update(self, net):
        be = net.be
        updates = net.update_buffers()[0]
        if self._sums is None or self._sums.size < len(updates):
            self._sums = be.zeros(max(1, len(updates)))
        for i, buffer in enumerate(updates):
            be.sum_into(buffer, self._sums[i : i + 1])
        finite = bool(np.all(np.isfinite(be.to_host(self._sums)[: len(updates)])))
        if finite:
            for buffer in updates:
                be.scal(1.0 / self.scale, buffer)
            net._update_layers()
            self._clean += 1
            if self.dynamic and self._clean % self.growth_interval == 0:
                self.scale *= 2.0
        else:
            for buffer in updates:
                be.fill(buffer, 0.0)
            self.skipped += 1
            self._clean = 0
            if self.dynamic:
                self.scale = max(1.0, self.scale / 2.0)
        for buffer in updates:
            be.scal(self.scale, buffer)
        return finite


def make_net(be, scaler_class, scale=None, subdivisions=1, net_extra="", growth_interval=3):
    net = Network(
        parse_cfg_text(CFG.format(subdivisions=subdivisions, net_extra=net_extra)),
        backend=be,
        seed=3,
        precision="fp16",
    )
    net.loss_scaler = scaler_class(scale, growth_interval=growth_interval)
    return net


def batches(net, count, seed=0):
    rng = np.random.default_rng(seed)
    n = net.images_per_pass * net.subdivisions
    for _ in range(count):
        x = rng.random((n,) + net.input_shape, dtype=np.float32)
        yield x, np.eye(5, dtype=np.float32)[rng.integers(0, 5, n)]


def parameters(net):
    """Every parameter, accumulated update and rolling statistic, on the host."""
    arrays = []
    for layer in (owner for l in net.layers for owner in l.param_owners()):
        arrays += [(f"{layer.index}.{name}", net.be.to_host(a)) for name, a in layer.params()]
        for name in ("weight_updates", "bias_updates", "scale_updates"):
            if getattr(layer, name, None) is not None:
                arrays.append((f"{layer.index}.{name}", net.be.to_host(getattr(layer, name))))
    return arrays


def inject_overflow(net, iterations):
    """Make the head's delta huge (1e38: inf once scaled) in every pass of the given
    iterations (counted by train()): a forward wrapper, run again at each pass on the
    NumPy backend, whose recorded steps are the Python steps run again."""
    head = net.layers[-1]
    forward = head.forward

    def overflowing(n):
        forward(n)
        if n.test_iteration in iterations:
            head.delta[0] = 1e38

    head.forward = overflowing


def train(net, data, poisoned=()):
    """Train on data (iterations counted from 0), the passes of the poisoned ones
    overflowing; the (scale, skipped) after each iteration."""
    inject_overflow(net, set(poisoned))
    history = []
    for i, (x, truth) in enumerate(data):
        net.test_iteration = i
        net.train_iteration(x, truth)
        history.append((net.loss_scaler.scale, net.loss_scaler.skipped))
    return history


@pytest.mark.parametrize(
    "subdivisions,net_extra,scale",
    [(1, "", None), (2, "", None), (1, "adam=1", None), (2, "", 64.0), (1, "", 1000.3)],
    ids=["sgd", "sgd-subdivisions", "adam", "static", "static-not-power-of-two"],
)
@OVERFLOWS
def test_device_scaler_trains_as_the_host_scaler_did(subdivisions, net_extra, scale):
    poisoned = {1, 2, 6}
    nets = [
        make_net(NumpyBackend(), kind, scale, subdivisions, net_extra)
        for kind in (precisions.LossScaler, HostLossScaler)
    ]
    data = list(batches(nets[0], 10))
    device, host = (train(net, data, poisoned) for net in nets)
    assert device == host
    if scale is None:  # halved at 1, 2, 6; doubled after 3 clean updates in a row (5, 9)
        want = [4096, 2048, 1024, 1024, 1024, 2048, 1024, 1024, 1024, 2048]
        assert [s for s, _ in device] == want
        assert device[-1] == (2048, 3)
    else:
        assert all(s == scale for s, _ in device) and device[-1][1] == 3
    for (name, got), (_, want) in zip(parameters(nets[0]), parameters(nets[1])):
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert precisions.log_note(nets[0]) == precisions.log_note(nets[1])
    # One recorded training pass per kind of pass, however the scale moved; the host
    # scaler's key held the scale, so each new scale was recorded again.
    assert nets[0].graphs.captured == subdivisions
    assert nets[1].graphs.captured > nets[0].graphs.captured or scale is not None


@OVERFLOWS
def test_a_skipped_update_leaves_the_weights_and_zeroes_the_buffers():
    net = make_net(NumpyBackend(), precisions.LossScaler, subdivisions=1)
    data = list(batches(net, 3))
    train(net, data[:1])
    before = parameters(net)
    inject_overflow(net, {1})
    net.test_iteration = 1
    net.train_iteration(*data[1])
    assert (net.loss_scaler.scale, net.loss_scaler.skipped) == (2048.0, 1)
    for (name, got), (_, want) in zip(parameters(net), before):
        if name.endswith("_updates"):
            assert not got.any(), name  # the gradients and momentum's history dropped
        elif "rolling" not in name:  # (the forward still moves the rolling statistics)
            np.testing.assert_array_equal(got, want, err_msg=name)
    assert precisions.log_note(net) == ", fp16 loss scale 2048, 1 skipped"


@OVERFLOWS
def test_scale_set_by_hand_reaches_the_recorded_step():
    net = make_net(NumpyBackend(), precisions.LossScaler)
    data = list(batches(net, 4))
    train(net, data[:2])
    net.loss_scaler.scale = 2.0**100  # the scaled deltas overflow fp16
    net.train_iteration(*data[2])
    assert (net.loss_scaler.scale, net.loss_scaler.skipped) == (2.0**99, 1)
    net.loss_scaler.scale = 8.0
    net.train_iteration(*data[3])
    assert (net.loss_scaler.scale, net.loss_scaler.skipped) == (8.0, 1)
    assert net.graphs.captured == 1 and net.graphs.replayed == 3


def test_growth_interval_must_be_positive():
    with pytest.raises(ValueError, match="growth_interval must be at least 1, got 0"):
        precisions.LossScaler(growth_interval=0)


# ---- the ops, on the NumPy backend -------------------------------------------------------


def scaler_state(be, scale, clean=0, skipped=0):
    scales = be.from_host([scale, 1.0 / scale])
    counts = be.int_zeros(3)
    be.write(counts, [0, clean, skipped])
    return scales, counts


def test_unscale_check_flags_inf_and_nan_in_any_array():
    be = NumpyBackend()
    arrays = [be.from_host(np.arange(n, dtype=np.float32) - 2) for n in (0, 5, 3)]
    table = be.array_table(arrays)
    scales, counts = scaler_state(be, 4.0)
    be.unscale_check(table, scales, counts)
    assert counts[0] == 0
    np.testing.assert_array_equal(arrays[1], np.float32([-2, -1, 0, 1, 2]) / 4)
    for bad in (np.inf, -np.inf, np.nan):
        arrays[2][1] = bad
        be.unscale_check(table, scales, counts)
        assert counts[0] == 1
        counts[0] = 0


def test_rescale_or_zero_and_the_step_follow_the_rules():
    be = NumpyBackend()
    a = be.from_host([1.0, -3.0])
    table = be.array_table([a])
    scales, counts = scaler_state(be, 4.0, clean=1)
    be.loss_scale_step(scales, counts, dynamic=True, growth_interval=2)  # 2nd clean: doubles
    be.rescale_or_zero(table, scales, counts)
    np.testing.assert_array_equal(a, [8.0, -24.0])
    assert list(scales) == [8.0, 0.125] and list(counts) == [0, 2, 0]
    counts[0] = 1
    be.loss_scale_step(scales, counts, dynamic=True, growth_interval=2)
    be.rescale_or_zero(table, scales, counts)
    np.testing.assert_array_equal(a, [0.0, 0.0])
    assert list(scales) == [4.0, 0.25] and list(counts) == [1, 0, 1]
    scales, counts = scaler_state(be, 1.0)
    counts[0] = 1
    be.loss_scale_step(scales, counts, dynamic=True, growth_interval=2)  # not below 1
    assert list(scales) == [1.0, 1.0] and list(counts) == [1, 0, 1]
    scales, counts = scaler_state(be, 1000.3, clean=1)
    inverse = scales[1]
    be.loss_scale_step(scales, counts, dynamic=False, growth_interval=2)  # static: stays
    assert scales[0] == np.float32(1000.3) and scales[1] == inverse and counts[1] == 2


def test_sgd_update_is_the_three_ops_and_skip_leaves_everything():
    be = NumpyBackend()
    rng = np.random.default_rng(1)
    w, d = (rng.standard_normal(50).astype(np.float32) for _ in range(2))
    rate = be.from_host([0.01])
    for weight_decay in (True, False):
        want_w, want_d = w.copy(), d.copy()
        if weight_decay:
            be.axpy(-0.0005 * 64, want_w, want_d)
        be.axpy_array(rate, want_d, want_w)
        be.scal(0.9, want_d)
        got_w, got_d = w.copy(), d.copy()
        flag = be.int_zeros(1)
        be.sgd_update(got_w, got_d, rate, -0.0005 * 64, 0.9, skip=flag, weight_decay=weight_decay)
        np.testing.assert_array_equal(got_w, want_w)
        np.testing.assert_array_equal(got_d, want_d)
        flag[0] = 1
        be.sgd_update(got_w, got_d, rate, -0.0005 * 64, 0.9, skip=flag, weight_decay=weight_decay)
        np.testing.assert_array_equal(got_w, want_w)
        np.testing.assert_array_equal(got_d, want_d)


def test_adam_update_skips_when_flagged():
    be = NumpyBackend()
    w, d, m, v = (be.from_host(np.linspace(-1, 1, 7) + k) for k in range(4))
    step = be.from_host([0.001, 1])
    before = [a.copy() for a in (w, d, m, v)]
    flag = be.int_zeros(1)
    flag[0] = 1
    be.adam_update(w, d, m, v, step, 0.9, 0.999, 1e-7, 0.0005, skip=flag)
    for got, want in zip((w, d, m, v), before):
        np.testing.assert_array_equal(got, want)
    flag[0] = 0
    be.adam_update(w, d, m, v, step, 0.9, 0.999, 1e-7, 0.0005, skip=flag)
    assert not np.array_equal(w, before[0]) and not d.any()


# ---- GPU --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda():
    if not cuda_available():
        pytest.skip("needs PyCUDA and a CUDA GPU")
    from darknet_py.backends.cuda_backend import CudaBackend

    return CudaBackend(0)


# Sizes around the table kernels' chunk (2048 elements a block) and a few big ones; views
# at odd offsets (not 16-byte aligned), an empty array among them.
TABLE_SIZES = [(0, 0), (1, 0), (2047, 3), (2048, 1), (2049, 0), (5, 7), (100_003, 0), (31, 1)]


def table_arrays(rng, be, bad=None):
    """(host arrays, backend views) of TABLE_SIZES; bad = (array, index, value) planted."""
    hosts, views = [], []
    for k, (n, offset) in enumerate(TABLE_SIZES):
        host = rng.uniform(-3, 3, n + offset).astype(np.float32)
        if bad is not None and bad[0] == k:
            host[offset + bad[1]] = bad[2]
        whole = be.from_host(host)
        hosts.append(host[offset:].copy())
        views.append(whole[offset : offset + n])
    return hosts, views


@gpu
@pytest.mark.parametrize(
    "bad", [None, (6, 99_999, np.inf), (2, 2046, np.nan), (1, 0, -np.inf), (3, 2047, np.inf)]
)
@pytest.mark.parametrize("dynamic", [True, False])
def test_cuda_scaler_kernels_match_numpy(cuda, bad, dynamic):
    delta_host = np.random.default_rng(8).uniform(-1, 1, 3001).astype(np.float32)
    results = []
    for be in (NumpyBackend(), cuda):
        _, views = table_arrays(np.random.default_rng(7), be, bad)
        table = be.array_table(views)
        scales, counts = scaler_state(be, 1024.0, clean=2, skipped=5)
        delta = be.from_host(delta_host)
        be.scale_by(scales[0:1], delta)
        be.fill(counts[0:1], 0)
        be.unscale_check(table, scales, counts)
        after_unscale = [be.to_host(v) for v in views]
        flag_after_check = int(be.to_host(counts)[0])
        be.loss_scale_step(scales, counts, dynamic, 3)
        be.rescale_or_zero(table, scales, counts)
        results.append(
            (
                be.to_host(delta),
                after_unscale,
                flag_after_check,
                be.to_host(scales),
                be.to_host(counts),
                [be.to_host(v) for v in views],
            )
        )
    (d0, u0, f0, s0, c0, v0), (d1, u1, f1, s1, c1, v1) = results
    np.testing.assert_array_equal(d1, d0)
    assert f1 == f0 == (bad is not None)
    for got, want in zip(u1, u0):
        np.testing.assert_array_equal(got, want)  # a single rounded product: exact
    np.testing.assert_array_equal(s1, s0)
    np.testing.assert_array_equal(c1, c0)
    for got, want in zip(v1, v0):
        np.testing.assert_array_equal(got, want)


@gpu
def test_cuda_rescale_or_zero_writes_every_element(cuda):
    """A skipped step's buffers poisoned with NaN come back all zero; the views' neighbours
    stay as they were."""
    whole = cuda.from_host(np.full(3 * 4099, np.nan, np.float32))
    views = [whole[1:4097], whole[4099 : 4099 + 2049], whole[2 * 4099 : 2 * 4099 + 1]]
    table = cuda.array_table(views)
    scales, counts = scaler_state(cuda, 2.0)
    cuda.write(counts, [1, 0, 0])
    cuda.rescale_or_zero(table, scales, counts)
    host = cuda.to_host(whole)
    for view_range in ((1, 4097), (4099, 4099 + 2049), (2 * 4099, 2 * 4099 + 1)):
        assert not host[slice(*view_range)].any()
    untouched = np.ones(host.size, bool)
    for lo, hi in ((1, 4097), (4099, 4099 + 2049), (2 * 4099, 2 * 4099 + 1)):
        untouched[lo:hi] = False
    assert np.isnan(host[untouched]).all()


@gpu
@pytest.mark.parametrize("weight_decay", [True, False])
def test_cuda_sgd_update_is_the_three_kernels_bit_for_bit(cuda, weight_decay):
    rng = np.random.default_rng(3)
    w0, d0 = (rng.standard_normal(70_001).astype(np.float32) for _ in range(2))
    rate = cuda.from_host([0.0123])
    three = [cuda.from_host(w0), cuda.from_host(d0)]
    if weight_decay:
        cuda.axpy(-0.0005 * 64, three[0], three[1])
    cuda.axpy_array(rate, three[1], three[0])
    cuda.scal(0.9, three[1])
    fused = [cuda.from_host(w0), cuda.from_host(d0)]
    flag = cuda.int_zeros(1)
    cuda.sgd_update(*fused, rate, -0.0005 * 64, 0.9, skip=flag, weight_decay=weight_decay)
    for got, want in zip(fused, three):
        np.testing.assert_array_equal(cuda.to_host(got), cuda.to_host(want))
    ref = NumpyBackend()
    w, d = w0.copy(), d0.copy()
    ref.sgd_update(w, d, ref.from_host([0.0123]), -0.0005 * 64, 0.9, weight_decay=weight_decay)
    np.testing.assert_allclose(cuda.to_host(fused[0]), w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(cuda.to_host(fused[1]), d, rtol=1e-6, atol=1e-7)
    cuda.write(flag, [1])
    before = [cuda.to_host(a) for a in fused]
    cuda.sgd_update(*fused, rate, -0.0005 * 64, 0.9, skip=flag, weight_decay=weight_decay)
    for got, want in zip(fused, before):
        np.testing.assert_array_equal(cuda.to_host(got), want)


@gpu
def test_cuda_adam_update_skips_when_flagged(cuda):
    arrays = [cuda.from_host(np.linspace(-1, 1, 5000, dtype=np.float32) + k) for k in range(4)]
    step = cuda.from_host([0.001, 1])
    flag = cuda.int_zeros(1)
    cuda.write(flag, [1])
    before = [cuda.to_host(a) for a in arrays]
    cuda.adam_update(*arrays, step, 0.9, 0.999, 1e-7, 0.0005, skip=flag)
    for got, want in zip(arrays, before):
        np.testing.assert_array_equal(cuda.to_host(got), want)
    cuda.write(flag, [0])
    cuda.adam_update(*arrays, step, 0.9, 0.999, 1e-7, 0.0005, skip=flag)
    assert not cuda.to_host(arrays[1]).any()  # d zeroed: the update ran


def train_setting_scales(net, data, scales_at):
    """Train on data; before iteration i set the scale to scales_at[i] where given (an
    overflow forced without Python in the recorded step: 2**100 overflows fp16)."""
    history = []
    for i, (x, truth) in enumerate(data):
        if i in scales_at:
            net.loss_scaler.scale = scales_at[i]
        net.train_iteration(x, truth)
        history.append((net.loss_scaler.scale, net.loss_scaler.skipped))
    return history


@gpu
@pytest.mark.parametrize("net_extra", ["", "adam=1"])
@OVERFLOWS
def test_cuda_fp16_training_matches_the_host_scaler(cuda, net_extra):
    """The same fp16 training on the GPU with the device scaler and with the host-side one
    it replaced, the scale forced up to overflow twice: the same scale history and skipped
    count, the same weights within 1e-4 of the training's own movement (the two run the
    same kernels with the same roundings, so they are expected to agree to the bit; the
    tolerance only allows for a nondeterministic reduction), one recorded pass."""
    from darknet_py.backends.cuda_backend import CudaBackend

    scales_at = {2: 2.0**100, 3: 2.0**100, 4: 16.0}
    nets = [
        make_net(CudaBackend(0), kind, None, 1, net_extra)
        for kind in (precisions.LossScaler, HostLossScaler)
    ]
    start = parameters(nets[0])
    data = list(batches(nets[0], 10))
    device, host = (train_setting_scales(net, data, scales_at) for net in nets)
    assert device == host
    assert device[-1][1] == 2 and device[4][0] == 16.0
    # By name: the update buffers made at the first training step are not in `start`.
    start, after = dict(start), dict(parameters(nets[1]))
    assert dict(parameters(nets[0])).keys() == after.keys()
    moved = sum(
        float(((after[name] - a) ** 2).sum()) for name, a in start.items() if "rolling" not in name
    )
    apart = sum(
        float(((after[name] - a) ** 2).sum())
        for name, a in parameters(nets[0])
        if "rolling" not in name
    )
    print(f"device against host scaler: {np.sqrt(apart / moved):.3g} of the training's movement")
    assert np.sqrt(apart / moved) < 1e-4
    assert nets[0].graphs.captured == 1 and nets[0].graphs.replayed == len(data) - 1
