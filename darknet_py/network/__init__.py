"""A Darknet network: the [net] options, the layers, and the forward/backward/update loop.

Network is composed of three parts, each a mixin in its own module:
planner.py (allocation and storage plans, memory estimates, shapes, set_batch/resize),
executor.py (forward, backward, update, training steps, graphs, costs) and inference.py
(predict, infer, photos, predict_in_parts, detect, classify). This module builds the
network from a cfg (load_network, build_network) and holds what every part reads: the
constructor's state, the layers, the weights files and the host-memory check.
"""

import os

import numpy as np

from .. import precision as precisions
from ..backends import get_backend
from ..cfg import CfgError, parse_cfg
from ..graphs import StepGraphs
from ..layers import LAYER_TYPES, layer_class
from ..layers.base import BuildContext
from ..names import load_names

# DARKNET_FLAVOURS, NetOptions and NetworkError are the package's public names, read here
from ..net_options import (
    DARKNET_FLAVOURS,  # noqa: F401
    FORK_CPU,
    NetOptions,  # noqa: F401
    NetworkError,  # noqa: F401
    cfg_flavour,
    check_flavour,
    parse_net_options,
    weights_flavour,
)
from ..weights import FORK_WEIGHTS_HEADER, load_weights, save_weights
from .arguments import whole_number
from .executor import NetworkExecutor
from .inference import NetworkInference
from .planner import NetworkPlanner


class Network(NetworkPlanner, NetworkExecutor, NetworkInference):
    """Build with load_network(); see docs/python-api.md for the Python API."""

    def __init__(
        self,
        sections,
        path="<cfg>",
        batch=None,
        backend=None,
        seed=0,
        allocate=True,
        darknet=None,
        random_init=True,
        precision=None,
    ):
        if sections[0].type != "net":
            raise CfgError(
                f"the first section must be [net], not [{sections[0].header}]",
                path,
                sections[0].line,
            )
        self.path = os.fspath(path)
        # Which Darknet's arithmetic this network follows (see DARKNET_FLAVOURS).
        self.flavour = check_flavour(darknet) or cfg_flavour(sections)
        self.fork_cpu = self.flavour == FORK_CPU
        self.darknet = "alexeyab" if self.fork_cpu else self.flavour
        self.options = parse_net_options(sections[0], self.flavour)
        # fp32 (Darknet-exact) unless asked, the environment or [net] precision= say otherwise.
        self.net_precision = precisions.read_net_section(sections[0])
        try:
            self.precision = precisions.resolve(precision, self.net_precision)
        except precisions.PrecisionError as e:  # precision= or $DARKNET_PRECISION
            raise NetworkError(str(e)) from None
        sections[0].warn_unused()
        if batch is not None:
            self.options.batch = int(batch)
        self.batch = self.options.batch
        # Darknet says "batch" for three things; here each has its own word:
        #   iteration - one weight update (Darknet's max_batches and get_current_batch);
        #   images per iteration - the cfg's batch=, what the data loader hands over;
        #   pass - one forward and backward over images_per_pass = batch / subdivisions
        #     images (Darknet's net->batch).
        # images_per_pass is kept apart from self.batch, which follows whatever the last
        # forward ran (detect() runs 1 image), so that the iteration count and the update
        # do not change under inference.
        self.images_per_pass = self.batch
        self.subdivisions = self.options.subdivisions
        self.be = backend if backend is not None else get_backend("cpu")
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.seen = 0
        # Data-parallel training (distributed/data_parallel.py): the replicas' gradients are
        # summed before each update; None for one process. `seen` counts every replica's images.
        self.data_parallel = None
        self.names = None  # class names, when a .data/.names file gave them
        self.weights_header = FORK_WEIGHTS_HEADER if self.darknet == "alexeyab" else (0, 2, 0)
        self.layers = self._build(sections[1:])
        if not self.layers:
            raise CfgError("the cfg has a [net] section but no layers", path)
        # A classifier's class tree (tree.Hierarchy): as in Darknet, the last [softmax]
        # layer's tree=; training sets it from a .data file's tree= too.
        softmaxes = [layer for layer in self.layers if layer.type == "softmax"]
        self.hierarchy = softmaxes[-1].hierarchy if softmaxes else None
        precisions.assign(self.layers, self.precision)
        self.loss_scaler = precisions.loss_scaler(self)  # fp16 training's; else None
        # Darknet's network state seen by the layer being run.
        self.input = None
        self.truth = None  # the truth buffer on the backend (softmax, cost)
        self.truth_host = None  # the same values as float32 (N, T), for host-side losses
        self.delta = None
        self.train = False
        self.cost = None
        self._prefetched = []  # [[(host array, backend array, upload), ...]]: prefetch()
        self._net_input = None  # the input of the last forward, on the backend
        self._training_ready = False
        self._params_ready = False
        # Values a step reads from the backend, written before it (so that a step replayed
        # as a graph sees this step's): dropout's per-step seed and the update's rate.
        self.step_seed = self.be.int_zeros(1)
        self.update_rate = self.be.zeros(1)
        self.adam = None  # adam.Adam, made for the first training step when adam=1
        self.graphs = StepGraphs(self.be)
        # Inference folds batch norm into the convolution weights (made once, remade after
        # the parameters change); False runs Darknet's unfolded normalisation.
        self._fold_batchnorm = True
        self._share_deltas, self.delta_plan = False, None  # see share_deltas
        self._share_outputs, self.output_plan = False, None  # see share_outputs
        self._half_outputs = True  # see half_outputs
        self._nhwc = None  # see nhwc: None follows DARKNET_NHWC (on CUDA)
        self.layout_plan = None  # layout_plan.py's, made with the arrays
        self._zero_before = {}  # backward step -> the shared deltas zeroed before it
        self._rebuild_before = {}  # backward step -> the layers whose output is made again
        if allocate:  # info only needs shapes
            self._allocate(self.batch, train=False)
            # random_init=False: the caller loads every parameter next (no draws to waste).
            for layer in self.layers:
                layer.init_params(self.be, self.rng if random_init else None)
            self._params_ready = True

    # ---- building ---------------------------------------------------------------
    def _build(self, sections):
        o = self.options
        c, h, w = o.channels, o.height, o.width
        inputs = o.inputs
        layers = []
        ctx = BuildContext(
            layers=layers, net=o, batch=self.batch, darknet=self.darknet, fork_cpu=self.fork_cpu
        )
        for index, section in enumerate(sections):
            if section.type == "net":
                raise CfgError("[net] may only be the first section", self.path, section.line)
            if section.type not in LAYER_TYPES:
                raise CfgError(f"unknown layer type [{section.header}]", self.path, section.line)
            layer = layer_class(section.type)(index, section, c, h, w, inputs, ctx)
            layer.stopbackward = section.get_int("stopbackward", 0)
            section.get_int("dontload", 0)  # read by the weights loader
            section.get_int("dontloadscales", 0)
            section.warn_unused()
            layers.append(layer)
            c, h, w, inputs = layer.out_c, layer.out_h, layer.out_w, layer.outputs
        return layers

    def _check_host_memory(self, batch, train, layers=None):
        """Refuse, before allocating, a network whose arrays cannot fit in this machine's
        RAM (NumPy would fail half-way with a bare MemoryError, or the kernel kill us).
        layers: resize's new layers, checked before they replace the network's (their
        parameters, not made yet, are the network's). It stays beside host_memory_bytes,
        which tests replace on this module to play a smaller machine."""
        if layers is None:
            need = self.memory_bytes(batch, train)
        else:
            current, self.layers = self.layers, layers
            try:
                need = self.memory_bytes(batch, train)
            finally:
                self.layers = current
            params = sum(a.size for l in current for _, a in l.params())
            need += 4 * params * (2 if train else 1)
        if not self._params_ready:
            # Parameters are created after the first allocation: estimate them from sizes.
            need += 4 * sum(getattr(l, "nweights", 0) for l in self.layers) * (2 if train else 1)
        have = host_memory_bytes()
        if have and need > have:
            raise NetworkError(
                f"{self.path}: this network needs about {need / 2**30:.1f} GiB of memory at "
                f"batch {batch}{' for training' if train else ''}, more than this machine's "
                f"{have / 2**30:.1f} GiB; lower batch (raise subdivisions) or the layer sizes"
            )

    @property
    def bflops(self):
        """Total BFLOPs as this network's Darknet counts them (the fork also counts maxpool,
        shortcut and pooling layers)."""
        if self.darknet == "alexeyab":
            # The fork keeps each layer's count, and the total, in a float32.
            total = np.float32(0)
            for layer in self.layers:
                total += np.float32(layer.fork_bflops)
            return float(total)
        return sum(l.bflops for l in self.layers)

    def summary(self):
        """Darknet's layer table, as text lines, with the total BFLOPs last."""
        lines = ["layer     filters    size              input                output"]
        for layer in self.layers:
            lines.append(
                f"{layer.index:5d} {getattr(layer, 'short', layer.type):<6s}{layer.describe()}"
            )
        lines.append(f"Total BFLOPs: {self.bflops:.3f}")
        return lines

    # ---- weights ------------------------------------------------------------------
    def load_weights(self, path, cutoff=None, transfer=False):
        """Load a .weights file; with transfer, also one trained for another class count
        (returns a weights.TransferReport saying which layers were loaded). cutoff: load
        only the layers before it. Every check is made before a parameter is written."""
        if cutoff is not None:
            cutoff = whole_number(cutoff, "load_weights' cutoff", least=0)
        return load_weights(self, path, cutoff, transfer=transfer)

    def save_weights(self, path, cutoff=None):
        """Write the layers before cutoff (all: None) to path, atomically."""
        if cutoff is not None:
            cutoff = whole_number(cutoff, "save_weights' cutoff", least=0)
        save_weights(self, path, cutoff)


def host_memory_bytes():
    """This machine's physical RAM in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


# export/engine.py's attach(net, engine, weights, seed, cutoff, transfer), which puts
# load_network's engine= into effect, and its served_from_cache (same arguments), whether
# ONNX Runtime will serve the network from its cache (then the weights wait unwritten:
# weights.PendingParameters); darknet_py's __init__ installs them (the export package
# stands on a higher floor than this module).
ENGINE_HOOK = {"attach": None, "served_from_cache": None}


def load_network(
    cfg,
    weights=None,
    batch=None,
    device="cpu",
    seed=0,
    cutoff=None,
    transfer=False,
    darknet=None,
    names=None,
    precision=None,
    engine=None,
):
    """Parse a cfg, build the network on `device` ("cpu", "cuda", "cuda:N" or "auto"),
    and load `weights` if given. `batch` overrides the cfg's batch/subdivisions.
    transfer=True accepts weights trained for another class count: the layers whose
    shapes match are loaded, the others keep their random start; net.transfer_report
    says which (None when the file matched the cfg). `darknet` ("original", "alexeyab" or
    "alexeyab-cpu": the fork trained as its GPU or its CPU build does) picks which Darknet's
    arithmetic to follow; None: the fork's (GPU build) when the
    weights header is the fork's or the cfg uses fork-only sections, options or
    activations, else the original's. `names`: class names for detect/classify results, as
    a list, a names file or a .data file (its names=). `precision` ("fp32", "tf32", "fp16",
    "bf16"; None: $DARKNET_PRECISION, else the cfg's [net] precision=, else fp32) sets the
    convolutions' arithmetic (darknet_py/precision.py). `engine` serves inference on the
    CPU: None ("auto") ONNX Runtime when it is installed and `weights` are given (the
    network exported on the first predict, checked against NumPy and cached; NumPy where
    it cannot export, net.engine_note saying why), "numpy" Darknet's exact arithmetic,
    "onnxruntime" ONNX Runtime or an error (docs/onnx.md). Training always runs on the
    backend."""
    if batch is not None:
        batch = whole_number(batch, "batch")
    names = load_names(names)
    sections = parse_cfg(cfg)
    check_flavour(darknet)
    if darknet is None and weights is not None:
        darknet = weights_flavour(weights)
    backend = get_backend(device)
    net = Network(
        sections,
        cfg,
        batch=batch,
        backend=backend,
        seed=seed,
        darknet=darknet,
        random_init=weights is None or cutoff is not None or transfer,
        precision=precision,
    )
    net.transfer_report = None
    if weights is not None:
        cached = ENGINE_HOOK["served_from_cache"]
        defer = cached is not None and cached(net, engine, weights, seed, cutoff, transfer)
        loaded = (
            load_weights(net, weights, defer=True)
            if defer
            else net.load_weights(weights, cutoff, transfer=transfer)
        )
        if not isinstance(loaded, int):
            net.transfer_report = loaded
    net.names = names
    if ENGINE_HOOK["attach"] is not None:
        ENGINE_HOOK["attach"](net, engine, weights, seed, cutoff, transfer)
    return net


def build_network(cfg, batch=None, darknet=None):
    """Parse and work out every layer's shape, allocating nothing: for `info` and checks."""
    return Network(
        parse_cfg(cfg),
        cfg,
        batch=batch if batch is not None else 1,
        allocate=False,
        darknet=check_flavour(darknet),
    )
