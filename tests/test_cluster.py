"""Clusters (issue 28): ranks that srun or torchrun started (distributed/cluster.py, the
launcher's run_as_cluster_rank), and stop signals to one process or the whole group
(training/stops.py): one backup, one line naming the signal, exit code 128 + signal."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import data_file, finish, weights_floats, write_run_cfg

from darknet_py.data.loader import default_workers
from darknet_py.distributed.cluster import (
    ClusterEnvironmentError,
    ClusterRank,
    expand_hostlist,
    read_cluster_environment,
    slurm_without_srun,
)
from darknet_py.distributed.comm import free_port
from darknet_py.distributed.launcher import cluster_device
from darknet_py.training import stops
from darknet_py.weights import read_header


# ---- the launchers' environment ---------------------------------------------------------------
@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node[01-04,07],gpu5", ["node01", "node02", "node03", "node04", "node07", "gpu5"]),
        ("gpu5", ["gpu5"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]-g[1,3]", ["r1-g1", "r1-g3", "r2-g1", "r2-g3"]),
        ("a,b[2],c", ["a", "b2", "c"]),
    ],
)
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[01-04", "node01]", "n[a-b]", "n[4-2]", "a,,b"])
def test_a_bad_host_list_is_named(text):
    with pytest.raises(ClusterEnvironmentError, match="host list"):
        expand_hostlist(text)


SRUN = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_ID": "123456",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
}


def test_srun_tasks_are_ranks_and_meet_on_the_first_host():
    rank = read_cluster_environment(SRUN)
    assert rank == ClusterRank("Slurm", 5, 8, 1, 4, ("gpu07", 29500 + 456))
    moved = read_cluster_environment(dict(SRUN, MASTER_ADDR="ib-gpu07", MASTER_PORT="4000"))
    assert moved.master == ("ib-gpu07", 4000)
    assert read_cluster_environment(dict(SRUN, SLURM_NTASKS_PER_NODE="2")).local_world_size == 2
    # a batch script's own process: not a task of srun
    batch = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    assert read_cluster_environment(batch) is None
    assert "SLURM_NTASKS=8, but srun did not start this process" in slurm_without_srun(batch)
    assert slurm_without_srun(SRUN) is None


def test_torchrun_variables_are_ranks_and_win_over_slurm():
    env = dict(
        SRUN,
        RANK="3",
        WORLD_SIZE="4",
        LOCAL_RANK="3",
        LOCAL_WORLD_SIZE="4",
        MASTER_ADDR="10.0.0.1",
        MASTER_PORT="29400",
    )
    assert read_cluster_environment(env) == ClusterRank("torchrun", 3, 4, 3, 4, ("10.0.0.1", 29400))
    assert read_cluster_environment({}) is None
    # torchrun's agent holds MASTER_PORT for its own store: rank 0 takes the next port
    assert read_cluster_environment(dict(env, TORCHELASTIC_RUN_ID="1")).master == (
        "10.0.0.1",
        29401,
    )


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR is not"),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "RANK=2 with WORLD_SIZE=2: expected a rank from 0 to 1",
        ),
        (
            {"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "RANK='x': expected a whole number",
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
            "MASTER_PORT=70000: not a TCP port",
        ),
        (dict(SRUN, SLURM_STEP_NODELIST="gpu[07-08", SLURM_JOB_NODELIST=""), "unbalanced"),
    ],
)
def test_incomplete_launcher_variables_are_named(env, message):
    with pytest.raises(
        ClusterEnvironmentError, match=message.replace("(", r"\(").replace("[", r"\[")
    ):
        read_cluster_environment(env)


def test_each_rank_takes_its_local_gpu():
    rank = ClusterRank("Slurm", 5, 8, 1, 4, ("gpu07", 29500))
    assert cluster_device(rank, "auto", 4) == "cuda:1"
    assert cluster_device(rank, "auto", 1) == "cuda:0"  # the launcher showed it one GPU
    assert cluster_device(rank, "auto", 0) == "cpu"
    assert cluster_device(rank, "cpu", 4) == "cpu"
    with pytest.raises(ValueError, match="local rank 3 has no GPU: this machine shows 2"):
        cluster_device(ClusterRank("Slurm", 7, 8, 3, 4, ("h", 1)), "auto", 2)
    with pytest.raises(ValueError, match="leave out --gpu/--device"):
        cluster_device(rank, "cuda:0", 4)


@pytest.mark.parametrize(
    "cpus, ranks, workers",
    [(64, 1, 16), (64, 4, 15), (128, 8, 15), (8, 1, 7), (8, 2, 3), (8, 4, 1), (2, 4, 1)],
)
def test_ranks_of_one_machine_share_its_cpus_before_the_cap(monkeypatch, cpus, ranks, workers):
    # 4 ranks on 64 CPUs once got 16 // 4 = 4 workers each, too few to feed a GPU.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert default_workers(ranks) == workers


# ---- runs ---------------------------------------------------------------------------------------
def darknet_py_process(*args, env=None):
    """`darknet-py ARGS` in its own process group (as a shell runs a job)."""
    return subprocess.Popen(
        [sys.executable, "-m", "darknet_py", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def test_two_torchrun_processes_train_as_two_ranks(bars, tmp_path):
    cfg = write_run_cfg(tmp_path)
    port = free_port()
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ranks = [
        darknet_py_process(
            "train",
            cfg,
            data_file(bars, tmp_path / "torchrun"),
            "--seed",
            3,
            "--device",
            "cpu",
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
        )
        for r in (1, 0)
    ]
    (code1, out1, err1), (code0, out0, err0) = [finish(r, timeout=60) for r in ranks]
    assert (code0, code1) == (0, 0), err0 + err1
    assert out1.strip() == (  # rank 1: its start line only
        f"darknet-py: rank 1 of 2: pid {ranks[0].pid}, cpu, local rank 1, from the torchrun "
        f"environment (RANK, WORLD_SIZE, LOCAL_RANK), rank 0 at 127.0.0.1:{port}"
    )
    assert "on the CPU x 2 ranks" in out0 and "Saved" in out0
    # The same ranks, shards and seeds as `--ranks 2`: the same weights.
    code, _, err = finish(
        darknet_py_process(
            "train", cfg, data_file(bars, tmp_path / "ranks"), "--ranks", 2, "--seed", 3
        )
    )
    assert code == 0, err
    seen, torchrun = weights_floats(tmp_path / "torchrun" / "tiny_final.weights")
    assert seen == 32
    np.testing.assert_array_equal(
        torchrun, weights_floats(tmp_path / "ranks" / "tiny_final.weights")[1]
    )


def test_scancel_of_two_torchrun_ranks_saves_one_backup(bars, tmp_path):
    """srun's ranks get scancel's SIGTERM, every process of each (no launcher of ours in
    between)."""
    cfg, data = write_run_cfg(tmp_path, max_batches=100000), data_file(bars, tmp_path / "b")
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    rank1, rank0 = [
        darknet_py_process(
            "train", cfg, data, "--device", "cpu", env=dict(env, RANK=str(r), LOCAL_RANK=str(r))
        )
        for r in (1, 0)
    ]
    for line in rank0.stdout:
        if line.startswith("3, "):
            os.killpg(rank1.pid, signal.SIGTERM)
            os.killpg(rank0.pid, signal.SIGTERM)
            break
    (code0, out0, err0), (code1, out1, err1) = finish(rank0, 30), finish(rank1, 30)
    assert (code0, code1) == (143, 143), err0 + err1
    assert err0 == err1 == "" and "(SIG" not in out1
    assert [l for l in out0.splitlines() if "(SIG" in l][0].startswith("Terminated (SIGTERM)")
    assert_one_complete_backup(tmp_path / "b")


def test_a_torchrun_rank_whose_peer_dies_says_so_in_one_line(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path, max_batches=100000), data_file(bars, tmp_path / "b")
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    rank1 = darknet_py_process(
        "train", cfg, data, "--device", "cpu", env=dict(env, RANK="1", LOCAL_RANK="1")
    )
    rank0 = darknet_py_process(
        "train", cfg, data, "--device", "cpu", env=dict(env, RANK="0", LOCAL_RANK="0")
    )
    for line in rank0.stdout:
        if line.startswith("3, "):
            rank0.kill()
            break
    code, _, err = finish(rank1, 30)
    finish(rank0, 30)
    assert code == 3
    assert err.strip() == (
        "darknet-py: error: rank 1: rank 0 ended (its connection to rank 1 closed)"
    )


def test_launcher_options_are_refused_under_a_launcher(bars, tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    code, _, err = finish(
        darknet_py_process(
            "train", write_run_cfg(tmp_path), data_file(bars, tmp_path / "b"), "--ranks", 2, env=env
        )
    )
    assert code == 2
    assert "torchrun started this process as rank 0 of 2: leave out --gpus" in err
    assert not (tmp_path / "b").exists()


def start_and_wait_for(args, first_line="3, ", env=None):
    """A training run (its own process group) and its pids, once `first_line` shows."""
    run = darknet_py_process(*args, env=env)
    pids, lines = [run.pid], []
    for line in run.stdout:
        lines.append(line)
        if line.startswith("darknet-py: rank "):
            pids.append(int(line.split("pid ")[1].split(",")[0]))
        if line.startswith(first_line):
            return run, pids, lines
    raise AssertionError("".join(lines) + run.stderr.read())


def all_gone(pids):
    return not [
        p
        for p in pids
        if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
    ]


def assert_one_complete_backup(backup_dir, ranks=2):
    names = os.listdir(backup_dir)
    assert not [n for n in names if n.startswith(".")], names  # no temporary left
    backup = backup_dir / "tiny.backup"
    with open(backup, "rb") as f:
        _, seen, _, offset = read_header(f, backup)
    floats = (os.path.getsize(backup) - offset) // 4
    assert seen > 0 and seen % (4 * ranks) == 0  # whole iterations of ranks x 4 images
    return seen, floats


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_group_sigterm_of_two_ranks_saves_one_backup_and_exits_143(bars, tmp_path, start):
    # Forked ranks (DARKNET_RANK_START=fork) once inherited the launcher's ignored signals.
    cfg, data = write_run_cfg(tmp_path, max_batches=100000), data_file(bars, tmp_path / "b")
    run, pids, _ = start_and_wait_for(
        ["train", cfg, data, "--ranks", 2], env=dict(os.environ, DARKNET_RANK_START=start)
    )
    os.killpg(run.pid, signal.SIGTERM)  # what timeout and scancel do
    code, out, err = finish(run, timeout=30)
    assert code == 128 + signal.SIGTERM, err
    assert err == ""
    backup = tmp_path / "b" / "tiny.backup"
    stops = [line for line in out.splitlines() if "(SIG" in line]
    assert len(stops) == 1 and stops[0].startswith("Terminated (SIGTERM) at iteration ")
    assert stops[0].endswith(f": saved {backup} (resume with --weights {backup})")
    seen, floats = assert_one_complete_backup(tmp_path / "b")
    assert floats == weights_floats(backup)[1].size > 0
    assert seen == 8 * int(stops[0].split("iteration ")[1].split(":")[0])
    assert all_gone(pids)


def test_ctrl_c_twice_keeps_the_backup_and_prints_no_traceback(bars, tmp_path):
    cfg = write_run_cfg(tmp_path, max_batches=100000)
    for trial, gap in enumerate((0.0, 0.03)):
        data = data_file(bars, tmp_path / f"b{trial}")
        run, pids, _ = start_and_wait_for(["train", cfg, data, "--ranks", 2])
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        time.sleep(gap)
        os.killpg(run.pid, signal.SIGINT)
        code, out, err = finish(run, timeout=30)
        assert code == 130, err
        assert "Traceback" not in err and "Aborted" not in err and "KeyboardInterrupt" not in err
        stops = [line for line in out.splitlines() if "(SIG" in line]
        assert len(stops) == 1 and stops[0].startswith("Interrupted (SIGINT) at iteration ")
        assert_one_complete_backup(tmp_path / f"b{trial}")
        assert all_gone(pids)


def test_sigterm_to_a_single_process_names_it_and_saves(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path, max_batches=100000), data_file(bars, tmp_path / "b")
    run, pids, _ = start_and_wait_for(["train", cfg, data, "--device", "cpu", "--workers", 1])
    os.killpg(run.pid, signal.SIGHUP)  # the terminal closed
    code, out, err = finish(run, timeout=30)
    assert code == 128 + signal.SIGHUP, err
    assert [l for l in out.splitlines() if "(SIG" in l][0].startswith("Hung up (SIGHUP)")
    assert_one_complete_backup(tmp_path / "b", ranks=1)


def test_one_backup_answers_a_sigusr1_that_reaches_a_rank_twice(monkeypatch):
    # A group SIGUSR1 reaches each rank directly and again through the launcher, and the
    # ranks take it on either side of a step's end: the backup they agree on answers the
    # copies still pending and those arriving just after; a later SIGUSR1 asks again.
    now = [100.0]
    monkeypatch.setattr(stops.time, "monotonic", lambda: now[0])
    signals = stops.StopSignals()
    signals._handle(signal.SIGUSR1, None)  # pending here: another rank asked first
    signals.saved()  # the ranks agreed: backup written
    assert not signals.take_save()
    now[0] += 0.01
    signals._handle(signal.SIGUSR1, None)  # the launcher's copy, just after
    assert not signals.take_save()
    now[0] += stops.SAVE_REPEAT_SECONDS
    signals._handle(signal.SIGUSR1, None)  # a new warning
    assert signals.take_save() and not signals.take_save()


def test_sigusr1_saves_a_backup_and_training_goes_on(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path, max_batches=40), data_file(bars, tmp_path / "b")
    run, pids, _ = start_and_wait_for(["train", cfg, data, "--ranks", 2], first_line="2, ")
    os.killpg(run.pid, signal.SIGUSR1)  # Slurm's --signal=USR1@SECONDS before pre-emption
    code, out, err = finish(run, timeout=60)
    assert code == 0, err
    saves = [l for l in out.splitlines() if l.startswith("SIGUSR1 at iteration ")]
    assert len(saves) == 1 and saves[0].endswith("; training goes on")
    saved_at = int(saves[0].split("iteration ")[1].split(":")[0])
    assert saved_at < 40
    assert weights_floats(tmp_path / "b" / "tiny.backup")[0] == 8 * saved_at
    assert weights_floats(tmp_path / "b" / "tiny_final.weights")[0] == 8 * 40
    assert f"Saved {tmp_path / 'b' / 'tiny_final.weights'} after 40 iterations" in out


def test_a_ctrl_c_during_the_save_does_not_break_it(bars, tmp_path, monkeypatch):
    """The second Ctrl-C lands inside the backup's save (made to happen there): the save
    completes, and the run ends with the first signal."""
    from helpers import Lines

    from darknet_py.train import train
    from darknet_py.training.checkpoints import Checkpoints
    from darknet_py.training.stops import Stopped

    save = Checkpoints.save
    during_save = []

    def save_with_a_ctrl_c(self, net, path):
        if path == self.backup:
            os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs
            during_save.append(path)
        save(self, net, path)

    def ctrl_c_at_3(result):
        if result.iterations == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Checkpoints, "save", save_with_a_ctrl_c)
    lines = Lines()
    with pytest.raises(Stopped) as stop:
        train(
            write_run_cfg(tmp_path, max_batches=50),
            data_file(bars, tmp_path / "b"),
            device="cpu",
            log=lines,
            workers=0,
            on_iteration=ctrl_c_at_3,
        )
    assert stop.value.signum == signal.SIGINT and during_save
    assert [l for l in lines if "(SIG" in l][0].startswith("Interrupted (SIGINT) at iteration 3")
    assert weights_floats(tmp_path / "b" / "tiny.backup")[0] == 3 * 4
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
