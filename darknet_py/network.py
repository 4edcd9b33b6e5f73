"""A Darknet network: the [net] options, the layers, and the forward/backward/update loop.

Mirrors Darknet's network.c: the state a layer sees during forward/backward
(``input``, ``delta``, ``truth``, ``train``, ``workspace``) lives on the Network,
and the loop sets it before each layer, exactly as forward_network/backward_network do.
"""
import os
import warnings
from dataclasses import replace

import numpy as np

from . import optimizer, precision as precisions
from .adam import Adam
from .backends import DeviceOutOfMemory, get_backend
from .cfg import CfgError, CfgWarning, parse_cfg
from .delta_plan import plan_deltas, share_delta_arrays, zeroing_steps
from .output_plan import output_is_shared, plan_outputs, share_output_arrays
from .output_storage import assign_output_storage, plan_output_storage
from .image import decode_image
from .graphs import StepGraphs, run_pieces
from .layers import LAYER_TYPES, layer_class
from .layers.base import BuildContext, UpdateArgs, keeps_activation_input
from .layers.batchnorm import bn_rebuild_output, x_precision
from .names import load_names
from .predictions import (DETECTOR_TYPES, as_image, classify, detect, detect_batch,
                          detector_layers)
from .net_options import (DARKNET_FLAVOURS, FORK_CPU, NetOptions, NetworkError,  # noqa: F401
                          check_flavour, cfg_flavour, parse_net_options, weights_flavour)
from .weights import FORK_WEIGHTS_HEADER, load_weights, save_weights


# The buffer each parameter's gradient accumulates in (Darknet's names).
_UPDATE_BUFFER = {"biases": "bias_updates", "scales": "scale_updates",
                  "weights": "weight_updates"}


class Network:
    """Build with load_network(); see docs/python-api.md for the Python API."""
    # ONNX Runtime serving inference on the CPU (export/engine.py; load_network's engine=),
    # else None: the backend runs it. engine_note: why NumPy serves it, where it does.
    inference_engine = None
    engine_note = None
    # The layers whose outputs the last inference wrote when ONNX Runtime ran it (its
    # outputs: the heads, or the output layer); None: every layer's (the backend ran it).
    engine_outputs = None

    def __init__(self, sections, path="<cfg>", batch=None, backend=None, seed=0, allocate=True,
                 darknet=None, random_init=True, precision=None):
        if sections[0].type != "net":
            raise CfgError(f"the first section must be [net], not [{sections[0].header}]",
                           path, sections[0].line)
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
        except precisions.PrecisionError as e:   # precision= or $DARKNET_PRECISION
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
        self.names = None         # class names, when a .data/.names file gave them
        self.weights_header = FORK_WEIGHTS_HEADER if self.darknet == "alexeyab" else (0, 2, 0)
        self.layers = self._build(sections[1:])
        if not self.layers:
            raise CfgError("the cfg has a [net] section but no layers", path)
        # A classifier's class tree (tree.Hierarchy): as in Darknet, the last [softmax]
        # layer's tree=; training sets it from a .data file's tree= too.
        softmaxes = [layer for layer in self.layers if layer.type == "softmax"]
        self.hierarchy = softmaxes[-1].hierarchy if softmaxes else None
        precisions.assign(self.layers, self.precision)
        self.loss_scaler = precisions.loss_scaler(self)   # fp16 training's; else None
        # Darknet's network state seen by the layer being run.
        self.input = None
        self.truth = None         # the truth buffer on the backend (softmax, cost)
        self.truth_host = None    # the same values as float32 (N, T), for host-side losses
        self.delta = None
        self.train = False
        self.cost = None
        self._prefetched = []     # [[(host array, backend array, upload), ...]]: prefetch()
        self._net_input = None    # the input of the last forward, on the backend
        self._training_ready = False
        self._params_ready = False
        # Values a step reads from the backend, written before it (so that a step replayed
        # as a graph sees this step's): dropout's per-step seed and the update's rate.
        self.step_seed = self.be.int_zeros(1)
        self.update_rate = self.be.zeros(1)
        self.adam = None   # adam.Adam, made for the first training step when adam=1
        self.graphs = StepGraphs(self.be)
        # Inference folds batch norm into the convolution weights (made once, remade after
        # the parameters change); False runs Darknet's unfolded normalisation.
        self._fold_batchnorm = True
        self._share_deltas, self.delta_plan = False, None   # see share_deltas
        self._share_outputs, self.output_plan = False, None   # see share_outputs
        self._half_outputs = True   # see half_outputs
        self._zero_before = {}    # backward step -> the shared deltas zeroed before it
        self._rebuild_before = {}   # backward step -> the layers whose output is made again
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
        ctx = BuildContext(layers=layers, net=o, batch=self.batch, darknet=self.darknet,
                           fork_cpu=self.fork_cpu)
        for index, section in enumerate(sections):
            if section.type == "net":
                raise CfgError("[net] may only be the first section", self.path, section.line)
            if section.type not in LAYER_TYPES:
                raise CfgError(f"unknown layer type [{section.header}]", self.path, section.line)
            layer = layer_class(section.type)(index, section, c, h, w, inputs, ctx)
            layer.stopbackward = section.get_int("stopbackward", 0)
            section.get_int("dontload", 0)            # read by the weights loader
            section.get_int("dontloadscales", 0)
            section.warn_unused()
            layers.append(layer)
            c, h, w, inputs = layer.out_c, layer.out_h, layer.out_w, layer.outputs
        return layers

    def _allocate(self, batch, train):
        be = self.be
        if be.name == "cpu":
            self._check_host_memory(batch, train)
        try:
            self.workspace = None  # free the old one before sizing the new
            for layer in self.layers:   # and the old outputs and deltas before the new are
                layer.output = layer.delta = None   # made (not both at once at the peak)
            self.input = self.delta = None
            assign_output_storage(self.layers, self.output_index, self.precision, train,
                                  self.fold_batchnorm, on=self._half_outputs)
            self.delta_plan = share_delta_arrays(self.layers, be, batch, train and
                                                 self._share_deltas and not self.fork_cpu)
            self.output_plan = share_output_arrays(self.layers, be, batch, train and
                                                   self._share_outputs and not self.fork_cpu,
                                                   self.output_index)
            for layer in self.layers:
                layer.allocate(be, batch, train)  # may size its workspace for this batch
            self._zero_before = zeroing_steps(self.layers, self.delta_plan)
            self._rebuild_before = {step: [self.layers[i] for i in rebuilt] for step, rebuilt
                                    in self.output_plan.rebuild_before.items()}
            self.workspace = be.zeros(max([1] + [l.workspace_size for l in self.layers]))
        except DeviceOutOfMemory:
            need = self.memory_bytes(batch, train)
            raise NetworkError(
                f"out of GPU memory: this network needs about {need / 2**20:.0f} MiB at batch "
                f"{batch}{' for training' if train else ''}; raise subdivisions in [net] "
                f"(or lower batch) to fit") from None
        self.batch = batch
        self.train_buffers = train
        self._input_buf = None
        self._truth_buf = None
        self.graphs.drop()

    @property
    def share_deltas(self):
        """Whether training shares delta arrays between layers whose deltas are never
        live at once (delta_plan.py): the same arithmetic, bit for bit, in less memory
        (yolov4 b32: 8.3 GB). Off for load_network's networks, so that layer_delta reads
        every delta after a backward (it refuses a shared one: its values last only through
        the backward); on in `darknet-py train` and `bench --train`; never in the
        "alexeyab-cpu" flavour. Setting it re-allocates trained buffers."""
        return self._share_deltas

    @share_deltas.setter
    def share_deltas(self, on):
        self._set_sharing("_share_deltas", on)

    def _set_sharing(self, name, on):
        """Switch one of the share_* plans, re-allocating trained buffers on a change."""
        on = switch(on, "net." + name.lstrip("_"))
        if on != getattr(self, name):
            setattr(self, name, bool(on))
            if getattr(self, "train_buffers", False):
                self._allocate(self.batch, True)

    @property
    def share_outputs(self):
        """Whether training shares output arrays between layers whose lifetimes do not meet
        (output_plan.py): outputs nothing reads in the backward, and batch-normalised outputs
        made again from x right before the backward reads them: the same training, bit for
        bit in fp32 (fp16/bf16: remade from x's 16 bits), in less memory (yolov4 b32: 5.2
        GB; the remaking costs one light pass per such layer). Off for
        load_network's networks, so that layer_output reads every layer's output after a
        pass (it refuses a shared one); on in `darknet-py train` and `bench --train`;
        never in the "alexeyab-cpu" flavour. Setting it re-allocates trained buffers."""
        return self._share_outputs

    @share_outputs.setter
    def share_outputs(self, on):
        self._set_sharing("_share_outputs", on)

    @property
    def fold_batchnorm(self):
        """Whether inference folds batch norm into the convolution weights (made once,
        remade after the parameters change); False runs Darknet's unfolded normalisation.
        Switching it re-allocates an inference network whose outputs it changes the
        storage of (fp16/bf16: output_storage.py keeps a batch-normalised convolution's
        inference output at 16 bits only when folded)."""
        return self._fold_batchnorm

    @fold_batchnorm.setter
    def fold_batchnorm(self, on):
        if switch(on, "net.fold_batchnorm") == self._fold_batchnorm:
            return
        self._fold_batchnorm = bool(on)
        train = getattr(self, "train_buffers", None)
        if train is False and self._half_outputs and self.precision in precisions.HALF_STORAGE:
            self._allocate(self.batch, train)

    @property
    def half_outputs(self):
        """Whether fp16/bf16 keep layer outputs at 16 bits where every reader takes them
        (output_storage.py: half the bytes moved between layers; a convolution reader's
        products unchanged, a [shortcut]'s sum rounded once). On by default; False keeps
        every output fp32 (to compare against). Setting it re-allocates."""
        return self._half_outputs

    @half_outputs.setter
    def half_outputs(self, on):
        if switch(on, "net.half_outputs") != self._half_outputs:
            self._half_outputs = bool(on)
            if getattr(self, "train_buffers", None) is not None:
                self._allocate(self.batch, self.train_buffers)

    def memory_bytes(self, batch, train):
        """A close estimate of the device memory the network's arrays take (a BN layer's
        x at 2 bytes a value under fp16/bf16, as the CUDA backend keeps it)."""
        # A recurrent layer's inner layers hold their own outputs (and deltas) per image.
        sizes = [l.outputs + sum(o.outputs for o in l.param_owners() if o is not l)
                 for l in self.layers]
        per_image = sum(sizes)
        if train:   # deltas, and a third array where a layer may keep one
            per_image = 2 * per_image + sum(n for l, n in zip(self.layers, sizes)
                                            if keeps_a_third_array(l))
        # A [route] of one whole input shares its output array (route.py).
        per_image -= sum(l.outputs for l in self.layers if l.views_its_input())
        if train and self._share_deltas and not self.fork_cpu:
            per_image -= plan_deltas(self.layers).saved_floats
        storage = (plan_output_storage(self.layers, self.output_index, self.precision, train,
                                       self.fold_batchnorm) if self._half_outputs else None)
        outputs = plan_outputs(self.layers, self.output_index,
                               train and self._share_outputs and not self.fork_cpu, storage)
        per_image -= outputs.saved_floats
        if storage is not None:   # outputs kept at 16 bits: half a float a value
            per_image -= sum(l.outputs for l in self.layers if storage[l.index] != "fp32"
                             and l.index not in outputs.buffer_of
                             and not l.views_its_input()) / 2
            per_image -= sum(n for n, stored in zip(outputs.buffer_floats,
                                                    outputs.buffer_storage)
                             if stored != "fp32") / 2
        if train:   # a BN layer's x kept at 16 bits (fp16/bf16): half a float a value
            per_image -= sum(l.outputs for l in self.layers if getattr(l, "batch_normalize", 0)
                             and x_precision(l) != precisions.DEFAULT) / 2
        try:
            params = sum(a.size for l in self.layers for _, a in l.params())
        except AttributeError:  # parameters not created yet
            params = 0
        ws = max([1] + [l.workspace_size for l in self.layers])
        return int(4 * (batch * per_image + params * (2 if train else 1) + ws))

    def _check_host_memory(self, batch, train, layers=None):
        """Refuse, before allocating, a network whose arrays cannot fit in this machine's
        RAM (NumPy would fail half-way with a bare MemoryError, or the kernel kill us).
        layers: resize's new layers, checked before they replace the network's (their
        parameters, not made yet, are the network's)."""
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
                f"{have / 2**30:.1f} GiB; lower batch (raise subdivisions) or the layer sizes")

    # ---- shape facts --------------------------------------------------------------
    @property
    def input_shape(self):
        o = self.options
        if o.height and o.width and o.channels:
            return (o.channels, o.height, o.width)
        return (o.inputs,)

    @property
    def inputs(self):
        return int(np.prod(self.input_shape))

    @property
    def outputs(self):
        return self.layers[-1].outputs

    @property
    def images_per_iteration(self):
        """Images per weight update: the cfg's batch= (subdivisions passes), on every
        data-parallel rank together."""
        return self.images_per_pass * self.subdivisions * self.replicas

    @property
    def replicas(self):
        """Processes training this network together, each on its own images."""
        return 1 if self.data_parallel is None else self.data_parallel.world_size

    @property
    def iteration(self):
        """Darknet's get_current_batch: updates done so far, counted from `seen`."""
        return self.seen // self.images_per_iteration

    @property
    def learning_rate(self):
        return optimizer.current_rate(self.options.learning_rate, self.options.policy,
                                      self.iteration, self.options.max_batches, self.rng)

    @property
    def truth_size(self):
        """Floats per box in a detector's truth buffer: x, y, w, h, class (the fork adds a
        track id)."""
        return 6 if self.darknet == "alexeyab" else 5

    @property
    def max_boxes(self):
        """Boxes per image in a detector's truth buffer (zero padded)."""
        return 200 if self.darknet == "alexeyab" else 90

    def _is_detector(self):
        return any(l.type in DETECTOR_TYPES for l in self.layers)

    def truth_for_network(self, truth):
        """A detector truth buffer with this network's fields per box (truth_size) from either
        Darknet's: 200 x 6 floats is the fork's layout, any other multiple of 5 is rows of
        (x, y, w, h, class) as the original and the data loader write them. The box count
        is kept (each head reads at most its own max); other truths pass unchanged."""
        truth = np.asarray(truth, dtype=np.float32)
        if truth.ndim != 2 or not self._is_detector():
            return truth
        width = truth.shape[1]
        fields = 6 if width == 200 * 6 else 5 if width % 5 == 0 else None
        if fields is None or fields == self.truth_size:
            return truth
        rows = truth.reshape(truth.shape[0], width // fields, fields)
        out = np.zeros(rows.shape[:2] + (self.truth_size,), dtype=np.float32)
        common = min(fields, self.truth_size)
        out[:, :, :common] = rows[:, :, :common]   # the fork's track id: 0
        return out.reshape(truth.shape[0], -1)

    def checked_truth(self, truth, n):
        """truth for n images as (n, floats per image) float32 rows, or a ValueError that
        gives the shape this network wants (a wrong one ended in NumPy's broadcast error, or
        was read as other images' values)."""
        truth = np.asarray(truth, dtype=np.float32)
        per_image = truth.size // n if n else 0
        rows_ok = truth.size == n * per_image and (truth.ndim < 2 or truth.shape[0] == n)
        if self._is_detector():
            head = next(l for l in reversed(self.layers) if l.type in DETECTOR_TYPES)
            grid = getattr(head, "truths", None) if head.type == "detection" else None
            fits = per_image > 0 and (per_image % 5 == 0 or per_image % self.truth_size == 0
                                      or per_image == grid)
            fields = "x, y, w, h, class" + (", track id" if self.truth_size == 6 else "")
            want = (f"({n}, {self.max_boxes * self.truth_size}): {self.max_boxes} boxes of "
                    f"({fields}) per image, zero padded (any whole number of boxes does)")
        else:
            readers = [l for l in self.layers if l.type in ("softmax", "logistic", "cost")
                       and not getattr(l, "noloss", 0)]
            if not readers:
                return truth.reshape(n, -1)   # nothing reads it
            reader = readers[-1]
            fits = per_image == reader.outputs
            want = (f"({n}, {reader.outputs}): per image the {reader.outputs} values its "
                    f"[{reader.type}] layer {reader.index} is trained towards"
                    + (" (one-hot: 1 at the image's class)" if reader.type == "softmax"
                       and self.hierarchy is None else ""))
        if not (rows_ok and fits):
            raise ValueError(f"truth of shape {truth.shape} for {n} image"
                             f"{'s' if n != 1 else ''}: this network wants {want}")
        return truth.reshape(n, -1)

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
            lines.append(f"{layer.index:5d} {getattr(layer, 'short', layer.type):<6s}"
                         f"{layer.describe()}")
        lines.append(f"Total BFLOPs: {self.bflops:.3f}")
        return lines

    # ---- running --------------------------------------------------------------
    def set_batch(self, batch):
        """Re-allocate activations for a new batch size; weights are kept. The images of a
        training pass stay images_per_pass (load_network's batch= sets them)."""
        batch = whole_number(batch, "set_batch's batch")
        if batch != self.batch:
            self._allocate(batch, self.train_buffers)

    def resize(self, width, height):
        """Darknet's resize_network: rebuild every layer for a width x height input (YOLO's
        random=1 multi-scale training), keeping parameters, accumulated updates and batch-norm
        statistics. Layers whose weights are sized by their input (connected, local) cannot."""
        width = whole_number(width, "resize's width")
        height = whole_number(height, "resize's height")
        o = self.options
        if (width, height) == (o.width, o.height):
            return
        old_size = (o.width, o.height, o.inputs)
        o.width, o.height, o.inputs = width, height, width * height * o.channels
        old = self.layers
        try:
            with warnings.catch_warnings():  # the cfg's warnings were shown at load time
                warnings.simplefilter("ignore")
                layers = self._build([layer.section for layer in old])
            for new, prev in _layer_pairs(layers, old):
                if (prev.type in ("connected", "local")
                        and (new.inputs, new.outputs) != (prev.inputs, prev.outputs)):
                    raise NetworkError(f"cannot resize this network to {width}x{height}: layer "
                                       f"{prev.index} [{prev.type}] has weights sized by its input")
            if self.be.name == "cpu":   # refused while the old size's arrays are still there
                self._check_host_memory(self.batch, self.train_buffers, layers)
        except Exception:
            o.width, o.height, o.inputs = old_size
            raise
        for layer in old:   # the old size's outputs and deltas go before the new are made
            layer.output = layer.delta = None
        self.layers = layers
        self._allocate(self.batch, self.train_buffers)
        for new, prev in _layer_pairs(layers, old):
            own = set(vars(new))  # made by parsing and allocation: belongs to the new size
            for name, value in vars(prev).items():
                if name not in own:
                    setattr(new, name, value)

    # How many prefetched batches are kept: the one a step is about to use and the next.
    PREFETCHED_KEPT = 2

    def prefetch(self, x, truth=None):
        """Start uploading a coming batch, x (N, C, H, W) and its truth rows, while the
        backend works on what is queued: a later forward or training pass on these arrays,
        or on row slices of them, waits for this upload instead of copying them again.
        The arrays must stay unchanged until then. The training loop hands batch k+1
        over before iteration k runs, so its copy overlaps k's compute (on the GPU, from
        the data loader's page-locked slots)."""
        # Both converted before either upload starts: a refused truth leaves no upload behind.
        hosts = [np.asarray(host, dtype=np.float32) for host in (x, truth) if host is not None]
        record = []
        for host in hosts:
            array, upload = self.be.upload_async(host)
            record.append((host, array, upload))
        self._prefetched.append(record)
        while len(self._prefetched) > self.PREFETCHED_KEPT:
            self._forget_prefetched()

    def _forget_prefetched(self):
        for _, _, upload in self._prefetched.pop(0):
            self.be.finish_upload(upload)   # its host memory may be reused after this

    def finish_prefetch(self):
        """Wait for every prefetched upload and forget them: call it before their host
        memory goes away (a data loader closing unpins and unmaps its slots)."""
        while self._prefetched:
            self._forget_prefetched()

    def _prefetched_rows(self, x):
        """The backend array holding x's values when x is a prefetched array or a run of
        rows of one (found by address: x must lie inside it), else None."""
        if not x.flags.c_contiguous or not x.size:
            return None
        start = x.__array_interface__["data"][0]
        for record in reversed(self._prefetched):
            for host, array, upload in record:
                first = host.__array_interface__["data"][0]
                offset, misaligned = divmod(start - first, host.itemsize)
                if not misaligned and 0 <= offset and offset + x.size <= host.size:
                    self.be.wait_upload(upload)
                    return array[offset:offset + x.size]
        return None

    def _upload(self, x, name, buf_attr, per_image):
        """x into the network's fixed buffer for it (copied from its prefetched upload
        when there is one): the buffers stay put, so a captured step can replay on them."""
        x = np.asarray(x, dtype=np.float32)
        n = x.shape[0] if x.ndim > 1 else 1
        if x.size != n * per_image:
            raise (self._input_shape_error(x.shape) if name == "input" else
                   ValueError(f"{name} has shape {x.shape}; expected (N, {per_image})"))
        buf = getattr(self, buf_attr)
        if buf is None or buf.size != x.size:
            buf = self.be.zeros(x.size)
            setattr(self, buf_attr, buf)
        prefetched = self._prefetched_rows(x)
        if prefetched is None:
            self.be.write(buf, x)
        else:
            self.be.copy(prefetched, buf)
        return buf

    def _input_shape_error(self, shape):
        return ValueError(f"input has shape {shape}; the network needs "
                          f"(N, {', '.join(map(str, self.input_shape))})")

    def forward(self, x, truth=None, train=False):
        """Run every layer on host array x (N, C, H, W); returns nothing (read outputs with
        layer_output). With train=True, batch statistics are used and deltas zeroed."""
        if not train and truth is None and self.inference_engine is not None \
                and self.inference_engine.infer(self, x):
            return
        net_input = self._stage(x, truth, train)
        if train:
            self._write_step_seed()
        self._forward_layers(net_input, train)
        self.collect_costs()

    def _write_step_seed(self):
        """The step's part of every dropout layer's seed (the layer adds its own)."""
        seed = (int(self.seen) * 1000003 + int(self.seed or 0) * 104729) & 0xFFFFFFFF
        self.be.write(self.step_seed, [seed - (1 << 32) if seed >= 1 << 31 else seed])

    def _stage(self, x, truth, train):
        """Buffers for x's batch, x and truth uploaded: the network input on the backend."""
        # x and truth are checked before the buffers change: a refused call leaves them.
        x = np.asarray(x, dtype=np.float32)
        n = x.shape[0] if x.ndim > 1 else 1
        if x.size != n * self.inputs:
            raise self._input_shape_error(x.shape)
        truth_host = None
        if truth is not None:
            # The YOLO/region/detection losses read the host copy: no round trip from the GPU.
            truth_host = np.asarray(truth, dtype=np.float32)
            if truth_host.size % n:
                raise ValueError(f"truth has shape {truth_host.shape}, which is not rows for "
                                 f"{n} image{'s' if n != 1 else ''}")
            truth_host = truth_host.reshape(n, -1)
            if train:
                for layer in self.layers:
                    layer.check_truth(self, truth_host)
        if train and not self._training_ready:
            self._prepare_training()
        if n != self.batch or (train and not self.train_buffers):
            self._allocate(n, train or self.train_buffers)
        net_input = self._upload(x, "input", "_input_buf", self.inputs)
        self.truth, self.truth_host = None, truth_host
        if truth_host is not None:
            self.truth = self._upload(truth_host, "truth", "_truth_buf", truth_host.shape[1])
        return net_input

    def _forward_layers(self, net_input, train):
        self.engine_outputs = None
        self.train = train
        self.input = net_input
        self.delta = None
        for layer in self.layers:
            # The fork's GPU build (and the original) clear every delta before a pass, its
            # CPU build only those of its l.train layers (see Layer.fork_train); a shared
            # delta is zeroed in the backward instead, before its first writer's.
            if train and layer.delta is not None and layer.shared_delta is None \
                    and (layer.fork_train or not self.fork_cpu):
                self.be.fill(layer.delta, 0.0)
            layer.forward(self)
            self.input = layer.output
        self._net_input = net_input

    def _clear_fork_deltas(self):
        """At an iteration's first pass, zero the deltas that the fork's passes do not (its
        layers without l.train: route, upsample, ...; see Layer.fork_train). Its CPU build
        keeps adding to them from iteration to iteration, so that they grow without bound
        and yolov4-tiny does not learn (mAP 1% where its GPU build reaches 96%,
        bench/RESULTS.md); within an iteration its passes are followed as they are.
        Only for "alexeyab-cpu": the GPU build clears every delta before each pass."""
        if not self.fork_cpu:
            return
        for layer in self.layers:
            if layer.delta is not None and not layer.fork_train and layer.darknet == "alexeyab":
                self.be.fill(layer.delta, 0.0)

    def collect_costs(self):
        """After a training forward (and its backward and update): hand every loss layer
        the figures it left on the backend (one read each, the step's only waits on the
        device) and set self.cost, Darknet's mean over the layers that have a cost."""
        for layer in self.layers:
            if layer.pending:
                layer.pending = False
                layer.collect(self.be.to_host(layer.scalars))
        costs = [l.cost for l in self.layers if l.cost is not None]
        self.cost = float(sum(costs) / len(costs)) if costs and self.train else None

    def backward(self):
        """Darknet's backward_network: each layer gets the previous layer's output and delta."""
        self._backward_start()
        self._backward_layers(len(self.layers) - 1, 0)

    def _backward_start(self):
        if self.loss_scaler is not None:
            self.loss_scaler.scale_deltas(self)

    @property
    def backward_end(self):
        """The lowest layer the backward reaches: Darknet's stops below the last layer with
        stopbackward."""
        stops = [i for i, layer in enumerate(self.layers) if layer.stopbackward]
        return stops[-1] + 1 if stops else 0

    def _backward_layers(self, top, bottom):
        """The backward of layers top down to bottom (none below backward_end)."""
        for i in range(top, max(bottom, self.backward_end) - 1, -1):
            layer = self.layers[i]
            for delta in self._zero_before.get(i, ()):   # shared: zeroed as the forward did
                self.be.fill(delta, 0.0)
            for rebuilt in self._rebuild_before.get(i, ()):   # remade: output_plan.py
                bn_rebuild_output(rebuilt, self)
            if i == 0:
                self.input, self.delta = self._net_input, None
            else:
                prev = self.layers[i - 1]
                self.input, self.delta = prev.output, prev.delta
            layer.backward(self)

    def _train_pieces(self, net_input, stops):
        """A training pass (no update) as pieces run in turn: the forward and the backward
        down to layer stops[0], then down to each further stop (descending, the last
        backward_end)."""
        def first():
            self._forward_layers(net_input, True)
            self._backward_start()
            self._backward_layers(len(self.layers) - 1, stops[0])

        def down_to(k):
            return lambda: self._backward_layers(stops[k - 1] - 1, stops[k])
        return [first] + [down_to(k) for k in range(1, len(stops))]

    def _write_update_rate(self):
        """Write this iteration's learning rate / images per iteration for the update;
        returns the learning rate."""
        rate = self.learning_rate
        scale = self.fork_loss_scale
        if scale != 1.0:   # the fork's GPU update: float learning_rate = rate / loss_scale
            rate_scaled = float(np.float32(rate) / np.float32(scale))
        else:
            rate_scaled = rate
        self.be.write(self.update_rate, [rate_scaled / self.images_per_iteration])
        if self.adam is not None:
            self.adam.write_step(rate_scaled, self.iteration)
        return rate

    @property
    def fork_loss_scale(self):
        """The fork's [net] loss_scale as its GPU build trains with it (the [yolo] and
        [softmax] gradients times it, the rate and the weight decay's share divided by it);
        1 for the original, the fork's CPU build and fp16 training (whose own scaler reads it)."""
        if self.darknet != "alexeyab" or self.fork_cpu or self.loss_scaler is not None:
            return 1.0
        return self.options.loss_scale

    def _update_layers(self):
        """Every layer's SGD step, or Adam's where its Darknet uses it (the rate and t written by
        _write_update_rate)."""
        args = UpdateArgs(rate=self.update_rate, momentum=self.options.momentum,
                          decay=self.options.decay * self.fork_loss_scale,
                          batch=self.images_per_iteration)
        # (adam_update_gpu's decay is not scaled by loss_scale)
        adam_args = (replace(args, adam=self.adam, decay=self.options.decay)
                     if self.adam is not None else args)
        for layer in self.layers:
            if layer.fork_train or layer.darknet != "alexeyab":   # see Layer.fork_train
                layer.update(adam_args if self.adam is not None and self.adam.uses(layer)
                             else args)

    def update_buffers(self):
        """(accumulated updates, batch-norm rolling statistics): the backend arrays that
        data-parallel replicas combine before an update, in a fixed order. Parameters
        without an update buffer (the fork's untrained BN beta) are not among them."""
        updates, statistics = [], []
        for layer in (owner for l in self.layers for owner in l.param_owners()):
            for name, _ in layer.params():
                if name.startswith("rolling_"):
                    statistics.append(getattr(layer, name))
                elif (buffer := getattr(layer, _UPDATE_BUFFER[name], None)) is not None:
                    updates.append(buffer)
        return updates, statistics

    def params_changed(self):
        """Call after writing parameters by hand: drops what was derived from them."""
        self.graphs.drop()
        self._params_updated()

    def _params_updated(self):
        """After a training pass (parameters and rolling statistics moved in place):
        inference's folded weights are stale, and with them the recorded forward passes
        that read them."""
        self.graphs.drop("predict")
        if self.inference_engine is not None:   # it exports the new values on its next run
            self.inference_engine.params_changed()
        for layer in self.layers:
            layer.params_changed()

    @property
    def capturable(self):
        """Whether a step may be replayed as a graph: every layer works on the backend alone.
        (A data-parallel pass replays its forward and backward only, the last pass of an
        iteration in pieces: the gradients' exchange and the update stay outside graphs.)"""
        return self.graphs.enabled and all(layer.capturable for layer in self.layers)

    def _run_step(self, kind, key, net_input, train, step, between=None):
        """step(): a forward (and backward, update) on net_input; replayed as a graph when
        the network allows it, for steps of the same kind, key and buffers. step may be a
        list of pieces run in turn, between(k) called after piece k (graphs.py)."""
        self.train, self._net_input = train, net_input   # as the step sets them eagerly
        if self.capturable:
            self.graphs.run(kind, key, (net_input, self.truth), step, self.layers, between)
        else:
            run_pieces(step, between)

    def _prepare_training(self):
        if self.options.adam and self.adam is None:
            self.adam = Adam(self.be, self.darknet, *self.options.adam_betas_eps)
            if self.adam.rules == "original" and any(l.type == "crnn" for l in self.layers):
                warnings.warn(CfgWarning(
                    f"{self.path}: [crnn] with adam=1: pjreddie's GPU build fails here (it "
                    f"gives the inner convolutions no Adam state); darknet-py updates them "
                    f"with Adam"), stacklevel=2)
        self.inference_engine = None   # training runs on the backend; its weights move
        for layer in self.layers:
            layer.init_updates(self.be)
        self._training_ready = True

    def predict(self, x):
        """Inference on x float32 (N, C, H, W) in [0, 1]; returns the network's output: the
        last layer that is not a [cost] layer (Darknet's get_network_output_layer; a cost
        layer's output is its per-element error). Photos (a path, an OpenCV BGR uint8
        (H, W, 3) array, a list of them, or an (N, H, W, 3) uint8 array) are letterboxed
        to the network size: on the backend, from their uint8 bytes (infer_photos)."""
        photos = self.as_photos(x)
        if photos is not None:
            self.infer_photos(photos)
        else:
            self.infer(x)
        return self.layer_output(self.output_index)

    def infer_photos(self, photos, letter=True):
        """infer() on photos: OpenCV BGR uint8 (H, W, 3) arrays of any sizes, or one
        (N, H, W, 3) uint8 array, for a 3-channel network. Their bytes are uploaded as they
        are (a quarter of the float input's) on the copy stream, then converted and
        letterboxed (letter) or resized into the network input on the backend
        (letterbox_images: image.py's arithmetic, its bits)."""
        if self.input_shape[0] != 3 or len(self.input_shape) != 3:
            raise ValueError(f"infer_photos: the network takes {self.input_shape} inputs, "
                             f"not 3-channel images")
        if not len(photos):
            raise ValueError("infer_photos: no images")
        one_array = isinstance(photos, np.ndarray)
        for photo in [photos] if one_array else photos:
            if not (isinstance(photo, np.ndarray) and photo.dtype == np.uint8 and photo.size
                    and photo.ndim == (4 if one_array else 3) and photo.shape[-1] == 3):
                got = (f"{photo.dtype} of shape {photo.shape}" if isinstance(photo, np.ndarray)
                       else type(photo).__name__)
                raise ValueError(f"infer_photos takes OpenCV BGR uint8 (H, W, 3) photos or one "
                                 f"(N, H, W, 3) uint8 array; got {got}")
        if len(photos) != self.batch:
            self._allocate(len(photos), self.train_buffers)
        staged = self._upload_photos(photos)
        self._run_photos(staged, letter)
        self.be.finish_upload(staged[1])

    def _upload_photos(self, photos):
        """(backend uint8 array, its upload, the photos' shapes): the photos' bytes, copied
        on the copy stream after the work queued so far."""
        host = (photos if isinstance(photos, np.ndarray)
                else np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in photos]))
        array, upload = self.be.upload_bytes_async(np.ascontiguousarray(host))
        return array, upload, [p.shape[:2] for p in photos]

    def _run_photos(self, staged, letter):
        """The layers on the photos of staged (_upload_photos), letterboxed into the input
        once their upload has landed."""
        array, upload, shapes = staged
        _, height, width = self.input_shape
        self.truth = self.truth_host = None
        buf = self._input_buf
        if buf is None or buf.size != len(shapes) * self.inputs:
            buf = self._input_buf = self.be.zeros(len(shapes) * self.inputs)
        self.be.wait_upload(upload)
        offsets = np.cumsum([0] + [h * w * 3 for h, w in shapes[:-1]])
        self.be.letterbox_images(array, shapes, offsets, width, height, letter, buf)
        self._run_step("predict", (self.batch, self.fold_batchnorm), buf, False,
                       lambda: self._forward_layers(buf, False))
        self.collect_costs()

    def _predict_photos_in_parts(self, photos, part):
        """predict_in_parts for photos: part k+1's bytes copy while part k's layers run,
        and part k's output comes back while part k+1's run."""
        output, result, rows, parts = self._parts_of(photos, part)
        staged, pending = [self._upload_photos(parts[0])], None
        for k in range(len(parts)):
            if k + 1 < len(parts):   # queued before part k's layers: copies beside them
                staged.append(self._upload_photos(parts[k + 1]))
            self._run_photos(staged[k], True)
            if pending is not None:
                self.be.finish_download(pending)
            pending = self.be.download_async(output, rows[k * part:(k + 1) * part])
        self.be.finish_download(pending)
        for _, upload, _ in staged:
            self.be.finish_upload(upload)
        return result.astype(self.be.dtype, copy=False)

    def as_photos(self, x):
        """x as a list of BGR uint8 (H, W, 3) photos (paths decoded) or an (N, H, W, 3)
        uint8 array, when it is photos a 3-channel network can take from their bytes;
        None for anything else (float input, other channel counts), and where ONNX Runtime
        serves inference (it takes the float input sized on the host)."""
        if (len(self.input_shape) != 3 or self.input_shape[0] != 3
                or self.inference_engine is not None):
            return None
        if isinstance(x, np.ndarray):
            if x.dtype == np.uint8 and x.ndim == 4 and x.shape[3] == 3:
                return x
            return [x] if x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3 else None
        items = list(x) if isinstance(x, (list, tuple)) else [x]
        photos = []
        for item in items:
            if isinstance(item, (str, os.PathLike)):
                item = decode_image(item, 3)[0]
            if not (isinstance(item, np.ndarray) and item.dtype == np.uint8 and item.ndim == 3
                    and item.shape[2] == 3 and item.size):
                return None
            photos.append(item)
        return photos or None

    def predict_in_parts(self, x, part):
        """predict(x) for many images, run `part` images at a time so that the copies hide
        behind the layers: while the device runs one part, the next part's input is staged
        and uploaded (prefetch, on the copy stream) and the previous part's output taken
        (download_async). Returns what predict(x) returns; the network is left at batch
        `part` (its layers' outputs hold the last part). Photos (as predict takes them) go
        up as their bytes, letterboxed on the backend (infer_photos)."""
        part = whole_number(part, "predict_in_parts' part")
        photos = self.as_photos(x)
        if photos is not None:
            return self._predict_photos_in_parts(photos, part)
        x = np.ascontiguousarray(self._as_network_input(x), dtype=np.float32)
        output, result, rows, parts = self._parts_of(x, part)
        pending = None
        self.prefetch(parts[0])
        for k, images in enumerate(parts):
            # Part k+1's upload waits for the work queued before it: queued before part k's
            # layers (from the second part on), it runs beside them.
            if k and k + 1 < len(parts):
                self.prefetch(parts[k + 1])
            self.infer(images)   # takes its prefetched upload
            if k == 0 and len(parts) > 1:
                self.prefetch(parts[1])
            if pending is not None:
                self.be.finish_download(pending)
            pending = self.be.download_async(output, rows[k * part:(k + 1) * part])
        self.be.finish_download(pending)
        self.finish_prefetch()
        return result.astype(self.be.dtype, copy=False)

    def _parts_of(self, x, part):
        """predict_in_parts' start: the network at batch `part`; (the output layer's
        output for a part, the result array for all of x, its rows per image, x's parts)."""
        if len(x) % part:
            raise ValueError(f"{len(x)} images do not split into parts of {part}")
        self.set_batch(part)
        layer = self.layers[self.output_index]
        output = layer.output[:part * layer.outputs]
        result = np.empty(layer.output_shape(len(x)), dtype=output.dtype)
        parts = [x[start:start + part] for start in range(0, len(x), part)]
        return output, result, result.reshape(len(x), -1), parts

    def infer(self, x=None):
        """Inference on x as predict runs it, every output left on the backend (read the
        ones needed with layer_output): no copy back, no wait for the device. x=None runs
        again on the input staged last (what `bench` times as the GPU-only forward)."""
        if x is not None and self.inference_engine is not None \
                and self.inference_engine.infer(self, x):
            return
        if x is None:
            net_input = self._net_input
            if net_input is None:
                raise NetworkError("infer() without an input: no input was staged before")
        else:
            net_input = self._stage(self._as_network_input(x), None, False)
        self._run_step("predict", (self.batch, self.fold_batchnorm), net_input, False,
                       lambda: self._forward_layers(net_input, False))
        self.collect_costs()

    @property
    def engine(self):
        """What serves inference: "onnxruntime", "numpy" or the GPU backend's name ("cuda").
        Asking makes ONNX Runtime's engine ready (its export, or the cached one)."""
        if self.inference_engine is not None and self.inference_engine.prepare(self):
            return self.inference_engine.name
        return "numpy" if self.be.name == "cpu" else self.be.name

    @property
    def output_index(self):
        """The index of the network's output layer: the last one that is not [cost]."""
        last = len(self.layers) - 1
        while last > 0 and self.layers[last].type == "cost":
            last -= 1
        return last

    def _as_network_input(self, x):
        """predict's input as float32 (N, C, H, W): a photo (a path, or an OpenCV (H, W, 3)
        uint8 array) is letterboxed to the network size for you; an array of another shape
        is refused with the shape expected."""
        from .image import letterbox
        if len(self.input_shape) == 1:   # [net] inputs=N without an image size (rnn.cfg)
            x = np.asarray(x, dtype=np.float32)
            rows = x[None] if x.ndim == 1 else x
            if rows.ndim != 2 or rows.shape[1] != self.inputs:
                raise ValueError(f"predict takes float32 rows of {self.inputs} inputs, shape "
                                 f"(N, {self.inputs}); got shape {x.shape}")
            return rows
        channels, height, width = self.input_shape
        if isinstance(x, (str, os.PathLike)) or (getattr(x, "dtype", None) == np.uint8
                                                  and np.ndim(x) in (2, 3)):
            x = letterbox(as_image(x, channels), width, height)
        x = np.asarray(x, dtype=np.float32)
        given = x.shape
        if x.ndim == 2 and x.shape[1] == self.inputs:   # flat rows, as Darknet's float *input
            x = x.reshape((len(x),) + tuple(self.input_shape))
        if x.ndim == len(self.input_shape):
            x = x[None]
        if x.ndim != 4 or x.shape[1:] != (channels, height, width):
            raise ValueError(
                f"predict takes float32 images of shape (N, {channels}, {height}, {width}) "
                f"(RGB, 0-1), or a photo (a path or an OpenCV (H, W, 3) uint8 array) that it "
                f"letterboxes; got shape {given} (letter-box a photo yourself with "
                f"darknet_py.letterbox(load_image(path), {width}, {height}))")
        return x

    def _checked_training_batch(self, x, truth, step="train_pass"):
        """(x as float32 images, truth as checked rows) for a training step, `step`
        ("train_pass" or "train_iteration"), or a ValueError naming what it wanted and what
        it got, raised before the step changes anything. The step's image count is fixed:
        images_per_pass for a pass, subdivisions of them for an iteration (on this process,
        of a data-parallel run); another count would change the iteration count and with
        it the learning rate, as Darknet never does (its net->batch is fixed at load)."""
        if not self._params_ready:
            raise NetworkError(f"{self.path}: the network was built without its arrays "
                               f"(build_network); load it with load_network to train it")
        shape = tuple(self.input_shape)
        images = self.images_per_pass * (self.subdivisions if step == "train_iteration" else 1)
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise ValueError(
                f"{step} takes float images (N, {', '.join(map(str, shape))}) with values "
                f"in [0, 1]; got dtype {x.dtype}"
                + (" (uint8 pixels: divide them by 255)" if x.dtype == np.uint8 else ""))
        if x.ndim < 2 or x.shape[1:] not in (shape, (self.inputs,)):
            rows = f" or flat rows ({images}, {self.inputs})" if len(shape) > 1 else ""
            raise ValueError(f"{step} takes images of shape ({images}, "
                             f"{', '.join(map(str, shape))}){rows}; got shape {x.shape}")
        if len(x) != images:
            if step == "train_iteration":
                passes = self.subdivisions
                what = (f"subdivisions={passes} pass{'es' if passes != 1 else ''} of "
                        f"net.images_per_pass={self.images_per_pass}"
                        + (f" on each of {self.replicas} processes" if self.replicas > 1
                           else ""))
            else:
                what = "net.images_per_pass"
            raise ValueError(f"{step} takes {images} image{'s' if images != 1 else ''} "
                             f"({what}), got {len(x)}; "
                             f"load_network's batch= sets the images per pass")
        truth = self.checked_truth(truth, images)
        truth_rows = self.truth_for_network(truth)
        for layer in self.layers:   # class ids beyond a head's classes, ...
            layer.check_truth(self, truth_rows)
        if self.be.name == "cpu" and (images != self.batch or not self.train_buffers):
            self._check_host_memory(images, True)   # before seen and the buffers change
        return x.astype(np.float32, copy=False), truth

    def train_iteration(self, x, truth):
        """One Darknet iteration (train_network): the images of one update, x (N, C, H, W)
        with N = images_per_pass * subdivisions (another N is refused), and their truth
        rows, run as `subdivisions` passes of images_per_pass images (gradients accumulate),
        then the weight update. Returns the loss per image (the passes' costs summed, over
        N), as Darknet's train_network does."""
        x, truth = self._checked_training_batch(x, truth, "train_iteration")
        n = self.images_per_pass
        total = 0.0
        for start in range(0, len(x), n):
            cost = self.train_pass(x[start:start + n], truth[start:start + n])
            total += cost if cost is not None else 0.0
        return total / len(x)

    def train_pass(self, x, truth):
        """One pass (train_network_datum): seen += N, training forward and backward of
        x (N, C, H, W) with N = images_per_pass (another N is refused), and the weight
        update when it is the last pass of an iteration.
        Returns Darknet's cost for the pass (the loss summed over its images)."""
        x, truth = self._checked_training_batch(x, truth, "train_pass")
        n = x.shape[0]
        if n != self.batch:
            self.set_batch(n)
        self.seen += n * self.replicas
        net_input = self._stage(x, self.truth_for_network(truth), True)
        passes = self.seen // (n * self.replicas)
        update = passes % self.subdivisions == 0
        if (passes - 1) % self.subdivisions == 0:
            self._clear_fork_deltas()
        self._write_step_seed()
        self.last_rate = self._write_update_rate() if update else None
        parallel, scaler = self.data_parallel, self.loss_scaler
        # The last pass of a data-parallel iteration sums the ranks' gradients bucket by
        # bucket while its backward runs (distributed/buckets.py); None: after the backward.
        buckets = parallel.buckets(self) if update and parallel is not None else None

        # A data-parallel pass records its forward and backward as the first passes of an
        # iteration are: the update waits for the replicas' gradients.
        fused_update = update and parallel is None and scaler is None

        def step():
            self._forward_layers(net_input, True)
            self.backward()
            if fused_update:
                self._update_layers()

        o = self.options
        key = (self.batch, fused_update, o.momentum, o.decay, self.images_per_iteration,
               scaler and scaler.scale)
        if buckets is None:
            self._run_step("train", key, net_input, True, step)
        else:
            # The pass in pieces, each ending after a layer that completes buckets, whose
            # sums start between the pieces. Each piece is its own CUDA graph and the NCCL
            # calls stay outside graphs, as the exchange after the backward always was: a
            # collective recorded into a graph runs only when every rank replays its graph,
            # and a capture that fails midway (the step then runs eagerly) would leave this
            # rank's NCCL calls out of step with the other ranks'. A split costs one graph
            # launch per piece (about a dozen for yolov4).
            self._run_step("train", key + (buckets.stops,), net_input, True,
                           self._train_pieces(net_input, buckets.stops),
                           between=lambda piece: buckets.start(self, piece))
        if parallel is None:
            if update and scaler is not None:   # it looks at the gradients before updating
                scaler.update(self)
        else:
            if update:   # the replicas' gradients are summed between backward and update
                if buckets is None:
                    parallel.reduce(self)
                else:
                    buckets.finish(self)
                if scaler is not None:
                    scaler.update(self)
                else:
                    self._update_layers()
                parallel.updated(self)
        self._params_updated()   # the update, and the forward's batch-norm rolling statistics
        self.collect_costs()   # after the update: the step's launches queue without a wait
        return self.cost

    def layer_output(self, i):
        """Layer i's output from the last forward, as a host array (N, C, H, W) or (N, n)."""
        layer = self.layers[i]
        if self.engine_outputs is not None and layer.index not in self.engine_outputs:
            raise NetworkError(
                f"layer {layer.index} [{layer.type}]: ONNX Runtime ran the last inference and "
                f"gives only the outputs of layers {sorted(self.engine_outputs)}; load the "
                f"network with engine=\"numpy\" for every layer's")
        if getattr(self, "train_buffers", False) and output_is_shared(layer):
            raise NetworkError(f"layer {i}: its output shares an array with other layers' and "
                               f"lives only while its readers use it; set "
                               f"net.share_outputs = False before training to read it")
        return self.be.to_host(layer.output).reshape(layer.output_shape(self.batch))

    def layer_delta(self, i):
        layer = self.layers[i]
        if layer.delta is None:
            raise NetworkError(f"layer {i} has no delta: the network has not been trained")
        if layer.shared_delta is not None:
            raise NetworkError(f"layer {i}: its delta shares an array with other layers' and "
                               f"lasts only through the backward; set net.share_deltas = "
                               f"False before training to read it")
        return self.be.to_host(layer.delta).reshape(layer.output_shape(self.batch))

    # ---- applications ---------------------------------------------------------------
    def detect(self, image, thresh=0.5, hier=0.5, nms=0.45, batch=8):
        """Detections on an image (a path, a Darknet (3, H, W) float image, or an OpenCV
        BGR uint8 (H, W, 3) array), highest score first: each has .name, .score, .xyxy
        (pixels of the original image) and .box (relative centre x, y, w, h). Given a list
        of images, a list of such lists, `batch` images per forward pass. See
        predictions.py."""
        if isinstance(image, (list, tuple)):
            return detect_batch(self, list(image), thresh=thresh, hier=hier, nms=nms,
                                batch=whole_number(batch, "detect's batch"))
        return detect(self, image, thresh=thresh, hier=hier, nms=nms)

    def classify(self, image, top=5):
        """[(class_id, prob, name), ...] for the `top` most probable classes."""
        if detector_layers(self):
            raise ValueError(f"{self.path}: the network is a detector; use detect()")
        return classify(self, image, top=top)

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


def _layer_pairs(layers, old):
    """(new, old) for each layer and, in a recurrent one, each of its inner layers."""
    for new, prev in zip(layers, old):
        yield new, prev
        inner = [(n, p) for n, p in zip(new.param_owners(), prev.param_owners()) if n is not new]
        yield from inner


def whole_number(value, what, least=1):
    """value as an int, or a ValueError saying that `what` takes a whole number (a float
    such as 2.5 was cut to 2, and True read as 1)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < least:
        raise ValueError(f"{what} must be a whole number of at least {least}, got {value!r}")
    return int(value)


def switch(value, what):
    """value as a bool, or a ValueError: bool("false") is True, so only True, False, 1 and
    0 are taken."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer))
                                               and value in (0, 1)):
        return bool(value)
    raise ValueError(f"{what} takes True or False, got {value!r}")


def host_memory_bytes():
    """This machine's physical RAM in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


# export/engine.py's attach(net, engine, weights, seed, cutoff, transfer), which puts
# load_network's engine= into effect; darknet_py's __init__ installs it (the export
# package stands on a higher floor than this module).
ENGINE_HOOK = {"attach": None}


# Layer types whose training keeps only an output and a delta of the layer's size.
OUTPUT_AND_DELTA_ONLY = frozenset({"convolutional", "route", "shortcut", "upsample", "yolo"})


def keeps_a_third_array(layer):
    """Whether training may keep a third array of a layer's size besides its output and
    delta (memory_bytes): a batch-normalised layer's x, an activation's kept input,
    maxpool's indexes, and, to be safe, any type not known to keep none."""
    return (layer.type not in OUTPUT_AND_DELTA_ONLY or bool(getattr(layer, "batch_normalize", 0))
            or keeps_activation_input(layer))


def load_network(cfg, weights=None, batch=None, device="cpu", seed=0, cutoff=None,
                 transfer=False, darknet=None, names=None, precision=None, engine=None):
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
    net = Network(sections, cfg, batch=batch, backend=backend, seed=seed, darknet=darknet,
                  random_init=weights is None or cutoff is not None or transfer,
                  precision=precision)
    net.transfer_report = None
    if weights is not None:
        loaded = net.load_weights(weights, cutoff, transfer=transfer)
        if not isinstance(loaded, int):
            net.transfer_report = loaded
    net.names = names
    if ENGINE_HOOK["attach"] is not None:
        ENGINE_HOOK["attach"](net, engine, weights, seed, cutoff, transfer)
    return net


def build_network(cfg, batch=None, darknet=None):
    """Parse and work out every layer's shape, allocating nothing: for `info` and checks."""
    return Network(parse_cfg(cfg), cfg, batch=batch if batch is not None else 1, allocate=False,
                   darknet=check_flavour(darknet))
