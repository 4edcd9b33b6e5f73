"""NCCL through ctypes: the few calls data-parallel training needs, on CUDA arrays.

libnccl.so.2 comes from the `nvidia-nccl-cu13` wheel when it is installed (the `multigpu`
extra: pip install '.[multigpu]'), else from the system's library path, when a CUDA rank
creates its NcclCommunicator (launcher.connect): machines without NCCL never load it. Every NCCL
error becomes a CommError naming the rank, the call and NCCL's own words.
"""

import ctypes
import glob
import importlib.util
import os

import numpy as np

from .comm import CommError, Communicator

# nccl.h's values
NCCL_SUCCESS = 0
NCCL_IN_PROGRESS = 7
NCCL_FLOAT16 = 6
NCCL_FLOAT32 = 7
NCCL_BFLOAT16 = 9
NCCL_SUM = 0
NCCL_UNIQUE_ID_BYTES = 128
GROUP_OPS = 256  # operations per ncclGroupStart/End (NCCL caps a group's count)


# A CUDA backend array's element type -> NCCL's: fp32, and the 16-bit exchange's fp16 and
# bf16 (the CUDA backend keeps bf16 as its bits in uint16).
NCCL_TYPES = {
    np.dtype(np.float32): NCCL_FLOAT32,
    np.dtype(np.float16): NCCL_FLOAT16,
    np.dtype(np.uint16): NCCL_BFLOAT16,
}


def nccl_type(array):
    return NCCL_TYPES[np.dtype(getattr(array, "dtype", np.float32))]


class CudaStreams:
    """What start_all_reduce_sum needs from CUDA: a stream for the sums and events that
    order it with the backend's stream (PyCUDA's, imported when first used)."""

    def stream(self):
        import pycuda.driver as drv

        return drv.Stream()

    def event(self):
        import pycuda.driver as drv

        return drv.Event(drv.event_flags.DISABLE_TIMING)


class StreamSum:
    """A sum running on the communication stream: wait() makes the backend's stream wait
    for it (no wait on the host)."""

    def __init__(self, be, done):
        self.be, self.done = be, done

    def wait(self):
        self.be.stream.wait_for_event(self.done)


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


def library_candidates():
    """Where libnccl.so.2 is looked for, in order: the nvidia-nccl wheels' lib folders,
    then the name alone (the dynamic loader's search path)."""
    found = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found += sorted(glob.glob(os.path.join(root, "**", "libnccl.so.2"), recursive=True))
    return found + ["libnccl.so.2"]


def load_library(loader=ctypes.CDLL):
    errors = []
    for candidate in library_candidates():
        try:
            return _declare(loader(candidate))
        except OSError as e:
            errors.append(str(e))
    raise CommError(
        "NCCL (libnccl.so.2) not found: install it with pip install "
        "nvidia-nccl-cu13 (darknet-py's multigpu extra) or from NVIDIA's "
        f"packages ({errors[-1]})"
    )


def _declare(lib):
    """Argument and result types of the calls used (ctypes would guess them wrong)."""
    p, i, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetErrorString.argtypes = [i]
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(NcclUniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(p), i, NcclUniqueId, i]
    lib.ncclCommDestroy.argtypes = [p]
    lib.ncclCommAbort.argtypes = [p]
    lib.ncclCommGetAsyncError.argtypes = [p, ctypes.POINTER(i)]
    lib.ncclAllReduce.argtypes = [p, p, size, i, i, p, p]
    lib.ncclBroadcast.argtypes = [p, p, size, i, i, p, p]
    lib.ncclGroupStart.argtypes = []
    lib.ncclGroupEnd.argtypes = []
    for name in (
        "ncclGetUniqueId",
        "ncclCommInitRank",
        "ncclCommDestroy",
        "ncclCommAbort",
        "ncclCommGetAsyncError",
        "ncclAllReduce",
        "ncclBroadcast",
        "ncclGroupStart",
        "ncclGroupEnd",
    ):
        getattr(lib, name).restype = i
    return lib


class NcclCommunicator(Communicator):
    """NCCL collectives on one GPU's CUDA backend arrays, queued on the backend's stream
    (in order with the kernels that made the gradients). Rendezvous and barriers go
    through `tcp` (a TcpCommunicator), which also notices a rank that ends. The CUDA
    context of the rank's device must be current (make its backend first)."""

    def __init__(self, tcp, device_index, lib=None, streams=None):
        self.tcp = tcp
        self.streams = streams if streams is not None else CudaStreams()
        self._sum_stream = None  # start_all_reduce_sum's, made at its first call
        self.rank, self.world_size = tcp.rank, tcp.world_size
        self.device_index = device_index
        self.lib = lib if lib is not None else load_library()
        self.comm = ctypes.c_void_p()
        unique_id = NcclUniqueId()
        if self.rank == 0:
            self._check("ncclGetUniqueId", self.lib.ncclGetUniqueId(ctypes.byref(unique_id)))
        # The id is 128 raw bytes (NULs included): copied whole, never as a C string.
        shared = tcp.broadcast_bytes(
            ctypes.string_at(ctypes.byref(unique_id), NCCL_UNIQUE_ID_BYTES), NCCL_UNIQUE_ID_BYTES
        )
        ctypes.memmove(ctypes.byref(unique_id), shared, NCCL_UNIQUE_ID_BYTES)
        self._check(
            "ncclCommInitRank",
            self.lib.ncclCommInitRank(
                ctypes.byref(self.comm), self.world_size, unique_id, self.rank
            ),
        )

    def _check(self, call, result):
        if result not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
            text = self.lib.ncclGetErrorString(result)
            text = text.decode(errors="replace") if text else f"error {result}"
            raise CommError(
                f"rank {self.rank} (GPU {self.device_index}): {call} failed: "
                f"{text} (NCCL error {result})"
            )

    def _async_error(self):
        """An error NCCL met in the background (a peer lost mid-collective)."""
        state = ctypes.c_int(NCCL_SUCCESS)
        self._check(
            "ncclCommGetAsyncError", self.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(state))
        )
        self._check("a collective", state.value)

    def _grouped(self, be, name, call, arrays, *args, stream=None):
        """`call` (ncclAllReduce or ncclBroadcast) in place on each array, GROUP_OPS arrays
        to an NCCL group: NCCL launches a group's operations together, so a network's few
        hundred parameter arrays cost a launch or two rather than one each. (ctypes'
        functions carry no __name__: `name` is the call's, for errors.) Queued on the
        backend's stream, or on `stream`."""
        stream = ctypes.c_void_p((stream or be.stream).handle)
        arrays = [a for a in arrays if a.size]
        for first in range(0, len(arrays), GROUP_OPS):
            self._check("ncclGroupStart", self.lib.ncclGroupStart())
            try:
                for a in arrays[first : first + GROUP_OPS]:
                    self._check(
                        name,
                        call(
                            ctypes.c_void_p(a.ptr),
                            ctypes.c_void_p(a.ptr),
                            a.size,
                            nccl_type(a),
                            *args,
                            self.comm,
                            stream,
                        ),
                    )
            except CommError:
                self.lib.ncclGroupEnd()  # close the group; the first error is the one to tell
                raise
            self._check("ncclGroupEnd", self.lib.ncclGroupEnd())
        self._async_error()

    def all_reduce_sum(self, be, arrays):
        self._grouped(be, "ncclAllReduce", self.lib.ncclAllReduce, arrays, NCCL_SUM)

    def start_all_reduce_sum(self, be, arrays):
        """The sum on a stream of its own, after the work queued on the backend's stream so
        far (an event between them): the backward goes on while a bucket's gradients are
        summed. The NCCL calls stay outside CUDA graphs (network/executor.py's train_pass
        says why). 16-bit arrays are summed by NCCL in their own type, rounded hop by hop."""
        if self._sum_stream is None:
            self._sum_stream = self.streams.stream()
        queued = self.streams.event()
        queued.record(be.stream)
        self._sum_stream.wait_for_event(queued)
        self._grouped(
            be, "ncclAllReduce", self.lib.ncclAllReduce, arrays, NCCL_SUM, stream=self._sum_stream
        )
        done = self.streams.event()
        done.record(self._sum_stream)
        return StreamSum(be, done)

    def broadcast(self, be, arrays, root=0):
        self._grouped(be, "ncclBroadcast", self.lib.ncclBroadcast, arrays, int(root))

    def barrier(self, timeout=None):
        self.tcp.barrier(timeout)

    def abort(self):
        if self.comm:
            self.lib.ncclCommAbort(self.comm)
            self.comm = ctypes.c_void_p()
        self.tcp.abort()

    def close(self):
        if self.comm:
            self.lib.ncclCommDestroy(self.comm)
            self.comm = ctypes.c_void_p()
        self.tcp.close()
