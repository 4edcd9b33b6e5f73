"""What the detection heads ([yolo], [region], [detection]) share: anchors, the truth
buffer's layout, the per-step statistics line and the class-id check."""
import numpy as np

F32 = np.float32
TRUTH_FIELDS = 5  # x, y, w, h, class


def parse_anchors(s, count):
    """Darknet's anchors= list into `count` floats (width, height pairs). Without anchors=
    every value is 0.5, as in Darknet; a list that is given must be whole: an odd count, a
    missing pair or a value not above 0 is an error (Darknet read garbage or 0.5 there)."""
    biases = np.full(count, 0.5, dtype=F32)
    anchors = s.get_float_list("anchors", None)
    if anchors is None:
        return biases
    if len(anchors) % 2:
        raise s.error(f"{len(anchors)} values: anchors are width,height pairs, so their "
                      f"number must be even", "anchors")
    if len(anchors) != count:
        raise s.error(f"{len(anchors)} values given but num={count // 2} anchors take "
                      f"{count} (a width and a height each)", "anchors")
    bad = [a for a in anchors if not a > 0]
    if bad:
        raise s.error(f"anchor sizes must be above 0, got {bad[0]:g}", "anchors")
    biases[:] = anchors
    return biases


def truth_boxes(net, batch, max_boxes):
    """Per image, the truth boxes Darknet's loss loops see: float32 (n, 5) rows of
    (x, y, w, h, class), at most max_boxes, stopping at the first with x == 0 as
    Darknet's `if(!truth.x) break` does."""
    truth = net.truth_host.reshape(batch, -1)
    per_image = truth.shape[1] // TRUTH_FIELDS
    rows = truth[:, :per_image * TRUTH_FIELDS].reshape(batch, per_image, TRUTH_FIELDS)
    rows = rows[:, :max_boxes]
    out = []
    for b in range(batch):
        zero = np.nonzero(rows[b, :, 0] == 0)[0]
        out.append(rows[b, :zero[0] if zero.size else rows.shape[1]])
    return out


def report(net, layer, line):
    """Keep a layer's training statistics line; print it only when the network is verbose
    (the trainer's switch), as Darknet prints it every step."""
    layer.stats_line = line
    if getattr(net, "verbose", False):
        print(line, flush=True)


def check_classes(truth, classes, layer):
    bad = truth[(truth[:, 4] < 0) | (truth[:, 4] >= classes), 4] if len(truth) else []
    if len(bad):
        raise ValueError(f"a truth box has class {int(bad[0])} but [{layer.type}] layer "
                         f"{layer.index} has classes={classes} (ids 0..{classes - 1})")


def ratio(num, den):
    return num / den if den else float("nan")
