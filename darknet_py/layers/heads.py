"""What the detection heads ([yolo], [region], [detection]) share: anchors, the truth
buffer's layout, the per-step statistics line and the class-id check."""

import numpy as np

from ..boxes import TRUTH_FIELDS, truth_per_image
from ..losses.yolo import ratio  # noqa: F401 (the heads' statistics use it)
from ..plurals import counted

F32 = np.float32


def parse_anchors(s, count):
    """Darknet's anchors= list into `count` floats (width, height pairs). Without anchors=
    every value is 0.5, as in Darknet. A list that does not cover num anchors is warned
    about (the missing values stay 0.5, as in Darknet); values beyond 2*num are ignored with
    a warning, as Darknet reads only the first 2*num (the fork's stock cspx-p7 cfgs do both);
    a value not above 0 is an error."""
    biases = np.full(count, 0.5, dtype=F32)
    anchors = s.get_float_list("anchors", None)
    if anchors is None:
        return biases
    if len(anchors) < count:
        # A warning, not an error: the fork's stock cspx-p7-mish_hp.cfg lacks a comma and so
        # a value, and the fork builds it.
        odd = "; anchors are width,height pairs" if len(anchors) % 2 else ""
        s.warn(
            f"{counted(len(anchors), 'value')} given but num={count // 2} anchors take "
            f"{count}{odd}; "
            f"the missing values are 0.5, as in Darknet (a missing comma?)",
            "anchors",
        )
    if len(anchors) > count:
        s.warn(
            f"{counted(len(anchors), 'value')} given but num={count // 2} anchors take "
            f"{count}; "
            f"the rest are ignored, as Darknet does",
            "anchors",
        )
        anchors = anchors[:count]
    bad = [a for a in anchors if not a > 0]
    if bad:
        raise s.error(f"anchor sizes must be above 0, got {bad[0]:g}", "anchors")
    biases[: len(anchors)] = anchors
    return biases


def is_fork_flavour(obj):
    """Whether a network (or a layer's BuildContext) follows the AlexeyAB fork: its
    `darknet` is "alexeyab"."""
    return getattr(obj, "darknet", "original") == "alexeyab"


def truth_boxes(net, batch, max_boxes):
    """Per image, the truth boxes Darknet's loss loops see (boxes.truth_per_image) in the
    network's staged truth: rows of net.truth_size floats (5, or the fork's 6 with a
    track id last), at most max_boxes."""
    return truth_per_image(
        net.truth_host, batch, getattr(net, "truth_size", TRUTH_FIELDS), max_boxes
    )


def keep_report(layer, line):
    """Keep a head's statistics line (made after the step by collect, or in forward where
    the loss runs on the host); print it when the network was verbose at the step's
    forward (layer.print_stats), as Darknet prints it every step."""
    layer.stats_line = line
    if layer.print_stats:
        print(line, flush=True)


def check_classes(truth, classes, layer, whose="classes="):
    bad = truth[(truth[:, 4] < 0) | (truth[:, 4] >= classes), 4] if len(truth) else []
    if len(bad):
        raise ValueError(
            f"a truth box has class {int(bad[0])} but [{layer.type}] layer "
            f"{layer.index} has {whose}{classes} (ids 0..{classes - 1})"
        )
