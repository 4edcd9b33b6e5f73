"""Launching the ranks of one node: one process per device, each training (it imports
train, which nothing else in this package does) and reporting a failure in one line; the
first rank to fail ends them all."""
import multiprocessing
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

from ..backends import get_backend
from ..errors import USER_ERRORS, DarknetError, describe_error
from ..train import Terminated, train
from .comm import DEFAULT_TIMEOUT, CommError, TcpCommunicator, free_port
from .nccl import NcclCommunicator

EXIT_PEER_LOST = 3             # a rank that stopped because another one failed
REPORT_WAIT = 0.5              # seconds a rank gets to report its own failure


def parse_gpus(text, device_count):
    """--gpus 0,1 or all -> ["cuda:0", "cuda:1"]; ValueError naming what is wrong."""
    text = str(text).strip()
    if text == "all":
        if device_count < 1:
            raise ValueError("--gpus all: no CUDA GPU (or PyCUDA) found on this machine")
        return [f"cuda:{i}" for i in range(device_count)]
    try:
        indices = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--gpus {text!r}: expected GPU indices such as 0,1 or 'all'") from None
    if len(set(indices)) != len(indices):
        raise ValueError(f"--gpus {text}: a GPU is listed twice")
    for rank, index in enumerate(indices):
        if not 0 <= index < device_count:
            have = (f"{device_count} GPU{'s' if device_count != 1 else ''} "
                    f"(0-{device_count - 1})" if device_count else "no CUDA GPU (or PyCUDA)")
            raise ValueError(f"--gpus {text}: GPU {index} (local rank {rank}) does not exist; "
                             f"this machine has {have}")
    return [f"cuda:{i}" for i in indices]



@dataclass
class RankSpec:
    """What one worker process needs to start."""
    rank: int
    world_size: int
    device: str             # "cpu" or "cuda:N"
    master: tuple           # (host, port) of rank 0's rendezvous
    timeout: float
    train_kwargs: dict


class LaunchError(DarknetError):
    """A rank failed or could not start: one line naming it."""


def _worker(spec, errors):
    """Body of a worker process: join, train, report a failure as one line through
    `errors` (a Pipe end) and the exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the launcher decides what Ctrl-C does
    os.environ["NCCL_NVLS_ENABLE"] = "0"   # no NVLink SHARP multicast (docs/training.md)
    comm = None
    try:
        print(f"darknet-py: rank {spec.rank} of {spec.world_size}: pid {os.getpid()}, "
              f"{spec.device}", flush=True)
        comm = connect(spec.rank, spec.world_size, spec.device, spec.master, spec.timeout)
        kwargs = dict(spec.train_kwargs)
        if spec.rank != 0:   # one log: rank 0's
            kwargs.update(log=lambda line: None, verbose=False)
        else:
            kwargs["log"] = lambda line: print(line, flush=True)
        train(device=spec.device, comm=comm, **kwargs)
    except CommError as e:
        code, report = EXIT_PEER_LOST, ("peer", str(e))
    except USER_ERRORS as e:
        code, report = 2, ("error", describe_error(e))
    except KeyboardInterrupt:
        code, report = 130, None
    except BaseException as e:   # a bug: keep its traceback on stderr
        traceback.print_exc()
        code, report = 1, ("error", f"{type(e).__name__}: {e}")
    else:
        code, report = 0, None
    if report is not None:
        try:
            errors.send(report)
        except OSError:   # the launcher is gone: nobody to tell
            pass
    if comm is not None and code:
        comm.abort()
    sys.stdout.flush()
    os._exit(code)   # no atexit work (loader threads, CUDA teardown) may hang a failed rank


def connect(rank, world_size, device, master, timeout=DEFAULT_TIMEOUT):
    """The communicator for one rank: NCCL for CUDA devices, TCP for the CPU."""
    tcp = TcpCommunicator(rank, world_size, master, timeout=timeout)
    if str(device).startswith("cuda"):
        get_backend(device)   # NCCL binds to the CUDA context current when it starts
        return NcclCommunicator(tcp, int(str(device).partition(":")[2] or 0))
    return tcp


def _describe_exit(code):
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exit code {code}"


def launch(devices, train_kwargs, first_rank=0, world_size=None, master=None,
           timeout=DEFAULT_TIMEOUT):
    """Run the ranks first_rank .. first_rank+len(devices)-1 of a world_size-rank run, one
    process per device, and wait for them. When one fails, the others are stopped within
    seconds and LaunchError names the first that failed; SIGINT/SIGTERM go to rank 0
    (which saves the backup) and then stop the rest (re-raised as KeyboardInterrupt /
    the train module's Terminated). train_kwargs go to train() in every rank (picklable:
    rank 0 logs to stdout, the others stay quiet)."""
    world_size = world_size or len(devices)
    # A rank killed by a signal leaves its loader's shared memory to multiprocessing's
    # resource tracker, which frees it and would add a warning after the one error line.
    quiet = "ignore:resource_tracker:UserWarning"
    if quiet not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(
            w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)
    if master is None:
        master = ("127.0.0.1", free_port())
    context = multiprocessing.get_context("spawn")
    workers = []   # (rank, process, errors pipe end)
    stop_signal = None

    def on_signal(signum, frame):
        nonlocal stop_signal
        stop_signal = signum
        for rank, process, _ in workers:
            if rank == 0 and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i, device in enumerate(devices):
            rank = first_rank + i
            receive, send = context.Pipe(duplex=False)
            spec = RankSpec(rank, world_size, device, master, timeout, train_kwargs)
            process = context.Process(target=_worker, args=(spec, send),
                                      name=f"darknet-py rank {rank}")
            process.start()
            send.close()
            workers.append((rank, process, receive))
        failed = _wait(workers)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if stop_signal is not None:
        if stop_signal == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt()
    if failed:
        raise LaunchError(failed)


def _report(pipe, otherwise):
    """What a finished worker said about its failure; (otherwise, "") if nothing (a
    process killed by a signal closes its end without a word)."""
    try:
        return pipe.recv() if pipe.poll() else (otherwise, "")
    except (EOFError, OSError):
        return otherwise, ""


def _wait(workers):
    """Wait for every worker; after the first failure give the others REPORT_WAIT seconds
    each to fail with it, then SIGKILL them, and return the line naming the rank to
    blame: one that failed by itself rather than one that only lost its peers."""
    running = {process.sentinel: (rank, process, pipe) for rank, process, pipe in workers}
    failures = []
    while running:
        for sentinel in wait(list(running), timeout=1.0):
            rank, process, pipe = running.pop(sentinel)
            process.join()
            if process.exitcode != 0:
                kind, message = _report(pipe, "died")
                failures.append((rank, process.exitcode, kind, message))
        if failures and running:
            # Let the ranks that fail with it report in, then stop the rest with SIGKILL:
            # SIGTERM would make rank 0 save a backup, and the checkpoint must stay as
            # the last good iteration left it.
            for sentinel, (rank, process, pipe) in list(running.items()):
                process.join(REPORT_WAIT)
                if process.is_alive():
                    process.kill()
                    process.join()
                if process.exitcode != 0:
                    kind, message = _report(pipe, "stopped")
                    failures.append((rank, process.exitcode, kind, message))
            running.clear()
    if not failures:
        return None
    order = {"error": 0, "died": 1, "peer": 2, "stopped": 3}
    rank, code, kind, message = min(failures, key=lambda f: (order[f[2]], f[0]))
    if kind == "error":
        return f"rank {rank}: {message}"
    if kind == "died":
        return f"rank {rank} died ({_describe_exit(code)}); the other ranks were stopped"
    return f"rank {rank}: {message}; the other ranks were stopped"
