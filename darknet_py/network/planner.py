"""The Network's planner: where its arrays live and how big they are. Allocation for a
batch (outputs and deltas, the shared-array plans of delta_plan.py and output_plan.py, the
16-bit output storage of output_storage.py, the workspace), the switches that re-plan
them, the memory estimate, the input and output shapes, and set_batch/resize.

A mixin of darknet_py.network.Network, which composes it with the executor and the
inference front end: its methods read and write the Network's state through self.
"""

import warnings

import numpy as np

from .. import precision as precisions
from ..backends import DeviceOutOfMemory
from ..delta_plan import plan_deltas, share_delta_arrays, zeroing_steps
from ..layers.base import keeps_activation_input
from ..layers.batchnorm import x_precision
from ..layers.nhwc_forward import give_nhwc_arrays, is_nhwc
from ..layout_plan import assign_layouts, nhwc_from_environment
from ..net_options import NetworkError
from ..output_plan import plan_outputs, share_output_arrays
from ..output_storage import assign_output_storage, plan_output_storage
from ..weights import write_pending_parameters
from .arguments import switch, whole_number


class NetworkPlanner:
    """Allocation, storage and shape plans of a Network (see the module's docstring)."""

    def _allocate(self, batch, train):
        be = self.be
        if be.name == "cpu":
            self._check_host_memory(batch, train)
        try:
            self.workspace = None  # free the old one before sizing the new
            for layer in self.layers:  # and the old outputs and deltas before the new are
                layer.output = layer.delta = None  # made (not both at once at the peak)
            self.input = self.delta = None
            assign_output_storage(
                self.layers,
                self.output_index,
                self.precision,
                train,
                self.fold_batchnorm,
                on=self._half_outputs,
            )
            self.layout_plan = assign_layouts(
                self.layers,
                self.output_index,
                self.precision,
                train,
                self.fold_batchnorm,
                on=self._nhwc_wanted(),
            )
            self.delta_plan = share_delta_arrays(
                self.layers, be, batch, train and self._share_deltas and not self.fork_cpu
            )
            self.output_plan = share_output_arrays(
                self.layers,
                be,
                batch,
                train and self._share_outputs and not self.fork_cpu,
                self.output_index,
            )
            nhwc_arrays = give_nhwc_arrays(self.layers, be, batch, self.precision)
            for layer in self.layers:
                if is_nhwc(layer) and not layer.layout.boundary:
                    layer.shared_output = layer.nhwc_output  # allocate takes it as output
                layer.allocate(be, batch, train)  # may size its workspace for this batch
                if is_nhwc(layer) and layer.type == "route" and layer.views_its_input():
                    layer.output, layer.is_view = layer.sources[0].output, True
            del nhwc_arrays  # the layers hold them
            self._zero_before = zeroing_steps(self.layers, self.delta_plan)
            self._rebuild_before = {
                step: [self.layers[i] for i in rebuilt]
                for step, rebuilt in self.output_plan.rebuild_before.items()
            }
            self.workspace = be.zeros(max([1] + [l.workspace_size for l in self.layers]))
        except DeviceOutOfMemory:
            need = self.memory_bytes(batch, train)
            raise NetworkError(
                f"out of GPU memory: this network needs about {need / 2**20:.0f} MiB at batch "
                f"{batch}{' for training' if train else ''}; raise subdivisions in [net] "
                f"(or lower batch) to fit"
            ) from None
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

    @property
    def nhwc(self):
        """Whether fp16/bf16 inference keeps layer outputs channels-last (NHWC) at 16 bits
        where layout_plan.py allows (issue 42: convolutions as implicit GEMMs with no
        unfolding). Default: the environment's DARKNET_NHWC=1 on a CUDA backend, else off;
        setting it asks for it on any backend (the NumPy one runs the NHWC references).
        The backend needs conv_nhwc_forward. Setting it re-allocates."""
        return self._nhwc_wanted()

    @nhwc.setter
    def nhwc(self, on):
        on = bool(switch(on, "net.nhwc"))
        self._refuse_nhwc_without_its_convolution(on)
        self._nhwc = on
        if getattr(self, "train_buffers", None) is not None:
            self._allocate(self.batch, self.train_buffers)

    def _nhwc_wanted(self):
        """net.nhwc as set, else DARKNET_NHWC on CUDA; a backend without conv_nhwc_forward
        (the NHWC convolution) refuses it in one line."""
        wanted = getattr(self, "_nhwc", None)
        if wanted is None:
            # read (and a bad value refused) on every backend; it asks the GPU's alone
            wanted = nhwc_from_environment() and self.be.name == "cuda"
        self._refuse_nhwc_without_its_convolution(wanted)
        return wanted

    def _refuse_nhwc_without_its_convolution(self, wanted):
        """NetworkError (one line) when NHWC is wanted for a 16-bit network on a backend
        without conv_nhwc_forward."""
        if (
            wanted
            and self.precision in precisions.HALF_STORAGE
            and getattr(self.be, "conv_nhwc_forward", None) is None
        ):
            raise NetworkError(
                f"NHWC layer outputs (net.nhwc, DARKNET_NHWC) need an NHWC convolution, "
                f"which the {self.be.name} backend does not have yet"
            )

    def memory_bytes(self, batch, train):
        """A close estimate of the device memory the network's arrays take (a BN layer's
        x at 2 bytes a value under fp16/bf16, as the CUDA backend keeps it)."""
        # A recurrent layer's inner layers hold their own outputs (and deltas) per image.
        sizes = [
            l.outputs + sum(o.outputs for o in l.param_owners() if o is not l) for l in self.layers
        ]
        per_image = sum(sizes)
        if train:  # deltas, and a third array where a layer may keep one
            per_image = 2 * per_image + sum(
                n for l, n in zip(self.layers, sizes) if keeps_a_third_array(l)
            )
        # A [route] of one whole input shares its output array (route.py).
        per_image -= sum(l.outputs for l in self.layers if l.views_its_input())
        if train and self._share_deltas and not self.fork_cpu:
            per_image -= plan_deltas(self.layers).saved_floats
        storage = (
            plan_output_storage(
                self.layers, self.output_index, self.precision, train, self.fold_batchnorm
            )
            if self._half_outputs
            else None
        )
        outputs = plan_outputs(
            self.layers,
            self.output_index,
            train and self._share_outputs and not self.fork_cpu,
            storage,
        )
        per_image -= outputs.saved_floats
        if storage is not None:  # outputs kept at 16 bits: half a float a value
            per_image -= (
                sum(
                    l.outputs
                    for l in self.layers
                    if storage[l.index] != "fp32"
                    and l.index not in outputs.buffer_of
                    and not l.views_its_input()
                )
                / 2
            )
            per_image -= (
                sum(
                    n
                    for n, stored in zip(outputs.buffer_floats, outputs.buffer_storage)
                    if stored != "fp32"
                )
                / 2
            )
        if train:  # a BN layer's x kept at 16 bits (fp16/bf16): half a float a value
            per_image -= (
                sum(
                    l.outputs
                    for l in self.layers
                    if getattr(l, "batch_normalize", 0) and x_precision(l) != precisions.DEFAULT
                )
                / 2
            )
        try:
            params = sum(a.size for l in self.layers for _, a in l.params())
        except AttributeError:  # parameters not created yet
            params = 0
        ws = max([1] + [l.workspace_size for l in self.layers])
        return int(4 * (batch * per_image + params * (2 if train else 1) + ws))

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
    def output_index(self):
        """The index of the network's output layer: the last one that is not [cost]."""
        last = len(self.layers) - 1
        while last > 0 and self.layers[last].type == "cost":
            last -= 1
        return last

    # ---- batch and input size ---------------------------------------------------
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
        write_pending_parameters(self)  # the old layers' attributes are carried over below
        old_size = (o.width, o.height, o.inputs)
        o.width, o.height, o.inputs = width, height, width * height * o.channels
        old = self.layers
        try:
            with warnings.catch_warnings():  # the cfg's warnings were shown at load time
                warnings.simplefilter("ignore")
                layers = self._build([layer.section for layer in old])
            for new, prev in _layer_pairs(layers, old):
                if prev.type in ("connected", "local") and (new.inputs, new.outputs) != (
                    prev.inputs,
                    prev.outputs,
                ):
                    raise NetworkError(
                        f"cannot resize this network to {width}x{height}: layer "
                        f"{prev.index} [{prev.type}] has weights sized by its input"
                    )
            if self.be.name == "cpu":  # refused while the old size's arrays are still there
                self._check_host_memory(self.batch, self.train_buffers, layers)
        except Exception:
            o.width, o.height, o.inputs = old_size
            raise
        for layer in old:  # the old size's outputs and deltas go before the new are made
            layer.output = layer.delta = None
        self.layers = layers
        self._allocate(self.batch, self.train_buffers)
        for new, prev in _layer_pairs(layers, old):
            own = set(vars(new))  # made by parsing and allocation: belongs to the new size
            for name, value in vars(prev).items():
                if name not in own:
                    setattr(new, name, value)


def _layer_pairs(layers, old):
    """(new, old) for each layer and, in a recurrent one, each of its inner layers."""
    for new, prev in zip(layers, old):
        yield new, prev
        inner = [(n, p) for n, p in zip(new.param_owners(), prev.param_owners()) if n is not new]
        yield from inner


# Layer types whose training keeps only an output and a delta of the layer's size.
OUTPUT_AND_DELTA_ONLY = frozenset({"convolutional", "route", "shortcut", "upsample", "yolo"})


def keeps_a_third_array(layer):
    """Whether training may keep a third array of a layer's size besides its output and
    delta (memory_bytes): a batch-normalised layer's x, an activation's kept input,
    maxpool's indexes, and, to be safe, any type not known to keep none."""
    return (
        layer.type not in OUTPUT_AND_DELTA_ONLY
        or bool(getattr(layer, "batch_normalize", 0))
        or keeps_activation_input(layer)
    )
