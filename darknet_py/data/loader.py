"""Batches of training or validation data, built ahead of the trainer by worker processes.

A batch is assembled in a slot of shared memory (multiprocessing.shared_memory): the
loader queues a batch's rows as a few jobs (about one per worker), a worker decodes and
augments each image of its job and writes it and its truth row straight into the slot,
and next_batch() returns arrays that are views of the slot, so batches are neither
pickled nor copied (a GPU training run page-locks the slots, and uploads from them). A slot
is reused once every array handed out from it is garbage; the ring of slots grows while the
caller keeps batches.

Workers are started with forkserver (spawn where there is none), never fork: a parent
that has initialised CUDA cannot fork safely. Each image's randomness comes from
(seed, batch index, row, attempt), never from which worker made it, so a seed gives the
same batches with any number of workers, or none (workers=0 builds them in-process).
"""

import math
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import traceback
import weakref
from multiprocessing import resource_tracker, shared_memory

try:  # unlink a segment by name, as multiprocessing.shared_memory does
    from _posixshmem import shm_unlink
except ImportError:  # Windows: a segment goes with its last handle
    shm_unlink = None

import numpy as np

from ..boxes import TRUTH_FIELDS
from ..image import ImageError
from ..plurals import counted
from ..processes import children_ignore_signals, trace_start
from ..tree import fill_hierarchy
from .augment import (
    ClassifierAugment,
    DetectorAugment,
    augment_classifier_hwc,
    augment_detection_hwc,
    center_crop_hwc,
    from_hwc,
    prepare_detector_eval_image,
    read_hwc,
    to_hwc,
)
from .augment_fork import (
    ForkAugment,
    ForkClassifierAugment,
    fork_classifier_sample,
    fork_detection_sample,
)
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


_SAMPLE_ATTEMPTS = 100  # replacement draws for one batch row before giving up
TASKS = ("classifier", "detector")
MISSING_LABELS_LISTED = 3  # paths named in the summary of images without a label file
_POLL_SECONDS = 0.5  # how often a waiting loader checks that its workers live
_STOP_SECONDS = 5.0  # how long close() waits for a worker before terminating it
WORKER_NICENESS = 10  # added to the workers' nice value (lower CPU priority)
# Thread counts of the math libraries a worker may load, set to 1 in each worker.
WORKER_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def default_workers(ranks=1):
    """Worker processes of one training process: its share of the CPUs this process may
    use when `ranks` training processes of one machine share them, less one CPU per rank
    for its training loop, at most 16 (at ~10 ms of CPU per 416x416 image, 16 workers
    make over 1,000 images/s, more than one GPU trains on with these networks). The CPUs
    are divided before the cap: 4 ranks on 64 CPUs get 15 each, not 16 // 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    ranks = max(1, int(ranks))
    return max(1, min(16, (cpus - ranks) // ranks))


class DataLoader:
    """Batches of Darknet training (or validation) data, built ahead by worker processes.

    Training (``train=True``): an endless stream; each image is drawn at random with
    replacement (``sampling="random"``, as Darknet's get_random_paths) or from a fresh
    permutation each epoch (``sampling="shuffle"``), then augmented. Batch ``k`` depends
    only on (seed, k, input size), never on the workers, so a seed reproduces the run,
    and ``start=k`` (a resumed run's iteration) yields what an uninterrupted run would.
    An image that cannot be read (or whose labels are malformed or ambiguous) is reported
    once through ``on_warning(message)`` (default: one line on stderr) and its row is
    refilled with another image. A detector image without a label file is used with no
    boxes, as in Darknet; such images are counted and summed up in one warning (count and
    first paths) at each epoch's end and when the loader closes.

    Validation (``train=False``): each path once, in list order, without augmentation
    (classifier: centre crop; detector: letterbox, or plain resize with
    ``letterbox=False``; truth boxes are the label file's, relative to the original image).
    The last batch may be short; unreadable images are reported and left out.

    ``batch``: images per next_batch(); for training, the images of one iteration (the
    cfg's batch=, all its subdivisions: Network.train_iteration splits them into passes).
    ``workers``: processes building batches (0: build them in the calling thread;
    default: default_workers()).
    ``prefetch``: batches queued ahead (default: enough to keep every worker busy).
    ``pin``: a function that page-locks a host array and returns a function unpinning it
    (a backend's pin): the shared-memory slots are pinned, so that a GPU network uploads
    batches from them asynchronously, without a staging copy (workers=0: not pinned).
    ``set_size(w, h)`` changes the input size from the next batch on (YOLO random=1).
    The arrays of a batch are views of shared memory, valid for as long as they are
    referenced. One thread consumes a loader; close it (or use ``with``) to stop the
    workers and free the shared memory.
    """

    def __init__(
        self,
        paths,
        *,
        task,
        width,
        height,
        batch,
        classes,
        labels=None,
        channels=3,
        augment=None,
        train=True,
        letterbox=True,
        max_boxes=MAX_BOXES,
        sampling="random",
        seed=0,
        workers=None,
        prefetch=None,
        on_warning=None,
        start=0,
        pin=None,
        hierarchy=None,
        darknet="original",
    ):
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        if sampling not in ("random", "shuffle"):
            raise ValueError(f"sampling must be 'random' or 'shuffle', got {sampling!r}")
        if batch < 1 or width < 1 or height < 1:
            raise ValueError("batch, width and height must be positive")
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise DataError("no images to load: the image list is empty")
        if task == "classifier":
            if labels is None:
                raise ValueError("a classifier loader needs labels (the class names)")
            if len(labels) < classes:
                raise ValueError(f"{len(labels)} labels for {classes} classes")
        if augment is None and train:
            augment = ClassifierAugment() if task == "classifier" else DetectorAugment()
        self.paths, self.task, self.batch, self.train = paths, task, batch, train
        self.seed = int(np.random.SeedSequence().entropy) if seed is None else int(seed)
        self._maker = _SampleMaker(
            paths=paths,
            task=task,
            classes=classes,
            channels=channels,
            augment=augment,
            labels=list(labels)[:classes] if labels is not None else None,
            letterbox=letterbox,
            max_boxes=max_boxes,
            seed=self.seed,
            hierarchy=hierarchy,
            darknet=darknet,
        )
        self.sampling = sampling
        self.bad_paths = {}  # path -> message: unusable images, reported once
        self.missing_labels = []  # detector images used with no label file, in order
        self._missing_seen = set()
        self._missing_summed = 0  # how many the last summary counted
        self._on_warning = on_warning or _warn_on_stderr
        self._perms = {}  # epoch -> permutation (sampling="shuffle")
        self._size = (int(width), int(height))
        self._next = int(start)
        self._closed = False
        self._pool = None
        workers = default_workers() if workers is None else int(workers)
        if workers > 0:
            ahead = prefetch if prefetch is not None else max(2, math.ceil(2 * workers / batch))
            try:
                self._pool = _WorkerPool(self._maker, workers, max(1, int(ahead)), train, pin)
            except OSError as e:  # no /dev/shm or no POSIX semaphores, say
                raise DataError(
                    f"cannot start the data loader's worker processes "
                    f"({e.strerror or e}); --workers 0 loads in this process"
                ) from None
            # Runs at close(), when the loader is collected, or at interpreter exit.
            self._stop_workers = weakref.finalize(self, self._pool.close)

    # -- public --------------------------------------------------------------------------

    @property
    def size(self):
        """The current input (width, height)."""
        return self._size

    def set_size(self, width, height):
        """Use a new input size from the next batch on; batches queued at the old size
        are dropped and rebuilt (Darknet likewise drops its in-flight load)."""
        size = (int(width), int(height))
        if size != self._size:
            self._size = size
            if self._pool is not None:
                self._pool.drop_queued()

    def load_ahead(self):
        """Queue the next batches with the workers now rather than at next_batch(): a run
        that starts its loader before its network is built gets its first batch
        meanwhile. Nothing with workers=0."""
        if self._pool is None or self._closed:
            return
        for ahead in range(self._pool.ahead):
            k = self._next + ahead
            if self.train or k < self.batches_per_epoch:
                self._pool.queue_batch(k, self._size, self._rows(k))

    def pin_with(self, pin):
        """Page-lock the slots with `pin` (see the class's docstring) from now on, those
        made already too: for a loader started before its GPU was ready."""
        if self._pool is not None:
            self._pool.pin_slots(pin)

    @property
    def workers(self):
        """The worker processes' ids (empty with workers=0 or once closed)."""
        return [] if self._pool is None else self._pool.pids()

    @property
    def batches_per_epoch(self):
        return math.ceil(len(self.paths) / self.batch)

    def __len__(self):
        """Batches in one pass over the list (training streams go on past it)."""
        return self.batches_per_epoch

    def next_batch(self):
        """The next Batch; in validation mode raises StopIteration after the last."""
        if self._closed:
            raise RuntimeError("DataLoader is closed")
        k = self._next
        if not self.train and k >= self.batches_per_epoch:
            raise StopIteration
        try:
            if self._pool is None:
                batch = self._build_here(k)
            else:
                for ahead in range(self._pool.ahead):
                    if self.train or k + ahead < self.batches_per_epoch:
                        self._pool.queue_batch(k + ahead, self._size, self._rows(k + ahead))
                batch = self._finish(*self._pool.collect(k, self._report))
        except BaseException:
            self.close()  # a worker died, a bug, Ctrl-C: stop the workers now
            raise
        self._next = k + 1
        if self.train and (k + 1) * self.batch // len(self.paths) > k * self.batch // len(
            self.paths
        ):
            self._sum_up_missing_labels()
        return batch

    def __iter__(self):
        """Training: continue the endless stream. Validation: one pass from the start."""
        if not self.train:
            if self._pool is not None:
                self._pool.drop_queued()
            self._next = 0
        while True:
            try:
                batch = self.next_batch()
            except StopIteration:
                return
            yield batch

    def close(self):
        """Stop the workers, free the shared memory, sum up missing label files."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._stop_workers()
        self._sum_up_missing_labels()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _rows(self, k):
        """[(row, first image index)] of batch k: the training draws (later draws, for
        unusable images, come from the row's own generator) or the validation slice."""
        n = len(self.paths)
        if not self.train:
            first = k * self.batch
            return [(i, first + i) for i in range(min(self.batch, n - first))]
        if self.sampling == "random":
            picks = self._maker.rng(0, k).integers(0, n, self.batch)
            return [(i, int(p)) for i, p in enumerate(picks)]
        rows = []
        for i in range(self.batch):
            epoch, offset = divmod(k * self.batch + i, n)
            if epoch not in self._perms:
                self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
                self._perms[epoch] = self._maker.rng(1, epoch).permutation(n)
            rows.append((i, int(self._perms[epoch][offset])))
        return rows

    def _build_here(self, k):
        rows = self._rows(k)
        x, truth = self._maker.empty_batch(len(rows), self._size)
        outcomes = []
        for row, first in rows:
            reports = []
            try:
                outcomes.append(
                    self._maker.make(
                        k, row, first, self._size, self.train, x[row], truth[row], reports
                    )
                )
            finally:
                self._report(reports)
        return self._finish(x, truth, outcomes)

    def _finish(self, x, truth, outcomes):
        """The Batch of rows whose image was usable (validation leaves the others out,
        moving the later rows up)."""
        kept = [(row, o) for row, o in enumerate(outcomes) if o is not None]
        for to, (row, _) in enumerate(kept):
            if to != row:
                x[to], truth[to] = x[row], truth[row]
        return Batch(
            x[: len(kept)],
            truth[: len(kept)],
            [self.paths[o[0]] for _, o in kept],
            [o[1] for _, o in kept],
        )

    def _report(self, reports):
        for kind, path, message in reports:
            if kind == "missing":
                if path not in self._missing_seen:
                    self._missing_seen.add(path)
                    self.missing_labels.append(path)
            elif path not in self.bad_paths:
                self.bad_paths[path] = message
                self._on_warning(
                    f"{message}; skipping it"
                    if path in message
                    else f"{path}: {message}; skipping it"
                )

    def _sum_up_missing_labels(self):
        count = len(self.missing_labels)
        if count > self._missing_summed:
            self._missing_summed = count
            first = ", ".join(self.missing_labels[:MISSING_LABELS_LISTED])
            more = ", ..." if count > MISSING_LABELS_LISTED else ""
            self._on_warning(
                f"{count} image{'s' if count > 1 else ''} without a label "
                f"file so far, used with no boxes (as Darknet does): "
                f"{first}{more}"
            )


def _warn_on_stderr(message):
    # One write per line, so that lines from several sources never interleave.
    sys.stderr.write(f"darknet-py: warning: {message}\n")
    sys.stderr.flush()


class _SampleMaker:
    """Makes one row of a batch: reads, augments (training) or prepares (validation) an
    image into the row's arrays. Picklable: each worker process holds a copy."""

    def __init__(
        self,
        *,
        paths,
        task,
        classes,
        channels,
        augment,
        labels,
        letterbox,
        max_boxes,
        seed,
        hierarchy=None,
        darknet="original",
    ):
        self.paths, self.task, self.classes, self.channels = paths, task, classes, channels
        self.darknet = darknet  # whose label-path rule finds a detector image's labels
        self.hierarchy = hierarchy
        self.augment, self.labels, self.letterbox = augment, labels, letterbox
        self.max_boxes, self.seed = max_boxes, seed
        self.truth_size = classes if task == "classifier" else max_boxes * TRUTH_FIELDS
        self.distinct_paths = len(set(paths))
        self.bad_paths = set()  # this process's: skipped without reading again
        self.current = None  # where this process says which image it is on

    def rng(self, *key):
        return np.random.default_rng(np.random.SeedSequence([self.seed, *key]))

    def floats(self, count, size):
        """(image floats, truth floats) of a batch of `count` rows at `size`."""
        w, h = size
        return count * self.channels * h * w, count * self.truth_size

    def views(self, block, count, size):
        """The x and truth arrays of a batch laid out in the float32 array `block`."""
        w, h = size
        nx, nt = self.floats(count, size)
        return (
            block[:nx].reshape(count, self.channels, h, w),
            block[nx : nx + nt].reshape(count, self.truth_size),
        )

    def empty_batch(self, count, size):
        return self.views(np.empty(sum(self.floats(count, size)), np.float32), count, size)

    def make(self, k, row, first, size, train, x_out, truth_out, reports):
        """Fill one row. Returns (image index, (width, height) of the source image), or
        None when a validation image is unusable. Appends ("bad" or "missing", path,
        message) to `reports`. Raises DataError when no usable training image is found."""
        if not train:
            image_size = self._load_into(first, None, size, x_out, truth_out, reports)
            return None if image_size is None else (first, image_size)
        for attempt in range(_SAMPLE_ATTEMPTS):
            index = (
                first
                if attempt == 0
                else int(self.rng(3, k, row, attempt).integers(len(self.paths)))
            )
            if self.paths[index] in self.bad_paths:
                continue  # as if read and failed again: the same draws follow either way
            image_size = self._load_into(
                index, self.rng(2, k, row, attempt), size, x_out, truth_out, reports
            )
            if image_size is not None:
                return index, image_size
            if len(self.bad_paths) >= self.distinct_paths:
                break
        raise DataError(
            f"no usable image after {_SAMPLE_ATTEMPTS} draws "
            f"({len(self.bad_paths)} of {counted(len(self.paths), 'image')} "
            f"{'is' if len(self.bad_paths) == 1 else 'are'} unusable; "
            f"the last: {self.paths[index]})"
        )

    def _load_into(self, index, rng, size, x_out, truth_out, reports):
        """Load, augment (rng given) or prepare (rng None) image `index` into the output
        rows. Returns the source image's (width, height), or None (after reporting it)
        when the image is unusable."""
        path = self.paths[index]
        w, h = size
        if self.current is not None:
            self.current.value = index
        try:
            hwc = read_hwc(path, self.channels)
            if self.task == "classifier":
                truth_out[:] = self._classifier_truth(path)
                if rng is None:
                    out = center_crop_hwc(hwc, w, h)
                elif isinstance(self.augment, ForkClassifierAugment):
                    out, truth_out[:] = fork_classifier_sample(
                        hwc,
                        truth_out,
                        lambda: self._random_other_image(rng, reports),
                        self.augment,
                        w,
                        h,
                        rng,
                    )
                else:
                    out = augment_classifier_hwc(hwc, self.augment, w, h, rng)
            else:
                try:
                    boxes = read_image_labels(path, self.classes, self.darknet)
                except MissingLabelFile as e:
                    reports.append(("missing", path, str(e)))
                    boxes = np.zeros((0, TRUTH_FIELDS), dtype=np.float32)
                if rng is None:
                    out = to_hwc(prepare_detector_eval_image(from_hwc(hwc), w, h, self.letterbox))
                    kept = boxes[: self.max_boxes]
                    truth_out[:] = 0
                    truth_out[: kept.size] = kept.reshape(-1)
                elif isinstance(self.augment, ForkAugment):
                    out, truth_out[:] = fork_detection_sample(
                        hwc,
                        boxes,
                        lambda: self._random_other_image(rng, reports),
                        self.augment,
                        w,
                        h,
                        rng,
                        self.max_boxes,
                    )
                else:
                    out, truth_out[:] = augment_detection_hwc(
                        hwc, boxes, self.augment, w, h, rng, self.max_boxes
                    )
            x_out[:] = out.transpose(2, 0, 1)
            return hwc.shape[1], hwc.shape[0]
        except (ImageError, DataError) as e:
            self.bad_paths.add(path)
            reports.append(("bad", path, str(e)))
            return None

    def _classifier_truth(self, path):
        """A classifier image's truth row: one-hot, or with a class tree Darknet's
        fill_hierarchy of it (ancestors set, groups without a class marked no-truth)."""
        truth = classifier_truth(path, self.labels, self.classes)
        return truth if self.hierarchy is None else fill_hierarchy(truth, self.hierarchy)

    def _random_other_image(self, rng, reports):
        """Another training image and its truth, drawn with rng: the other images of a
        mosaic, a mixup or a cutmix. The truth is a detector image's boxes (a missing
        label file means none, as for the sample's own image) or a classifier image's
        truth row. Unusable images are reported and others drawn."""
        for _ in range(_SAMPLE_ATTEMPTS):
            path = self.paths[int(rng.integers(len(self.paths)))]
            if path in self.bad_paths:
                continue
            try:
                hwc = read_hwc(path, self.channels)
                if self.task == "classifier":
                    return hwc, self._classifier_truth(path)
                try:
                    return hwc, read_image_labels(path, self.classes, self.darknet)
                except MissingLabelFile as e:
                    reports.append(("missing", path, str(e)))
                    return hwc, np.zeros((0, TRUTH_FIELDS), dtype=np.float32)
            except (ImageError, DataError) as e:
                self.bad_paths.add(path)
                reports.append(("bad", path, str(e)))
        raise DataError(
            f"no usable image for a mosaic, mixup or cutmix after {_SAMPLE_ATTEMPTS} draws"
        )


# ---------------------------------------------------------------------------------------
# Worker processes and shared-memory slots


class _Slot:
    """A shared-memory segment one batch at a time is built in, pinned with `pin`."""

    def __init__(self, index, nbytes, pin, names):
        _check_shm_space(nbytes)
        self.index = index
        # The name is the pool's before the segment exists: a Ctrl-C that lands inside the
        # creation (after shm_open, before Python has the object) leaves a segment only
        # the name finds, and the pool's close unlinks it.
        names.append(f"dnpy{os.getpid()}_{len(names)}_{os.urandom(3).hex()}")
        try:
            self.segment = _Segment(name=names[-1], create=True, size=nbytes)
        except OSError as e:
            raise DataError(
                f"cannot create {nbytes / 2**20:.0f} MiB of shared memory for "
                f"the data loader ({e.strerror or e}); --workers 0 loads in this "
                f"process"
            ) from None
        self.unpin = None
        self.pin_with(pin)
        self.nbytes = nbytes
        self.free = True

    def pin_with(self, pin):
        if pin and self.unpin is None:
            self.unpin = pin(np.frombuffer(self.segment.buf, np.uint8))

    def release(self):
        self.free = True

    def close(self):
        if self.unpin is not None:
            self.unpin()
        _close_segment(self.segment)


def _check_shm_space(nbytes):
    """Refuse a segment /dev/shm has no room for: writing past its end would kill a
    worker with SIGBUS instead of saying why."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return  # no /dev/shm (not Linux): shared_memory says what is wrong, if anything
    if nbytes > free:
        raise DataError(
            f"/dev/shm has {free / 2**20:.0f} MiB free but the data loader "
            f"needs {nbytes / 2**20:.0f} MiB more for a batch: enlarge /dev/shm "
            f"(docker run --shm-size=...), or --workers 0 loads in this process"
        )


class _Queued:
    """A batch queued with the workers: its slot, size and the rows done so far."""

    def __init__(self, ident, size, slot, rows):
        self.ident, self.size, self.slot = ident, size, slot
        self.outcomes = [None] * len(rows)
        self.waiting = len(rows)
        self.error = None
        self.dropped = False


def start_worker_server():
    """Start the process the workers are forked from now, with this module (NumPy, OpenCV,
    the augmentations) imported in it: it gets ready while the caller builds its network
    (a rank's start-up), and each worker starts in milliseconds instead of importing them
    again (~1.5 s for two workers on a loaded 2-core machine). It and the resource tracker
    ignore the signals a process group gets (children_ignore_signals). Without fork
    servers (not on Linux) the workers are spawned: nothing to start."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    from multiprocessing import forkserver

    # Read when the server starts: this module, then the workers' one-thread settings.
    forkserver.set_forkserver_preload([__name__, f"{__package__}.worker_env"])
    with children_ignore_signals():
        resource_tracker.ensure_running()
        forkserver.ensure_running()
    return multiprocessing.get_context("forkserver")


class _WorkerPool:
    """The worker processes, their job and result queues, and the slots."""

    def __init__(self, maker, workers, ahead, train, pin):
        self.maker, self.ahead, self.train, self.pin = maker, ahead, train, pin
        context = start_worker_server() or multiprocessing.get_context("spawn")
        self.jobs = context.Queue()
        self.results = context.Queue()
        self.stopping = context.RawValue("b", 0)
        # Only this process holds the writing end: workers read EOF once it is gone, even
        # when killed (the forkserver outlives it, so their parent process id does not
        # change).
        alive, self.alive = context.Pipe(duplex=False)
        self.slots = []
        self.segment_names = []  # every segment's name, given before it is made (_Slot)
        self.queued = {}  # batch index -> _Queued (current size)
        self.by_ident = {}  # ident -> _Queued, dropped ones included until done
        self.next_ident = 0
        self.processes = []
        try:
            # The workers leave the signals a group gets to the training process: it
            # stops them.
            with children_ignore_signals():
                for _ in range(workers):
                    current = context.RawValue("q", -1)
                    process = context.Process(
                        target=_work,
                        daemon=True,
                        name="darknet-data",
                        args=(maker, self.jobs, self.results, current, self.stopping, alive),
                    )
                    process.start()
                    self.processes.append((process, current))
            trace_start(f"loader's {workers} workers started")
        except BaseException:
            self.close()
            raise

    def pids(self):
        return [p.pid for p, _ in self.processes]

    def pin_slots(self, pin):
        self.pin = pin
        for slot in self.slots:
            slot.pin_with(pin)

    def queue_batch(self, k, size, rows):
        if k in self.queued:
            return
        nbytes = 4 * sum(self.maker.floats(len(rows), size))
        slot = self._free_slot(nbytes)
        slot.free = False
        job = _Queued(self.next_ident, size, slot, rows)
        self.next_ident += 1
        self.queued[k] = self.by_ident[job.ident] = job
        # A job of several rows, about one per worker: each message costs the training
        # process tens of microseconds to send or receive.
        per_job = math.ceil(len(rows) / len(self.processes))
        for start in range(0, len(rows), per_job):
            self.jobs.put(
                (
                    job.ident,
                    slot.index,
                    slot.segment.name,
                    len(rows),
                    size,
                    self.train,
                    k,
                    rows[start : start + per_job],
                )
            )

    def _free_slot(self, nbytes):
        free = [s for s in self.slots if s.free]
        fits = [s for s in free if s.nbytes >= nbytes]
        if fits:
            return fits[0]
        if free:  # too small for the new size: replace its segment
            slot = free[0]
            slot.close()
            self.slots[slot.index] = _Slot(slot.index, nbytes, self.pin, self.segment_names)
            return self.slots[slot.index]
        self.slots.append(_Slot(len(self.slots), nbytes, self.pin, self.segment_names))
        trace_start(f"loader slot {len(self.slots) - 1} made ({nbytes >> 20} MB)")
        return self.slots[-1]

    def drop_queued(self):
        """Forget the queued batches: their rows still arrive, and free the slot after."""
        for job in self.queued.values():
            job.dropped = True
        self.queued.clear()

    def collect(self, k, report):
        """Wait for batch k; returns (x, truth, outcomes) with x and truth views of its
        slot, which is freed when both are garbage."""
        job = self.queued[k]
        while job.waiting:
            self._receive(report)
        del self.queued[k], self.by_ident[job.ident]
        if job.error is not None:
            job.slot.free = True
            kind, text = job.error
            raise kind(text)
        count = len(job.outcomes)
        block = np.frombuffer(
            job.slot.segment.buf, np.float32, sum(self.maker.floats(count, job.size))
        )
        weakref.finalize(block, job.slot.release)
        x, truth = self.maker.views(block, count, job.size)
        return x, truth, job.outcomes

    def _receive(self, report):
        try:
            message = self.results.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            self._check_alive()
            return
        ident, done = message
        job = self.by_ident[ident]
        for row, outcome, reports, error in done:
            report(reports)
            job.waiting -= 1
            job.outcomes[row] = outcome
            if error is not None:
                job.error = job.error or error
        if job.dropped and not job.waiting:
            del self.by_ident[ident]
            job.slot.free = True

    def _check_alive(self):
        for process, current in self.processes:
            if process.exitcode is not None:
                code = process.exitcode
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                on = (
                    f"while loading {self.maker.paths[current.value]}"
                    if current.value >= 0
                    else "between images"
                )
                raise DataError(f"a data loader worker (pid {process.pid}) died ({how}) {on}")

    def close(self):
        self.stopping.value = 1  # workers skip the jobs still queued
        for _ in self.processes:
            self.jobs.put(None)
        for process, _ in self.processes:
            process.join(_STOP_SECONDS)
            if process.exitcode is None:
                process.kill()
                process.join()
        for q in (self.jobs, self.results):
            q.cancel_join_thread()  # nobody reads them any more: do not wait to flush
            q.close()
        for slot in self.slots:
            slot.close()
        for name in self.segment_names:  # any a Ctrl-C left half made
            _unlink_segment_named(name)
        self.alive.close()
        # Dropping the queues unlinks their named semaphores (in /dev/shm) now.
        self.processes, self.slots, self.jobs, self.results = [], [], None, None


class _Segment(shared_memory.SharedMemory):
    """A segment whose batches may outlive it: its arrays keep the mapping alive."""

    def __del__(self):
        try:
            self.close()
        except BufferError:
            pass  # at interpreter exit, with batch arrays still referenced


def _unlink_segment_named(name):
    """Unlink the segment `name` if it is still there. By name, not by attaching to it: a
    segment cut short before its size was set cannot be mapped. (CPython's own unlink,
    which its resource tracker uses too.)"""
    if shm_unlink is None:
        return
    try:
        shm_unlink("/" + name)
    except FileNotFoundError:
        pass


# Segments that batch arrays still use: unlinked already, unmapped once those are gone.
_still_mapped = []


def _close_segment(segment):
    try:
        segment.unlink()
    except FileNotFoundError:  # unlinked already (a slot replaced, then closed again)
        pass
    _still_mapped.append(segment)
    for s in list(_still_mapped):
        try:
            s.close()
            _still_mapped.remove(s)
        except BufferError:
            pass  # a batch handed out from it is still referenced


# glibc's mallopt parameters (malloc.h) and the values a worker sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_WORKER_MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks below come from the heap
_WORKER_TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of freed heap instead of returning it


def keep_freed_memory():
    """Make this process's malloc keep the memory of freed images for the next ones (glibc;
    elsewhere nothing). By default each image-sized block (over 128 KiB) is mapped fresh
    and unmapped when freed: every sample then page-faults its few MB in again, which was a
    third of a worker's CPU time (kernel time). Returns whether it was set."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _WORKER_MMAP_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, _WORKER_TRIM_THRESHOLD)
    )


def _work(maker, jobs, results, current, stopping, alive):
    """A worker process: build rows from `jobs` into shared memory until told to stop
    (None), or until the loader's process is gone (EOF on `alive`)."""
    # Ctrl-C reaches the whole process group: the parent decides, and stops the workers
    # (they start ignoring the signals it handles: children_ignore_signals).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Below the training loop's priority: it feeds the GPU and must not wait for a CPU
    # behind the workers, which take every cycle it leaves.
    os.nice(WORKER_NICENESS)
    # One thread each: the parallelism is the workers. The server set them already
    # (worker_env), unless something else started it; set before OpenCV loads here (the
    # server never loads it): its bundled OpenBLAS starts a thread for every CPU but one as
    # it loads, 63 idle ones a worker on a 64-CPU host.
    os.environ.update(dict.fromkeys(WORKER_THREAD_VARIABLES, "1"))
    import cv2

    cv2.setNumThreads(1)  # the parallelism is the workers
    keep_freed_memory()
    # Failures are reported by the parent in one line each; OpenCV's own warnings from
    # several processes would interleave.
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    results.cancel_join_thread()
    maker.current = current
    segments = {}  # slot index -> SharedMemory
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if alive.poll():  # readable: EOF, as nothing is ever sent
                break
            continue
        if job is None:
            break
        if stopping.value:
            continue
        ident, slot, name, count, size, train, k, rows = job
        segment = segments.get(slot)
        if segment is None or segment.name != name:
            if segment is not None:
                segment.close()
            segment = segments[slot] = shared_memory.SharedMemory(name=name)
        block = np.frombuffer(segment.buf, np.float32, sum(maker.floats(count, size)))
        x, truth = maker.views(block, count, size)
        done = []  # (row, outcome, reports, error) of each row of the job
        for row, first in rows:
            reports, outcome, error = [], None, None
            try:
                outcome = maker.make(k, row, first, size, train, x[row], truth[row], reports)
            except DataError as e:
                error = (DataError, str(e))
            except Exception:
                error = (
                    RuntimeError,
                    f"the data loader failed on "
                    f"{maker.paths[max(current.value, 0)]}:\n"
                    f"{traceback.format_exc()}",
                )
            current.value = -1
            done.append((row, outcome, reports, error))
        del block, x, truth
        results.put((ident, done))
    for segment in segments.values():
        segment.close()
