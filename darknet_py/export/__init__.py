"""ONNX out of a darknet-py network: `darknet-py export`, its check in ONNX Runtime, and
ONNX Runtime as a CPU engine (`--engine onnxruntime`).

Nothing here is imported by the rest of darknet-py unless a user asks for it: the onnx
and onnxruntime packages are an optional extra (pip install 'darknet-cfg-runner[onnx]'),
imported on first use; without them the user gets one line naming the pip command.

  builder.py      the graph under construction: nodes, constants, per-image shapes
  activations.py  every Darknet activation as ONNX operators
  layers.py       one function per layer class, registered by class
  heads.py        [yolo]/[region]/... activations, --decode (boxes, scores) and --nms
  model.py        export_model: walk the layers, name the outputs, metadata, fp16
  check.py        run a model in ONNX Runtime against darknet-py's own forward
  engine.py       OnnxRuntimeEngine: a network's predict() served by ONNX Runtime
  command.py      what `darknet-py export` and --engine do (cli.py registers them)
"""
from ..network import NetworkError

PIP_EXTRA = "pip install 'darknet-cfg-runner[onnx]'"


class ExportError(NetworkError):
    """A network or option ONNX export cannot serve: one line for the user (cli turns a
    NetworkError into exit code 2)."""


def require(module):
    """Import onnx or onnxruntime, or say in one line how to install them."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExportError(f"{module} is not installed; ONNX export and --engine onnxruntime "
                          f"need the onnx extra: {PIP_EXTRA}") from None
