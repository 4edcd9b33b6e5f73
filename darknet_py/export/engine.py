"""ONNX Runtime as a CPU engine: a network whose predict() runs an in-memory export.

OnnxRuntimeEngine stands in for the Network the commands load: it answers everything a
Network does (layers, input_shape, options, ...) from the network it wraps, and runs
predict()/forward() in ONNX Runtime, writing the raw outputs (every detection head, or
the output layer) into those layers' output buffers, where detect(), classify() and the
validation code read them. The NumPy backend stays the reference: ONNX Runtime's float
arithmetic differs from it in the last bits (the export test measures it)."""
import importlib.util
import sys

import numpy as np

from . import ExportError, require
from .check import session
from .model import export_model, output_layers

ENGINES = ("numpy", "onnxruntime")


class OnnxRuntimeEngine:
    engine = "onnxruntime"

    def __init__(self, net, threads=None):
        if net.be.name != "cpu":
            raise ExportError("--engine onnxruntime runs on the CPU; give --device cpu")
        self._net = net
        self._outputs = output_layers(net)
        self._session = session(export_model(net, batch=None).SerializeToString(), threads)
        self._names = [name for name, _ in self._outputs]

    def __getattr__(self, name):   # everything else is the wrapped network's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._net, name)

    def infer(self, x):
        """As Network.infer: x (N, C, H, W) in [0, 1] (or a photo, letterboxed as
        Network.predict does); every raw output left in its layer's buffer."""
        x = np.ascontiguousarray(self._net._as_network_input(x), dtype=np.float32)
        if len(x) != self._net.batch:
            self._net.set_batch(len(x))
        results = self._session.run(self._names, {"input": x})
        for (_, layer), value in zip(self._outputs, results):
            self._net.be.write(layer.output, value.reshape(-1))

    def predict(self, x):
        """As Network.predict: returns the last non-cost layer's output, and leaves every
        raw output in its layer's buffer."""
        self.infer(x)
        return self._net.layer_output(self._outputs[-1][1].index)

    def forward(self, x, truth=None, train=False):
        if train:
            raise ExportError("--engine onnxruntime runs inference only")
        self.predict(x)


def engine_device(engine, device):
    """The device to load a network on for `engine`: ONNX Runtime's is the CPU."""
    if engine != "onnxruntime":
        return device
    if device not in ("auto", "cpu"):
        raise ExportError(f"--engine onnxruntime runs on the CPU, not on --device {device}")
    return "cpu"


def with_engine(net, engine):
    """net itself for the NumPy engine (or None), else an OnnxRuntimeEngine around it."""
    if engine in (None, "numpy"):
        return net
    if engine != "onnxruntime":
        raise ExportError(f"unknown engine '{engine}' (known: {', '.join(ENGINES)})")
    return OnnxRuntimeEngine(net)


def load_with_engine(load, engine, device, **kwargs):
    """load(device=..., **kwargs) (load_network, say), served by `engine`. NumPy stays the
    CPU default (Darknet's exact arithmetic); when --device auto fell back to the CPU and
    ONNX Runtime is installed, a note offers it (docs/onnx.md)."""
    if engine == "onnxruntime":
        require("onnxruntime")
    net = with_engine(load(device=engine_device(engine, device), **kwargs), engine)
    if engine in (None, "numpy") and device in (None, "auto") and net.be.name == "cpu" \
            and importlib.util.find_spec("onnxruntime") is not None:
        print("darknet-py: note: on the CPU, --engine onnxruntime runs inference faster",
              file=sys.stderr)
    return net
