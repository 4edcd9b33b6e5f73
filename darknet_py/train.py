"""Training: Darknet's train_classifier and train_detector loops.

One iteration is what Darknet calls a batch: ``batch`` images from the data loader,
run through the network as ``subdivisions`` forward/backward passes of
``batch/subdivisions`` images each, the weights updated after the last one. The loss
printed is Darknet's: the sum of the passes' costs over the images of the iteration,
and the running average ``avg = .9*avg + .1*loss``, started at the first loss.

The iteration count lives in the weights file: ``seen`` (images trained on) divided by
the images per iteration. Resuming from ``<backup>/<cfg>.backup`` therefore continues at
the same iteration and learning rate; the data loader's batch k depends only on (seed, k,
input size), so a resumed run sees the batches the uninterrupted run would have seen.
(Momentum is not in a weights file, as in Darknet: the first update after a resume starts
its momentum from zero.)

Files in the .data file's backup directory, named after the cfg (``cfg/yolov3.cfg`` ->
``yolov3``), as Darknet writes them:

* ``yolov3.backup`` every 100 iterations, and when training is interrupted (Ctrl-C);
* detector: ``yolov3_<iteration>.weights`` every 100 iterations up to 1000, then every
  10000 (train_detector); classifier: ``<cfg>_<epoch>.weights`` after each pass over the
  training list (train_classifier numbers these by epoch);
* ``yolov3_final.weights`` at max_batches;
* with map evaluation: ``yolov3_last.weights`` after every evaluation and
  ``yolov3_best.weights`` whenever the score (mAP@0.5, or top-1 for a classifier) is the
  best so far;
* ``chart_yolov3.png``: loss (and the evaluation score) over the iterations, the whole
  run's: ``yolov3.history.json`` keeps the history beside the backup, so a resumed run's
  chart continues the earlier one's.

Every file is written atomically (a temporary file renamed into place), with the mode
a plain open() would give it.
"""
import json
import math
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .data.augment_fork import classifier_augment, detector_augment
from .data.config import load_data_config
from .data.labels import MissingLabelFile, check_classifier_labels, label_path, read_image_labels
from .data.loader import DataLoader, default_workers
from .detection import detector_layers, output_layer
from .distributed import Ranks
from .files import (OverwriteError, atomic_output, refuse_overwrite, remove_stale_temporaries,
                    write_text_atomically)
from .layers.heads import is_fork_flavour
from .network import NetworkError, load_network
from .precision import log_note as precision_log_note
from .validate import evaluate_classifier, evaluate_detector, network_task
from .weights import TransferReport, WeightsError, load_weights, read_header

BACKUP_EVERY = 100          # iterations between <cfg>.backup saves (Darknet's detector)
MULTISCALE_EVERY = 10       # iterations between input sizes with random=1 (train_detector)
CLASSIFIER_MULTISCALE_EVERY = 40   # train_classifier's interval for [net] random=1
FINAL_SIZE_ITERATIONS = 200        # the last 200 iterations run at the largest size


class TrainError(Exception):
    """A problem that stops training before (or instead of) it starts, or that training
    cannot go on from (divergence)."""


class Diverged(Exception):
    """The loss (or the weights) became NaN or infinite."""

    def __init__(self, loss):
        super().__init__(loss)
        self.loss = loss


class Terminated(KeyboardInterrupt):
    """SIGTERM, which job schedulers send before killing a job: handled as Ctrl-C is."""


def sigterm_as_interrupt():
    """Turn SIGTERM into Terminated (a KeyboardInterrupt) while training, so a scheduler's
    stop saves the backup as Ctrl-C does; returns the function that restores the old
    handler. Signal handlers can only be set from the main thread: elsewhere, nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def terminate(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    return lambda: signal.signal(signal.SIGTERM, previous)


def last_saved_backup(path, net):
    """The iteration a backup file holds, read from its header's `seen`."""
    try:
        with open(path, "rb") as f:
            _, seen, _, _ = read_header(f, path)
    except (OSError, WeightsError):
        return "unknown"
    return seen // net.images_per_iteration


def cfg_base(path):
    """Darknet's basecfg: the file name without directories and extension."""
    name = os.path.basename(os.fspath(path))
    return name.rsplit(".", 1)[0] if "." in name else name


# ---- Darknet's schedules ----------------------------------------------------------------
def detector_snapshot_due(iteration):
    """train_detector's numbered weights: every 100 iterations below 1000, then every 10000."""
    return iteration % 10000 == 0 or (iteration < 1000 and iteration % 100 == 0)


def default_map_interval(train_images, images_per_iteration):
    """Iterations between evaluations with --map: about 4 passes over the training list,
    at least 100 (the rule of AlexeyAB's darknet, which introduced -map)."""
    return max(100, 4 * train_images // max(1, images_per_iteration))


def multiscale_size(width, height, stride, iteration, max_batches, seed, classifier=False):
    """The input size Darknet's random=1 picks for the block of iterations holding
    `iteration`. train_detector draws (rand() % 10 + 10) * 32: a grid of 10..19 cells
    where a 416 network has 13; here the grid is scaled the same way from the cfg's own
    size, so small networks get small sizes. The last 200 iterations use the largest size,
    as Darknet's `dim = 608` does. (Classifiers: (rand() % 11 + 4) * 32, 4..14 cells of a
    224 network's 7, every 40 iterations.) The draw depends only on (seed, block), so a
    resumed run picks the sizes the uninterrupted run would have."""
    every = CLASSIFIER_MULTISCALE_EVERY if classifier else MULTISCALE_EVERY
    low, high, base = (4, 14, 7) if classifier else (10, 19, 13)
    block = iteration // every
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 7, block]))
    cells = int(rng.integers(low, high + 1))
    if not classifier and iteration + FINAL_SIZE_ITERATIONS > max_batches:
        cells = high
    grid_w = max(1, round(width / stride * cells / base))
    grid_h = max(1, round(height / stride * cells / base))
    return grid_w * stride, grid_h * stride


def network_stride(net):
    """The coarsest downsampling from the input to a detection layer (32 for YOLOv3), or
    to the last image-shaped layer of a classifier."""
    width = net.options.width
    grids = [l.w for l in detector_layers(net)]
    if not grids:
        grids = [l.out_w for l in net.layers if l.out_w > 0]
    smallest = max(1, min(grids))
    return max(1, width // smallest)


def numbered_weights(backup_dir, base, task, start, max_batches, images_per_iteration,
                     train_images):
    """The numbered weights files in backup_dir that a run from iteration `start` to
    max_batches would write: detector iterations (detector_snapshot_due), classifier
    epochs."""
    pattern = re.compile(re.escape(base) + r"_(\d+)\.weights$")
    try:
        names = os.listdir(backup_dir)
    except OSError:
        return []
    if task == "detector":
        def written(n):
            return start < n <= max_batches and detector_snapshot_due(n)
    else:
        first = start * images_per_iteration // train_images
        last = max_batches * images_per_iteration // train_images

        def written(n):
            return first < n <= last
    return [os.path.join(backup_dir, name) for name in sorted(names)
            if (m := pattern.match(name)) and written(int(m.group(1)))]


def check_policy(cfg, options, log):
    """Warn about learning-rate schedules that cannot do what their numbers say: a burn-in
    that never ends (the rate stays near 0 the whole run) and steps never reached."""
    policy, max_batches = options.policy, options.max_batches
    if policy["burn_in"] >= max_batches:
        log(f"darknet-py: warning: {cfg}: burn_in={policy['burn_in']} is not below "
            f"max_batches={max_batches}: the learning rate ramps up from 0 for the whole "
            f"run and never reaches learning_rate={options.learning_rate:g}")
    late = [step for step in policy.get("steps", ()) if step >= max_batches]
    if late:
        log(f"darknet-py: warning: {cfg}: steps={','.join(map(str, late))} at or beyond "
            f"max_batches={max_batches}: the rate never changes there")


def check_detector_labels(paths, classes):
    """Refuse a detector training list in which no image has a single labelled box:
    training would only teach the network that nothing is ever there."""
    for path in paths:
        try:
            if len(read_image_labels(path, classes)):
                return
        except MissingLabelFile:
            continue
    raise TrainError(f"none of the {len(paths)} training images has a labelled box (label "
                     f"files missing or empty; the first is looked for at "
                     f"{label_path(paths[0])})")


def resize_network(net, width, height):
    """Resize for multi-scale training; a network that cannot be resized stops training."""
    try:
        net.resize(width, height)
    except NetworkError as e:
        raise TrainError(f"random=1: {e}") from None


# ---- the chart ---------------------------------------------------------------------------
def _nice_ceiling(value):
    """A round number >= value (1, 2, 2.5, 5 times a power of ten) for an axis end."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * 0.9999:
            return step * power
    return 10 * power


def _tick_label(value):
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def draw_chart(path, losses, averages, iterations, scores=(), score_name="mAP@0.5",
               title="", max_batches=None):
    """Write a PNG chart: loss (grey) and average loss (blue) against the iteration on the
    left axis, the evaluation score (red, 0..1) on the right axis. Atomic write."""
    import cv2

    width, height = 1000, 600
    left, right, top, bottom = 80, 90 if scores else 30, 50, 70
    img = np.full((height, width, 3), 255, dtype=np.uint8)
    pw, ph = width - left - right, height - top - bottom
    font = cv2.FONT_HERSHEY_SIMPLEX
    ink, grid = (0, 0, 0), (225, 225, 225)
    x_end = max([max_batches or 0] + list(iterations) + [1])
    # The first iterations' losses are far larger than the rest: scale the axis to the
    # average loss after the first tenth of the run, so later progress stays visible
    # (the start of the grey raw-loss line is clipped at the top).
    settled = [v for v in averages[len(averages) // 10:] if math.isfinite(v)]
    everything = [v for v in list(averages) + list(losses) if math.isfinite(v)]
    y_end = _nice_ceiling(max(settled) * 1.1) if settled else 1.0
    if everything and max(everything) <= 1.5 * y_end:   # nothing far above: show it all
        y_end = _nice_ceiling(max(everything) * 1.05)

    def px(it):
        return int(round(left + pw * it / x_end))

    def py(v, end):
        return int(round(top + ph * (1 - min(max(v, 0.0), end) / end)))

    for k in range(6):   # grid and axis ticks
        y = top + ph * k // 5
        cv2.line(img, (left, y), (left + pw, y), grid, 1)
        label = _tick_label(y_end * (5 - k) / 5)
        (tw, th), _ = cv2.getTextSize(label, font, 0.45, 1)
        cv2.putText(img, label, (left - tw - 8, y + th // 2), font, 0.45, ink, 1, cv2.LINE_AA)
        if scores:
            cv2.putText(img, f"{(5 - k) / 5:.1f}", (left + pw + 8, y + th // 2), font, 0.45,
                        (0, 0, 200), 1, cv2.LINE_AA)
        x = left + pw * k // 5
        cv2.line(img, (x, top), (x, top + ph), grid, 1)
        label = _tick_label(round(x_end * k / 5))
        (tw, th), _ = cv2.getTextSize(label, font, 0.45, 1)
        cv2.putText(img, label, (x - tw // 2, top + ph + th + 8), font, 0.45, ink, 1,
                    cv2.LINE_AA)
    cv2.rectangle(img, (left, top), (left + pw, top + ph), ink, 1)

    def polyline(values, end, colour, thickness):
        pts = [(px(i), py(v, end)) for i, v in zip(iterations, values) if math.isfinite(v)]
        if len(pts) > 1:
            cv2.polylines(img, [np.array(pts, dtype=np.int32)], False, colour, thickness,
                          cv2.LINE_AA)

    polyline(losses, y_end, (190, 190, 190), 1)
    polyline(averages, y_end, (200, 80, 0), 2)
    if scores:
        pts = [(px(i), py(v, 1.0)) for i, v in scores]
        if len(pts) > 1:
            cv2.polylines(img, [np.array(pts, dtype=np.int32)], False, (0, 0, 200), 2,
                          cv2.LINE_AA)
        for (i, v), p in zip(scores, pts):
            cv2.circle(img, p, 4, (0, 0, 200), -1, cv2.LINE_AA)
        best = max(scores, key=lambda s: s[1])
        cv2.putText(img, f"best {score_name} {best[1]:.4f} at {best[0]}",
                    (left + pw - 330, top + 22), font, 0.5, (0, 0, 200), 1, cv2.LINE_AA)
    cv2.putText(img, title, (left, 32), font, 0.65, ink, 1, cv2.LINE_AA)
    cv2.putText(img, "iteration", (left + pw // 2 - 35, height - 18), font, 0.55, ink, 1,
                cv2.LINE_AA)
    legend = "loss (grey), average loss (blue)"
    if scores:
        legend += f", {score_name} (red, right axis)"
    (tw, _), _ = cv2.getTextSize(legend, font, 0.45, 1)
    cv2.putText(img, legend, (width - right - tw, 32), font, 0.45, ink, 1, cv2.LINE_AA)
    vertical = np.full((20, 100, 3), 255, dtype=np.uint8)   # the y-axis title, rotated
    cv2.putText(vertical, "loss", (30, 15), font, 0.55, ink, 1, cv2.LINE_AA)
    vertical = cv2.rotate(vertical, cv2.ROTATE_90_COUNTERCLOCKWISE)
    y0 = top + ph // 2 - 50
    img[y0:y0 + 100, 8:28] = vertical
    with atomic_output(path, kind="chart") as tmp:
        if not cv2.imwrite(tmp, img):
            raise OSError(f"{path}: cannot write the chart")


# ---- the history behind the chart --------------------------------------------------------
def history_path(backup_dir, base):
    return os.path.join(backup_dir, f"{base}.history.json")


def save_history(path, losses, scores):
    """The losses [(iteration, loss, average)] and scores [(iteration, score)] so far,
    beside <cfg>.backup, so that a resumed run's chart shows the whole run. Written
    atomically, whenever the backup is."""
    write_text_atomically(path, json.dumps({"losses": losses, "scores": scores}) + "\n")


def load_history(path, up_to, log):
    """(losses, scores) of the iterations up to `up_to` from a history file; empty when
    there is none or it cannot be read (the chart then starts at the resume)."""
    if not os.path.exists(path):
        return [], []
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        losses = [tuple(row) for row in saved["losses"] if row[0] <= up_to]
        scores = [tuple(row) for row in saved["scores"] if row[0] <= up_to]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        log(f"darknet-py: warning: {path}: cannot read the training history ({e}); the "
            f"chart starts at this run")
        return [], []
    return losses, scores


# ---- training ------------------------------------------------------------------------------
@dataclass
class TrainResult:
    backup_dir: str
    final_weights: str = None       # None when interrupted
    iterations: int = 0             # Darknet's current batch at the end
    seen: int = 0
    avg_loss: float = float("nan")
    losses: list = field(default_factory=list)      # (iteration, loss, avg_loss)
    scores: list = field(default_factory=list)      # (iteration, mAP or top-1)
    best_score: float = None
    best_weights: str = None
    interrupted: bool = False


def _format_duration(seconds):
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


def _writable_dir(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise TrainError(f"{path}: cannot create the backup directory ({e.strerror}); set "
                         f"backup= in the .data file") from None
    if not os.access(path, os.W_OK):
        raise TrainError(f"{path}: the backup directory is not writable; set backup= in "
                         f"the .data file")


def _param_layers_loaded(net, layers_loaded):
    """Index of the last layer with parameters among the first layers_loaded."""
    last = -1
    for layer in net.layers[:layers_loaded]:
        if layer.params():
            last = layer.index
    return last


def train(cfg, data, weights=None, clear=False, seed=0, device="auto", map_eval=False,
          map_every=None, max_batches=None, overwrite=False, log=print, log_every=1,
          verbose=True, workers=None, on_iteration=None, darknet=None, comm=None):
    """Train CFG on the .data file DATA, Darknet's way (see the module docstring).

    weights: start from this file: a backup or numbered weights (resumes at the iteration
      its `seen` gives), full weights to fine-tune, a pretrained partial file ending on a
      layer boundary (darknet53.conv.74: the layers it covers are loaded, seen starts at 0),
      or weights of this cfg trained for another class count (the layers whose shapes
      match are loaded, the log says which; seen starts at 0).
    clear: start the iteration count at 0 (Darknet's -clear).
    map_eval / map_every: evaluate on the valid list every map_every iterations (default:
      about 4 epochs, at least 100) and at the end; keep _best and _last weights.
    max_batches: overrides the cfg's max_batches (and so the poly policy's horizon).
    overwrite: a run starting at iteration 0 may replace the <cfg>.backup and
      <cfg>_final.weights an earlier run left in the backup directory (otherwise an error).
    log: prints a line; log_every: print every n-th iteration's line (and the last).
    verbose: let [yolo]/[region] layers print their per-pass statistics, as Darknet does.
    workers: data loader processes (0: load in this process; default: default_workers(),
      one per available CPU less one, at most 16).
    on_iteration(result): called after each iteration (a hook for tests and callers).
    comm: a distributed.Communicator when this process is one rank of a data-parallel run
      (distributed.py): the rank trains on its shard of the list with its own seed
      stream, the ranks' gradients are summed before every update, and only rank 0
      writes files.

    Raises TrainError (or DataError/CfgError/WeightsError) before training for problems a
    user fixes, including a run already at max_batches (pass clear=True to restart the
    count). On KeyboardInterrupt the weights are saved to <cfg>.backup, then the
    KeyboardInterrupt is re-raised. Returns a TrainResult.
    """
    config = load_data_config(data, require=("train",) + (("valid",) if map_eval else ()))
    paths = config.train_paths()
    if not paths:
        raise TrainError(f"{config.train}: the training list is empty")
    if comm is not None and len(paths) < comm.world_size:
        raise TrainError(f"{config.train}: {len(paths)} training images for "
                         f"{comm.world_size} ranks; each rank needs at least one")
    valid_paths = config.valid_paths() if map_eval else []
    if map_eval and not valid_paths:
        raise TrainError(f"{config.valid}: the valid list is empty (needed by --map)")

    ranks = Ranks(comm)
    net = load_network(cfg, None, device=device, seed=seed, darknet=darknet)
    net.names = config.names
    task = network_task(net)
    if task == "detector":   # before anything is written
        check_detector_labels(paths, detector_layers(net)[-1].classes)
    base = cfg_base(cfg)
    o = net.options

    # -- the starting point --
    if weights is not None:
        loaded = load_weights(net, weights, allow_partial=True, transfer=True)
        if isinstance(loaded, TransferReport):   # trained for another class count
            for line in loaded.lines(weights):
                log(line)
        elif loaded < len(net.layers):
            last = _param_layers_loaded(net, loaded)
            log(f"{weights}: pretrained weights for layers 0-{last} of {len(net.layers)} "
                f"(a partial file); the other layers start from random values")
            net.seen = 0   # a backbone's image count says nothing about this network
    if clear:
        net.seen = 0
    ranks.attach(net)
    if max_batches is not None:
        o.max_batches = int(max_batches)
    if o.max_batches <= 0:
        raise TrainError(f"{cfg}: max_batches is not set in [net]; set it there or give "
                         f"--max-batches N")
    images_per_iteration = net.images_per_iteration   # of every rank together
    if net.seen % images_per_iteration:
        # Saved by a run with another batch size: start at the beginning of the iteration
        # `seen` falls in, so every update again comes after a whole batch.
        log(f"darknet-py: note: {weights} has seen {net.seen} images, not a multiple of "
            f"this cfg's {images_per_iteration} per iteration; counting from "
            f"{net.iteration * images_per_iteration}")
        net.seen = net.iteration * images_per_iteration
    if net.iteration >= o.max_batches:
        raise TrainError(
            f"{weights}: already trained for {net.iteration} iterations ({net.seen} "
            f"images), and max_batches is {o.max_batches}: nothing to do. To train these "
            f"weights again from iteration 0 add --clear; to train longer raise max_batches "
            f"(or give --max-batches N)")

    backup_dir = config.backup
    if ranks.writer:
        _writable_dir(backup_dir)
        for stale in remove_stale_temporaries(backup_dir):
            log(f"darknet-py: note: removed {stale}, left by an interrupted save")
    backup_path = os.path.join(backup_dir, f"{base}.backup")
    final_path = os.path.join(backup_dir, f"{base}_final.weights")
    chart_path = os.path.join(backup_dir, f"chart_{base}.png")
    history = history_path(backup_dir, base)
    check_policy(cfg, o, log)
    # Everything this run writes must be new, unless --overwrite: the backup it continues
    # from is rewritten on purpose (as in Darknet), and a resumed run continues its own
    # chart and _last/_best files.
    resuming = net.iteration > 0
    continued = [chart_path, history] + [os.path.join(backup_dir, f"{base}_{kind}.weights")
                                for kind in ("last", "best") if map_eval]
    if not (weights is not None and os.path.exists(backup_path)
            and os.path.samefile(weights, backup_path)):
        continued.append(backup_path)
    targets = [final_path] + numbered_weights(backup_dir, base, task, net.iteration,
                                              o.max_batches, images_per_iteration, len(paths))
    if not resuming:
        targets += continued
    try:
        refuse_overwrite(targets, overwrite)
    except OverwriteError as e:
        hint = (f" To continue the earlier run, give --weights {backup_path}."
                if os.path.exists(backup_path) and not resuming else "")
        raise TrainError(f"{e}.{hint}") from None
    earlier = [p for p in targets if os.path.exists(p)]
    if earlier:
        log(f"darknet-py: note: --overwrite: this run will replace {', '.join(earlier)}")

    # -- data --
    if task == "classifier":
        problems = check_classifier_labels(paths, config.labels)
        if len(problems) == len(paths):
            raise TrainError(f"no training image can be labelled: {problems[0][1]}")
        if problems:
            log(f"darknet-py: warning: {len(problems)} of {len(paths)} training images "
                f"cannot be labelled and will be skipped (first: {problems[0][1]})")
        classes = config.classes
        outputs = output_layer(net).outputs
        if outputs != classes:
            raise TrainError(f"{cfg}: the network gives {outputs} outputs per image but "
                             f"{data} has classes={classes}; set the last layer's filters (or "
                             f"outputs) to {classes}")
        augment = classifier_augment(o, warn=lambda m: log(f"darknet-py: warning: {m}"))
        loader_args = dict(task="classifier", labels=config.labels, classes=classes)
        multiscale = bool(o.random)
    else:
        head = detector_layers(net)[-1]
        if head.type == "detection":
            raise TrainError(f"{cfg}: training YOLOv1 [detection] networks is not supported "
                             f"(train a [yolo] or [region] network)")
        classes = head.classes
        if classes != config.classes:
            log(f"darknet-py: warning: {data} has classes={config.classes} but the "
                f"network's [{head.type}] layer has classes={classes}; labels must use "
                f"0..{classes - 1}")
        augment = detector_augment(o, head, fork=is_fork_flavour(net),
                                   warn=lambda m: log(f"darknet-py: warning: {m}"))
        loader_args = dict(task="detector", classes=classes,
                           max_boxes=getattr(head, "max_boxes", 90))
        multiscale = bool(getattr(head, "random", 0))
    cfg_size = (o.width, o.height)
    stride = network_stride(net)
    loader = DataLoader(ranks.shard(paths), width=o.width, height=o.height,
                        batch=images_per_iteration // net.replicas, channels=o.channels,
                        augment=augment, seed=ranks.seed(seed),
                        workers=default_workers() if workers is None else workers,
                        start=net.iteration, pin=net.be.pin, **loader_args)
    if map_eval and map_every is None:
        map_every = default_map_interval(len(paths), images_per_iteration)

    result = TrainResult(backup_dir=backup_dir)
    # Resuming: the chart continues the earlier runs' history (result holds this run's).
    earlier_losses, earlier_scores = (load_history(history, net.iteration, log)
                                      if net.iteration else ([], []))
    if earlier_scores:   # _best.weights is replaced only by a better score
        result.best_score = max(score for _, score in earlier_scores)
        best = os.path.join(backup_dir, f"{base}_best.weights")
        result.best_weights = best if os.path.exists(best) else None
    net.verbose = verbose
    metric_name = "mAP@0.5" if task == "detector" else "top-1"

    log(base)
    log(f"Learning Rate: {o.learning_rate:g}, Momentum: {o.momentum:g}, Decay: {o.decay:g}")
    start_iteration = net.iteration
    if start_iteration:
        log(f"Resuming at iteration {start_iteration} ({net.seen} images seen) from "
            f"{weights}; max_batches {o.max_batches}")
    log(f"Training a {task} on {len(paths)} images, {images_per_iteration} per iteration"
        f"{f' in {net.subdivisions} subdivisions' if net.subdivisions > 1 else ''}, on "
        f"{'the CPU' if net.be.name == 'cpu' else net.be.name}"
        f"{f' x {net.replicas} ranks' if net.replicas > 1 else ''}; saving to {backup_dir}")

    def save(path):
        if ranks.writer:
            net.save_weights(path)

    def finite_weights():
        return all(np.isfinite(net.be.to_host(array)).all()
                   for layer in net.layers for _, array in layer.params())

    def chart():
        if not ranks.writer:
            return
        losses, scores = earlier_losses + result.losses, earlier_scores + result.scores
        save_history(history, losses, scores)
        draw_chart(chart_path, [h[1] for h in losses], [h[2] for h in losses],
                   [h[0] for h in losses], scores, metric_name,
                   f"{base}: {task} training, iteration {net.iteration} of {o.max_batches}",
                   o.max_batches)

    def evaluate(iteration):
        train_size = (o.width, o.height)
        resize_network(net, *cfg_size)
        started = time.perf_counter()
        if task == "detector":
            score = evaluate_detector(net, valid_paths, classes, config.names).map
        else:
            score = evaluate_classifier(net, valid_paths, config.labels, classes,
                                        k=1, channels=o.channels).top1
        resize_network(net, *train_size)
        result.scores.append((iteration, score))
        save(os.path.join(backup_dir, f"{base}_last.weights"))
        improved = result.best_score is None or score > result.best_score
        if improved:
            result.best_score = score
            result.best_weights = os.path.join(backup_dir, f"{base}_best.weights")
            save(result.best_weights)
        log(f"{metric_name} = {score:.4f} on {len(valid_paths)} valid images "
            f"({time.perf_counter() - started:.1f} s); best = {result.best_score:.4f}"
            f"{' (new best, saved ' + result.best_weights + ')' if improved else ''}")

    restore_sigterm = sigterm_as_interrupt()
    # Overflow in the arithmetic shows up as a non-finite loss, reported below as a
    # divergence; NumPy's own warnings about it would only be noise.
    float_errors = np.seterr(all="ignore")
    avg_loss = -1.0
    epoch = net.seen // len(paths)
    completed_seen = net.seen
    rate_per_iteration = None
    every = CLASSIFIER_MULTISCALE_EVERY if task == "classifier" else MULTISCALE_EVERY

    def input_size(iteration):
        """The input (width, height) of an iteration: with random=1, the size drawn at
        the start of its block of `every` iterations (or of this run, if later)."""
        if not multiscale:
            return cfg_size
        drawn_at = max(start_iteration, iteration - iteration % every)
        return multiscale_size(cfg_size[0], cfg_size[1], stride, drawn_at, o.max_batches,
                               seed, classifier=task == "classifier")

    def fetch(iteration):
        """The loader's batch for `iteration`, handed to the network to upload ahead."""
        loader.set_size(*input_size(iteration))
        batch = loader.next_batch()
        net.prefetch(*batch)
        return batch

    upcoming = None   # the next iteration's batch, already uploading
    try:
        while net.iteration < o.max_batches:
            iteration = net.iteration
            w, h = input_size(iteration)
            if (w, h) != (o.width, o.height):
                log(f"Resizing: {w} x {h}")
                resize_network(net, w, h)
            wall_start = time.perf_counter()
            x, truth = upcoming if upcoming is not None else fetch(iteration)
            # Batch k+1 is handed over before iteration k runs: its upload overlaps k.
            upcoming = fetch(iteration + 1) if iteration + 1 < o.max_batches else None
            train_start = time.perf_counter()
            loss = ranks.mean(net, net.train_iteration(x, truth))
            if not math.isfinite(loss):
                raise Diverged(loss)
            completed_seen = net.seen
            now = time.perf_counter()
            seconds = now - train_start
            wall = now - wall_start
            if avg_loss < 0:
                avg_loss = loss
            avg_loss = avg_loss * .9 + loss * .1
            i = net.iteration
            result.losses.append((i, loss, avg_loss))
            result.iterations, result.seen, result.avg_loss = i, net.seen, avg_loss
            rate_per_iteration = wall if rate_per_iteration is None else (
                0.9 * rate_per_iteration + 0.1 * wall)
            if i % log_every == 0 or i == o.max_batches or i == start_iteration + 1:
                eta = _format_duration(rate_per_iteration * (o.max_batches - i))
                if task == "detector":
                    line = (f"{i}: {loss:f}, {avg_loss:f} avg, {net.learning_rate:f} rate, "
                            f"{seconds:f} seconds, {i * images_per_iteration} images")
                else:
                    line = (f"{i}, {net.seen / len(paths):.3f}: {loss:f}, {avg_loss:f} avg, "
                            f"{net.learning_rate:f} rate, {seconds:f} seconds, "
                            f"{net.seen} images")
                log(f"{line} | {images_per_iteration / wall:.1f} images/s, ETA {eta}"
                    f"{precision_log_note(net)}")
            if i % BACKUP_EVERY == 0:
                if not finite_weights():   # a finite loss from weights already gone bad
                    raise Diverged(loss)
                save(backup_path)
            if task == "detector":
                if detector_snapshot_due(i):
                    save(os.path.join(backup_dir, f"{base}_{i}.weights"))
            elif net.seen // len(paths) > epoch:
                epoch = net.seen // len(paths)
                save(os.path.join(backup_dir, f"{base}_{epoch}.weights"))
            if map_eval and (i % map_every == 0 or i == o.max_batches):
                if ranks.writer:
                    evaluate(i)
                ranks.wait_for_writer()
            if i % BACKUP_EVERY == 0 or (map_eval and i % map_every == 0):
                chart()
            if on_iteration is not None:
                on_iteration(result)
    except Diverged as e:
        if result.losses:
            chart()
        last_good = [h[0] for h in result.losses if math.isfinite(h[1])]
        kept = (f"{backup_path} (iteration {last_saved_backup(backup_path, net)}) is kept"
                if os.path.exists(backup_path) else "no weights were saved")
        raise TrainError(
            f"training diverged at iteration {net.iteration}: the loss is {e.loss} "
            f"(last finite loss at iteration {last_good[-1] if last_good else 'none'}); "
            f"stopped without saving the diverged weights, {kept}. Lower learning_rate "
            f"(now {o.learning_rate:g}) or raise burn_in (now {o.policy['burn_in']})") from None
    except KeyboardInterrupt as e:
        # A half-done iteration is dropped: the resumed run repeats it whole.
        net.seen = completed_seen
        result.interrupted = True
        result.iterations, result.seen = net.iteration, net.seen
        why = "Terminated (SIGTERM)" if isinstance(e, Terminated) else "Interrupted"
        if not finite_weights():
            log(f"{why} at iteration {net.iteration}: the weights hold NaN or infinite "
                f"values, so {backup_path} was not replaced")
            raise
        save(backup_path)
        if result.losses:
            chart()
        log(f"{why} at iteration {net.iteration}: saved {backup_path} (resume "
            f"with --weights {backup_path})")
        raise
    finally:
        net.finish_prefetch()   # no upload may still read the slots the loader unmaps
        loader.close()
        restore_sigterm()
        np.seterr(**float_errors)
    save(final_path)
    result.final_weights = final_path
    result.iterations, result.seen = net.iteration, net.seen
    if result.losses:
        chart()
    log(f"Saved {final_path} after {net.iteration} iterations ({net.seen} images)")
    return result


__all__ = ["TrainError", "TrainResult", "cfg_base", "default_map_interval",
           "detector_snapshot_due", "draw_chart", "multiscale_size", "resize_network",
           "train"]
