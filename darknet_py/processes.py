"""Child processes and the signals meant for their parent.

Terminals, GNU timeout and Slurm's scancel signal a whole process group: the helper
processes a run starts (data loader workers, multiprocessing's forkserver and resource
tracker, the ranks while they start) would each die of a SIGTERM or SIGUSR1 meant for the
training process, which decides what happens (training/stops.py).
"""

import contextlib
import os
import signal
import sys
import threading
import time

# The signals training handles: the stop signals and SIGUSR1 (save a backup).
PARENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


@contextlib.contextmanager
def children_ignore_signals(signals=PARENT_SIGNALS):
    """Processes started inside this block ignore `signals` (an ignored signal stays
    ignored across fork and exec; a child may set its own handlers later). The ones this
    process receives meanwhile are blocked, not lost (Linux keeps a blocked signal pending
    even while it is ignored), and reach its own handlers at the end of the block.
    Outside the main thread no disposition can change: nothing is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    handlers = {s: signal.signal(s, signal.SIG_IGN) for s in signals}
    try:
        yield
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


_START = time.monotonic()


def _process_start():
    """The monotonic clock's reading when this process started (the interpreter's start
    and its imports included): Linux's start time of the process, else this module's
    import."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after the boot
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return _START
    return time.monotonic() - max(0.0, since)


PROCESS_START = _process_start()


def set_process_start(started):
    """Count since_start() from `started` (a time.monotonic() reading, the clock every
    process of the machine shares): a rank's from its launcher's start, the command's."""
    global PROCESS_START
    PROCESS_START = float(started)


def since_start():
    """Seconds since the process started (for a launched rank: since its launcher did)."""
    return time.monotonic() - PROCESS_START


def say(line, stream=None):
    """Write `line` and its newline in one write, then flush: processes that share a stdout
    (a run's ranks, forked at one moment) never interleave their lines. print() writes the
    text and the newline apart where the stream writes through (python -u,
    PYTHONUNBUFFERED), and two ranks' start lines came out as one."""
    stream = sys.stdout if stream is None else stream
    stream.write(f"{line}\n")
    stream.flush()


def _trace_exit():
    trace_start("interpreter exiting (after the other exit handlers)")


if os.environ.get("DARKNET_TRACE_START") == "1":  # the end of a process's run as well
    import atexit

    atexit.register(_trace_exit)  # registered first (at import): it runs last


def trace_start(event):
    """With DARKNET_TRACE_START=1: one line naming a milestone of this process's start-up
    (CUDA started, communicator ready, network built, loader started, first batch, first
    iteration) and the seconds since the process started (since_start: a launched rank's
    since its launcher did, so that the ranks' lines share one clock), to see where a
    run's start goes."""
    if os.environ.get("DARKNET_TRACE_START") == "1":
        say(f"darknet-py: trace pid {os.getpid()}: {event} at {since_start():.3f} s")


def exit_process(code):
    """End the process with `code` (a SystemExit's: None, a number or a message) as the
    interpreter's own exit does, less its last step. The command's threads are waited
    for and the exit handlers run (multiprocessing's joins its workers, logging flushes),
    then the standard streams are flushed; what Python would do after that is take every
    module and object apart, memory the process is about to give back anyway: 40-70 ms
    after a `detect` on a 2-core machine, a tenth of the whole command. Every file the
    commands write is closed by then (with blocks, VideoWriter.release)."""
    import atexit

    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None:  # an interpreter without it: the ordinary exit
        sys.exit(code)
    shutdown()  # as at a normal exit: executors told to stop, other threads joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed pipe, closed or no stream
            pass
    os._exit(code)
