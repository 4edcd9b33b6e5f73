"""The built-in check: run an exported model in ONNX Runtime and darknet-py's own forward
on the same input, and measure the largest difference of each raw output."""

import os

import numpy as np

from . import require
from .model import output_layers

CHECK_TOLERANCE = 1e-4  # relative to the output's largest magnitude, as the fixtures' tests


def session(model, threads=None, optimize=True, save_optimized=None):
    """An ONNX Runtime CPU session on a model (serialized bytes, or a file's path).
    threads: intra-op threads (None: intra_op_threads()). optimize: apply every graph
    optimisation (False for a model ONNX Runtime optimised and saved before, which loads
    faster as it is). save_optimized: (path, weights file name beside it) to save the
    optimised model to."""
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its warnings are not the user's business
    options.intra_op_num_threads = threads or intra_op_threads()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if save_optimized:
        options.optimized_model_filepath, weights_file = save_optimized
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", weights_file
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def intra_op_threads():
    """Threads for one ONNX Runtime operator: DARKNET_CPU_THREADS (as for the NumPy
    backend), else one per physical core this process may run on (the hardware threads of
    a core share its vector units), else 0: ONNX Runtime's own choice."""
    fixed = os.environ.get("DARKNET_CPU_THREADS", "").strip()
    if fixed.isdigit() and int(fixed) > 0:
        return int(fixed)
    return physical_cores() or 0


def physical_cores():
    """The physical cores among the CPUs this process may run on (Linux), else None."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = set()
    try:
        for cpu in os.sched_getaffinity(0):
            topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
            with open(topology + "physical_package_id") as f, open(topology + "core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
    except OSError:
        return None
    return len(cores) or None


def relative_difference(got, want):
    """max |got - want| over the largest finite |want|; equal values (infinities of a
    window wholly in Darknet's padding among them) differ by 0."""
    want = np.asarray(want, dtype=np.float64)
    if not want.size:
        return 0.0
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    finite = np.abs(want[np.isfinite(want)])
    scale = finite.max() if finite.size else 1.0
    with np.errstate(invalid="ignore"):
        diff = np.where(got == want, 0.0, np.abs(got - want))
    return float(np.nan_to_num(diff, nan=np.inf).max() / (scale or 1.0))


def compare(net, sess, x):
    """{output name: largest relative difference} of the raw outputs on x (N, C, H, W)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if net.batch != len(x):
        net.set_batch(len(x))
    net.predict(x)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"input": x})))
    return {
        name: relative_difference(got[name], net.layer_output(layer.index))
        for name, layer in output_layers(net)
    }
