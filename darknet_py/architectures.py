"""Cfg text of well-known detectors, written by code: yolov4, yolov4-tiny and yolov3-tiny with
the layers, options and [net] settings of the AlexeyAB fork's stock cfgs, for any class count,
size and batch.

Tests and benchmarks that need a network of a real detector's shape build it from here, so
they run on a fresh clone with no C Darknet's files beside it. The text is meant to parse
into the same layers as the fork's file (tests/test_architectures.py compares them where
that file is at hand).

    from darknet_py.architectures import cfg_text
    text = cfg_text("yolov4", classes=3, size=416, batch=32)
"""

YOLOV4_ANCHORS = "12, 16, 19, 36, 40, 28, 36, 75, 76, 55, 72, 146, 142, 110, 192, 243, 459, 401"
TINY_ANCHORS = "10,14,  23,27,  37,58,  81,82,  135,169,  344,319"


class CfgWriter:
    """Sections appended one by one; `index` is the number the next layer will have, so a
    writer can name earlier layers as Darknet's routes do."""

    def __init__(self, net_options):
        self.parts = ["[net]\n" + "".join(f"{k}={v}\n" for k, v in net_options.items())]
        self.index = 0

    def section(self, name, **options):
        self.parts.append(f"[{name}]\n" + "".join(f"{k}={v}\n" for k, v in options.items()))
        self.index += 1
        return self.index - 1

    def conv(self, filters, size, stride=1, activation="leaky", bn=True):
        options = {"batch_normalize": 1} if bn else {}
        return self.section(
            "convolutional",
            **options,
            filters=filters,
            size=size,
            stride=stride,
            pad=1,
            activation=activation,
        )

    def route(self, layers, **options):
        return self.section("route", layers=layers, **options)

    def text(self):
        return "\n".join(self.parts)


def net_options(batch, subdivisions, size, momentum, learning_rate, max_batches, steps):
    return {
        "batch": batch,
        "subdivisions": subdivisions,
        "width": size,
        "height": size,
        "channels": 3,
        "momentum": momentum,
        "decay": 0.0005,
        "angle": 0,
        "saturation": 1.5,
        "exposure": 1.5,
        "hue": ".1",
        "learning_rate": learning_rate,
        "burn_in": 1000,
        "max_batches": max_batches,
        "policy": "steps",
        "steps": steps,
        "scales": ".1,.1",
    }


def csp_stage(w, filters, blocks, first=False):
    """One stage of CSPDarknet53: a stride-2 convolution, then the residual blocks on one
    path, joined with the other path by a route and a 1x1 convolution."""
    half = filters if first else filters // 2
    down = w.conv(filters, 3, 2, "mish")
    w.conv(half, 1, activation="mish")
    w.route(-2)
    w.conv(half, 1, activation="mish")
    for _ in range(blocks):
        w.conv(filters // 2 if first else half, 1, activation="mish")
        w.conv(half, 3, activation="mish")
        w.section("shortcut", **{"from": -3}, activation="linear")
    w.conv(half, 1, activation="mish")
    w.route(f"-1,{-(w.index - down - 1)}")  # with the path that skipped the blocks
    return w.conv(filters, 1, activation="mish")


def yolo_head(w, mask, classes, anchors, num, extra):
    w.conv(3 * (classes + 5), 1, activation="linear", bn=False)
    return w.section("yolo", mask=mask, anchors=anchors, classes=classes, num=num, **extra)


def tiny_heads(w, classes, head, lateral, fine_mask):
    """The tiny detectors' two heads: the coarse one on what the writer has so far, the fine
    one on it upsampled and joined with layer `lateral`."""
    yolo_head(w, "3,4,5", classes, TINY_ANCHORS, 6, head)
    w.route(-4)
    w.conv(128, 1)
    w.section("upsample", stride=2)
    w.route(f"-1, {lateral}")
    w.conv(256, 3)
    yolo_head(w, fine_mask, classes, TINY_ANCHORS, 6, head)


def yolov4(classes=80, size=608, batch=64, subdivisions=8):
    w = CfgWriter(net_options(batch, subdivisions, size, 0.949, 0.0013, 500500, "400000,450000"))
    w.parts[0] += "mosaic=1\n"
    w.conv(32, 3, activation="mish")
    csp_stage(w, 64, 1, first=True)
    csp_stage(w, 128, 2)
    # the stages' outputs the neck reads again (layers 54 and 85 in the stock file)
    stage3 = csp_stage(w, 256, 8)
    stage4 = csp_stage(w, 512, 8)
    csp_stage(w, 1024, 4)
    w.conv(512, 1)
    w.conv(1024, 3)
    w.conv(512, 1)
    for pool in (5, 9, 13):  # spatial pyramid pooling
        w.section("maxpool", stride=1, size=pool)
        if pool != 13:
            w.route(-2 if pool == 5 else -4)
    w.route("-1,-3,-5,-6")
    w.conv(512, 1)
    w.conv(1024, 3)
    w.conv(512, 1)
    for filters, lateral in ((256, stage4), (128, stage3)):
        w.conv(filters, 1)
        w.section("upsample", stride=2)
        w.route(lateral)
        w.conv(filters, 1)
        w.route("-1, -3")
        for _ in range(2):
            w.conv(filters, 1)
            w.conv(2 * filters, 3)
        w.conv(filters, 1)
    common = {"jitter": ".3", "ignore_thresh": ".7", "truth_thresh": 1}
    tail = {
        "iou_thresh": 0.213,
        "cls_normalizer": "1.0",
        "iou_normalizer": 0.07,
        "iou_loss": "ciou",
        "nms_kind": "greedynms",
        "beta_nms": 0.6,
        "max_delta": 5,
    }
    w.conv(256, 3)
    yolo_head(w, "0,1,2", classes, YOLOV4_ANCHORS, 9, {**common, "scale_x_y": 1.2, **tail})
    for filters, join, scale in ((256, -16, 1.1), (512, -37, 1.05)):
        w.route(-4)
        w.conv(filters, 3, 2)
        w.route(f"-1, {join}")
        for _ in range(2):
            w.conv(filters, 1)
            w.conv(2 * filters, 3)
        w.conv(filters, 1)
        w.conv(2 * filters, 3)
        extra = {**common, "random": 1} if filters == 512 else common
        yolo_head(
            w,
            "3,4,5" if filters == 256 else "6,7,8",
            classes,
            YOLOV4_ANCHORS,
            9,
            {**extra, "scale_x_y": scale, **tail},
        )
    return w.text()


def yolov4_tiny(classes=80, size=416, batch=64, subdivisions=1):
    w = CfgWriter(net_options(batch, subdivisions, size, 0.9, 0.00261, 2000200, "1600000,1800000"))
    w.conv(32, 3, 2)
    w.conv(64, 3, 2)
    for filters in (64, 128, 256):  # CSP blocks: half the channels through two convolutions
        w.conv(filters, 3)
        w.route(-1, groups=2, group_id=1)
        w.conv(filters // 2, 3)
        w.conv(filters // 2, 3)
        w.route("-1,-2")
        joined = w.conv(filters, 1)
        w.route("-6,-1")
        w.section("maxpool", size=2, stride=2)
    w.conv(512, 3)
    w.conv(256, 1)
    w.conv(512, 3)
    head = {
        "jitter": ".3",
        "scale_x_y": 1.05,
        "cls_normalizer": "1.0",
        "iou_normalizer": 0.07,
        "iou_loss": "ciou",
        "ignore_thresh": ".7",
        "truth_thresh": 1,
        "random": 0,
        "resize": 1.5,
        "nms_kind": "greedynms",
        "beta_nms": 0.6,
    }
    tiny_heads(w, classes, head, joined, "1,2,3")
    return w.text()


def yolov3_tiny(classes=80, size=416, batch=1, subdivisions=1):
    w = CfgWriter(net_options(batch, subdivisions, size, 0.9, 0.001, 500200, "400000,450000"))
    for i, filters in enumerate((16, 32, 64, 128, 256, 512)):
        conv = w.conv(filters, 3)
        if filters == 256:
            lateral = conv
        w.section("maxpool", size=2, stride=2 if i < 5 else 1)
    w.conv(1024, 3)
    w.conv(256, 1)
    w.conv(512, 3)
    head = {"jitter": ".3", "ignore_thresh": ".7", "truth_thresh": 1, "random": 1}
    tiny_heads(w, classes, head, lateral, "0,1,2")
    return w.text()


ARCHITECTURES = {"yolov4": yolov4, "yolov4-tiny": yolov4_tiny, "yolov3-tiny": yolov3_tiny}


def cfg_text(name, classes=80, size=None, batch=None, subdivisions=None):
    """The cfg of architecture `name` (ARCHITECTURES) with `classes` classes; size, batch and
    subdivisions default to the stock file's."""
    if name not in ARCHITECTURES:
        raise ValueError(f"no architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    options = {
        k: v
        for k, v in (("size", size), ("batch", batch), ("subdivisions", subdivisions))
        if v is not None
    }
    return ARCHITECTURES[name](classes=classes, **options)
