"""Darknet's training schedules: when numbered weights are due, how often --map evaluates,
the input sizes of multi-scale training (random=1), and warnings about learning-rate
schedules that cannot do what their numbers say."""

import numpy as np

from ..network import NetworkError
from ..predictions import detector_layers
from .stops import TrainError

BACKUP_EVERY = 100  # iterations between <cfg>.backup saves (Darknet's detector)
MULTISCALE_EVERY = 10  # iterations between input sizes with random=1 (train_detector)
CLASSIFIER_MULTISCALE_EVERY = 40  # train_classifier's interval for [net] random=1
FINAL_SIZE_ITERATIONS = 200  # the last 200 iterations run at the largest size


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


def check_policy(cfg, options, log):
    """Warn about learning-rate schedules that cannot do what their numbers say: a burn-in
    that never ends (the rate stays near 0 the whole run) and steps never reached."""
    policy, max_batches = options.policy, options.max_batches
    if policy["burn_in"] >= max_batches:
        log(
            f"darknet-py: warning: {cfg}: burn_in={policy['burn_in']} is not below "
            f"max_batches={max_batches}: the learning rate ramps up from 0 for the whole "
            f"run and never reaches learning_rate={options.learning_rate:g}"
        )
    late = [step for step in policy.get("steps", ()) if step >= max_batches]
    if late:
        log(
            f"darknet-py: warning: {cfg}: steps={','.join(map(str, late))} at or beyond "
            f"max_batches={max_batches}: the rate never changes there"
        )


def resize_network(net, width, height):
    """Resize for multi-scale training; a network that cannot be resized stops training."""
    try:
        net.resize(width, height)
    except NetworkError as e:
        raise TrainError(f"random=1: {e}") from None
