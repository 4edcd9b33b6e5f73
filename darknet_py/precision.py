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

# Activations a tensor-core convolution applies in its epilogue (kernels/gemm_tc.cu,
# EpilogueActivation); any other runs as a pass of its own after.
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
        return check(os.environ[ENV])
    return from_cfg.precision or DEFAULT


def ask(name):
    """--precision's effect: `name` for every network this process and its children build
    (None: leave it to the cfg)."""
    if name is not None:
        os.environ[ENV] = check(name)


def assign(layers, precision):
    """Give each convolution its precision: the network's, except fp32 for one that feeds
    an output head (HEAD_TYPES), whose values thresholds and losses read."""
    for i, layer in enumerate(layers):
        if layer.type != "convolutional":
            continue
        head = i + 1 < len(layers) and layers[i + 1].type in HEAD_TYPES
        layer.precision = DEFAULT if head else precision


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
    if precision == "bf16":    # nearest, ties to even, on the upper 16 bits
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    elif precision == "tf32":  # nearest, ties away from zero, on 10 mantissa bits
        bits = (bits + 0x1000) & 0xFFFFE000
    else:
        check(precision)   # raises: names the choices
    out = bits.astype(np.uint32).view(np.float32)
    finite = np.isfinite(x)
    return np.where(finite, out, x)


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
