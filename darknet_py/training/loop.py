"""The training loop over a TrainPlan: batches from the data loader (the next one uploading
while this one trains), one line per iteration (loss, average, rate, images/s, ETA),
checkpoints, --map evaluations and the chart; a NaN loss or Ctrl-C ends it as Darknet
users expect (the last good backup kept; the backup saved and the resume command shown).
Stop signals (stops.py) end a single process where they land; the ranks of a data-parallel
run stop together at the end of a step; SIGUSR1 saves the backup and training goes on.
"""

import contextlib
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..data.loader import DataLoader, default_workers
from ..plurals import counted
from ..precision import log_note as precision_log_note
from ..processes import since_start, trace_start
from ..validate import evaluate_classifier, evaluate_detector
from .chart import draw_chart, load_history, save_history
from .checkpoints import finite_weights, last_saved_backup
from .schedule import (
    BACKUP_EVERY,
    CLASSIFIER_MULTISCALE_EVERY,
    MULTISCALE_EVERY,
    detector_snapshot_due,
    multiscale_size,
    resize_network,
)
from .stops import (
    SAVE_SIGNAL,
    STOP_SIGNALS,
    Diverged,
    Stopped,
    TrainError,
    signal_name,
    single_row_batch_norm,
    stop_signals,
    stopped,
)


@dataclass
class TrainResult:
    backup_dir: str
    final_weights: str = None  # None when interrupted
    iterations: int = 0  # Darknet's current batch at the end
    seen: int = 0
    avg_loss: float = float("nan")
    losses: list = field(default_factory=list)  # (iteration, loss, avg_loss)
    scores: list = field(default_factory=list)  # (iteration, mAP or top-1)
    best_score: float = None
    best_weights: str = None
    interrupted: bool = False
    # Seconds from the process's start (a launched rank's: its launcher's) to the first
    # iteration's start and to its end (processes.since_start); None before it.
    first_iteration_started_s: float = None
    first_iteration_s: float = None


def make_loader(plan, seed, workers, layout=None):
    """The data loader of this rank's share of the images, from the run's start. layout:
    the network's layout (plan.network_layout) for a loader started before the network is
    built, at iteration 0 and not pinned yet (DataLoader.pin_with)."""
    if layout is not None:
        o, batch, start, pin = layout.options, layout.images_per_iteration, 0, None
    else:
        net, o = plan.net, plan.net.options
        batch, start, pin = net.images_per_iteration // net.replicas, net.iteration, net.be.pin
    return DataLoader(
        plan.ranks.shard(plan.paths),
        width=o.width,
        height=o.height,
        batch=batch,
        channels=o.channels,
        augment=plan.augment,
        seed=plan.ranks.seed(seed),
        workers=default_workers() if workers is None else workers,
        start=start,
        pin=pin,
        **plan.loader_args,
    )


def first_size(plan, layout, seed, max_batches=None):
    """The input (width, height) of iteration 0 (TrainingRun.input_size's) from the
    network's layout; max_batches: the run's override of the cfg's."""
    o = layout.options
    if not plan.multiscale:
        return o.width, o.height
    return multiscale_size(
        o.width,
        o.height,
        plan.stride,
        0,
        o.max_batches if max_batches is None else int(max_batches),
        seed,
        classifier=plan.task == "classifier",
    )


def describe_stop(stop):
    """How the line about a stopped run starts: the signal's effect and name."""
    if not isinstance(stop, Stopped):
        return "Interrupted"  # a KeyboardInterrupt raised by code, not by a signal
    how = {"SIGINT": "Interrupted", "SIGTERM": "Terminated", "SIGHUP": "Hung up"}
    name = signal_name(stop.signum)
    return f"{how.get(name, 'Stopped')} ({name})"


def format_duration(seconds):
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


class TrainingRun:
    """One run of a plan. run() trains to max_batches and returns the TrainResult."""

    def __init__(self, plan, loader, seed=0, log=print, log_every=1, on_iteration=None):
        self.plan, self.net, self.loader, self.files = plan, plan.net, loader, plan.checkpoints
        self.seed, self.log, self.log_every, self.on_iteration = seed, log, log_every, on_iteration
        o = self.net.options
        self.cfg_size = (o.width, o.height)
        self.every = CLASSIFIER_MULTISCALE_EVERY if plan.task == "classifier" else MULTISCALE_EVERY
        self.result = TrainResult(backup_dir=self.files.backup_dir)
        # Resuming: the chart continues the earlier runs' history (result holds this run's).
        self.earlier_losses, self.earlier_scores = (
            load_history(self.files.history, self.net.iteration, log)
            if self.net.iteration
            else ([], [])
        )
        if self.earlier_scores:  # _best.weights is replaced only by a better score
            self.result.best_score = max(score for _, score in self.earlier_scores)
            self.result.best_weights = self.files.best if os.path.exists(self.files.best) else None
        self.avg_loss = -1.0
        self.epoch = self.net.seen // len(plan.paths)
        self.completed_seen = self.net.seen
        self.rate_per_iteration = None

    def log_start(self):
        plan, net, o, log = self.plan, self.net, self.net.options, self.log
        log(self.files.base)
        log(f"Learning Rate: {o.learning_rate:g}, Momentum: {o.momentum:g}, Decay: {o.decay:g}")
        if plan.start_iteration:
            log(
                f"Resuming at iteration {plan.start_iteration} ({counted(net.seen, 'image')} "
                f"seen) from {plan.weights}; max_batches {o.max_batches}"
            )
        log(
            f"Training a {plan.task} on {counted(len(plan.paths), 'image')}, "
            f"{net.images_per_iteration} per iteration"
            f"{f' in {net.subdivisions} subdivisions' if net.subdivisions > 1 else ''}, on "
            f"{'the CPU' if net.be.name == 'cpu' else net.be.name}"
            f"{f' x {net.replicas} ranks' if net.replicas > 1 else ''}; saving to "
            f"{self.files.backup_dir}"
        )

    # ---- the loop ------------------------------------------------------------------------
    def run(self):
        with stop_signals() as signals:
            # A rank stops where the ranks agree (the end of a step), never half-way
            # through a collective its peers would wait on.
            agreeing = self.plan.ranks.comm is not None
            with signals.deferred() if agreeing else contextlib.nullcontext():
                return self._run(signals)

    def _run(self, signals):
        net, max_batches = self.net, self.net.options.max_batches
        # Overflow in the arithmetic shows up as a non-finite loss, reported below as a
        # divergence; NumPy's own warnings about it would only be noise.
        float_errors = np.seterr(all="ignore")
        upcoming = None  # the next iteration's batch, already uploading
        try:
            while net.iteration < max_batches:
                iteration = net.iteration
                w, h = self.input_size(iteration)
                if (w, h) != (net.options.width, net.options.height):
                    self.log(f"Resizing: {w} x {h}")
                    resize_network(net, w, h)
                wall_start = time.perf_counter()
                x, truth = upcoming if upcoming is not None else self.fetch(iteration)
                first = iteration == self.plan.start_iteration
                if first:
                    trace_start("first batch loaded")
                # Batch k+1 is handed over before iteration k runs: its upload overlaps k.
                upcoming = self.fetch(iteration + 1) if iteration + 1 < max_batches else None
                if first:
                    self.plan.ranks.arrived(net)  # rank 0's parameters (Ranks.attach)
                    self.result.first_iteration_started_s = since_start()
                train_start = time.perf_counter()
                loss = net.train_iteration(x, truth)
                if first:
                    trace_start("first iteration trained (passes, exchange, update)")
                loss, asked = self.plan.ranks.mean_and_any(
                    net, loss, [signals.stop == s for s in STOP_SIGNALS] + [signals.take_save()]
                )
                if not math.isfinite(loss):
                    raise Diverged(loss)
                self.completed_seen = net.seen
                now = time.perf_counter()
                self.record(loss, seconds=now - train_start, wall=now - wall_start)
                if first:
                    self.first_iteration_done()
                stop = [s for s, yes in zip(STOP_SIGNALS, asked) if yes]
                if stop:
                    raise stopped(stop[0])
                if asked[-1]:
                    self.save_asked()
                    signals.saved()
                self.checkpoint(net.iteration, loss)
                if self.on_iteration is not None:
                    self.on_iteration(self.result)
        except Diverged as e:
            self.diverged(e.loss)
        except KeyboardInterrupt as e:
            with signals.deferred():  # a second Ctrl-C must not break the save
                self.interrupted(e)
            raise
        finally:
            trace_start("last iteration done")
            net.finish_prefetch()  # no upload may still read the slots the loader unmaps
            self.loader.close()
            trace_start("loader closed")
            np.seterr(**float_errors)
        result = self.finish()
        trace_start("training finished (the final weights written where this process writes)")
        return result

    def first_iteration_done(self):
        """The log's line on how long the run took to start: from the process's start
        (the command's, for the ranks of `train --gpus`) to the first iteration's start
        and its end (its loss known on every rank)."""
        result = self.result
        result.first_iteration_s = since_start()
        self.log(
            f"first iteration after {result.first_iteration_s:.2f} s (it started "
            f"{result.first_iteration_started_s:.2f} s after the process)"
        )

    def input_size(self, iteration):
        """The input (width, height) of an iteration: with random=1, the size drawn at
        the start of its block of `every` iterations (or of this run, if later)."""
        if not self.plan.multiscale:
            return self.cfg_size
        drawn_at = max(self.plan.start_iteration, iteration - iteration % self.every)
        return multiscale_size(
            self.cfg_size[0],
            self.cfg_size[1],
            self.plan.stride,
            drawn_at,
            self.net.options.max_batches,
            self.seed,
            classifier=self.plan.task == "classifier",
        )

    def fetch(self, iteration):
        """The loader's batch for `iteration`, handed to the network to upload ahead."""
        self.loader.set_size(*self.input_size(iteration))
        batch = self.loader.next_batch()
        self.net.prefetch(*batch)
        return batch

    def record(self, loss, seconds, wall):
        """Darknet's average loss, the result's figures and the iteration's line."""
        net, result, max_batches = self.net, self.result, self.net.options.max_batches
        if self.avg_loss < 0:
            self.avg_loss = loss
        self.avg_loss = self.avg_loss * 0.9 + loss * 0.1
        i = net.iteration
        result.losses.append((i, loss, self.avg_loss))
        result.iterations, result.seen, result.avg_loss = i, net.seen, self.avg_loss
        self.rate_per_iteration = (
            wall
            if self.rate_per_iteration is None
            else (0.9 * self.rate_per_iteration + 0.1 * wall)
        )
        if i % self.log_every == 0 or i == max_batches or i == self.plan.start_iteration + 1:
            eta = format_duration(self.rate_per_iteration * (max_batches - i))
            images = net.images_per_iteration
            if self.plan.task == "detector":
                line = (
                    f"{i}: {loss:f}, {self.avg_loss:f} avg, {net.learning_rate:f} rate, "
                    f"{seconds:f} seconds, {i * images} images"
                )
            else:
                line = (
                    f"{i}, {net.seen / len(self.plan.paths):.3f}: {loss:f}, "
                    f"{self.avg_loss:f} avg, {net.learning_rate:f} rate, {seconds:f} "
                    f"seconds, {net.seen} images"
                )
            self.log(f"{line} | {images / wall:.1f} images/s, ETA {eta}{precision_log_note(net)}")

    def checkpoint(self, i, loss):
        """After iteration i: the backup, numbered weights, an evaluation, the chart."""
        net, files, plan = self.net, self.files, self.plan
        if i % BACKUP_EVERY == 0:
            if not finite_weights(net):  # a finite loss from weights already gone bad
                raise Diverged(loss)
            files.save(net, files.backup)
        if plan.task == "detector":
            if detector_snapshot_due(i):
                files.save(net, files.numbered(i))
        elif net.seen // len(plan.paths) > self.epoch:
            self.epoch = net.seen // len(plan.paths)
            files.save(net, files.numbered(self.epoch))
        evaluating = plan.map_every is not None
        if evaluating and (i % plan.map_every == 0 or i == net.options.max_batches):
            if plan.ranks.writer:
                self.evaluate(i)
            plan.ranks.wait_for_writer()
        if i % BACKUP_EVERY == 0 or (evaluating and i % plan.map_every == 0):
            self.chart()

    def evaluate(self, iteration):
        net, plan, result, o = self.net, self.plan, self.result, self.net.options
        train_size = (o.width, o.height)
        resize_network(net, *self.cfg_size)
        started = time.perf_counter()
        if plan.task == "detector":
            score = evaluate_detector(net, plan.valid_paths, plan.classes, plan.config.names).map
        else:
            score = evaluate_classifier(
                net, plan.valid_paths, plan.config.labels, plan.classes, k=1, channels=o.channels
            ).top1
        resize_network(net, *train_size)
        result.scores.append((iteration, score))
        self.files.save(net, self.files.last)
        improved = result.best_score is None or score > result.best_score
        if improved:
            result.best_score = score
            result.best_weights = self.files.save(net, self.files.best)
        self.log(
            f"{plan.metric_name} = {score:.4f} on {len(plan.valid_paths)} valid images "
            f"({time.perf_counter() - started:.1f} s); best = {result.best_score:.4f}"
            f"{' (new best, saved ' + result.best_weights + ')' if improved else ''}"
        )

    def chart(self):
        if not self.files.writer:
            return
        losses = self.earlier_losses + self.result.losses
        scores = self.earlier_scores + self.result.scores
        save_history(self.files.history, losses, scores)
        o, plan = self.net.options, self.plan
        draw_chart(
            self.files.chart,
            [h[1] for h in losses],
            [h[2] for h in losses],
            [h[0] for h in losses],
            scores,
            plan.metric_name,
            f"{self.files.base}: {plan.task} training, iteration {self.net.iteration} "
            f"of {o.max_batches}",
            o.max_batches,
        )

    # ---- how a run ends ------------------------------------------------------------------
    def diverged(self, loss):
        """A NaN or infinite loss: the chart, and a TrainError naming what is kept."""
        net, backup, o = self.net, self.files.where(self.files.backup), self.net.options
        if self.result.losses:
            self.chart()
        last_good = [h[0] for h in self.result.losses if math.isfinite(h[1])]
        kept = (
            f"{backup} (iteration {last_saved_backup(backup, net)}) is kept"
            if os.path.exists(backup)
            else "no weights were saved"
        )
        cause = single_row_batch_norm(net)
        advice = (
            f"The cause: {cause}"
            if cause
            else f"Lower learning_rate (now {o.learning_rate:g}) or raise burn_in (now "
            f"{o.policy['burn_in']})"
        )
        raise TrainError(
            f"training diverged at iteration {net.iteration}: the loss is {loss} "
            f"(last finite loss at iteration {last_good[-1] if last_good else 'none'}); "
            f"stopped without saving the diverged weights, {kept}. {advice}"
        ) from None

    def save_asked(self):
        """SIGUSR1 (a scheduler's warning before it pre-empts the job): the backup now."""
        net, backup = self.net, self.files.backup
        if not self.files.writer or not finite_weights(net):
            return  # rank 0 writes; bad weights: the next iteration's loss reports them
        backup = self.files.save(net, backup)
        self.log(
            f"{signal_name(SAVE_SIGNAL)} at iteration {net.iteration}: saved {backup}; "
            f"training goes on"
        )

    def interrupted(self, stop):
        """Ctrl-C or another stop signal: save the backup (unless the weights went bad)
        and say how to resume; the caller re-raises."""
        net, backup, result = self.net, self.files.where(self.files.backup), self.result
        # A half-done iteration is dropped: the resumed run repeats it whole.
        net.seen = self.completed_seen
        result.interrupted = True
        result.iterations, result.seen = net.iteration, net.seen
        why = describe_stop(stop)
        stop.reported = True
        if not finite_weights(net):
            self.log(
                f"{why} at iteration {net.iteration}: the weights hold NaN or infinite "
                f"values, so {backup} was not replaced"
            )
            return
        backup = self.files.save(net, self.files.backup)
        if result.losses:
            self.chart()
        self.log(
            f"{why} at iteration {net.iteration}: saved {backup} (resume with --weights {backup})"
        )

    def finish(self):
        net, result = self.net, self.result
        final = self.files.save(net, self.files.final)
        result.final_weights = final
        result.iterations, result.seen = net.iteration, net.seen
        if result.losses:
            self.chart()
        self.log(
            f"Saved {final} after {counted(net.iteration, 'iteration')} "
            f"({counted(net.seen, 'image')})"
        )
        return result
