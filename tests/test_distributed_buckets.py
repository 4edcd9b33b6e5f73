"""Gradient buckets (darknet_py/distributed/buckets.py): the plan, the exchange started
between pieces of the backward, its equality with the exchange after the backward, the
16-bit exchange's tolerance and the loss scaler's agreement on skipped steps. Ranks are
threads talking over TCP on 127.0.0.1, as in test_distributed.py."""

import os

import numpy as np
import pytest
from helpers import darknet_py, data_file, finish, weights_floats, write_run_cfg
from test_cuda_graphs import RecordingBackend
from test_distributed import run_ranks

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.distributed import buckets as bucketing
from darknet_py.distributed.comm import Done, from_wire, sum_in_order, to_wire
from darknet_py.distributed.data_parallel import DataParallel
from darknet_py.network import Network
from darknet_py.precision import round_to

CFG = """[net]
batch={batch}
subdivisions={subdivisions}
width=8
height=8
channels=2
learning_rate={rate}
momentum=0.9
decay=0.0005
max_batches=100
policy=poly
power=2

[convolutional]
batch_normalize=1
filters=6
size=3
stride=1
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=6
size=3
stride=1
pad=1
activation=leaky
{stop}
[maxpool]
size=2
stride=2

[convolutional]
filters=8
size=3
stride=1
pad=1
activation=leaky

[connected]
output=3
activation=linear

[softmax]
"""


# Smooth activations and no batch norm: a net whose training a small change to the sums
# changes a little (the one above, leaky with batch norm on 4 images, is chaotic: sums
# changed by one part in 10^7 move its weights after 20 iterations by 3% of what training
# moved them, about what a 16-bit exchange does; docs/training.md).
SMOOTH_CFG = CFG.replace("batch_normalize=1\n", "").replace(
    "activation=leaky", "activation=logistic"
)


def make_net(
    rank=0,
    batch=4,
    subdivisions=2,
    stop="",
    backend=None,
    precision=None,
    graphs=False,
    rate=0.05,
    cfg=CFG,
):
    net = Network(
        parse_cfg_text(cfg.format(batch=batch, subdivisions=subdivisions, stop=stop, rate=rate)),
        "buckets.cfg",
        seed=11 if rank == 0 else 40 + rank,
        backend=backend or NumpyBackend(),
        precision=precision,
    )
    net.graphs.enabled = graphs
    return net


def data(iterations, images, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.random((iterations, images, 2, 8, 8)).astype(np.float32)
    truth = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (iterations, images))]
    return x, truth


def params(net):
    return [
        (f"{layer.index}.{name}", np.array(a, copy=True))
        for layer in net.layers
        for name, a in layer.params()
    ]


def train_ranks(
    world_size,
    iterations=4,
    bucket_bytes=0,
    exchange="auto",
    make=make_net,
    per_rank=4,
    subdivisions=2,
    before_iteration=None,
):
    """Each rank trains `iterations` iterations of per_rank images on its own share of one
    data set; returns each rank's (network, parameters)."""
    x, truth = data(iterations, world_size * per_rank)

    def body(comm):
        net = make(comm.rank)
        DataParallel(comm, bucket_bytes=bucket_bytes, exchange=exchange).attach(net)
        mine = slice(comm.rank * per_rank, (comm.rank + 1) * per_rank)
        for it in range(iterations):
            if before_iteration is not None:
                before_iteration(net, comm.rank, it)
            net.train_iteration(x[it, mine], truth[it, mine])
        return net, params(net)

    return run_ranks(world_size, body)


def assert_same_params(a, b):
    assert [n for n, _ in a] == [n for n, _ in b]
    for (name, pa), (_, pb) in zip(a, b):
        np.testing.assert_array_equal(pa, pb, err_msg=name)


class Comm:
    """A one-rank stand-in for a communicator: records what each sum was asked for."""

    rank, world_size = 0, 2

    def __init__(self):
        self.sums = []

    def start_all_reduce_sum(self, be, arrays):
        self.sums.append([be.storage_of(a) for a in arrays])
        return Done()


# ---- the plan ---------------------------------------------------------------------------
def test_the_plan_takes_every_update_buffer_once_in_reverse_layer_order_within_the_size():
    net = make_net()
    x, truth = data(1, 4)
    net.train_pass(x[0, :2], truth[0, :2])  # makes the update buffers; one pass accumulated
    before = [np.array(a) for a in net.update_buffers()[0]]
    cap = 600  # bytes: 150 floats; the [connected] weights (3 x 128) are larger alone
    plan = bucketing.GradientBuckets(net, Comm(), cap, "fp32")
    updates = net.update_buffers()[0]
    assert [id(a) for a in plan.views] == [id(a) for a in reversed(updates)]  # the views
    for view, old in zip(reversed(updates), reversed(before)):
        np.testing.assert_array_equal(view, old)  # the accumulated values carried over
    assert sum(b.size for b in plan.buckets) == sum(a.size for a in updates)
    layer_of = [
        i
        for i, layer in enumerate(net.layers)
        for owner in layer.param_owners()
        for name, _ in owner.params()
        if not name.startswith("rolling_")
    ]
    assert len(layer_of) == len(updates)
    order = list(reversed(layer_of))
    assert order == sorted(order, reverse=True)  # reverse layer order
    assert len(plan.buckets) >= 4
    for bucket in plan.buckets:
        assert bucket.size * 4 <= cap or len(bucket.entries) == 1
        assert np.shares_memory(bucket.flat, bucket.arrays[0])
        last = [id(v) for v in plan.views].index(id(bucket.arrays[-1]))
        assert bucket.ready_after == order[last]  # its lowest layer
    assert plan.stops == tuple(sorted({b.ready_after for b in plan.buckets} | {0}, reverse=True))


def test_a_layer_below_stopbackward_gets_its_buckets_started_with_the_last_piece():
    net = make_net(stop="stopbackward=1\n")
    x, truth = data(1, 4)
    net.train_pass(x[0, :2], truth[0, :2])
    assert net.backward_end == 2
    plan = bucketing.GradientBuckets(net, Comm(), 200, "fp32")
    assert plan.stops[-1] == 2
    assert {b.ready_after for b in plan.starts[-1]} >= {0, 1}


def test_settings_come_from_the_environment_and_bad_ones_say_what_is_wrong():
    assert bucketing.bucket_bytes({}) == 25 * 2**20
    assert bucketing.bucket_bytes({"DARKNET_BUCKET_MB": "0.5"}) == 2**19
    assert bucketing.bucket_bytes({"DARKNET_BUCKET_MB": "0"}) == 0
    for bad in ("-1", "lots", "inf", "nan"):
        with pytest.raises(ValueError, match=f"DARKNET_BUCKET_MB={bad}: expected megabytes"):
            bucketing.bucket_bytes({"DARKNET_BUCKET_MB": bad})
    assert bucketing.exchange_setting({}) == "auto"
    assert bucketing.exchange_setting({"DARKNET_EXCHANGE": "FP32"}) == "fp32"
    with pytest.raises(ValueError, match="DARKNET_EXCHANGE=fp8: expected auto or fp32"):
        bucketing.exchange_setting({"DARKNET_EXCHANGE": "fp8"})
    assert [bucketing.exchange_storage(p) for p in ("fp32", "tf32", "fp16", "bf16")] == [
        "fp32",
        "fp32",
        "fp16",
        "bf16",
    ]
    assert bucketing.exchange_storage("fp16", "fp32") == "fp32"


# ---- the exchange -------------------------------------------------------------------------
def test_each_bucket_is_summed_right_after_the_layer_that_completes_it():
    net = make_net(subdivisions=1)
    comm = Comm()
    parallel = DataParallel(comm, bucket_bytes=600, exchange="auto")
    net.data_parallel = parallel
    events = []
    for layer in net.layers:
        layer.backward = (lambda f, i: lambda n: (f(n), events.append(("backward", i))))(
            layer.backward, layer.index
        )
    started = comm.start_all_reduce_sum
    comm.start_all_reduce_sum = lambda be, arrays: (
        events.append(("sum", len(comm.sums))),
        started(be, arrays),
    )[1]
    x, truth = data(1, 4)
    net.train_pass(x[0], truth[0])
    plan = parallel._buckets
    expected = []
    for i in range(len(net.layers) - 1, -1, -1):
        expected.append(("backward", i))
        if i in plan.stops:
            piece = plan.stops.index(i)
            count = len(plan.starts[piece]) + (piece == 0)  # the statistics with the first
            expected += [("sum", None)] * count
    assert [(kind, None if kind == "sum" else i) for kind, i in events] == expected
    assert len(comm.sums) == len(plan.buckets) + 1
    assert comm.sums[0] == ["fp32"] * 4  # the two BN layers' rolling mean and variance


@pytest.mark.parametrize("stop", ["", "stopbackward=1\n"])
def test_bucketed_exchange_gives_the_weights_of_the_exchange_after_the_backward(stop):
    # 3 ranks, 2 passes an iteration, momentum, batch norm: the sums of each element run in
    # rank order either way, so the weights agree bit for bit.
    def make(rank):
        return make_net(rank, stop=stop)

    after = train_ranks(3, bucket_bytes=0, make=make)
    bucketed = train_ranks(3, bucket_bytes=600, make=make)
    assert len(bucketed[0][0].data_parallel._buckets.buckets) >= 4
    assert after[0][0].data_parallel._buckets is None
    for (_, a), (_, b) in zip(after, bucketed):
        assert_same_params(a, b)
    assert_same_params(bucketed[0][1], bucketed[2][1])  # replicas stay identical
    fresh = params(make_net(0, stop=stop))
    assert not np.array_equal(fresh[-1][1], bucketed[0][1][-1][1])  # training moved them


def test_replayed_pieces_give_the_weights_of_eager_passes():
    # RecordingBackend records each piece as a CUDA graph would (test_cuda_graphs.py): a
    # replay runs the recorded ops, and the sums between the pieces run outside them.
    eager = train_ranks(2, iterations=5, bucket_bytes=0)

    def recorded(rank):
        return make_net(rank, backend=RecordingBackend(), graphs=True)

    replayed = train_ranks(2, iterations=5, bucket_bytes=600, make=recorded)
    net = replayed[0][0]
    assert net.graphs.captured == 2 and net.graphs.replayed >= 4
    for (_, a), (_, b) in zip(eager, replayed):
        assert_same_params(a, b)


# ---- 16-bit exchange ----------------------------------------------------------------------
def test_the_wire_and_the_sum_round_as_nccl_does():
    values = np.array([1.0, 1 + 2**-10, 3e-8, 70000.0, -2.5], np.float32)
    for storage in ("fp16", "bf16"):
        rounded = round_to(values, storage)
        data = to_wire(rounded, storage)
        assert len(data) == 2 * len(values)
        np.testing.assert_array_equal(from_wire(data, storage), rounded)
    # Rounded after each addition: 2048 + 1 + 1 is 2048 in fp16, 2050 summed once.
    parts = [np.float32([2048.0]), np.float32([1.0]), np.float32([1.0])]
    assert sum_in_order(parts, "fp16")[0] == 2048.0
    assert sum_in_order(parts, "fp32")[0] == 2050.0


def test_round_and_widen_scaled_pack_a_bucket():
    be = NumpyBackend()
    src = be.from_host(np.float32([1.0, 3.0, 1e-3, 65504.0 * 2, -7.0]))
    for storage, scale in (("fp16", 0.25), ("bf16", 1.0)):
        packed = be.storage_zeros(src.size, storage)
        be.round_scaled(src, packed, scale)
        np.testing.assert_array_equal(packed, round_to(src * np.float32(scale), storage))
        back = be.zeros(src.size)
        be.widen_scaled(packed, back, 1 / scale)
        np.testing.assert_allclose(back, src, rtol=2**-8)
    with pytest.raises(TypeError, match="round_scaled: dst kept at fp32"):
        be.round_scaled(src, be.zeros(5), 1.0)


def change_of_training(a, b, start):
    """How much the weights a differ from b, relative to how far training moved b from
    start: ||a - b|| / ||b - start|| over every parameter but the rolling statistics."""
    kept = [i for i, (name, _) in enumerate(start) if ".rolling_" not in name]
    squares = [
        sum(float(((x[i][1] - y[i][1]) ** 2).sum()) for i in kept) for x, y in ((a, b), (b, start))
    ]
    return float(np.sqrt(squares[0] / squares[1]))


@pytest.mark.parametrize("precision,tolerance", [("fp16", 0.005), ("bf16", 0.04)])
def test_16_bit_exchange_stays_within_its_stated_tolerance(precision, tolerance):
    # docs/training.md states the figures (fp16 0.17%, bf16 1.4%): 20 iterations on 3
    # ranks, 16-bit sums against fp32 sums of the same fp16/bf16 training.
    def make(rank):
        return make_net(rank, precision=precision, cfg=SMOOTH_CFG)

    wide = train_ranks(3, iterations=20, bucket_bytes=600, exchange="fp32", make=make)
    narrow = train_ranks(3, iterations=20, bucket_bytes=600, make=make)
    plan = narrow[0][0].data_parallel._buckets
    assert plan.storage == precision and all(b.packed is not None for b in plan.buckets)
    assert wide[0][0].data_parallel._buckets.storage == "fp32"
    assert_same_params(narrow[0][1], narrow[2][1])  # every rank the same bits
    assert 0 < change_of_training(narrow[0][1], wide[0][1], params(make(0))) < tolerance


def test_every_rank_skips_the_step_whose_gradients_overflow_on_one_rank():
    def poison(net, rank, iteration):
        if rank == 1 and iteration == 2:  # rank 1's gradient overflows in this iteration
            conv = net.layers[3]
            backward = conv.backward

            def overflowing(n):
                backward(n)
                conv.weight_updates[0] = np.inf
                conv.backward = backward

            conv.backward = overflowing

    def make(rank):
        return make_net(rank, precision="fp16")

    ranks = train_ranks(3, iterations=4, bucket_bytes=600, make=make, before_iteration=poison)
    assert [net.loss_scaler.skipped for net, _ in ranks] == [1, 1, 1]
    assert len({net.loss_scaler.scale for net, _ in ranks}) == 1
    for _net, p in ranks:
        assert all(np.isfinite(a).all() for _, a in p)
        assert_same_params(p, ranks[0][1])


# ---- the command ----------------------------------------------------------------------------
def test_train_ranks_give_the_same_weights_with_and_without_buckets(bars, tmp_path):
    runs = {}
    for mb in ("0", "0.0001"):  # 104 bytes: each of the 4 update buffers a bucket
        (tmp_path / mb).mkdir()
        cfg = write_run_cfg(tmp_path / mb)
        code, _, err = finish(
            darknet_py(
                "train",
                cfg,
                data_file(bars, tmp_path / mb / "b"),
                "--ranks",
                2,
                "--seed",
                3,
                "--bucket-mb",
                mb,
            )
        )
        assert code == 0, err
        runs[mb] = weights_floats(tmp_path / mb / "b" / "tiny_final.weights")
    assert runs["0"][0] == runs["0.0001"][0] == 32
    np.testing.assert_array_equal(runs["0"][1], runs["0.0001"][1])


def test_a_bad_bucket_setting_is_one_line(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path), data_file(bars, tmp_path / "b")
    code, out, err = finish(
        darknet_py("train", cfg, data, "--ranks", 2, env=dict(os.environ, DARKNET_BUCKET_MB="many"))
    )
    assert code == 2
    assert err.strip() == (
        "darknet-py: error: DARKNET_BUCKET_MB=many: expected megabytes of "
        "gradients per bucket (a number >= 0; 0 sums every gradient after "
        "the backward)"
    )
    assert not os.path.exists(tmp_path / "b")
