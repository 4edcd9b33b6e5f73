"""darknet-py: Darknet's cfg-driven networks in Python (NumPy reference, CUDA kernels)."""

from .cfg import CfgError
from .export.engine import attach as _attach_engine
from .export.engine import served_from_cache as _served_from_cache
from .image import letterbox, load_image, resize_image
from .network import ENGINE_HOOK, Network, build_network, load_network
from .version import __version__
from .weights import WeightsError

__all__ = [
    "CfgError",
    "Network",
    "WeightsError",
    "build_network",
    "letterbox",
    "load_image",
    "load_network",
    "resize_image",
    "__version__",
]

ENGINE_HOOK["attach"] = _attach_engine  # load_network's engine= (export/engine.py)
ENGINE_HOOK["served_from_cache"] = _served_from_cache
