"""darknet-py: Darknet's cfg-driven networks in Python (NumPy reference, CUDA kernels)."""
from .cfg import CfgError
from .image import letterbox, load_image, resize_image
from .network import Network, build_network, load_network
from .weights import WeightsError

__all__ = ["CfgError", "Network", "WeightsError", "build_network", "letterbox", "load_image",
           "load_network", "resize_image"]
__version__ = "0.1.0"
