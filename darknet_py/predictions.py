"""Detections and classifications from a network's output, as Darknet's test paths make them.

The application side: src/network.c's get_network_boxes (each head decodes its own output
with its ``detections`` method), detect/classify, and src/image.c's draw_detections. Box
arithmetic and NMS live below the layers in boxes.py.
"""

import contextlib
import math
import os
import sys
import warnings

import numpy as np

from .boxes import do_nms_sort
from .errors import DarknetWarning
from .image import ImageError, from_bgr, letterbox, load_image, match_channels, resize_image
from .layers.heads import is_fork_flavour
from .names import find_names, read_names
from .plurals import counted
from .tree import hierarchy_predictions

DETECTOR_TYPES = ("yolo", "region", "detection", "gaussian_yolo")
F32 = np.float32


def detector_layers(net):
    return [l for l in net.layers if l.type in DETECTOR_TYPES]


def get_network_boxes(net, img_w, img_h, thresh=0.5, hier=0.5, relative=True, letter=True, image=0):
    """Darknet's get_network_boxes: every [yolo]/[region]/[detection] layer's detections for
    `image` of the last forward pass, in layer order, boxes on the original img_w x img_h
    image. ``letter`` says whether the input was letterboxed (else plainly resized).
    ``hier`` is Darknet's hierarchy threshold, which only a [region] layer with a softmax
    tree (tree=) reads, as in Darknet."""
    netw, neth = net.input_shape[2], net.input_shape[1]
    dets = []
    for layer in detector_layers(net):
        first = image * layer.outputs
        output = net.be.to_host(layer.output[first : first + layer.outputs])  # that image alone
        tree = {"hier": hier} if layer.type == "region" else {}
        dets += layer.detections(output, img_w, img_h, netw, neth, thresh, relative, letter, **tree)
    # An untrained or diverged net can put a box at infinity (exp overflow, as in C); it
    # cannot be drawn, matched or written, and Darknet's use of it is undefined.
    return [d for d in dets if np.all(np.isfinite(d.box))]


def nms_kind(net):
    """(kind, beta) of the NMS a detector uses: as the AlexeyAB fork's test, map and valid
    (net.layers[net.n - 1]), the network's last layer's nms_kind and beta_nms when it is a
    [yolo] or [Gaussian_yolo] of the fork; Darknet's default NMS otherwise."""
    last = net.layers[-1]
    return getattr(last, "nms_kind", "default"), getattr(last, "beta_nms", 0.6)


# ---- applications -----------------------------------------------------------------------------
def as_image(image, channels=3):
    """A Darknet (C, H, W) float32 image from a path, a Darknet image, or an OpenCV BGR
    uint8 array (H, W[, 3])."""
    if isinstance(image, (str, os.PathLike)):
        return load_image(image, channels)
    a = np.asarray(image)
    if a.size == 0:
        raise ImageError(f"the image array is empty (shape {a.shape})")
    if a.dtype == np.uint8:
        return from_bgr(a, channels)
    if a.ndim == 3 and a.shape[0] in (1, 3):
        return match_channels(np.ascontiguousarray(a, dtype=np.float32), channels)
    raise ImageError(
        f"expected an image path, a Darknet (C, H, W) float image or an OpenCV "
        f"(H, W, 3) uint8 BGR array; got {a.dtype} array of shape {a.shape}"
    )


class NamesWarning(DarknetWarning):
    """The class names given do not match the network's class count."""


def check_names(names, classes, *beside, warn_missing=True):
    """The names to show: those given, else a names file found beside the weights or cfg
    (names.find_names; a note on stderr says which), else None with a warning (unless
    warn_missing is False). Warns when the names do not match the network's class count
    (Darknet would read past the end of its list); classes without a name are shown as
    numbers."""
    if names is None:
        found = find_names(classes, *beside)
        if found is None:
            if warn_missing:
                warnings.warn(
                    "no class names given; classes are shown as numbers (give "
                    "--names FILE or --data FILE)",
                    NamesWarning,
                    stacklevel=2,
                )
            return None
        print(
            f"darknet-py: note: class names from {found} (give --names to choose others)",
            file=sys.stderr,
        )
        return read_names(found)
    if len(names) != classes:
        warnings.warn(
            f"{counted(len(names), 'class name')} given, but the network has "
            f"{counted(classes, 'class', 'classes')}"
            + ("; the others are shown as numbers" if len(names) < classes else ""),
            NamesWarning,
            stacklevel=2,
        )
    return names


def _class_name(names, class_id):
    if names is not None and 0 <= class_id < len(names):
        return names[class_id]
    return None


# Set by letterbox_forced(): the fork's -letter_box (darknet-py's --letter-box) for the
# networks of one command, which load their networks deep inside (map, valid, video).
_letterbox_forced = False


@contextlib.contextmanager
def letterbox_forced(on=True):
    """Within the block, detect() letterboxes every [yolo]/[region] network as the fork's
    `-letter_box` makes it do (a fork-flavour network is otherwise resized plainly)."""
    global _letterbox_forced
    before, _letterbox_forced = _letterbox_forced, bool(on) or _letterbox_forced
    try:
        yield
    finally:
        _letterbox_forced = before


def letterboxes(net):
    """Whether detect letterboxes for this net: a YOLOv1 [detection] net is plainly resized
    (as Darknet's yolo.c does), and so is a net of the AlexeyAB fork's flavour without [net]
    letter_box=1 or -letter_box (letterbox_forced); pjreddie's [yolo]/[region] nets are
    letterboxed."""
    layers = detector_layers(net)
    if layers[-1].type == "detection":
        return False
    if is_fork_flavour(net) and not _letterbox_forced:
        return bool(getattr(net.options, "letter_box", 0))
    return True


def default_thresh(net):
    """`detector test`'s default -thresh: .25 in the fork (its run_detector, also for demo
    and map), .5 in pjreddie's Darknet."""
    return 0.25 if is_fork_flavour(net) else 0.5


def _check_detector(net, thresh, nms):
    if not 0 <= thresh <= 1 or not 0 <= nms <= 1:  # also refuses NaN
        raise ValueError(f"thresh ({thresh}) and nms ({nms}) must be in [0, 1]")
    if not detector_layers(net):
        raise ValueError(
            f"{net.path}: the network has no [yolo], [region] or [detection] "
            f"layer; use classify() for classifiers"
        )


def _network_input(net, image):
    """(the image sized for the network, its original width, height)."""
    channels, neth, netw = net.input_shape
    img = as_image(image, channels)
    sized = letterbox(img, netw, neth) if letterboxes(net) else resize_image(img, netw, neth)
    return sized, img.shape[2], img.shape[1]


def _infer_images(net, images):
    """Run the network on images sized as detect sizes them (letterboxes); returns each
    image's (width, height). Photos go up as their uint8 bytes and are sized on the
    backend (Network.infer_photos); other images are sized on the host. The network is
    sized for them by infer_photos or infer, once every image was read."""
    photos = net.as_photos(images)
    if photos is not None:
        net.infer_photos(photos, letter=letterboxes(net))
        return [(p.shape[1], p.shape[0]) for p in photos]
    inputs = [_network_input(net, image) for image in images]
    net.infer(np.stack([sized for sized, _, _ in inputs]))
    return [(img_w, img_h) for _, img_w, img_h in inputs]


def _found(net, dets, img_w, img_h, thresh, nms, darknet_order):
    """NMS and the threshold on one image's candidates: detect()'s result."""
    classes = detector_layers(net)[-1].classes
    if nms:
        kind, beta = nms_kind(net)
        do_nms_sort(dets, classes, nms, kind, beta)
    found = []
    for d in dets:
        if d.probs.size == 0:
            continue
        best = int(np.argmax(d.probs))
        if d.probs[best] > thresh:
            d.class_id, d.prob = best, float(d.probs[best])
            d.name = _class_name(net.names, best)
            d.image_size = (img_w, img_h)
            found.append(d)
    if not darknet_order:
        found.sort(key=lambda d: -d.prob)
    return found


def detect(net, image, thresh=0.5, hier=0.5, nms=0.45, darknet_order=False):
    """Detect objects in one image as Darknet's `detector test` does: letterbox to the
    network size (see letterboxes), run with batch 1, decode, NMS per class (of the kind
    the last [yolo] layer's nms_kind gives). Returns the detections whose best class is
    above thresh, sorted by that probability, highest first (with darknet_order, in the
    order Darknet prints them: NMS's order); boxes relative to the original image. A
    detection may have more classes above thresh: see detection_classes."""
    _check_detector(net, thresh, nms)
    ((img_w, img_h),) = _infer_images(net, [image])  # the heads' outputs are read below
    dets = get_network_boxes(
        net, img_w, img_h, thresh, hier, relative=True, letter=letterboxes(net)
    )
    return _found(net, dets, img_w, img_h, thresh, nms, darknet_order)


def detect_batch(net, images, thresh=0.5, hier=0.5, nms=0.45, batch=8):
    """detect() on a list of images, `batch` of them per forward pass: a list with each
    image's detections, the same as detect() gives one at a time."""
    _check_detector(net, thresh, nms)
    results = []
    for start in range(0, len(images), max(1, int(batch))):
        sizes = _infer_images(net, images[start : start + batch])  # heads read per image
        for index, (img_w, img_h) in enumerate(sizes):
            dets = get_network_boxes(
                net, img_w, img_h, thresh, hier, relative=True, letter=letterboxes(net), image=index
            )
            results.append(_found(net, dets, img_w, img_h, thresh, nms, False))
    return results


def detection_classes(d):
    """[(class_id, prob)] of every class of a detection above the threshold it was found
    with (the heads zero the others), in class order: Darknet prints a line for each and
    labels the box with all of them."""
    return [(int(c), float(d.probs[c])) for c in np.flatnonzero(d.probs > 0)]


def output_layer(net):
    """Darknet's get_network_output_layer: the last layer that is not a [cost] layer."""
    for layer in reversed(net.layers):
        if layer.type != "cost":
            return layer
    return net.layers[-1]


def classify(net, image, top=5):
    """Classify one image as Darknet's `classifier predict` does: letterbox to the network
    size, batch 1, and the top-k outputs of the last non-cost layer (ties keep the lower
    index first, as Darknet's top_k); with a class tree, of the leaves' P(class). Returns
    [(class_id, prob, name or None), ...]."""
    channels, neth, netw = net.input_shape
    img = as_image(image, channels)
    sized = letterbox(img, netw, neth)
    net.set_batch(1)
    net.infer(sized[None])  # the output layer is read below
    layer = output_layer(net)
    pred = net.be.to_host(layer.output)[: layer.outputs].astype(np.float32)
    if net.hierarchy is not None:
        # classifier predict: every class's P(class), the inner classes zeroed
        pred = hierarchy_predictions(pred, net.hierarchy, only_leaves=True)
    order = np.argsort(-pred, kind="stable")[: max(0, int(top))]
    return [(int(i), float(pred[i]), _class_name(net.names, int(i))) for i in order]


# ---- drawing and export (image.c) ---------------------------------------------------------------
_COLORS = ((1, 0, 1), (0, 0, 1), (0, 1, 1), (0, 1, 0), (1, 1, 0), (1, 0, 0))


def class_color(class_id, classes):
    """Darknet's colour for a class (draw_detections' offset and get_color), as an
    (r, g, b) tuple of floats in [0, 1]."""
    classes = max(1, int(classes))
    offset = class_id * 123457 % classes
    ratio = offset / classes * 5
    i, j = math.floor(ratio), math.ceil(ratio)
    ratio -= i
    return tuple((1 - ratio) * _COLORS[i][c] + ratio * _COLORS[j][c] for c in range(3))


def pixel_box(box, img_w, img_h):
    """(left, top, right, bottom) integer pixels of a relative box, clamped to the image
    as Darknet's draw_detections does. A box wholly outside the image (possible: the
    network may place a centre past the border) collapses to a line on the border rather
    than getting a negative width or height."""
    x, y, w, h = box
    left = min(img_w - 1, max(0, int((x - w / 2) * img_w)))
    right = max(left, min(img_w - 1, int((x + w / 2) * img_w)))
    top = min(img_h - 1, max(0, int((y - h / 2) * img_h)))
    bottom = max(top, min(img_h - 1, int((y + h / 2) * img_h)))
    return left, top, right, bottom


def _display_name(names, class_id):
    name = _class_name(names, class_id)
    return name if name is not None else str(class_id)


def _label(d, names):
    """ "truck, car 56%": every class above the threshold, as Darknet joins them, and the
    best class's probability."""
    ids = [c for c, _ in detection_classes(d)] or [d.class_id]
    return f"{', '.join(_display_name(names, c) for c in ids)} {100 * d.prob:.0f}%"


def draw_detections(bgr_image, detections, names=None, classes=None):
    """Draw labelled boxes on a copy of an OpenCV BGR uint8 image and return it: Darknet's
    box widths (0.6% of the height) and class colours, each label on a filled patch of its
    box colour, in black or white, whichever reads better on it.

    Labels are placed by descending score: each goes above its box, else inside its top
    edge, else below it, at the first of those places no likelier label covers, and always
    wholly inside the picture; they are drawn likeliest last, so a likelier label is never
    covered by a less likely one. Text is 3% of the picture's height, at least 10 px.
    ``classes`` (for the colours) defaults to len(names), else the highest class id + 1."""
    import cv2

    img = np.ascontiguousarray(np.array(bgr_image, dtype=np.uint8, copy=True))
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    img_h, img_w = img.shape[:2]
    if classes is None:
        classes = len(names) if names else max([d.class_id for d in detections] + [0]) + 1
    shown = sorted((d for d in detections if d.class_id >= 0), key=lambda d: -d.prob)
    width = max(1, int(img_h * 0.006))
    style = _label_style(img_h)
    colors, labels, taken = [], [], []
    for d in shown:
        r, g, b = class_color(d.class_id, classes)
        colors.append(
            (
                (int(b * 255), int(g * 255), int(r * 255)),
                (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else (255, 255, 255),
            )
        )
        box = pixel_box(d.box, img_w, img_h)
        labels.append(_place_label(_label(d, names), box, img_w, img_h, taken, style))
    for d, (color, _) in zip(reversed(shown), reversed(colors)):  # likeliest box on top
        left, top, right, bottom = pixel_box(d.box, img_w, img_h)
        for k in range(width):  # Darknet's draw_box_width: lines nested inwards
            cv2.rectangle(img, (left + k, top + k), (right - k, bottom - k), color, 1)
    for (text, (x0, y0, x1, y1)), (color, ink) in zip(reversed(labels), reversed(colors)):
        cv2.rectangle(img, (x0, y0), (x1, y1), color, cv2.FILLED)
        cv2.putText(
            img,
            text,
            (x0 + style["pad"], y1 - style["pad"] - style["base"]),
            style["font"],
            style["scale"],
            ink,
            style["thickness"],
            cv2.LINE_AA,
        )
    return img


def _label_style(img_h):
    """Font, scale and thickness for labels 3% of the picture high (Darknet's size), and
    at least 10 px so that a 160 px thumbnail still reads."""
    import cv2

    font = cv2.FONT_HERSHEY_SIMPLEX
    (_, unit_h), _ = cv2.getTextSize("Ag", font, 1.0, 1)
    scale = max(10, img_h * 0.03) / unit_h
    thickness = max(1, int(round(scale * 1.6)))
    (_, th), base = cv2.getTextSize("Ag", font, scale, thickness)
    return dict(
        font=font, scale=scale, thickness=thickness, text_h=th, base=base, pad=max(1, thickness)
    )


def _place_label(text, box, img_w, img_h, taken, style):
    """(text, (x0, y0, x1, y1)) for a label of a box: the first of above / inside the top /
    below the box that no earlier (likelier) label overlaps, clamped into the picture."""
    import cv2

    (tw, _), _ = cv2.getTextSize(text, style["font"], style["scale"], style["thickness"])
    w = min(img_w - 1, tw + 2 * style["pad"])
    h = min(img_h - 1, style["text_h"] + style["base"] + 2 * style["pad"])
    left, top, _, bottom = box
    x0 = max(0, min(left, img_w - 1 - w))
    spots = []
    for y0 in (top - h, top, bottom):
        y0 = max(0, min(y0, img_h - 1 - h))
        spots.append((x0, y0, x0 + w, y0 + h))
    free = [r for r in spots if not any(_overlaps(r, t) for t in taken)]
    rect = free[0] if free else spots[0]
    taken.append(rect)
    return text, rect


def _overlaps(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def c_round(v):
    """C's round(): halves away from zero."""
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def ext_output_lines(detections, img_w, img_h, names=None, thresh=0.5):
    """The AlexeyAB fork's -ext_output text for detect()'s results: detections from the
    leftmost, each as "name: 87%\t(left_x: ... top_y: ... width: ... height: ...)" (its
    unclamped box in pixels, rounded), then the same line for each other class above
    thresh (the fork repeats the box since January 2020). Give the detections in NMS's
    order (darknet_order=True) for the fork's order among boxes with the same left edge."""
    lines = []
    for d in sorted(detections, key=lambda d: d.box[0] - d.box[2] / 2):
        x, y, w, h = d.box
        box = (
            f"\t(left_x: {c_round((x - w / 2) * img_w):4.0f}   top_y: "
            f"{c_round((y - h / 2) * img_h):4.0f}   width: {c_round(w * img_w):4.0f}   "
            f"height: {c_round(h * img_h):4.0f})"
        )
        name = d.name if d.name is not None else _class_name(names, d.class_id)
        lines.append(f"{name if name is not None else d.class_id}: {100 * d.prob:.0f}%{box}")
        for c, p in enumerate(d.probs):
            if p > thresh and c != d.class_id:
                other = _class_name(names, c)
                lines.append(f"{other if other is not None else c}: {100 * p:.0f}%{box}")
    return lines


def detections_to_json(detections, img_w, img_h, names=None):
    """JSON-ready dicts for detect()'s results on an img_w x img_h image: name, class_id,
    prob (the best class), classes (every class above the threshold: name, class_id,
    prob), objectness, the box in pixels (left, top, width, height, clamped as Darknet
    draws it) and the relative box (centre x, y, width, height)."""
    rows = []
    for d in detections:
        left, top, right, bottom = pixel_box(d.box, img_w, img_h)
        name = d.name if d.name is not None else _display_name(names, d.class_id)
        rows.append(
            {
                "name": name,
                "class_id": int(d.class_id),
                "prob": round(float(d.prob), 6),
                "classes": [
                    {"name": _display_name(names, c), "class_id": c, "prob": round(p, 6)}
                    for c, p in detection_classes(d)
                ],
                "objectness": round(float(d.objectness), 6),
                "box": {"left": left, "top": top, "width": right - left, "height": bottom - top},
                "relative_box": {
                    k: round(float(v), 6) for k, v in zip(("x", "y", "w", "h"), d.box)
                },
            }
        )
    return rows


def yolo_txt(detections):
    """detect()'s results as YOLO label lines, "class x y w h score" (relative to the image,
    six decimals), highest score first: the format of the labels a dataset is made of."""
    return "".join(
        f"{d.class_id} {d.box[0]:.6f} {d.box[1]:.6f} {d.box[2]:.6f} {d.box[3]:.6f} {d.prob:.6f}\n"
        for d in detections
    )
