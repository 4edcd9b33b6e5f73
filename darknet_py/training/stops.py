"""What stops training: TrainError (a problem found before training, or one it cannot go
on from), Diverged (a NaN or infinite loss; the loop turns it into a TrainError) and
Terminated (SIGTERM, handled as Ctrl-C is)."""
import signal
import threading

from ..errors import DarknetError


class TrainError(DarknetError):
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
