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

from .comm import CommError, Communicator

# nccl.h's values
NCCL_SUCCESS = 0
NCCL_IN_PROGRESS = 7
NCCL_FLOAT32 = 7
NCCL_SUM = 0
NCCL_UNIQUE_ID_BYTES = 128
GROUP_OPS = 256             # operations per ncclGroupStart/End (NCCL caps a group's count)


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
    raise CommError("NCCL (libnccl.so.2) not found: install it with pip install "
                    "nvidia-nccl-cu13 (darknet-py's multigpu extra) or from NVIDIA's "
                    f"packages ({errors[-1]})")


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
    for name in ("ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclCommAbort",
                 "ncclCommGetAsyncError", "ncclAllReduce", "ncclBroadcast", "ncclGroupStart",
                 "ncclGroupEnd"):
        getattr(lib, name).restype = i
    return lib


class NcclCommunicator(Communicator):
    """NCCL collectives on one GPU's CUDA backend arrays, queued on the backend's stream
    (in order with the kernels that made the gradients). Rendezvous and barriers go
    through `tcp` (a TcpCommunicator), which also notices a rank that ends. The CUDA
    context of the rank's device must be current (make its backend first)."""

    def __init__(self, tcp, device_index, lib=None):
        self.tcp = tcp
        self.rank, self.world_size = tcp.rank, tcp.world_size
        self.device_index = device_index
        self.lib = lib if lib is not None else load_library()
        self.comm = ctypes.c_void_p()
        unique_id = NcclUniqueId()
        if self.rank == 0:
            self._check("ncclGetUniqueId", self.lib.ncclGetUniqueId(ctypes.byref(unique_id)))
        # The id is 128 raw bytes (NULs included): copied whole, never as a C string.
        shared = tcp.broadcast_bytes(ctypes.string_at(ctypes.byref(unique_id),
                                                      NCCL_UNIQUE_ID_BYTES),
                                     NCCL_UNIQUE_ID_BYTES)
        ctypes.memmove(ctypes.byref(unique_id), shared, NCCL_UNIQUE_ID_BYTES)
        self._check("ncclCommInitRank", self.lib.ncclCommInitRank(
            ctypes.byref(self.comm), self.world_size, unique_id, self.rank))

    def _check(self, call, result):
        if result not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
            text = self.lib.ncclGetErrorString(result)
            text = text.decode(errors="replace") if text else f"error {result}"
            raise CommError(f"rank {self.rank} (GPU {self.device_index}): {call} failed: "
                            f"{text} (NCCL error {result})")

    def _async_error(self):
        """An error NCCL met in the background (a peer lost mid-collective)."""
        state = ctypes.c_int(NCCL_SUCCESS)
        self._check("ncclCommGetAsyncError",
                    self.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(state)))
        self._check("a collective", state.value)

    @staticmethod
    def _stream(be):
        return ctypes.c_void_p(be.stream.handle)

    def _grouped(self, be, name, call, arrays, *args):
        """`call` (ncclAllReduce or ncclBroadcast) in place on each array, GROUP_OPS arrays
        to an NCCL group: NCCL launches a group's operations together, so a network's few
        hundred parameter arrays cost a launch or two rather than one each. (ctypes'
        functions carry no __name__: `name` is the call's, for errors.)"""
        stream = self._stream(be)
        arrays = [a for a in arrays if a.size]
        for first in range(0, len(arrays), GROUP_OPS):
            self._check("ncclGroupStart", self.lib.ncclGroupStart())
            try:
                for a in arrays[first:first + GROUP_OPS]:
                    self._check(name, call(ctypes.c_void_p(a.ptr), ctypes.c_void_p(a.ptr),
                                           a.size, NCCL_FLOAT32, *args, self.comm, stream))
            except CommError:
                self.lib.ncclGroupEnd()   # close the group; the first error is the one to tell
                raise
            self._check("ncclGroupEnd", self.lib.ncclGroupEnd())
        self._async_error()

    def all_reduce_sum(self, be, arrays):
        self._grouped(be, "ncclAllReduce", self.lib.ncclAllReduce, arrays, NCCL_SUM)

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
