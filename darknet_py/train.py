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

from .backends import start_device
from .data.loader import start_worker_server
from .processes import trace_start
from .training.chart import draw_chart  # noqa: F401 (the package's names, below)
from .training.checkpoints import cfg_base  # noqa: F401
from .training.loop import TrainingRun, TrainResult, first_size, make_loader
from .training.plan import plan_training
from .training.schedule import (
    default_map_interval,
    detector_snapshot_due,  # noqa: F401
    multiscale_size,
    resize_network,
)
from .training.stops import Terminated, TrainError  # noqa: F401


def train(
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
    log=print,
    log_every=1,
    verbose=True,
    workers=None,
    on_iteration=None,
    darknet=None,
    comm=None,
):
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
    comm: a distributed.comm.Communicator when this process is one rank of a data-parallel run
      (distributed/): the rank trains on its shard of the list with its own seed
      stream, the ranks' gradients are summed before every update, and only rank 0
      writes files.

    Raises TrainError (or DataError/CfgError/WeightsError) before training for problems a
    user fixes, including a run already at max_batches (pass clear=True to restart the
    count). On KeyboardInterrupt the weights are saved to <cfg>.backup, then the
    KeyboardInterrupt is re-raised. Returns a TrainResult.
    """
    # A CUDA device starts on a thread of its own (a second or more) while the lists are
    # read, the labels checked and the loader started: none of them needs it.
    start_device(device)
    if workers != 0:  # its workers' server gets ready while the network is built
        start_worker_server()

    def start_loader(plan, layout):
        """The loader of a run from iteration 0, its first batches queued now, while the
        device starts and the network is built; pinned for the GPU once it is ready."""
        loader = make_loader(plan, seed, workers, layout=layout)
        loader.set_size(*first_size(plan, layout, seed, max_batches))
        loader.load_ahead()
        return loader

    plan = plan_training(
        cfg,
        data,
        weights=weights,
        clear=clear,
        seed=seed,
        device=device,
        map_eval=map_eval,
        map_every=map_every,
        max_batches=max_batches,
        overwrite=overwrite,
        darknet=darknet,
        comm=comm,
        log=log,
        start_loader=start_loader if workers != 0 else None,
    )
    trace_start("network built")
    if plan.loader is not None:
        loader = plan.loader
        loader.pin_with(plan.net.be.pin)
    else:
        loader = make_loader(plan, seed, workers)
    trace_start("loader started")
    plan.net.verbose = verbose
    run = TrainingRun(
        plan, loader, seed=seed, log=log, log_every=log_every, on_iteration=on_iteration
    )
    run.log_start()
    return run.run()


__all__ = [
    "Terminated",
    "TrainError",
    "TrainResult",
    "cfg_base",
    "default_map_interval",
    "detector_snapshot_due",
    "draw_chart",
    "multiscale_size",
    "resize_network",
    "train",
]
