"""Arithmetic precision of a network's convolutions: fp32 (the default, Darknet-exact),
or tf32 / fp16 / bf16 operands on the GPU's tensor cores with fp32 accumulation.

Chosen by `--precision` on the command line, `precision=` of load_network, or `[net]
precision=` in a cfg (ours: the C Darknets warn about it as unknown); the command line
wins over the cfg. The fork's `[net] loss_scale=` (read by its CUDNN_HALF builds) is read
here too: it never switches the precision by itself (fp32 stays the default), and it is
the static loss scale of fp16 training when fp16 is asked for.

The NumPy backend emulates a precision: operands rounded as the GPU rounds them (fp16
and bf16 to nearest even, tf32 to nearest with ties away from zero), products summed in
the backend's float type. So a CPU run shows the rounding's effect, and the GPU kernels
are tested against it.
"""

import os
from dataclasses import dataclass

import numpy as np

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
DEFAULT = "fp32"
# The command line's --precision, read by every network the process (and its children:
# data-parallel ranks) builds without a precision= of its own.
ENV = "DARKNET_PRECISION"
# Layers whose input stays fp32: the convolution feeding one of them runs at fp32 (the
# output heads' inputs, which thresholds and losses read).
HEAD_TYPES = ("yolo", "gaussian_yolo", "region", "detection", "softmax", "cost")

# Precisions whose batch-normalised layers keep x (the normalisation's input, read by the
# backward only) at 16 bits: the backends' storage_zeros / copy_rounded, and the x_precision
# of batchnorm_activation_backward and batchnorm_delta. Every other keeps an fp32 x.
HALF_STORAGE = ("fp16", "bf16")

# Activations a tensor-core convolution applies in its epilogue (ops/convolution/gemm_tc.cuh,
# through activations.cuh's epilogue_activate); any other runs as a pass of its own after.
EPILOGUE_ACTIVATIONS = ("linear", "logistic", "relu", "leaky", "swish", "mish")


class PrecisionError(ValueError):
    """A precision name that is not one of PRECISIONS."""


def check(name):
    """The precision `name` (case-insensitive); PrecisionError names the choices."""
    value = str(name).strip().lower()
    if value not in PRECISIONS:
        raise PrecisionError(f"unknown precision '{name}': use one of {', '.join(PRECISIONS)}")
    return value


@dataclass
class NetPrecision:
    """What [net] says about precision: its precision= (None: not given) and loss_scale=."""

    precision: str = None
    loss_scale: float = None


def read_net_section(s):
    """[net] precision= and loss_scale=, as read from cfg section `s` (a CfgError names
    the line of a bad value)."""
    out = NetPrecision()
    if s.has("precision"):
        try:
            out.precision = check(s.get_str("precision"))
        except PrecisionError as e:
            raise s.error(str(e), "precision") from None
    if s.has("loss_scale"):
        out.loss_scale = s.get_float("loss_scale", 1.0)
        if not out.loss_scale > 0:
            raise s.error(f"must be above 0, got {out.loss_scale:g}", "loss_scale")
    return out


def resolve(asked, from_cfg):
    """The precision a network runs at: `asked` (load_network's precision=), else
    $DARKNET_PRECISION (--precision), else the cfg's [net] precision=, else fp32."""
    if asked is not None:
        return check(asked)
    if os.environ.get(ENV):
        try:
            return check(os.environ[ENV])
        except PrecisionError as e:
            raise PrecisionError(f"${ENV}: {e}") from None
    return from_cfg.precision or DEFAULT


def ask(name):
    """--precision's effect: `name` for every network this process and its children build
    (None: leave it to the cfg)."""
    if name is not None:
        os.environ[ENV] = check(name)


def assign(layers, precision):
    """Give each convolution its precision: the network's, except fp32 for one that feeds
    an output head (HEAD_TYPES), whose values thresholds and losses read, and for the
    fork's binary/xnor convolutions, whose sign-and-mean weights the packed half-precision
    weights would not carry."""
    for i, layer in enumerate(layers):
        if layer.type != "convolutional":
            continue
        head = i + 1 < len(layers) and layers[i + 1].type in HEAD_TYPES
        binary = getattr(layer, "binary", 0) or getattr(layer, "xnor", 0)
        layer.precision = DEFAULT if head or binary else precision


# ---- emulation (NumPy) ----------------------------------------------------------------


def round_to(x, precision):
    """x (float32 values) rounded to `precision`'s operand format, returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    if precision == "fp32":
        return x.copy()
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    if precision == "bf16":  # nearest, ties to even, on the upper 16 bits
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    elif precision == "tf32":  # nearest, ties away from zero, on 10 mantissa bits
        bits = (bits + 0x1000) & 0xFFFFE000
    else:
        check(precision)  # raises: names the choices
    out = bits.astype(np.uint32).view(np.float32)
    finite = np.isfinite(x)
    return np.where(finite, out, x)


def widened(host):
    """A host copy of 16-bit storage as the float32 values it holds, widened exactly:
    float16, or uint16 holding bf16's bits (the upper half of a float32). Other arrays are
    returned as they are."""
    if host.dtype == np.uint16:
        return (host.astype(np.uint32) << 16).view(np.float32)
    if host.dtype == np.float16:
        return host.astype(np.float32)
    return host


def storage(precision):
    """How a layer of `precision` keeps its batch norm's x: fp16 or bf16 (HALF_STORAGE),
    else fp32 (PrecisionError for a name not in PRECISIONS)."""
    precision = check(precision)
    return precision if precision in HALF_STORAGE else DEFAULT


@dataclass
class PackedWeights:
    """A convolution group's weights (rows x k) converted once to `precision` for
    conv_forward: `data` is the backend's array (rows x pitch elements of the precision on
    the GPU; float rows x k, already rounded, on the NumPy backend)."""

    data: object
    rows: int
    k: int
    pitch: int
    precision: str


# ---- loss scaling (fp16 training) ------------------------------------------------------


class LossScaler:
    """fp16 training's loss scale: the heads' deltas are multiplied by `scale` before the
    backward, so small gradients survive their rounding to fp16 operands; the update
    buffers then hold scale x their value, and the update unscales them first.

    Static (the fork's [net] loss_scale=): a step whose gradients hold inf or NaN is
    skipped. Dynamic (no loss_scale): also halves the scale on such a step (to at least 1),
    and doubles it after `growth_interval` clean updates in a row. `skipped` counts the
    skipped updates.

    Darknet's update leaves momentum x the last update in the buffers, and gradients add
    to that: the buffers stay in scaled units between updates (unscaled for the update,
    scaled again after), so momentum is untouched by the scale. A skipped update drops its
    gradients and the momentum history with them (the buffers are zeroed).

    The state lives on the backend, as PyTorch's GradScaler keeps it on the GPU: `scales`
    (scale, 1/scale) and `counts` (found inf, clean updates in a row, skipped), made at
    the first use. Every step of the scaler is a backend op that reads them there (the
    optimizer ops of ops/optimizers): a training step with its update is one recorded graph
    whatever the scale does, and the host never waits on the gradients. `scale` and
    `skipped` read the backend when asked (the log line): a wait for the queued work."""

    def __init__(self, scale=None, growth_interval=1000):
        if int(growth_interval) < 1:
            raise ValueError(f"growth_interval must be at least 1, got {growth_interval}")
        self.dynamic = scale is None
        self.growth_interval = int(growth_interval)
        self._scale = float(2.0**12 if scale is None else scale)  # until bound
        self.be = None
        self.scales = None  # backend (scale, 1/scale)
        self.counts = None  # backend int (found inf, clean, skipped)
        self._table = None  # be.array_table of the update buffers, and those buffers
        self._table_arrays = ()

    def bind(self, be):
        """Make the state on backend `be` (once; the scale set so far carried over)."""
        if self.be is be:
            return
        self.be = be
        self.scales = be.zeros(2)
        self.counts = be.int_zeros(3)
        self._write_scale(self._scale)
        self._table, self._table_arrays = None, ()

    def _write_scale(self, value):
        # The inverse from the host's double, as the host scaler's scal(1.0 / scale) took it
        # (a static scale that is no power of two keeps the same rounding).
        self.be.write(self.scales, [value, 1.0 / value])

    @property
    def scale(self):
        """The loss scale now (a dynamic one read from the backend: a wait)."""
        if self.be is None or not self.dynamic:
            return self._scale
        return float(self.be.to_host(self.scales)[0])

    @scale.setter
    def scale(self, value):
        self._scale = float(value)
        if self.be is not None:
            self._write_scale(self._scale)

    @property
    def skipped(self):
        """Updates skipped so far (read from the backend: a wait)."""
        if self.be is None:
            return 0
        return int(self.be.to_host(self.counts)[2])

    def graph_key(self):
        """What a recorded step of this scaler depends on beyond the backend's state: the
        scaler itself (its arrays) and the rule the bookkeeping kernel was given."""
        return (self, self.dynamic, self.growth_interval)

    def scale_deltas(self, net):
        """Multiply the gradient sources (the heads' deltas, written in forward) by the scale."""
        self.bind(net.be)
        for layer in net.layers:
            if layer.type in HEAD_TYPES and getattr(layer, "delta", None) is not None:
                net.be.scale_by(self.scales[0:1], layer.delta)

    def _update_table(self, be, updates):
        if len(updates) != len(self._table_arrays) or any(
            a is not b for a, b in zip(updates, self._table_arrays)
        ):
            self._table, self._table_arrays = be.array_table(updates), tuple(updates)
        return self._table

    def update(self, net):
        """The iteration's update, queued on the backend: applied unscaled when every
        gradient is finite, else skipped (buffers zeroed); the scale adapted when dynamic,
        the counts moved. Nothing is read back."""
        be = net.be
        self.bind(be)
        table = self._update_table(be, net.update_buffers()[0])
        found_inf = self.counts[0:1]
        be.fill(found_inf, 0)
        be.unscale_check(table, self.scales, self.counts)
        net._update_layers(skip=found_inf)
        be.loss_scale_step(self.scales, self.counts, self.dynamic, self.growth_interval)
        be.rescale_or_zero(table, self.scales, self.counts)  # momentum's history, scaled again


def loss_scaler(net):
    """The LossScaler fp16 training needs (static from [net] loss_scale=, else dynamic);
    None for the other precisions (tf32 and bf16 keep fp32's exponent range)."""
    if net.precision != "fp16":
        return None
    return LossScaler(net.net_precision.loss_scale)


def log_note(net):
    """The training log line's precision part ('' for fp32)."""
    if getattr(net, "precision", DEFAULT) == DEFAULT:
        return ""
    scaler = getattr(net, "loss_scaler", None)
    if scaler is None:
        return f", {net.precision}"
    return f", {net.precision} loss scale {scaler.scale:g}, {scaler.skipped} skipped"
