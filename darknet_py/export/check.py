"""The built-in check: run an exported model in ONNX Runtime and darknet-py's own forward
on the same input, and measure the largest difference of each raw output."""
import numpy as np

from . import require
from .model import output_layers

CHECK_TOLERANCE = 1e-4   # relative to the output's largest magnitude, as the fixtures' tests


def session(model_bytes, threads=None):
    """An ONNX Runtime CPU session on serialized model bytes."""
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3   # its warnings are not the user's business
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


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
    return {name: relative_difference(got[name], net.layer_output(layer.index))
            for name, layer in output_layers(net)}
