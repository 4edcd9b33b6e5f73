"""darknet-py's version (pyproject.toml's); the ONNX cache keys its exports by it."""

__version__ = "0.1.0"
