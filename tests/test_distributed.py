"""Data-parallel training on the CPU (darknet_py/distributed/): the TCP communicator, the update
hook, the launcher's fault handling, resume, and two "nodes" meeting over 127.0.0.1."""

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from helpers import (
    CLASSIFIER_CFG,
    NO_BN_CFG,
    RUN_CFG,
    darknet_py,
    data_file,
    finish,
    weights_floats,
    write_run_cfg,
)

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.distributed.comm import CommError, TcpCommunicator, free_port, parse_master
from darknet_py.distributed.data_parallel import DataParallel, rank_seed, shard
from darknet_py.distributed.launcher import (
    LaunchError,
    PendingCommunicator,
    parse_gpus,
    rank_start_method,
)
from darknet_py.network import Network
from darknet_py.optimizer import current_rate
from darknet_py.processes import say


def run_ranks(world_size, body, timeout=60.0):
    """Run body(comm) for each rank in its own thread over 127.0.0.1; their results."""
    master = ("127.0.0.1", free_port())
    results, errors = [None] * world_size, []

    def rank_main(rank):
        try:
            comm = TcpCommunicator(rank, world_size, master, timeout=timeout)
            try:
                results[rank] = body(comm)
            finally:
                comm.close()
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    if errors:
        raise errors[0]
    return results


# ---- the communicator ------------------------------------------------------------------------
def test_all_reduce_broadcast_and_barrier_over_tcp():
    from darknet_py.backends.numpy_backend import NumpyBackend

    be = NumpyBackend()

    def body(comm):
        a = be.from_host(np.arange(5, dtype=np.float32) * (comm.rank + 1))
        b = be.from_host([comm.rank + 0.5])
        comm.all_reduce_sum(be, [a, b])
        c = be.from_host(np.full(3, 10.0 * comm.rank + 1))
        comm.broadcast(be, [c])
        comm.barrier(timeout=5)
        return a.copy(), b.copy(), c.copy(), comm.sum_value(be, comm.rank)

    results = run_ranks(3, body)
    for a, b, c, total in results:
        np.testing.assert_array_equal(a, np.arange(5) * 6)
        np.testing.assert_array_equal(b, [0.5 + 1.5 + 2.5])
        np.testing.assert_array_equal(c, [1, 1, 1])  # rank 0's values everywhere
        assert total == 3


def test_a_rank_that_ends_is_named_at_once():
    from darknet_py.backends.numpy_backend import NumpyBackend

    be = NumpyBackend()

    def body(comm):
        if comm.rank == 2:
            comm.close()  # as a process killed mid-run: its sockets close
            return None
        started = time.monotonic()
        with pytest.raises(CommError) as e:
            comm.all_reduce_sum(be, [be.zeros(4)])
        return str(e.value), time.monotonic() - started

    results = run_ranks(3, body, timeout=30)
    assert "rank 2 ended" in results[0][0]
    assert results[0][1] < 5  # not the 30 s timeout
    assert "rank 0 ended" in results[1][0]  # rank 0 gave up and closed its side


def test_a_silent_rank_times_out_with_its_number():
    from darknet_py.backends.numpy_backend import NumpyBackend

    be = NumpyBackend()
    release = threading.Event()

    def body(comm):
        if comm.rank == 1:
            release.wait(10)  # alive but never joins the sum
            return None
        try:
            with pytest.raises(CommError, match=r"rank 1 did not answer rank 0 within 1 s"):
                comm.all_reduce_sum(be, [be.zeros(4)])
        finally:
            release.set()

    run_ranks(2, body, timeout=1)


def test_a_pending_communicator_connects_behind_the_caller_and_sums():
    # The ranks connect on threads of their own; their first collective waits for that.
    master = ("127.0.0.1", free_port())
    comms = [PendingCommunicator(r, 2, "cpu", master, timeout=30) for r in range(2)]
    assert [c.rank for c in comms] == [0, 1] and comms[1].world_size == 2  # at once
    sums = [None, None]
    threads = [
        threading.Thread(
            target=lambda r=r: sums.__setitem__(
                r, comms[r].sum_values(NumpyBackend(), [r + 1.0, 2.0])
            )
        )
        for r in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sums == [[3.0, 4.0], [3.0, 4.0]]
    for c in comms:
        c.close()


def test_a_pending_communicator_raises_its_connect_error_at_first_use():
    comm = PendingCommunicator(
        0, 2, "cpu", ("127.0.0.1", free_port()), timeout=5, connect_timeout=0.5
    )
    with pytest.raises(CommError, match="rank 1"):
        comm.barrier()
    comm.abort()  # after a failed start: nothing to abort, no error


def test_options_are_checked():
    assert parse_master("10.0.0.1:29500") == ("10.0.0.1", 29500)
    for bad in ("10.0.0.1", ":80", "host:0", "host:http"):
        with pytest.raises(ValueError, match="expected HOST:PORT"):
            parse_master(bad)
    assert parse_gpus("0,1", 2) == ["cuda:0", "cuda:1"]
    assert parse_gpus("all", 3) == ["cuda:0", "cuda:1", "cuda:2"]
    with pytest.raises(
        ValueError,
        match=r"GPU 7 \(local rank 1\) does not exist; this "
        r"machine has 2 GPUs \(0-1\)",
    ):
        parse_gpus("0,7", 2)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        parse_gpus("all", 0)
    with pytest.raises(ValueError, match="listed twice"):
        parse_gpus("1,1", 2)
    assert shard(list(range(7)), 1, 3) == [1, 4]
    assert rank_seed(5, 0, 1) == 5  # one rank: the plain seed
    assert len({rank_seed(5, r, 2) for r in range(2)}) == 2


# ---- the update hook: 2 ranks == 1 rank with twice the batch -------------------------------
def test_two_ranks_train_like_one_with_twice_the_batch():
    rng = np.random.default_rng(3)
    steps = 3
    x = rng.random((steps, 8, 1, 12, 12)).astype(np.float32)
    truth = np.eye(2, dtype=np.float32)[rng.integers(0, 2, (steps, 8))]
    # One process: batch 8 in 4 passes of 2.
    whole = Network(
        parse_cfg_text(NO_BN_CFG.format(batch=8, subdivisions=4, momentum=0.9, max_batches=10)),
        "one.cfg",
        seed=7,
    )
    for step in range(steps):
        for p in range(4):
            whole.train_pass(x[step, 2 * p : 2 * p + 2], truth[step, 2 * p : 2 * p + 2])

    def body(comm):
        # Each rank: batch 4 in 2 passes of 2; rank r gets images 4r..4r+3. The ranks start
        # from different random weights: attach() gives them rank 0's.
        net = Network(
            parse_cfg_text(NO_BN_CFG.format(batch=4, subdivisions=2, momentum=0.9, max_batches=10)),
            "r.cfg",
            seed=7 if comm.rank == 0 else 99,
        )
        DataParallel(comm).attach(net)
        rates = []
        for step in range(steps):
            for p in range(2):
                k = 4 * comm.rank + 2 * p
                net.train_pass(x[step, k : k + 2], truth[step, k : k + 2])
            rates.append(net.last_rate)
        return net, rates

    (r0, rates0), (r1, rates1) = run_ranks(2, body)
    assert r0.seen == r1.seen == whole.seen == 24
    assert r0.iteration == whole.iteration == steps
    # Darknet's rate for an update counts the iteration it ends (seen already added).
    assert (
        rates0
        == rates1
        == [current_rate(0.05, whole.options.policy, i + 1, 10) for i in range(steps)]
    )
    for a, b, c in zip(r0.layers, r1.layers, whole.layers):
        for (name, pa), (_, pb), (_, pc) in zip(a.params(), b.params(), c.params()):
            np.testing.assert_array_equal(pa, pb, err_msg=name)  # replicas: bitwise equal
            # The sums run in another order than one process's: float32 rounding only.
            np.testing.assert_allclose(pa, pc, rtol=1e-5, atol=1e-6, err_msg=name)
    assert not np.allclose(
        r0.layers[0].weights,
        Network(
            parse_cfg_text(NO_BN_CFG.format(batch=8, subdivisions=4, momentum=0.9, max_batches=10)),
            "fresh.cfg",
            seed=7,
        )
        .layers[0]
        .weights,
    )


def test_batch_norm_replicas_stay_identical():
    rng = np.random.default_rng(4)
    x = rng.random((2, 4, 1, 12, 12)).astype(np.float32)
    truth = np.eye(2, dtype=np.float32)[rng.integers(0, 2, (2, 4))]

    def body(comm):
        net = Network(
            parse_cfg_text(
                CLASSIFIER_CFG.format(batch=2, subdivisions=1, momentum=0.9, max_batches=10)
            ),
            "bn.cfg",
            seed=1,
        )
        DataParallel(comm).attach(net)
        for step in range(2):
            net.train_pass(
                x[step, 2 * comm.rank : 2 * comm.rank + 2],
                truth[step, 2 * comm.rank : 2 * comm.rank + 2],
            )
        return net

    r0, r1 = run_ranks(2, body)
    for (name, pa), (_, pb) in zip(r0.layers[0].params(), r1.layers[0].params()):
        np.testing.assert_array_equal(pa, pb, err_msg=name)
    assert np.abs(r0.layers[0].rolling_mean).max() > 0  # the statistics did move


def test_parameters_sent_ahead_arrive_before_the_first_pass():
    # train()'s form of attach: the broadcast runs on its own thread while the rank starts
    # its loader; arrived() waits for it. Rank 1 starts from other weights and ends with
    # rank 0's, and an update before arrived() is refused rather than summing gradients
    # of other weights.
    def body(comm):
        net = Network(
            parse_cfg_text(
                CLASSIFIER_CFG.format(batch=2, subdivisions=1, momentum=0.9, max_batches=10)
            ),
            "ahead.cfg",
            seed=5 if comm.rank == 0 else 6,
        )
        early = Network(
            parse_cfg_text(
                CLASSIFIER_CFG.format(batch=2, subdivisions=1, momentum=0.9, max_batches=10)
            ),
            "early.cfg",
            seed=5,
        )
        hurried = DataParallel(comm)
        hurried.send_parameters(early)
        with pytest.raises(RuntimeError, match="without arrived"):
            hurried.reduce(early)
        hurried.arrived(early)
        parallel = DataParallel(comm)
        parallel.send_parameters(net)
        parallel.arrived(net)
        return {name: a.copy() for name, a in net.layers[0].params()}

    r0, r1 = run_ranks(2, body)
    first = Network(
        parse_cfg_text(
            CLASSIFIER_CFG.format(batch=2, subdivisions=1, momentum=0.9, max_batches=10)
        ),
        "r0.cfg",
        seed=5,
    )
    for name, c in first.layers[0].params():
        np.testing.assert_array_equal(r1[name], c, err_msg=name)
        np.testing.assert_array_equal(r0[name], c, err_msg=name)
    other = dict(
        Network(
            parse_cfg_text(
                CLASSIFIER_CFG.format(batch=2, subdivisions=1, momentum=0.9, max_batches=10)
            ),
            "r1.cfg",
            seed=6,
        )
        .layers[0]
        .params()
    )
    assert not np.array_equal(r1["weights"], other["weights"])  # rank 1 did start elsewhere


# ---- whole runs: the command starts the ranks ---------------------------------------------
@pytest.fixture(scope="module")
def two_rank_run(bars, tmp_path_factory):
    """A 2-rank run of 4 iterations, the reference for the other runs."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    cfg, data = write_run_cfg(tmp), data_file(bars, tmp / "backup")
    code, out, err = finish(darknet_py("train", cfg, data, "--ranks", 2, "--seed", 3))
    assert code == 0, err
    return tmp, out


def test_two_ranks_write_once_and_count_every_image(two_rank_run):
    tmp, out = two_rank_run
    seen, _ = weights_floats(tmp / "backup" / "tiny_final.weights")
    assert seen == 4 * 4 * 2  # iterations x batch x ranks
    assert "on the CPU x 2 ranks" in out
    iteration_lines = [l for l in out.splitlines() if l[:2] in ("1,", "2,", "3,", "4,")]
    assert len(iteration_lines) == 4  # one log (rank 0's), not one per rank
    assert iteration_lines[-1].split("|")[0].rstrip().endswith("32 images")
    assert sorted(os.listdir(tmp / "backup")) == [
        "chart_tiny.png",
        "tiny.history.json",
        "tiny_final.weights",
    ]


def test_resume_on_two_ranks_continues_seen_and_rate(two_rank_run, bars, tmp_path):
    reference, _ = two_rank_run
    cfg, data = write_run_cfg(tmp_path), data_file(bars, tmp_path / "backup")
    code, _, err = finish(
        darknet_py("train", cfg, data, "--ranks", 2, "--seed", 3, "--max-batches", 2)
    )
    assert code == 0, err
    first = tmp_path / "backup" / "tiny_final.weights"
    assert weights_floats(first)[0] == 2 * 8
    code, out, err = finish(
        darknet_py("train", cfg, data, "--ranks", 2, "--seed", 3, "--weights", first, "--overwrite")
    )
    assert code == 0, err
    assert "Resuming at iteration 2 (16 images seen)" in out
    rates = {
        int(l.split(",")[0]): float(l.split(" avg, ")[1].split(" rate")[0])
        for l in out.splitlines()
        if l[:2] in ("3,", "4,")
    }
    assert rates == {3: 0.025, 4: 0.025}  # steps=3 halves 0.05 from iteration 3 on
    seen, resumed = weights_floats(tmp_path / "backup" / "tiny_final.weights")
    whole_seen, whole = weights_floats(reference / "backup" / "tiny_final.weights")
    assert seen == whole_seen == 32
    # Momentum 0 and the loader's batches depend only on (seed, rank, iteration): the
    # resumed run is the uninterrupted one.
    np.testing.assert_array_equal(resumed, whole)


def test_ranks_are_forked_where_a_fork_can_work_unless_spawn_is_asked_for(monkeypatch):
    monkeypatch.delenv("DARKNET_RANK_START", raising=False)
    monkeypatch.delitem(sys.modules, "pycuda.driver", raising=False)
    assert rank_start_method(["cuda:0", "cuda:1"]) == "fork"
    assert rank_start_method(["cpu", "cpu"]) == "fork"
    monkeypatch.setitem(sys.modules, "pycuda.driver", object())  # CUDA may have started
    assert rank_start_method(["cuda:0"]) == "spawn"  # a fork could not use CUDA
    assert rank_start_method(["cpu"]) == "fork"
    monkeypatch.setenv("DARKNET_RANK_START", "spawn")
    assert rank_start_method(["cpu"]) == "spawn"
    monkeypatch.delitem(sys.modules, "pycuda.driver")
    assert rank_start_method(["cuda:0"]) == "spawn"
    monkeypatch.setenv("DARKNET_RANK_START", "fork")
    assert rank_start_method(["cuda:0"]) == "fork"
    monkeypatch.setenv("DARKNET_RANK_START", "thread")
    with pytest.raises(LaunchError, match="DARKNET_RANK_START=thread: expected fork or spawn"):
        rank_start_method(["cpu"])


def test_spawned_ranks_train_as_forked_ones(two_rank_run, bars, tmp_path):
    reference, _ = two_rank_run  # forked: the default
    cfg, data = write_run_cfg(tmp_path), data_file(bars, tmp_path / "backup")
    code, out, err = finish(
        darknet_py(
            "train",
            cfg,
            data,
            "--ranks",
            2,
            "--seed",
            3,
            env=dict(os.environ, DARKNET_RANK_START="spawn"),
        )
    )
    assert code == 0, err
    assert "on the CPU x 2 ranks" in out and "Traceback" not in err
    np.testing.assert_array_equal(
        weights_floats(tmp_path / "backup" / "tiny_final.weights")[1],
        weights_floats(reference / "backup" / "tiny_final.weights")[1],
    )


def test_two_nodes_of_one_rank_meet_over_localhost(two_rank_run, bars, tmp_path):
    reference, _ = two_rank_run
    cfg, data = write_run_cfg(tmp_path), data_file(bars, tmp_path / "backup")
    master = f"127.0.0.1:{free_port()}"
    nodes = [
        darknet_py(
            "train",
            cfg,
            data,
            "--ranks",
            1,
            "--nodes",
            2,
            "--node-rank",
            r,
            "--master",
            master,
            "--seed",
            3,
        )
        for r in (1, 0)
    ]
    results = [finish(node) for node in nodes]
    assert [code for code, _, _ in results] == [0, 0], results[0][2] + results[1][2]
    assert "Saved" in results[1][1] and "Saved" not in results[0][1]  # node 0 logs
    # The same ranks, seeds and shards as --ranks 2 on one node: the same weights.
    np.testing.assert_array_equal(
        weights_floats(tmp_path / "backup" / "tiny_final.weights")[1],
        weights_floats(reference / "backup" / "tiny_final.weights")[1],
    )


def child_pids(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_killing_a_rank_ends_the_run_naming_it_and_keeps_the_checkpoint(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path, max_batches=100000), data_file(bars, tmp_path / "b")
    backup = tmp_path / "b" / "tiny.backup"
    backup.parent.mkdir()
    net = Network(
        parse_cfg_text(RUN_CFG.format(batch=4, subdivisions=2, momentum=0.0, max_batches=100000)),
        cfg,
        seed=2,
    )
    net.seen = 8 * 3  # a checkpoint at iteration 3 (of 2 ranks x 4 images)
    net.save_weights(str(backup))
    saved = backup.read_bytes(), os.stat(backup).st_mtime_ns
    run = darknet_py("train", cfg, data, "--ranks", 2, "--weights", backup)
    pids = {}
    started = None
    for line in run.stdout:  # wait for the ranks' pids and a first iteration
        if line.startswith("darknet-py: rank "):
            rank, pid = line.split()[2], line.split("pid ")[1].split(",")[0]
            pids[int(rank)] = int(pid)
        if line.startswith("5, ") and len(pids) == 2:
            os.kill(pids[1], signal.SIGKILL)
            started = time.monotonic()
            break
    assert started is not None, run.stderr.read()
    code, _, err = finish(run, timeout=30)
    assert time.monotonic() - started < 30
    assert code == 2
    assert err.strip() == (
        "darknet-py: error: rank 1 died (killed by SIGKILL); the other ranks were stopped"
    )
    assert not [
        p
        for p in pids.values()
        if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
    ]
    assert (backup.read_bytes(), os.stat(backup).st_mtime_ns) == saved


def test_sigterm_saves_a_backup_from_rank_0_and_stops_every_rank(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path, max_batches=100000), data_file(bars, tmp_path / "b")
    run = darknet_py("train", cfg, data, "--ranks", 2)
    pids = []
    for line in run.stdout:
        if line.startswith("darknet-py: rank "):
            pids.append(int(line.split("pid ")[1].split(",")[0]))
        if line.startswith("3, "):
            run.send_signal(signal.SIGTERM)
            break
    code, out, err = finish(run, timeout=30)
    assert code == 128 + signal.SIGTERM, err
    backup = tmp_path / "b" / "tiny.backup"
    assert f"saved {backup} (resume with --weights {backup})" in out
    seen, _ = weights_floats(backup)
    assert seen > 0 and seen % 8 == 0  # whole iterations of 2 ranks x 4 images
    assert not [
        p
        for p in pids
        if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
    ]


def test_map_evaluates_on_rank_0_while_the_others_wait(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path), data_file(bars, tmp_path / "backup")
    code, out, err = finish(darknet_py("train", cfg, data, "--ranks", 2, "--map", "--map-every", 2))
    assert code == 0, err
    scores = [l for l in out.splitlines() if l.startswith("top-1 = ")]
    assert len(scores) == 2 and all("on 10 valid images" in l for l in scores)
    assert {"tiny_best.weights", "tiny_last.weights"} <= set(os.listdir(tmp_path / "backup"))


def test_bad_data_parallel_options_are_one_line(bars, tmp_path):
    from click.testing import CliRunner

    from darknet_py.cli import cli

    cfg, data = write_run_cfg(tmp_path), data_file(bars, tmp_path / "backup")
    runner = CliRunner()
    for args, message in (
        (["--gpus", "99"], "--gpus 99: GPU 99 (local rank 0) does not exist; this machine has"),
        (["--ranks", "2", "--nodes", "2"], "--nodes > 1 needs --master HOST:PORT"),
        (
            ["--ranks", "1", "--nodes", "2", "--node-rank", "1", "--master", "h"],
            "expected HOST:PORT",
        ),
        (["--ranks", "2", "--device", "cpu"], "leave out --gpu/--device"),
    ):
        result = runner.invoke(cli, ["train", cfg, data] + args)
        assert result.exit_code == 2, args
        assert message in result.output, result.output
    assert not os.path.exists(tmp_path / "backup")  # refused before anything started


def test_a_rank_that_stops_answering_ends_the_run_at_the_timeout(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path, max_batches=100000), data_file(bars, tmp_path / "b")
    run = darknet_py("train", cfg, data, "--ranks", 2, "--comm-timeout", 5)
    pids = {}
    for line in run.stdout:
        if line.startswith("darknet-py: rank "):
            pids[int(line.split()[2])] = int(line.split("pid ")[1].split(",")[0])
        if line.startswith("3, ") and len(pids) == 2:
            os.kill(pids[1], signal.SIGSTOP)  # alive, but silent
            started = time.monotonic()
            break
    code, _, err = finish(run, timeout=60)
    assert 4 <= time.monotonic() - started < 20  # rank 0 may have begun waiting first
    assert code == 2
    assert err.strip() == (
        "darknet-py: error: rank 0: rank 1 did not answer rank 0 within "
        "5 s (communication timeout); the other ranks were stopped"
    )
    assert (
        not os.path.exists(f"/proc/{pids[1]}")
        or open(f"/proc/{pids[1]}/stat").read().split()[2] == "Z"
    )


def test_a_ranks_line_goes_out_in_one_write():
    # Forked ranks print their start line at one moment into one pipe; print() wrote the
    # text and the newline apart on a write-through stream, and the lines interleaved.
    writes = []

    class Stream:
        def write(self, text):
            writes.append(text)

        def flush(self):
            writes.append("<flush>")

    say("darknet-py: rank 1 of 2: pid 7, cpu", Stream())
    assert writes == ["darknet-py: rank 1 of 2: pid 7, cpu\n", "<flush>"]
