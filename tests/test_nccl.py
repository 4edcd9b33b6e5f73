"""The NCCL communicator's argument handling and error mapping, with libnccl replaced by
a recording stand-in (no GPU or NCCL here); the real thing is in the gpu+multigpu tests."""

import ctypes
import threading
from types import SimpleNamespace

import pytest

from darknet_py.distributed import nccl
from darknet_py.distributed.comm import CommError, TcpCommunicator, free_port


class FakeNccl:
    """Records the calls; `fail` maps a call's name to the result code it returns."""

    ERRORS = {2: b"unhandled system error", 3: b"internal error", 6: b"remote process exited"}

    def __init__(self, fail=None, async_error=0, unique_id=b"\x00id\x00" + b"\x07" * 124):
        self.calls, self.fail, self.async_error, self.unique_id = (
            [],
            fail or {},
            async_error,
            unique_id,
        )

    def _result(self, name, *args):
        self.calls.append((name,) + args)
        return self.fail.get(name, 0)

    def ncclGetErrorString(self, code):
        return self.ERRORS.get(code)

    def ncclGetUniqueId(self, ref):
        ctypes.memmove(ref, self.unique_id, nccl.NCCL_UNIQUE_ID_BYTES)
        return self._result("ncclGetUniqueId")

    def ncclCommInitRank(self, comm_ref, nranks, unique_id, rank):
        comm_ref._obj.value = 0x77  # the communicator handle NCCL hands back
        return self._result("ncclCommInitRank", nranks, bytes(unique_id), rank)

    def ncclAllReduce(self, send, recv, count, dtype, op, comm, stream):
        return self._result("ncclAllReduce", send.value, recv.value, count, dtype, op, stream.value)

    def ncclBroadcast(self, send, recv, count, dtype, root, comm, stream):
        return self._result(
            "ncclBroadcast", send.value, recv.value, count, dtype, root, stream.value
        )

    def ncclGroupStart(self):
        return self._result("ncclGroupStart")

    def ncclGroupEnd(self):
        return self._result("ncclGroupEnd")

    def ncclCommGetAsyncError(self, comm, state_ref):
        state_ref._obj.value = self.async_error
        return self._result("ncclCommGetAsyncError")

    def ncclCommAbort(self, comm):
        return self._result("ncclCommAbort")

    def ncclCommDestroy(self, comm):
        return self._result("ncclCommDestroy")


def single(lib):
    return nccl.NcclCommunicator(TcpCommunicator(0, 1, ("127.0.0.1", 1)), 0, lib=lib)


BACKEND = SimpleNamespace(stream=SimpleNamespace(handle=0xABC))


def test_collectives_pass_pointers_counts_float32_sum_and_the_stream():
    lib = FakeNccl()
    comm = single(lib)
    arrays = [
        SimpleNamespace(ptr=0x1000, size=10),
        SimpleNamespace(ptr=0x2000, size=0),
        SimpleNamespace(ptr=0x3000, size=3),
    ]
    comm.all_reduce_sum(BACKEND, arrays)
    comm.broadcast(BACKEND, arrays[:1], root=0)
    reduce_calls = [c for c in lib.calls if c[0] == "ncclAllReduce"]
    assert reduce_calls == [
        ("ncclAllReduce", 0x1000, 0x1000, 10, 7, 0, 0xABC),
        ("ncclAllReduce", 0x3000, 0x3000, 3, 7, 0, 0xABC),
    ]  # in place
    assert ("ncclBroadcast", 0x1000, 0x1000, 10, 7, 0, 0xABC) in lib.calls
    comm.close()
    assert lib.calls[-1] == ("ncclCommDestroy",)


def test_collectives_go_in_groups_of_at_most_group_ops(monkeypatch):
    monkeypatch.setattr(nccl, "GROUP_OPS", 2)
    lib = FakeNccl()
    comm = single(lib)
    comm.all_reduce_sum(BACKEND, [SimpleNamespace(ptr=0x10 * (i + 1), size=4) for i in range(5)])
    names = [c[0] for c in lib.calls if c[0] != "ncclGetUniqueId" and c[0] != "ncclCommInitRank"]
    group = ["ncclGroupStart", "ncclAllReduce", "ncclAllReduce", "ncclGroupEnd"]
    assert names == group + group + [
        "ncclGroupStart",
        "ncclAllReduce",
        "ncclGroupEnd",
        "ncclCommGetAsyncError",
    ]


def test_a_failed_call_closes_its_group_and_names_the_call():
    lib = FakeNccl(fail={"ncclAllReduce": 2})
    with pytest.raises(CommError, match="ncclAllReduce failed"):
        single(lib).all_reduce_sum(BACKEND, [SimpleNamespace(ptr=8, size=4)])
    assert [c[0] for c in lib.calls][-2:] == ["ncclAllReduce", "ncclGroupEnd"]


def test_errors_become_one_line_naming_rank_call_and_nccl_words():
    comm = single(FakeNccl(fail={"ncclAllReduce": 2}))
    with pytest.raises(
        CommError,
        match=r"^rank 0 \(GPU 0\): ncclAllReduce failed: "
        r"unhandled system error \(NCCL error 2\)$",
    ):
        comm.all_reduce_sum(BACKEND, [SimpleNamespace(ptr=8, size=4)])
    with pytest.raises(CommError, match=r"ncclCommInitRank failed: internal error"):
        single(FakeNccl(fail={"ncclCommInitRank": 3}))
    with pytest.raises(CommError, match=r"a collective failed: remote process exited"):
        single(FakeNccl(async_error=6)).broadcast(BACKEND, [SimpleNamespace(ptr=8, size=4)])
    with pytest.raises(CommError, match=r"failed: error 99 \(NCCL error 99\)"):
        single(FakeNccl(fail={"ncclBroadcast": 99})).broadcast(
            BACKEND, [SimpleNamespace(ptr=8, size=4)]
        )


def test_abort_aborts_the_communicator():
    lib = FakeNccl()
    comm = single(lib)
    comm.abort()
    assert lib.calls[-1] == ("ncclCommAbort",)


def test_the_unique_id_reaches_every_rank_whole():
    master = ("127.0.0.1", free_port())
    libs = [FakeNccl(), FakeNccl(unique_id=b"\xff" * 128)]  # rank 1's own id is not used
    comms = [None, None]

    def start(rank):
        comms[rank] = nccl.NcclCommunicator(
            TcpCommunicator(rank, 2, master, timeout=10), rank, lib=libs[rank]
        )

    threads = [threading.Thread(target=start, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    init = [[c for c in lib.calls if c[0] == "ncclCommInitRank"][0] for lib in libs]
    assert init[0] == ("ncclCommInitRank", 2, FakeNccl().unique_id, 0)
    assert init[1] == ("ncclCommInitRank", 2, FakeNccl().unique_id, 1)  # NULs and all
    assert not [c for c in libs[1].calls if c[0] == "ncclGetUniqueId"]
    for comm in comms:
        comm.close()


def test_a_missing_library_says_how_to_get_it():
    def loader(path):
        raise OSError(f"{path}: cannot open shared object file")

    with pytest.raises(
        CommError,
        match=r"NCCL \(libnccl.so.2\) not found: install it with "
        r"pip install nvidia-nccl-cu13",
    ):
        nccl.load_library(loader)
    assert nccl.library_candidates()[-1] == "libnccl.so.2"


class FakeStream:
    def __init__(self, name, handle, log):
        self.name, self.handle, self.log = name, handle, log

    def wait_for_event(self, event):
        self.log.append(("wait", self.name, event.number))


class FakeStreams:
    """CudaStreams' stand-in: streams and events that write what they do into `log`."""

    def __init__(self, log):
        self.log, self.events = log, 0

    def stream(self):
        self.log.append(("new stream",))
        return FakeStream("sums", 0xC0FFEE, self.log)

    def event(self):
        self.events += 1
        event = SimpleNamespace(number=self.events)
        event.record = lambda stream: self.log.append(("record", event.number, stream.name))
        return event


def test_a_started_sum_runs_on_its_own_stream_between_two_events():
    import numpy as np

    lib = FakeNccl()
    comm = nccl.NcclCommunicator(
        TcpCommunicator(0, 1, ("127.0.0.1", 1)), 0, lib=lib, streams=FakeStreams(lib.calls)
    )
    be = SimpleNamespace(stream=FakeStream("compute", 0xABC, lib.calls))
    del lib.calls[:]
    first = comm.start_all_reduce_sum(
        be, [SimpleNamespace(ptr=0x10, size=5, dtype=np.dtype(np.float16))]
    )
    second = comm.start_all_reduce_sum(
        be,
        [
            SimpleNamespace(ptr=0x20, size=3, dtype=np.dtype(np.uint16)),
            SimpleNamespace(ptr=0x30, size=2, dtype=np.dtype(np.float32)),
        ],
    )
    first.wait()
    second.wait()
    assert lib.calls == [
        ("new stream",),  # once
        ("record", 1, "compute"),
        ("wait", "sums", 1),  # after the work queued so far
        ("ncclGroupStart",),
        ("ncclAllReduce", 0x10, 0x10, 5, nccl.NCCL_FLOAT16, 0, 0xC0FFEE),
        ("ncclGroupEnd",),
        ("ncclCommGetAsyncError",),
        ("record", 2, "sums"),
        ("record", 3, "compute"),
        ("wait", "sums", 3),
        ("ncclGroupStart",),
        ("ncclAllReduce", 0x20, 0x20, 3, nccl.NCCL_BFLOAT16, 0, 0xC0FFEE),  # bf16's bits
        ("ncclAllReduce", 0x30, 0x30, 2, nccl.NCCL_FLOAT32, 0, 0xC0FFEE),
        ("ncclGroupEnd",),
        ("ncclCommGetAsyncError",),
        ("record", 4, "sums"),
        ("wait", "compute", 2),
        ("wait", "compute", 4),
    ]  # the backend's stream, not the host
