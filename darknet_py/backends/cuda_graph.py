"""CUDA graphs through the driver API (libcuda) with ctypes: PyCUDA has no graph API.
(Also the page-locking of existing host memory, which PyCUDA's register_host_memory
refuses for arrays that do not own their memory, such as views of shared memory.)

A graph is recorded by stream capture: between begin_capture(stream) and
end_capture(stream) the kernels and copies queued on the stream are recorded, not run;
instantiate() turns the recording into an executable graph that launch() replays with
one driver call (about 1 us per kernel instead of ~5-10 us of Python launch overhead).

Every driver call's result is checked: a failure raises GraphError naming the call and
the driver's error name and text. Handles are plain integers (the driver's pointers).
"""

import ctypes
import ctypes.util

# CUstreamCaptureMode. Relaxed: this thread may still allocate device memory while a
# capture is open (an array first allocated inside a captured step); nothing is lost,
# since host synchronisation on the capturing stream still fails and ends the capture.
CAPTURE_MODE_RELAXED = 2
# CUgraphInstantiate_flags: none of them (auto-free, upload, device launch) is needed.
_INSTANTIATE_FLAGS = 0


class GraphError(RuntimeError):
    """A CUDA graph driver call failed (capture, instantiation, launch)."""


_lib = None


def _driver():
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise GraphError(f"cannot load the CUDA driver library ({name}): {e}") from None
        for fn, args in (
            ("cuStreamBeginCapture_v2", (ctypes.c_void_p, ctypes.c_int)),
            ("cuStreamEndCapture", (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))),
            (
                "cuGraphInstantiateWithFlags",
                (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong),
            ),
            ("cuGraphLaunch", (ctypes.c_void_p, ctypes.c_void_p)),
            ("cuGraphExecDestroy", (ctypes.c_void_p,)),
            ("cuGraphDestroy", (ctypes.c_void_p,)),
            ("cuMemHostRegister_v2", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)),
            ("cuMemHostUnregister", (ctypes.c_void_p,)),
            ("cuGetErrorName", (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))),
            ("cuGetErrorString", (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))),
        ):
            try:
                f = getattr(lib, fn)
            except AttributeError:
                raise GraphError(
                    f"the CUDA driver ({name}) has no {fn}: CUDA graphs need a "
                    f"driver for CUDA 11.4 or newer"
                ) from None
            f.argtypes, f.restype = args, ctypes.c_int
        _lib = lib
    return _lib


def _error_text(lib, code):
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(name)) or not name.value:
        return f"CUDA error {code}"
    lib.cuGetErrorString(code, ctypes.byref(text))
    return f"{name.value.decode()}: {(text.value or b'').decode()}"


def _check(call, code):
    if code:
        raise GraphError(f"{call} failed: {_error_text(_driver(), code)}")


def begin_capture(stream_handle):
    """Start recording the work queued on the stream (a PyCUDA Stream's .handle)."""
    lib = _driver()
    _check("cuStreamBeginCapture", lib.cuStreamBeginCapture_v2(stream_handle, CAPTURE_MODE_RELAXED))


def end_capture(stream_handle):
    """Stop recording; returns the graph handle. Raises GraphError when the capture was
    invalidated (an operation that cannot be captured was queued or synchronised)."""
    lib = _driver()
    graph = ctypes.c_void_p()
    _check("cuStreamEndCapture", lib.cuStreamEndCapture(stream_handle, ctypes.byref(graph)))
    if not graph.value:
        raise GraphError("cuStreamEndCapture returned no graph")
    return graph.value


def instantiate(graph):
    lib = _driver()
    graph_exec = ctypes.c_void_p()
    _check(
        "cuGraphInstantiateWithFlags",
        lib.cuGraphInstantiateWithFlags(ctypes.byref(graph_exec), graph, _INSTANTIATE_FLAGS),
    )
    return graph_exec.value


def launch(graph_exec, stream_handle):
    _check("cuGraphLaunch", _driver().cuGraphLaunch(graph_exec, stream_handle))


def destroy(graph_exec, graph):
    """Free an executable graph and its graph (either may be None)."""
    lib = _driver()
    if graph_exec:
        _check("cuGraphExecDestroy", lib.cuGraphExecDestroy(graph_exec))
    if graph:
        _check("cuGraphDestroy", lib.cuGraphDestroy(graph))


def register_host(pointer, nbytes):
    """Page-lock nbytes of host memory at pointer for the current context."""
    _check("cuMemHostRegister", _driver().cuMemHostRegister_v2(pointer, nbytes, 0))


def unregister_host(pointer):
    _check("cuMemHostUnregister", _driver().cuMemHostUnregister(pointer))
