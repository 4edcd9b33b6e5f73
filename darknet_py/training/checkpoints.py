"""The files a training run writes in the .data file's backup directory, named after the
cfg as Darknet names them (cfg/yolov3.cfg -> yolov3):

* <cfg>.backup every BACKUP_EVERY iterations and when training is interrupted;
* numbered weights: detector <cfg>_<iteration>.weights (schedule.detector_snapshot_due),
  classifier <cfg>_<epoch>.weights after each pass over the training list;
* <cfg>_final.weights at max_batches;
* with --map: <cfg>_last.weights after every evaluation, <cfg>_best.weights at the best
  score so far;
* chart_<cfg>.png and <cfg>.history.json (chart.py).

Only the writer rank writes. Weights are written atomically by weights.save_weights (a
temporary file renamed into place); a save interrupted before the rename leaves a
temporary file that the next run removes. A weights file that appears under one of the
run's names after its start (a second run with the same backup directory) is never
replaced: the run writes beside it (files.OutputClaims).
"""

import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..files import OutputClaims, remove_stale_temporaries
from ..weights import WeightsError, read_header
from .chart import history_path
from .schedule import detector_snapshot_due
from .stops import TrainError


def cfg_base(path):
    """Darknet's basecfg: the file name without directories and extension."""
    name = os.path.basename(os.fspath(path))
    return name.rsplit(".", 1)[0] if "." in name else name


@dataclass
class Checkpoints:
    backup_dir: str
    base: str  # cfg_base of the cfg
    writer: bool = True  # only rank 0 of a data-parallel run writes
    # the weights files claimed at the start; a name someone else writes meanwhile is not
    # replaced
    claims: OutputClaims = field(default_factory=OutputClaims)

    def _path(self, name):
        return os.path.join(self.backup_dir, name)

    @property
    def backup(self):
        return self._path(f"{self.base}.backup")

    @property
    def final(self):
        return self._path(f"{self.base}_final.weights")

    @property
    def last(self):
        return self._path(f"{self.base}_last.weights")

    @property
    def best(self):
        return self._path(f"{self.base}_best.weights")

    @property
    def chart(self):
        return self._path(f"chart_{self.base}.png")

    @property
    def history(self):
        return history_path(self.backup_dir, self.base)

    def numbered(self, number):
        """A detector's weights at iteration `number`, a classifier's after epoch `number`."""
        return self._path(f"{self.base}_{number}.weights")

    def save(self, net, path):
        """Write the weights (the writer rank) under `path`, or beside it when a file this
        run did not write took that name since it started (OutputClaims); returns the name
        written."""
        if not self.writer:
            return path
        target = self.claims.target(path)
        net.save_weights(target)
        self.claims.wrote(target)
        return target

    def where(self, path):
        """The name the run writes `path` under (see save)."""
        return self.claims.where(path)

    def prepare(self, log):
        """Create the backup directory (the writer's) and remove the temporary files an
        interrupted save left there."""
        self.claims.log = log
        if not self.writer:
            return
        writable_dir(self.backup_dir)
        for stale in remove_stale_temporaries(self.backup_dir):
            log(f"darknet-py: note: removed {stale}, left by an interrupted save")

    def numbered_on_disk(self, task, start, max_batches, images_per_iteration, train_images):
        """The numbered weights files already in the backup directory that a run from
        iteration `start` to max_batches would write: detector iterations, classifier
        epochs."""
        pattern = re.compile(re.escape(self.base) + r"_(\d+)\.weights$")
        try:
            names = os.listdir(self.backup_dir)
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

        return [
            self._path(name)
            for name in sorted(names)
            if (m := pattern.match(name)) and written(int(m.group(1)))
        ]


def writable_dir(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise TrainError(
            f"{path}: cannot create the backup directory ({e.strerror}); set "
            f"backup= in the .data file"
        ) from None
    if not os.access(path, os.W_OK):
        raise TrainError(
            f"{path}: the backup directory is not writable; set backup= in the .data file"
        )


def last_saved_backup(path, net):
    """The iteration a backup file holds, read from its header's `seen`."""
    try:
        with open(path, "rb") as f:
            _, seen, _, _ = read_header(f, path)
    except (OSError, WeightsError):
        return "unknown"
    return seen // net.images_per_iteration


def finite_weights(net):
    """False when a parameter holds NaN or infinite values (weights not worth saving)."""
    return all(
        np.isfinite(net.be.to_host(array)).all()
        for layer in net.layers
        for _, array in layer.params()
    )
