"""The [net] section's options (Darknet's parse_net_options) and which Darknet's
arithmetic a network follows (its flavour: from the cfg, the weights' header or the user)."""

from dataclasses import dataclass, field

from . import optimizer
from .adam import read_adam
from .errors import DarknetError
from .weights import FORK_WEIGHTS_HEADER, peek_header


@dataclass
class NetOptions:
    """Everything Darknet's parse_net_options reads from [net]."""

    batch: int = 1  # images per forward pass (Darknet: batch / subdivisions)
    subdivisions: int = 1
    width: int = 0
    height: int = 0
    channels: int = 0
    inputs: int = 0
    learning_rate: float = 0.001
    momentum: float = 0.9
    decay: float = 0.0001
    max_batches: int = 0
    policy: dict = field(default_factory=lambda: {"policy": "constant", "burn_in": 0, "power": 4.0})
    # Augmentation, read here so a typo in them is reported; used by the data loader.
    max_crop: int = 0
    min_crop: int = 0
    max_ratio: float = 0.0
    min_ratio: float = 0.0
    center: int = 0
    flip: int = 1  # 0: no random mirroring (AlexeyAB's option; digits, text)
    clip: float = 0.0
    angle: float = 0.0
    aspect: float = 1.0
    saturation: float = 1.0
    exposure: float = 1.0
    hue: float = 0.0
    random: int = 0
    time_steps: int = 1
    notruth: int = 0
    adam: int = 0
    adam_betas_eps: tuple = None  # (B1, B2, eps) with adam=1 (adam.read_adam)
    # The AlexeyAB fork's detector augmentation (data/augment_fork.py); letter_box also
    # letterboxes the fork's detect and map inputs, which it otherwise resizes plainly.
    letter_box: int = 0
    mosaic: int = 0
    mosaic_bound: int = 0
    mixup: int = 0
    cutmix: int = 0
    blur: int = 0
    gaussian_noise: int = 0
    label_smooth_eps: float = 0.0  # the fork's classifier label smoothing
    loss_scale: float = 1.0  # the fork's (its GPU build's gradient scale)


def parse_net_options(s, darknet="original"):
    o = NetOptions()
    batch = s.get_int("batch", 1)
    o.learning_rate = s.get_float("learning_rate", 0.001)
    o.momentum = s.get_float("momentum", 0.9)
    o.decay = s.get_float("decay", 0.0001)
    o.subdivisions = s.get_int("subdivisions", 1)
    o.time_steps = s.get_int("time_steps", 1)
    o.notruth = s.get_int("notruth", 0)
    if o.subdivisions < 1:
        raise s.error("must be at least 1", "subdivisions")
    if batch < o.subdivisions:
        raise s.error(f"batch={batch} is smaller than subdivisions={o.subdivisions}", "batch")
    o.batch = batch // o.subdivisions * o.time_steps
    o.random = s.get_int("random", 0)
    # The fork's loss_scale: its GPU build multiplies the [yolo] and [softmax] gradients by
    # it and divides the rate by it (in float32 they nearly cancel); its CPU build ignores it.
    o.loss_scale = s.get_float("loss_scale", 1.0)
    o.adam = s.get_int("adam", 0)
    if o.adam:  # as the GPU builds train with it (adam.py)
        o.adam_betas_eps = read_adam(s, darknet)
        if darknet == "alexeyab-cpu":
            s.warn(
                "trains with SGD and momentum, as the fork's CPU build does (its update has "
                "no Adam; its GPU build's has)",
                "adam",
            )
            o.adam = 0
    o.height = s.get_int("height", 0)
    o.width = s.get_int("width", 0)
    o.channels = s.get_int("channels", 0)
    o.inputs = s.get_int("inputs", o.height * o.width * o.channels)
    o.max_crop = s.get_int("max_crop", o.width * 2)
    o.min_crop = s.get_int("min_crop", o.width)
    o.max_ratio = s.get_float("max_ratio", o.max_crop / o.width if o.width else 0.0)
    o.min_ratio = s.get_float("min_ratio", o.min_crop / o.width if o.width else 0.0)
    o.center = s.get_int("center", 0)
    o.flip = s.get_int("flip", 1)
    o.clip = s.get_float("clip", 0.0)
    o.angle = s.get_float("angle", 0.0)
    o.aspect = s.get_float("aspect", 1.0)
    o.saturation = s.get_float("saturation", 1.0)
    o.exposure = s.get_float("exposure", 1.0)
    o.hue = s.get_float("hue", 0.0)
    for key in (
        "letter_box",
        "mosaic",
        "mosaic_bound",
        "mixup",
        "cutmix",
        "blur",
        "gaussian_noise",
    ):
        setattr(o, key, s.get_int(key, 0))
    o.label_smooth_eps = s.get_float("label_smooth_eps", 0.0)
    if not 0 <= o.label_smooth_eps < 1:
        raise s.error(
            f"must be at least 0 and below 1, got {o.label_smooth_eps:g}", "label_smooth_eps"
        )
    for key in ("width", "height", "channels", "inputs"):
        if s.has(key) and getattr(o, key) < 1:
            raise s.error(f"must be at least 1, got {getattr(o, key)}", key)
    if not o.inputs and not (o.height and o.width and o.channels):
        raise s.error("no input size: give width, height and channels (or inputs)", "width")
    o.policy = optimizer.read_policy(s)
    o.max_batches = s.get_int("max_batches", 0)
    return o


class NetworkError(DarknetError):
    pass


# ---- which Darknet's arithmetic ------------------------------------------------------------
# "original": pjreddie/darknet. "alexeyab": the AlexeyAB fork (hank-ai/darknet), which
# differs in batch-norm epsilon and momentum, counts BFLOPs its own way, writes weights
# headers 0.2.5 and keeps 6 x 200 truth values per image; it trains as the fork's GPU build
# (GPU=1 CUDNN=1) does, the build its users train with. "alexeyab-cpu": the same fork
# trained as its CPU build does (docs/fork-training.md: the col2im overwrite, no BN beta,
# its batch-norm divisor, ...). Both have net.darknet == "alexeyab" (net.fork_cpu tells).
DARKNET_FLAVOURS = ("original", "alexeyab", "alexeyab-cpu")
FORK_CPU = "alexeyab-cpu"

# What only the fork reads: seeing any of it in a cfg means the cfg was written for it.
_FORK_SECTIONS = {
    "sam",
    "scale_channels",
    "local_avgpool",
    "reorg3d",
    "empty",
    "gaussian_yolo",
    "conv_lstm",
    "history",
    "implicit",
}
_FORK_KEYS = {
    "net": {
        "mosaic",
        "cutmix",
        "mixup",
        "letter_box",
        "ema_alpha",
        "blur",
        "label_smooth_eps",
        "sgdr_cycle",
        "sgdr_mult",
        "max_epochs",
        "contrastive",
        "gaussian_noise",
        "mosaic_bound",
        "track",
        "adversarial_lr",
        "dynamic_minibatch",
        "optimized_memory",
    },
    "route": {"groups", "group_id"},
    "shortcut": {"weights_type", "weights_normalization"},
    "maxpool": {"stride_x", "stride_y", "maxpool_depth", "out_channels"},
    "convolutional": {"stride_x", "stride_y", "share_index", "antialiasing", "bin_output"},
    "rnn": {"logistic"},
    "crnn": {"hidden", "output", "size", "stride", "pad", "padding", "dilation", "groups"},
    "yolo": {
        "scale_x_y",
        "iou_loss",
        "iou_normalizer",
        "cls_normalizer",
        "obj_normalizer",
        "nms_kind",
        "beta_nms",
        "new_coords",
        "max_delta",
        "objectness_smooth",
        "iou_thresh",
        "resize",
        "counters_per_class",
        "label_smooth_eps",
    },
}
_FORK_ACTIVATIONS = {
    "relu6",
    "revleaky",
    "gelu",
    "swish",
    "mish",
    "hard_mish",
    "normalize_channels",
    "normalize_channels_softmax",
    "normalize_channels_softmax_maxval",
}


def cfg_flavour(sections):
    """ "alexeyab" when the cfg uses a section, option or activation only the fork has."""
    for s in sections:
        if s.type in _FORK_SECTIONS:
            return "alexeyab"
        keys = set(s.options)
        if keys & _FORK_KEYS.get(s.type, set()):
            return "alexeyab"
        if s.type == "shortcut" and "," in (s.options["from"].value if "from" in keys else ""):
            return "alexeyab"
        if "activation" in keys and s.options["activation"].value in _FORK_ACTIVATIONS:
            return "alexeyab"
    return "original"


def weights_flavour(path):
    """ "alexeyab" for a weights file whose header is the fork's 0.2.5; None otherwise
    (the original's 0.2.0 is also what converters write, so it decides nothing)."""
    return "alexeyab" if peek_header(path) == FORK_WEIGHTS_HEADER else None


def check_flavour(darknet):
    if darknet not in (None,) + DARKNET_FLAVOURS:
        raise NetworkError(
            f"unknown Darknet flavour '{darknet}' (known: {', '.join(DARKNET_FLAVOURS)})"
        )
    return darknet
