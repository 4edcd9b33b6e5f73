"""What stops training: TrainError (a problem found before training, or one it cannot go
on from), Diverged (a NaN or infinite loss; the loop turns it into a TrainError, naming
the cause when single_row_batch_norm finds one) and Stopped (a stop signal: SIGINT,
SIGTERM or SIGHUP), and the signal handling behind it.

Schedulers and terminals signal the whole process group (GNU timeout, Slurm's scancel,
Ctrl-C), or only the process they started. Either way the run ends the same: rank 0 saves
one backup, one line names the signal, every rank ends, the exit code is 128 + signal.
`StopSignals` records the signals instead of letting each one raise wherever it lands:

* a single process (and any process before its training loop) raises Stopped at once,
  as Ctrl-C always did, and from then on only records: a second Ctrl-C while the backup is
  written is ignored, not a KeyboardInterrupt in the middle of the save;
* the ranks of a data-parallel run only record it; they agree at the end of the step
  (distributed.data_parallel.Ranks.step_end) and stop together, so rank 0 is never killed
  by its peers' ending before it has saved.

SIGUSR1 (Slurm's `--signal` warning before a pre-emption) asks for a backup and training
goes on. One SIGUSR1 to a run's process group reaches each rank twice (directly, and
passed on by the launcher) and lands on either side of a step's end on different ranks:
one backup answers every SIGUSR1 that came before it or within SAVE_REPEAT_SECONDS after.
"""

import contextlib
import os
import signal
import threading
import time

from ..errors import DarknetError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # in the order they win
SAVE_SIGNAL = signal.SIGUSR1
# A SIGUSR1 this soon after a backup is the same request (a copy passed on, or the group's
# signal reaching this rank after the others agreed on the backup).
SAVE_REPEAT_SECONDS = 1.0


class TrainError(DarknetError):
    """A problem that stops training before (or instead of) it starts, or that training
    cannot go on from (divergence)."""


class Diverged(Exception):
    """The loss (or the weights) became NaN or infinite."""

    def __init__(self, loss):
        super().__init__(loss)
        self.loss = loss


def single_row_batch_norm(net):
    """Why the first training pass will diverge, in one sentence naming the cfg line, or
    None: a batch norm that trains on one value per channel. Both Darknets divide a
    channel's squared deviations by n - 1, so the variance of a single value is 0/0 (NaN)
    and the loss is NaN from iteration 1 whatever the learning rate. A recurrent layer's
    inner layers normalize one time step's rows: batch / subdivisions of them (the
    network's batch is that times time_steps)."""
    for layer in net.layers:
        owners = layer.param_owners()
        stepped = owners != [layer]
        rows = net.images_per_pass // (layer.steps if stepped else 1)
        for owner in owners:
            normalizes = getattr(owner, "batch_normalize", 0) or owner.type == "batchnorm"
            if not normalizes or rows * owner.out_h * owner.out_w != 1:
                continue
            section = layer.section
            option = section.options.get("batch_normalize")
            where = f"{section.path}:{option.line if option else section.line}"
            what = (
                "1 row per time step (batch / subdivisions = 1)"
                if stepped
                else "1 value per channel (batch / subdivisions = 1, 1x1 outputs)"
            )
            return (
                f"{where}: layer {layer.index} [{layer.type}] batch-normalizes {what}: "
                f"the variance of a single row is 0/0, so the loss is nan from the first "
                f"iteration; raise batch= to 2 or more times subdivisions, or set "
                f"batch_normalize=0"
            )
    return None


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP): handled as Ctrl-C is; `signum` says which,
    and the command exits with 128 + signum, as a shell reports a job the signal ended."""

    def __init__(self, signum=signal.SIGINT):
        super().__init__(signal_name(signum))
        self.signum = int(signum)
        self.reported = False  # set once a line has said what the stop did


class Terminated(Stopped):
    """SIGTERM, which job schedulers send before killing a job."""

    def __init__(self, signum=signal.SIGTERM):
        super().__init__(signum)


def stopped(signum):
    """The exception for a stop signal (Terminated for SIGTERM)."""
    return Terminated() if signum == signal.SIGTERM else Stopped(signum)


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(interrupt):
    """The exit code of a run a KeyboardInterrupt ended: 128 + the signal's number."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


class StopSignals:
    """The stop and save signals of this process, as they arrive: `stop` (the first stop
    signal's number, or None) and `save` (a SIGUSR1 not yet acted on). While `immediate`
    the first stop signal raises Stopped where it lands (then only records); `forward`
    (a callable of the signal number) is told of every signal (the launcher passes them
    on to its ranks)."""

    def __init__(self):
        self.stop = None
        self.save = False
        self.saved_at = None  # time.monotonic() of the last backup a SIGUSR1 asked for
        self.immediate = True
        self.forward = None
        self._previous = {}
        self.pid = os.getpid()  # a forked child holds a copy that is not its own

    def install(self):
        for s in STOP_SIGNALS + (SAVE_SIGNAL,):
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def uninstall(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        if self.forward is not None:
            self.forward(signum)
        if signum == SAVE_SIGNAL:
            if self.saved_at is None or time.monotonic() - self.saved_at >= SAVE_REPEAT_SECONDS:
                self.save = True
            return
        if self.stop is None:
            self.stop = signum
            if self.immediate:
                self.immediate = False  # a second signal must not break the save
                raise stopped(signum)

    def take_save(self):
        """True once for each SIGUSR1 (or several that came together)."""
        save, self.save = self.save, False
        return save

    def saved(self):
        """A backup a SIGUSR1 asked for was made (on any rank's asking): it answers the
        ones still pending here and those within SAVE_REPEAT_SECONDS."""
        self.save = False
        self.saved_at = time.monotonic()

    @contextlib.contextmanager
    def deferred(self):
        """Record stop signals without raising for the duration (the step loop of a
        data-parallel rank, which stops where the ranks agree)."""
        immediate, self.immediate = self.immediate, False
        try:
            yield self
        finally:
            self.immediate = immediate and self.stop is None


_held = None  # the StopSignals a command holds for its run (held_stop_signals)


def _held_here():
    """The StopSignals this process holds: None in a child forked from a holder (the
    launcher forks its ranks with the signals ignored; each installs handlers of its own)."""
    global _held
    if _held is not None and _held.pid != os.getpid():
        _held = None
    return _held


@contextlib.contextmanager
def held_stop_signals():
    """A command's StopSignals, for training to use (stop_signals) and for the command's
    own wait (the launcher's). After a stop it stays installed: the process is about to
    exit with 128 + signal, and a late Ctrl-C must not interrupt that exit."""
    global _held
    if _held_here() is not None or threading.current_thread() is not threading.main_thread():
        yield _held or StopSignals()
        return
    _held = StopSignals().install()
    try:
        yield _held
    finally:
        if _held.stop is None:
            _held.uninstall()
            _held = None


@contextlib.contextmanager
def stop_signals():
    """The StopSignals of a training run: the command's (held_stop_signals), else one
    installed for the run and removed after it. Outside the main thread no handler can be
    set: a StopSignals that never receives anything."""
    if _held_here() is not None:
        yield _held
        return
    if threading.current_thread() is not threading.main_thread():
        yield StopSignals()
        return
    signals = StopSignals().install()
    try:
        yield signals
    finally:
        signals.uninstall()
