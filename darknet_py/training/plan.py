"""The plan of a training run, made before anything is trained or written: the dataset's
lists and their checks, the network with its starting weights (the iteration it resumes
at), the task's data settings, and the outputs, refusing to replace what an earlier run
left unless --overwrite. Every problem a user fixes is a TrainError (or DataError,
CfgError, WeightsError) raised here, so a refused run writes nothing: the plan's only
work on disk is creating the backup directory and removing the temporary files that
interrupted saves left there.
"""

import os
import warnings
from dataclasses import dataclass, field

from ..cfg import parse_cfg
from ..data.augment_fork import classifier_augment, detector_augment
from ..data.check import check_detector_dataset
from ..data.config import load_data_config
from ..data.labels import MissingLabelFile, check_classifier_labels, label_path, read_image_labels
from ..distributed.data_parallel import Ranks
from ..errors import DarknetWarning
from ..files import OverwriteError, refuse_overwrite
from ..layers.heads import is_fork_flavour
from ..net_options import check_flavour, weights_flavour
from ..network import Network, load_network
from ..plurals import counted
from ..predictions import detector_layers, output_layer
from ..processes import trace_start
from ..validate import check_valid_set, network_task
from ..weights import TransferReport, load_weights
from .checkpoints import Checkpoints, cfg_base
from .schedule import check_policy, default_map_interval, network_stride
from .stops import TrainError, single_row_batch_norm


@dataclass
class TrainPlan:
    cfg: str
    data: str
    config: object  # the .data file's DataConfig
    paths: list  # every rank's training images
    valid_paths: list  # evaluated with --map
    ranks: Ranks
    net: object  # built, starting weights loaded, options.max_batches final
    task: str  # "classifier" or "detector"
    weights: str  # the --weights file, or None
    start_iteration: int
    checkpoints: Checkpoints
    replaced: list = field(default_factory=list)  # existing outputs --overwrite replaces
    classes: int = 0
    augment: object = None
    loader_args: dict = field(default_factory=dict)
    multiscale: bool = False
    stride: int = 32  # network_stride: multi-scale sizes are multiples of it
    map_every: int = None  # iterations between evaluations; None without --map
    loader: object = None  # the data loader, where started before the network

    @property
    def metric_name(self):
        return "mAP@0.5" if self.task == "detector" else "top-1"


def plan_training(
    cfg,
    data,
    weights=None,
    clear=False,
    seed=0,
    device="auto",
    map_eval=False,
    map_every=None,
    max_batches=None,
    overwrite=False,
    darknet=None,
    comm=None,
    log=print,
    start_loader=None,
):
    """The TrainPlan of train()'s arguments (see train.train), or the error that stops it.

    What needs no device comes first, on the network's layout (its layers and shapes, no
    arrays): the lists, the label checks and the data settings, so that a CUDA device
    started beforehand (backends.start_device) gets ready meanwhile. start_loader(plan,
    layout): called then for a run from iteration 0 (no --weights), to start the data loader
    before the network is built; its loader becomes plan.loader (closed again if the plan
    is refused). With --weights the network comes first (its errors before the data's),
    and the loader after it."""
    config, paths, valid_paths = _lists(data, map_eval, comm)
    ranks = Ranks(comm)
    layout = network_layout(cfg, weights, darknet)
    task = network_task(layout)
    _check_labels(paths, valid_paths, config, layout, task, ranks, map_eval, log)
    trace_start("labels checked")
    plan = TrainPlan(
        cfg=cfg,
        data=data,
        config=config,
        paths=paths,
        valid_paths=valid_paths,
        ranks=ranks,
        net=None,
        task=task,
        weights=weights,
        start_iteration=0,
        checkpoints=None,
    )
    plan.stride = network_stride(layout)
    if weights is not None:  # a bad weights file is the error to tell before the data's
        _plan_network(
            plan,
            layout,
            weights,
            clear,
            seed,
            device,
            map_eval,
            map_every,
            max_batches,
            overwrite,
            darknet,
            log,
        )
        _data_settings(plan, layout, log)
        return plan
    _data_settings(plan, layout, log)
    if start_loader is not None:
        plan.loader = start_loader(plan, layout)
        trace_start("loader started before the network")
    try:
        _plan_network(
            plan,
            layout,
            weights,
            clear,
            seed,
            device,
            map_eval,
            map_every,
            max_batches,
            overwrite,
            darknet,
            log,
        )
    except BaseException:
        if plan.loader is not None:
            plan.loader.close()
        raise
    return plan


def _check_labels(paths, valid_paths, config, layout, task, ranks, map_eval, log):
    """The training and (with --map) validation labels, checked before anything is written."""
    if task == "detector":  # before anything is written
        classes = detector_layers(layout)[-1].classes
        if ranks.writer:  # every label file read: once, not once per rank (its warnings
            # are rank 0's to print; a refusal ends rank 0, which ends the others)
            check_detector_dataset(
                paths,
                classes,
                warn=lambda m: log(f"darknet-py: warning: {m}"),
                darknet=layout.darknet,
            )
        check_detector_labels(paths, classes, layout.darknet)
    if map_eval and ranks.writer:  # before iteration 1 (a bad valid set stopped runs at
        # the first evaluation), on the rank that evaluates
        check_valid_set(
            valid_paths,
            config.valid,
            task,
            labels=config.labels,
            classes=(detector_layers(layout)[-1].classes if task == "detector" else None),
            warn=lambda m: log(f"darknet-py: warning: {m}"),
            darknet=layout.darknet,
        )


def _data_settings(plan, layout, log):
    if plan.task == "classifier":
        _classifier_data(plan, layout, log)
    else:
        _detector_data(plan, layout, log)


def network_layout(cfg, weights=None, darknet=None):
    """The network of `cfg` with its layers and shapes but no arrays (no device needed),
    in the flavour load_network would pick; its cfg warnings are left to load_network,
    which reads the cfg again."""
    if darknet is None and weights is not None:
        darknet = weights_flavour(weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DarknetWarning)
        return Network(parse_cfg(cfg), cfg, allocate=False, darknet=check_flavour(darknet))


def _plan_network(
    plan,
    layout,
    weights,
    clear,
    seed,
    device,
    map_eval,
    map_every,
    max_batches,
    overwrite,
    darknet,
    log,
):
    """The device's part of the plan: the network built and its starting weights loaded,
    the iteration counts and the outputs this run writes."""
    cfg, ranks = plan.cfg, plan.ranks
    net = load_network(cfg, None, device=device, seed=seed, darknet=darknet)
    trace_start("network loaded")
    net.share_deltas = True  # the same training in less memory (delta_plan.py,
    net.share_outputs = True  # output_plan.py)
    net.names = plan.config.names
    _start_from(net, weights, clear, log)
    ranks.attach(net)  # before the counts below: a replica counts every rank's images
    _check_iterations(net, cfg, weights, max_batches, log)
    plan.net, plan.start_iteration = net, net.iteration
    plan.checkpoints = Checkpoints(plan.config.backup, cfg_base(cfg), ranks.writer)
    plan.checkpoints.prepare(log)
    check_policy(cfg, net.options, log)
    cause = single_row_batch_norm(net)
    if cause:
        log(f"darknet-py: warning: {cause}")
    plan.replaced = _claim_outputs(plan, map_eval, overwrite)
    if plan.replaced:
        log(f"darknet-py: note: --overwrite: this run will replace {', '.join(plan.replaced)}")
    if map_eval:
        plan.map_every = (
            map_every
            if map_every is not None
            else default_map_interval(len(plan.paths), net.images_per_iteration)
        )


def _lists(data, map_eval, comm):
    """The .data file's config and its training (and, with --map, valid) images."""
    config = load_data_config(data, require=("train",) + (("valid",) if map_eval else ()))
    paths = config.train_paths()
    if not paths:
        raise TrainError(f"{config.train}: the training list is empty")
    if comm is not None and len(paths) < comm.world_size:
        raise TrainError(
            f"{config.train}: {len(paths)} training images for "
            f"{comm.world_size} ranks; each rank needs at least one"
        )
    valid_paths = config.valid_paths() if map_eval else []
    if map_eval and not valid_paths:
        raise TrainError(f"{config.valid}: the valid list is empty (needed by --map)")
    return config, paths, valid_paths


def check_detector_labels(paths, classes, darknet="original"):
    """Refuse a detector training list in which no image has a single labelled box:
    training would only teach the network that nothing is ever there."""
    for path in paths:
        try:
            if len(read_image_labels(path, classes, darknet)):
                return
        except MissingLabelFile:
            continue
    raise TrainError(
        f"none of the {len(paths)} training images has a labelled box (label "
        f"files missing or empty; the first is looked for at "
        f"{label_path(paths[0], darknet)})"
    )


def _start_from(net, weights, clear, log):
    """Load the starting weights: a backup or numbered weights resume at their `seen`; a
    partial file or weights for another class count start at 0."""
    if weights is not None:
        loaded = load_weights(net, weights, allow_partial=True, transfer=True)
        if isinstance(loaded, TransferReport):  # trained for another class count
            for line in loaded.lines(weights):
                log(line)
        elif loaded < len(net.layers):
            last = _param_layers_loaded(net, loaded)
            log(
                f"{weights}: pretrained weights for layers 0-{last} of {len(net.layers)} "
                f"(a partial file); the other layers start from random values"
            )
            net.seen = 0  # a backbone's image count says nothing about this network
    if clear:
        net.seen = 0


def _param_layers_loaded(net, layers_loaded):
    """Index of the last layer with parameters among the first layers_loaded."""
    last = -1
    for layer in net.layers[:layers_loaded]:
        if layer.params():
            last = layer.index
    return last


def _check_iterations(net, cfg, weights, max_batches, log):
    """Settle max_batches and the iteration the run starts at; a run with nothing left to
    do is an error that points to --clear."""
    o = net.options
    if max_batches is not None:
        o.max_batches = int(max_batches)
    if o.max_batches <= 0:
        raise TrainError(
            f"{cfg}: max_batches is not set in [net]; set it there or give --max-batches N"
        )
    images_per_iteration = net.images_per_iteration  # of every rank together
    if net.seen % images_per_iteration:
        # Saved by a run with another batch size: start at the beginning of the iteration
        # `seen` falls in, so every update again comes after a whole batch.
        log(
            f"darknet-py: note: {weights} has seen {counted(net.seen, 'image')}, not a "
            f"multiple of this cfg's {images_per_iteration} per iteration; counting from "
            f"{net.iteration * images_per_iteration}"
        )
        net.seen = net.iteration * images_per_iteration
    if net.iteration >= o.max_batches:
        raise TrainError(
            f"{weights}: already trained for {counted(net.iteration, 'iteration')} "
            f"({counted(net.seen, 'image')}), and max_batches is {o.max_batches}: nothing to "
            f"do. To train these weights again from iteration 0 add --clear; to train longer "
            f"raise max_batches (or give --max-batches N)"
        )


def _claim_outputs(plan, map_eval, overwrite):
    """Everything this run writes must be new, unless --overwrite: the backup it continues
    from is rewritten on purpose (as in Darknet), and a resumed run continues its own chart
    and _last/_best files. Returns the existing files --overwrite will replace."""
    files, net, weights = plan.checkpoints, plan.net, plan.weights
    resuming = net.iteration > 0
    continued = [files.chart, files.history] + ([files.last, files.best] if map_eval else [])
    if not (
        weights is not None
        and os.path.exists(files.backup)
        and os.path.samefile(weights, files.backup)
    ):
        continued.append(files.backup)
    targets = [files.final] + files.numbered_on_disk(
        plan.task, net.iteration, net.options.max_batches, net.images_per_iteration, len(plan.paths)
    )
    if not resuming:
        targets += continued
    try:
        refuse_overwrite(targets, overwrite)
    except OverwriteError as e:
        hint = (
            f" To continue the earlier run, give --weights {files.backup}."
            if os.path.exists(files.backup) and not resuming
            else ""
        )
        raise TrainError(f"{e}.{hint}") from None
    # What is there now is this run's to replace; what appears later is not (files.save).
    files.claims.claim(targets + continued + [files.backup, files.final, files.last, files.best])
    return [p for p in targets if os.path.exists(p)]


def _classifier_data(plan, layout, log):
    config, paths, o = plan.config, plan.paths, layout.options
    problems = check_classifier_labels(paths, config.labels)
    if len(problems) == len(paths):
        raise TrainError(f"no training image can be labelled: {problems[0][1]}")
    if problems:
        log(
            f"darknet-py: warning: {len(problems)} of {len(paths)} training images "
            f"cannot be labelled and will be skipped (first: {problems[0][1]})"
        )
    classes = config.classes
    outputs = output_layer(layout).outputs
    if outputs != classes:
        raise TrainError(
            f"{plan.cfg}: the network gives {outputs} outputs per image but "
            f"{plan.data} has classes={classes}; set the last layer's filters (or "
            f"outputs) to {classes}"
        )
    plan.classes = classes
    plan.augment = classifier_augment(o, warn=lambda m: log(f"darknet-py: warning: {m}"))
    plan.loader_args = dict(
        task="classifier", labels=config.labels, classes=classes, hierarchy=layout.hierarchy
    )
    plan.multiscale = bool(o.random)


def _detector_data(plan, layout, log):
    head = detector_layers(layout)[-1]
    if head.type == "detection":
        raise TrainError(
            f"{plan.cfg}: training YOLOv1 [detection] networks is not supported "
            f"(train a [yolo] or [region] network)"
        )
    classes = head.classes
    if classes != plan.config.classes:
        log(
            f"darknet-py: warning: {plan.data} has classes={plan.config.classes} but the "
            f"network's [{head.type}] layer has classes={classes}; labels must use "
            f"0..{classes - 1}"
        )
    plan.classes = classes
    plan.augment = detector_augment(
        layout.options,
        head,
        fork=is_fork_flavour(layout),
        warn=lambda m: log(f"darknet-py: warning: {m}"),
    )
    plan.loader_args = dict(
        task="detector",
        classes=classes,
        darknet=layout.darknet,
        max_boxes=getattr(head, "max_boxes", 90),
    )
    plan.multiscale = bool(getattr(head, "random", 0))
