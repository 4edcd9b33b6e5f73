"""Batches of training or validation data, built ahead of the trainer."""
import math
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..boxes import TRUTH_FIELDS
from ..image import ImageError
from .augment import (ClassifierAugment, DetectorAugment, augment_classifier_hwc,
                      augment_detection_hwc, center_crop_hwc, from_hwc,
                      prepare_detector_eval_image, read_hwc, to_hwc)
from .augment_fork import ForkAugment, fork_detection_sample
from .config import DataError
from .labels import MAX_BOXES, MissingLabelFile, classifier_truth, read_image_labels


class Batch(tuple):
    """A batch: unpacks as ``x, truth``; also carries ``paths`` (one per row) and
    ``image_sizes`` ((width, height) of each source image, for undoing a letterbox)."""

    def __new__(cls, x, truth, paths, image_sizes):
        self = super().__new__(cls, (x, truth))
        self.paths = paths
        self.image_sizes = image_sizes
        return self

    @property
    def x(self):
        return self[0]

    @property
    def truth(self):
        return self[1]


_SAMPLE_ATTEMPTS = 100    # replacement draws for one batch slot before giving up
TASKS = ("classifier", "detector")


class DataLoader:
    """Batches of Darknet training (or validation) data, built ahead in worker threads.

    Training (``train=True``): an endless stream; each image is drawn at random with
    replacement (``sampling="random"``, as Darknet's get_random_paths) or from a fresh
    permutation each epoch (``sampling="shuffle"``), then augmented. Batch ``k`` depends
    only on (seed, k, input size), never on thread timing, so a seed reproduces the run,
    and ``start=k`` (a resumed run's iteration) yields what an uninterrupted run would.
    An image that cannot be read (or whose labels are malformed or ambiguous) is reported
    once through ``on_error(path, message)`` (default: a line on stderr) and its slot is
    refilled with another image. A detector image without a label file is used with no
    boxes, as in Darknet, and reported once too.

    Validation (``train=False``): each path once, in list order, without augmentation
    (classifier: centre crop; detector: letterbox, or plain resize with
    ``letterbox=False``; truth boxes are the label file's, relative to the original image).
    The last batch may be short; unreadable images are reported and left out.

    ``set_size(w, h)`` changes the input size from the next batch on (YOLO random=1).
    """

    def __init__(self, paths, *, task, width, height, batch, classes, labels=None,
                 channels=3, augment=None, train=True, letterbox=True,
                 max_boxes=MAX_BOXES, sampling="random", seed=0, workers=4, prefetch=None,
                 on_error=None, start=0):
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        if sampling not in ("random", "shuffle"):
            raise ValueError(f"sampling must be 'random' or 'shuffle', got {sampling!r}")
        if batch < 1 or width < 1 or height < 1:
            raise ValueError("batch, width and height must be positive")
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise DataError("no images to load: the image list is empty")
        self._distinct_paths = len(set(self.paths))
        if task == "classifier":
            if labels is None:
                raise ValueError("a classifier loader needs labels (the class names)")
            if len(labels) < classes:
                raise ValueError(f"{len(labels)} labels for {classes} classes")
        if augment is None and train:
            augment = ClassifierAugment() if task == "classifier" else DetectorAugment()
        self.task, self.batch, self.classes = task, batch, classes
        self.labels = list(labels)[:classes] if labels is not None else None
        self.channels, self.augment, self.train = channels, augment, train
        self.letterbox, self.max_boxes, self.sampling = letterbox, max_boxes, sampling
        self.truth_size = classes if task == "classifier" else max_boxes * TRUTH_FIELDS
        self.seed = int(np.random.SeedSequence().entropy) if seed is None else int(seed)
        self.bad_paths = {}           # path -> message: unusable images, reported once
        self.missing_labels = set()   # detector images trained on with no label file
        self._on_error = on_error or _report_to_stderr
        self._report_lock = threading.Lock()
        self._perm_lock = threading.Lock()
        self._perms = {}              # epoch -> permutation (sampling="shuffle")
        self._size = (int(width), int(height))
        self._workers = max(1, int(workers))
        self._prefetch = max(1, int(prefetch if prefetch is not None else 2 * self._workers))
        self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="darknet-data")
        self._pending = {}            # batch index -> (future, size)
        self._next = int(start)
        self._lock = threading.Lock()
        self._closed = False

    # -- public --------------------------------------------------------------------------

    @property
    def size(self):
        """The current input (width, height)."""
        return self._size

    def set_size(self, width, height):
        """Use a new input size from the next batch on; batches prefetched at the old size
        are rebuilt (Darknet likewise drops its in-flight load when it resizes)."""
        with self._lock:
            size = (int(width), int(height))
            if size == self._size:
                return
            self._size = size
            for k, (future, old) in list(self._pending.items()):
                if future.cancel():
                    self._pending[k] = (self._executor.submit(self._build, k, size), size)

    @property
    def batches_per_epoch(self):
        return math.ceil(len(self.paths) / self.batch)

    def __len__(self):
        """Batches in one pass over the list (training streams go on past it)."""
        return self.batches_per_epoch

    def next_batch(self):
        """The next Batch; in validation mode raises StopIteration after the last."""
        with self._lock:
            if self._closed:
                raise RuntimeError("DataLoader is closed")
            k = self._next
            if not self.train and k >= self.batches_per_epoch:
                raise StopIteration
            self._fill()
            future, size = self._pending.pop(k)
            self._next = k + 1
            self._fill()
            want = self._size
        if size != want:
            future.cancel()
            return self._build(k, want)
        return future.result()

    def __iter__(self):
        """Training: continue the endless stream. Validation: one pass from the start."""
        if not self.train:
            with self._lock:
                for future, _ in self._pending.values():
                    future.cancel()
                self._pending.clear()
                self._next = 0
        while True:
            try:
                batch = self.next_batch()
            except StopIteration:
                return
            yield batch

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for future, _ in self._pending.values():
                future.cancel()
            self._pending.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- internals -----------------------------------------------------------------------

    def _fill(self):
        end = self._next + self._prefetch
        if not self.train:
            end = min(end, self.batches_per_epoch)
        for k in range(self._next, end):
            if k not in self._pending:
                self._pending[k] = (self._executor.submit(self._build, k, self._size), self._size)

    def _rng(self, *key):
        return np.random.default_rng(np.random.SeedSequence([self.seed, *key]))

    def _report(self, path, message, missing_label=False):
        with self._report_lock:
            if missing_label:
                if path in self.missing_labels:
                    return
                self.missing_labels.add(path)
            else:
                if path in self.bad_paths:
                    return
                self.bad_paths[path] = message
        self._on_error(path, message)

    def _slot_index(self, k, i, picks):
        """Index into paths for slot i of batch k, first choice."""
        if self.sampling == "random":
            return int(picks[i])
        position = k * self.batch + i
        epoch, offset = divmod(position, len(self.paths))
        with self._perm_lock:
            perm = self._perms.get(epoch)
            if perm is None:
                perm = self._rng(1, epoch).permutation(len(self.paths))
                self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
                self._perms[epoch] = perm
        return int(perm[offset])

    def _build(self, k, size):
        w, h = size
        if self.train:
            picks = self._rng(0, k).integers(0, len(self.paths), self.batch)
            count = self.batch
        else:
            first = k * self.batch
            count = min(self.batch, len(self.paths) - first)
        x = np.zeros((count, self.channels, h, w), dtype=np.float32)
        truth = np.zeros((count, self.truth_size), dtype=np.float32)
        paths, sizes = [], []
        row = 0
        for i in range(count):
            if self.train:
                index, image_size = self._train_slot(k, i, picks, w, h, x[row], truth[row])
            else:
                index = first + i
                image_size = self._load_into(index, None, w, h, x[row], truth[row])
                if image_size is None:
                    continue
            paths.append(self.paths[index])
            sizes.append(image_size)
            row += 1
        return Batch(x[:row], truth[:row], paths, sizes)

    def _train_slot(self, k, i, picks, w, h, x_out, truth_out):
        for attempt in range(_SAMPLE_ATTEMPTS):
            if attempt == 0:
                index = self._slot_index(k, i, picks)
            else:
                index = int(self._rng(3, k, i, attempt).integers(len(self.paths)))
            if self.paths[index] in self.bad_paths:
                continue   # as if read and failed again: the same draws follow either way
            image_size = self._load_into(index, self._rng(2, k, i, attempt), w, h, x_out,
                                         truth_out)
            if image_size is not None:
                return index, image_size
            if len(self.bad_paths) >= self._distinct_paths:
                break
        raise DataError(f"no usable image after {_SAMPLE_ATTEMPTS} draws "
                        f"({len(self.bad_paths)} of {len(self.paths)} images are unusable; "
                        f"first: {next(iter(self.bad_paths.items()), ('', ''))[1]})")

    def _load_into(self, index, rng, w, h, x_out, truth_out):
        """Load, augment (rng given) or prepare (rng None) image `index` into the output
        rows. Returns the source image's (width, height), or None (after reporting it)
        when the image is unusable."""
        path = self.paths[index]
        try:
            hwc = read_hwc(path, self.channels)
            if self.task == "classifier":
                truth_out[:] = classifier_truth(path, self.labels, self.classes)
                if rng is None:
                    out = center_crop_hwc(hwc, w, h)
                else:
                    out = augment_classifier_hwc(hwc, self.augment, w, h, rng)
            else:
                try:
                    boxes = read_image_labels(path, self.classes)
                except MissingLabelFile as e:
                    self._report(path, f"{e}; using the image with no boxes", missing_label=True)
                    boxes = np.zeros((0, TRUTH_FIELDS), dtype=np.float32)
                if rng is None:
                    out = to_hwc(prepare_detector_eval_image(from_hwc(hwc), w, h,
                                                              self.letterbox))
                    kept = boxes[:self.max_boxes]
                    truth_out[:] = 0
                    truth_out[:kept.size] = kept.reshape(-1)
                elif isinstance(self.augment, ForkAugment):
                    out, truth_out[:] = fork_detection_sample(
                        hwc, boxes, lambda: self._random_labelled_image(rng), self.augment,
                        w, h, rng, self.max_boxes)
                else:
                    out, truth_out[:] = augment_detection_hwc(hwc, boxes, self.augment, w, h,
                                                               rng, self.max_boxes)
            x_out[:] = out.transpose(2, 0, 1)
            return hwc.shape[1], hwc.shape[0]
        except (ImageError, DataError) as e:
            message = str(e)
            self._report(path, f"{message}; skipping it" if path in message
                         else f"{path}: {message}; skipping it")
            return None


    def _random_labelled_image(self, rng):
        """Another training image (image, boxes), drawn with rng: the other images of a
        mosaic or a mixup. An unreadable one fails the whole sample (its slot is refilled);
        a missing label file means no boxes, as for the sample's own image."""
        path = self.paths[int(rng.integers(len(self.paths)))]
        hwc = read_hwc(path, self.channels)
        try:
            return hwc, read_image_labels(path, self.classes)
        except MissingLabelFile as e:
            self._report(path, f"{e}; using the image with no boxes", missing_label=True)
            return hwc, np.zeros((0, TRUTH_FIELDS), dtype=np.float32)


def _report_to_stderr(path, message):
    print(f"darknet-py: {message}", file=sys.stderr, flush=True)
