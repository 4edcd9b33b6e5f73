"""ONNX out of a darknet-py network: `darknet-py export`, its check in ONNX Runtime, and
ONNX Runtime as a CPU engine (`--engine onnxruntime`).

The onnx and onnxruntime packages are default dependencies (on the machines PyPI has
their wheels for), imported on first use: onnxruntime when the CPU engine starts, onnx
only to export (a cached export needs none). Without them the user gets one line naming
the pip command, and the CPU engine is NumPy.

  builder.py      the graph under construction: nodes, constants, per-image shapes
  activations.py  every Darknet activation as ONNX operators
  layers.py       one function per layer class, registered by class
  heads.py        [yolo]/[region]/... activations, --decode (boxes, scores) and --nms
  model.py        export_model: walk the layers, name the outputs, metadata, fp16
  check.py        run a model in ONNX Runtime against darknet-py's own forward
  engine.py       OnnxRuntimeEngine: a network's predict() served by ONNX Runtime
  command.py      what `darknet-py export` and --engine do (cli.py registers them)
"""

from ..errors import DarknetWarning
from ..network import NetworkError

PIP_COMMAND = "pip install onnx onnxruntime"


class ExportError(NetworkError):
    """A network or option ONNX export cannot serve: one line for the user (cli turns a
    NetworkError into exit code 2)."""


class EngineCacheWarning(DarknetWarning):
    """A file of the CPU engine's cache could not be read and is made again."""


def require(module):
    """Import onnx or onnxruntime, or say in one line how to install them."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExportError(
            f"{module} is not installed; ONNX export and --engine onnxruntime "
            f"need onnx and onnxruntime: {PIP_COMMAND}"
        ) from None
