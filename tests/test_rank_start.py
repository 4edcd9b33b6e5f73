"""The start of a data-parallel rank (issue: ranks ready in parallel): what needs no
device overlaps what does, and the log says how long the start took."""

import os
import re
import threading
import time

import pytest
from helpers import darknet_py, data_file, finish, write_run_cfg

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.distributed import launcher
from darknet_py.distributed.comm import CommError, free_port

TRACE = re.compile(r"^darknet-py: trace pid (\d+): (.*) at ([0-9.]+) s$")


class FakeGpu:
    """A GPU backend stand-in: its start (start_device) and NCCL's are recorded; the start
    holds until `ready` is set."""

    def __init__(self):
        self.ready, self.events, self.left = threading.Event(), [], []
        self.asked = []  # threads that asked for the backend (their rendezvous done)

    def start_device(self, device):
        self.events.append(("start_device", device, threading.current_thread().name))

    def get_backend(self, device):
        self.asked.append(threading.current_thread().name)
        self.ready.wait(10)
        self.events.append(("backend", device, threading.current_thread().name))
        fake = self

        class Backend:
            def leave_thread(self):
                fake.left.append(threading.current_thread().name)

        return Backend()


def pending_pair(monkeypatch, fake, nccl):
    monkeypatch.setattr(launcher, "start_device", fake.start_device)
    monkeypatch.setattr(launcher, "get_backend", fake.get_backend)
    monkeypatch.setattr(launcher, "NcclCommunicator", nccl)
    master = ("127.0.0.1", free_port())
    return [
        launcher.PendingCommunicator(r, 2, f"cuda:{r}", master, timeout=10, connect_timeout=10)
        for r in range(2)
    ]


def test_gpu_ranks_meet_before_their_device_is_ready_and_start_nccl_after(monkeypatch):
    fake, made = FakeGpu(), []

    def nccl(tcp, index):
        made.append((tcp.rank, index, fake.ready.is_set()))
        return tcp

    comms = pending_pair(monkeypatch, fake, nccl)
    # The device's start is asked for on the main thread, returning at once.
    assert [e[0] for e in fake.events] == ["start_device", "start_device"]
    assert {e[2] for e in fake.events} == {threading.main_thread().name}
    deadline = time.monotonic() + 10
    while len(fake.asked) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    # Both ranks met over TCP and wait for their device; NCCL has not started.
    assert sorted(fake.asked) == [
        "darknet-py rank 0 communicator",
        "darknet-py rank 1 communicator",
    ]
    assert made == [] and not fake.ready.is_set()
    fake.ready.set()
    for c in comms:
        c.ready()
    assert sorted(made) == [(0, 0, True), (1, 1, True)]
    # NCCL started on the communicators' threads, which let go of the context after.
    assert sorted(fake.left) == ["darknet-py rank 0 communicator", "darknet-py rank 1 communicator"]
    sums = [None, None]
    threads = [
        threading.Thread(
            target=lambda r=r: sums.__setitem__(r, comms[r].sum_values(NumpyBackend(), [r + 1.0]))
        )
        for r in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sums == [[3.0], [3.0]]
    for c in comms:
        c.close()


def test_a_failed_nccl_start_is_raised_at_the_first_collective_naming_the_rank(monkeypatch):
    fake = FakeGpu()
    fake.ready.set()

    def nccl(tcp, index):
        raise CommError(
            f"rank {tcp.rank} (GPU {index}): ncclCommInitRank failed: "
            f"unhandled system error (NCCL error 2)"
        )

    comms = pending_pair(monkeypatch, fake, nccl)
    for rank, c in enumerate(comms):
        with pytest.raises(CommError, match=rf"^rank {rank} \(GPU {rank}\): ncclCommInitRank"):
            c.barrier()
        c.abort()
    assert len(fake.left) == 2  # the context was let go on the failure too


def traces(out):
    """{pid: {event: seconds}} of DARKNET_TRACE_START's lines."""
    found = {}
    for line in out.splitlines():
        m = TRACE.match(line)
        if m:
            found.setdefault(int(m[1]), {}).setdefault(m[2], float(m[3]))
    return found


def test_a_ranks_start_order_and_its_first_iteration_line(bars, tmp_path):
    cfg, data = write_run_cfg(tmp_path, max_batches=2), data_file(bars, tmp_path / "b")
    started = time.monotonic()
    code, out, err = finish(
        darknet_py(
            "train",
            cfg,
            data,
            "--ranks",
            2,
            "--seed",
            3,
            env=dict(os.environ, DARKNET_TRACE_START="1"),
        )
    )
    wall = time.monotonic() - started
    assert code == 0, err
    ranks = {pid: t for pid, t in traces(out).items() if "network loaded" in t}
    assert len(ranks) == 2
    for t in ranks.values():
        rank = next(e.split()[1] for e in t if e.endswith("rendezvous done"))
        # Connected, labels checked and the loader's first batches queued before the
        # network is built; rank 0's parameters sent after it.
        assert (
            t[f"rank {rank} rendezvous done"] <= t["network loaded"]
            and t["labels checked"]
            <= t["loader started before the network"]
            <= t["network loaded"]
            <= t["parameters from rank 0 on their way"]
            <= t["first batch loaded"]
            <= t["first iteration trained (passes, exchange, update)"]
        ), t
    lines = [line for line in out.splitlines() if line.startswith("first iteration after")]
    assert len(lines) == 1  # rank 0's log alone
    m = re.fullmatch(
        r"first iteration after ([0-9.]+) s \(it started ([0-9.]+) s after the "
        r"process\)",
        lines[0],
    )
    assert m, lines[0]
    end, begin = float(m[1]), float(m[2])
    # Counted from the command's start (the launcher's), which the ranks' traces share.
    rank0 = min(ranks.values(), key=lambda t: "rank 0 rendezvous done" not in t)
    assert 0 < begin <= end < wall
    assert rank0["first iteration trained (passes, exchange, update)"] <= end + 0.01
    order = [
        line.split(",")[0] if line[:2] in ("1,", "2,") else line[:21]
        for line in out.splitlines()
        if line[:2] in ("1,", "2,") or line.startswith("first iteration after")
    ]
    assert order == ["1", "first iteration after", "2"]  # after iteration 1's own line


def test_a_loader_started_early_loads_ahead_and_is_pinned_later(bars):
    from darknet_py.data.loader import DataLoader

    paths = (bars / "train.list").read_text().split()
    pinned = []

    def pin(host):
        pinned.append(host.nbytes)
        return lambda: pinned.append(-host.nbytes)

    with (
        DataLoader(
            paths,
            task="classifier",
            labels=["horiz", "vert"],
            classes=2,
            width=12,
            height=12,
            batch=4,
            workers=1,
            seed=1,
        ) as early,
        DataLoader(
            paths,
            task="classifier",
            labels=["horiz", "vert"],
            classes=2,
            width=12,
            height=12,
            batch=4,
            workers=1,
            seed=1,
        ) as plain,
    ):
        early.load_ahead()  # the workers build the first batches before anyone asks
        queued = sorted(early._pool.queued)
        assert queued == list(range(early._pool.ahead)) and queued
        early.pin_with(pin)
        slot_bytes = 4 * sum(early._pool.maker.floats(4, (12, 12)))
        assert pinned == [slot_bytes] * len(queued)  # the slots made so far, once each
        early.pin_with(pin)
        assert len(pinned) == len(queued)
        for _ in range(3):
            a, b = early.next_batch(), plain.next_batch()
            assert (a.x == b.x).all() and (a.truth == b.truth).all()  # the same batches
    # Slots made later were pinned as they were made; every slot was unpinned at close.
    assert len([n for n in pinned if n > 0]) > len(queued)
    assert sorted(n for n in pinned if n < 0) == sorted(-n for n in pinned if n > 0)
