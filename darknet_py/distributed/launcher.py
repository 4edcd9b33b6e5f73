"""Launching the ranks of one node: one process per device, each training (it imports
train, which nothing else in this package does) and reporting a failure in one line; the
first rank to fail ends them all; a stop signal reaches them all, and they stop together.
A rank that a cluster's launcher (srun, torchrun) started runs the same rank body in its
own process (run_as_cluster_rank)."""

import multiprocessing
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

from .. import processes
from ..backends import get_backend, start_device
from ..data.loader import default_workers
from ..errors import USER_ERRORS, DarknetError, describe_error
from ..processes import PARENT_SIGNALS, children_ignore_signals, say, set_process_start, trace_start
from ..train import train
from ..training.loop import describe_stop
from ..training.stops import Stopped, exit_code, held_stop_signals, stopped
from .comm import (
    CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    CommError,
    Communicator,
    DeviceThread,
    TcpCommunicator,
    free_port,
)
from .nccl import NcclCommunicator

EXIT_PEER_LOST = 3  # a rank that stopped because another one failed
REPORT_WAIT = 0.5  # seconds a rank gets to report its own failure
RANK_START_ENV = "DARKNET_RANK_START"  # fork or spawn: see rank_start_method


def parse_gpus(text, device_count):
    """--gpus 0,1 or all -> ["cuda:0", "cuda:1"]; ValueError naming what is wrong.
    device_count None: the list's form only (the GPUs are counted later: see launch's
    `check`); "all" needs the count."""
    text = str(text).strip()
    if text == "all":
        if device_count is None:
            raise ValueError("--gpus all: the GPUs must be counted first")
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
        if device_count is not None and not 0 <= index < device_count:
            have = (
                f"{device_count} GPU{'s' if device_count != 1 else ''} (0-{device_count - 1})"
                if device_count
                else "no CUDA GPU (or PyCUDA)"
            )
            raise ValueError(
                f"--gpus {text}: GPU {index} (local rank {rank}) does not exist; "
                f"this machine has {have}"
            )
    return [f"cuda:{i}" for i in indices]


@dataclass
class RankSpec:
    """What one worker process needs to start."""

    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:N"
    master: tuple  # (host, port) of rank 0's rendezvous
    timeout: float
    train_kwargs: dict
    origin: str = ""  # the start line's note on where the rank came from
    started: float = None  # the launcher's start (time.monotonic()), the rank's clock's zero


class LaunchError(DarknetError):
    """A rank failed or could not start: one line naming it."""


def rank_log(line):
    """Rank 0's log on the streams of a one-process run (cli_options.log_line): warnings
    on stderr, progress and notes on stdout; each line in one write (say)."""
    say(line, sys.stderr if line.startswith("darknet-py: warning:") else sys.stdout)


def run_rank(spec):
    """Join the run as spec.rank and train: (exit code, report), report None or (kind,
    what) for the launcher: ("error"|"peer", line) or ("signal", number) for a rank that
    stopped with the others on a signal. The shared body of `train --gpus/--ranks`'s
    worker processes and of a rank a cluster's launcher started."""
    comm = None
    try:
        # Started with the signals training handles ignored and blocked (the launcher's
        # children_ignore_signals): training's handlers are in place now (held_stop_signals).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PARENT_SIGNALS)
        if spec.started is not None:
            set_process_start(spec.started)
        say(
            f"darknet-py: rank {spec.rank} of {spec.world_size}: pid {os.getpid()}, "
            f"{spec.device}{spec.origin}"
        )
        trace_start(f"rank {spec.rank} started")
        comm = PendingCommunicator(
            spec.rank, spec.world_size, spec.device, spec.master, spec.timeout
        )
        kwargs = dict(spec.train_kwargs)
        if spec.rank != 0:  # one log: rank 0's
            kwargs.update(log=lambda line: None, verbose=False)
        else:
            kwargs["log"] = rank_log
        train(device=spec.device, comm=comm, **kwargs)
    except Stopped as e:
        code, report = exit_code(e), ("signal", e.signum)
        if spec.rank == 0 and not getattr(e, "reported", False):
            say(f"{describe_stop(e)} before training started: nothing saved")
    except CommError as e:
        code, report = EXIT_PEER_LOST, ("peer", str(e))
    except USER_ERRORS as e:
        code, report = 2, ("error", describe_error(e))
    except KeyboardInterrupt:
        code, report = 130, None
    except BaseException as e:  # a bug: keep its traceback on stderr
        traceback.print_exc()
        code, report = 1, ("error", f"{type(e).__name__}: {e}")
    else:
        code, report = 0, None
    if comm is not None and code:
        comm.abort()
    sys.stdout.flush()
    return code, report


def _worker(spec, errors):
    """Body of a worker process: run_rank, its report through `errors` (a Pipe end) and
    its exit code."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # no NVLink SHARP multicast (docs/training.md)
    with held_stop_signals():
        code, report = run_rank(spec)
    if report is not None:
        try:
            errors.send(report)
        except OSError:  # the launcher is gone: nobody to tell
            pass
    os._exit(code)  # no atexit work (loader threads, CUDA teardown) may hang a failed rank


class PendingCommunicator(Communicator):
    """A rank's communicator made on a thread of its own while the rank's main thread reads
    its lists and builds its network; its first collective waits for it and raises what
    making it raised. On that thread: the rendezvous over TCP at once (it needs no
    device), then for a GPU, once the device's CUDA start is done (started here on a
    thread of its own, backends.start_device: the driver, the context NCCL binds to),
    ncclCommInitRank (~0.6 s)."""

    def __init__(
        self,
        rank,
        world_size,
        device,
        master,
        timeout=DEFAULT_TIMEOUT,
        connect_timeout=CONNECT_TIMEOUT,
    ):
        self.rank, self.world_size = rank, world_size
        self._comm, self._aborted = None, False
        gpu = str(device).startswith("cuda")
        if gpu:
            start_device(device)
        self._making = DeviceThread(
            lambda: self._connect(
                rank, world_size, device if gpu else None, master, (timeout, connect_timeout)
            ),
            None,
            name=f"darknet-py rank {rank} communicator",
        )

    def _connect(self, rank, world_size, gpu_device, master, timeouts):
        """The rendezvous, then NCCL on `gpu_device` ("cuda:N"; None: TCP alone)."""
        tcp = TcpCommunicator(
            rank, world_size, master, timeout=timeouts[0], connect_timeout=timeouts[1]
        )
        trace_start(f"rank {rank} rendezvous done")
        if gpu_device is None:
            self._comm = tcp
        else:
            be = get_backend(gpu_device)  # the device's start, its context current here
            try:
                self._comm = NcclCommunicator(tcp, int(str(gpu_device).partition(":")[2] or 0))
            except BaseException:
                tcp.abort()
                raise
            finally:
                be.leave_thread()  # a thread must not end with a context pushed
        trace_start(f"rank {rank} communicator ready")
        if self._aborted:
            self._comm.abort()

    def ready(self):
        """The communicator, once made (waits for it)."""
        self._making.wait()
        return self._comm

    def all_reduce_sum(self, be, arrays):
        self.ready().all_reduce_sum(be, arrays)

    def broadcast(self, be, arrays, root=0):
        self.ready().broadcast(be, arrays, root)

    def barrier(self, timeout=None):
        self.ready().barrier(timeout)

    def sum_values(self, be, values):
        return self.ready().sum_values(be, values)

    def abort(self):
        # Still connecting (peers may never come): abort once made, without waiting.
        self._aborted = True
        if not self._making.is_alive() and self._comm is not None:
            self._comm.abort()

    def close(self):
        if self._comm is not None or self._making.is_alive():
            self.ready().close()


def connect(rank, world_size, device, master, timeout=DEFAULT_TIMEOUT):
    """The communicator for one rank: NCCL for CUDA devices, TCP for the CPU."""
    tcp = TcpCommunicator(rank, world_size, master, timeout=timeout)
    if str(device).startswith("cuda"):
        get_backend(device)  # NCCL binds to the CUDA context current when it starts
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


def launch(
    devices,
    train_kwargs,
    first_rank=0,
    world_size=None,
    master=None,
    timeout=DEFAULT_TIMEOUT,
    check=None,
):
    """Run the ranks first_rank .. first_rank+len(devices)-1 of a world_size-rank run, one
    process per device, and wait for them. When one fails, the others are stopped within
    seconds and LaunchError names the first that failed. A stop signal (to this process
    or to the whole group) reaches every rank: they stop together at the end of a step,
    rank 0 saves the backup, and Stopped (a KeyboardInterrupt naming the signal) is
    raised here once all have ended; SIGUSR1 is passed on (a backup, and training goes
    on). train_kwargs go to train() in every rank (picklable: rank 0 logs to stdout, the
    others stay quiet). check: called once the ranks are starting; a ValueError from it
    ends them and becomes the LaunchError (the launcher's own CUDA start, to count the
    GPUs, then runs while the ranks import rather than before them)."""
    world_size = world_size or len(devices)
    quiet_resource_tracker()
    if master is None:
        master = ("127.0.0.1", free_port())
    context = multiprocessing.get_context(rank_start_method(devices))
    trace_start("launching the ranks")
    workers = []  # (rank, process, errors pipe end)

    def forward(signum):
        for _, process, _ in workers:
            if process.is_alive():
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass

    with held_stop_signals() as signals, signals.deferred():
        signals.forward = forward
        try:
            # The ranks start ignoring the signals until their handlers are set; one
            # that comes meanwhile is passed on again while they run (_wait).
            with children_ignore_signals():
                for i, device in enumerate(devices):
                    rank = first_rank + i
                    receive, send = context.Pipe(duplex=False)
                    spec = RankSpec(
                        rank,
                        world_size,
                        device,
                        master,
                        timeout,
                        train_kwargs,
                        started=processes.PROCESS_START,
                    )
                    process = context.Process(
                        target=_worker, args=(spec, send), name=f"darknet-py rank {rank}"
                    )
                    process.start()
                    send.close()
                    workers.append((rank, process, receive))
            if check is not None:
                try:
                    check()
                except ValueError as e:
                    for _, process, _ in workers:
                        process.kill()
                        process.join()
                    raise LaunchError(str(e)) from None
            failed, stopped_by = _wait(workers, signals)
            trace_start("every rank ended")
        finally:
            signals.forward = None
    stop = signals.stop or stopped_by
    if stop is not None and not (failed and failed[0] == "error"):
        interrupt = stopped(stop)
        interrupt.reported = True  # rank 0 said it
        raise interrupt
    if failed:
        raise LaunchError(failed[1])


def rank_start_method(devices):
    """How the ranks' processes start: forked, with darknet-py already imported (0.3 s
    sooner a run on 2 H200s, 0.55 s on 4 by the start trace), where a
    fork can work; else spawned (a fresh interpreter that imports darknet-py again). A fork
    cannot work for GPU ranks once this process has started CUDA (a forked child cannot
    use its parent's CUDA), nor where the platform has no fork. DARKNET_RANK_START=spawn
    spawns them whatever the case; =fork asks for the default."""
    asked = os.environ.get(RANK_START_ENV, "")
    if asked not in ("", "fork", "spawn"):
        raise LaunchError(f"{RANK_START_ENV}={asked}: expected fork or spawn")
    cuda = any(str(d).startswith("cuda") for d in devices)
    can_fork = "fork" in multiprocessing.get_all_start_methods() and not (
        cuda and "pycuda.driver" in sys.modules
    )
    return "fork" if asked != "spawn" and can_fork else "spawn"


def quiet_resource_tracker():
    """A rank that ends at once (os._exit, or killed) leaves its loader's shared memory
    and semaphores to multiprocessing's resource tracker, which frees them and would add
    a warning after the one line that says why the rank ended. Set before the tracker
    starts (it reads the variable)."""
    quiet = "ignore:resource_tracker:UserWarning"
    if quiet not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(
            w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w
        )


def _report(pipe, otherwise):
    """What a finished worker said about its failure; (otherwise, "") if nothing (a
    process killed by a signal closes its end without a word)."""
    try:
        return pipe.recv() if pipe.poll() else (otherwise, "")
    except (EOFError, OSError):
        return otherwise, ""


def _wait(workers, signals):
    """Wait for every worker: (failure, stop signal). failure is None or (kind, the line
    naming the rank to blame: one that failed by itself rather than one that only lost
    its peers); the stop signal is the one ranks stopped on (else None). After the first
    failure the others get REPORT_WAIT seconds each to fail with it, then SIGKILL; ranks
    that stop on a signal are waited for (rank 0 is saving the backup)."""
    running = {process.sentinel: (rank, process, pipe) for rank, process, pipe in workers}
    failures, stop = [], None
    while running:
        for sentinel in wait(list(running), timeout=1.0):
            rank, process, pipe = running.pop(sentinel)
            process.join()
            if process.exitcode != 0:
                kind, message = _report(pipe, "died")
                if kind == "signal":
                    stop = stop or message
                else:
                    failures.append((rank, process.exitcode, kind, message))
        if signals.stop is not None:
            # Again each second: a rank still starting ignored the first one.
            signals.forward(signals.stop)
        if failures and running:
            # Let the ranks that fail with it report in, then stop the rest with SIGKILL:
            # SIGTERM would make rank 0 save a backup, and the checkpoint must stay as
            # the last good iteration left it.
            for _, (rank, process, pipe) in list(running.items()):
                process.join(REPORT_WAIT)
                if process.is_alive():
                    process.kill()
                    process.join()
                if process.exitcode != 0:
                    kind, message = _report(pipe, "stopped")
                    if kind != "signal":
                        failures.append((rank, process.exitcode, kind, message))
            running.clear()
    if not failures:
        return None, stop
    order = {"error": 0, "died": 1, "peer": 2, "stopped": 3}
    rank, code, kind, message = min(failures, key=lambda f: (order[f[2]], f[0]))
    if kind == "error":
        return ("error", f"rank {rank}: {message}"), stop
    if kind == "died":
        return (
            kind,
            f"rank {rank} died ({_describe_exit(code)}); the other ranks were stopped",
        ), stop
    return (kind, f"rank {rank}: {message}; the other ranks were stopped"), stop


def cluster_device(cluster, device, device_count):
    """The device of a rank a cluster launcher started: its local rank's GPU (GPU 0 when
    the launcher shows each rank only its own), the CPU with --device cpu or without a
    GPU; ValueError naming what does not fit."""
    if device == "cpu" or (device == "auto" and device_count == 0):
        return "cpu"
    if device != "auto":
        raise ValueError(
            f"--device {device}: under {cluster.launcher} each rank trains on "
            f"the GPU of its local rank; leave out --gpu/--device (or give "
            f"--device cpu for CPU ranks)"
        )
    if cluster.local_rank < device_count:
        return f"cuda:{cluster.local_rank}"
    if device_count == 1:  # CUDA_VISIBLE_DEVICES holds this rank's GPU alone
        return "cuda:0"
    raise ValueError(
        f"{cluster.launcher}: local rank {cluster.local_rank} has no GPU: this "
        f"machine shows {device_count} (0-{device_count - 1})"
    )


def cluster_workers(cluster, workers):
    """Loader workers of one rank: its share of the CPUs this process may use, unless the
    launcher already gave each rank its own CPUs (an affinity smaller than the machine)."""
    if workers is not None:
        return workers
    try:
        own_cpus = len(os.sched_getaffinity(0)) < (os.cpu_count() or 1)
    except AttributeError:  # not on Linux
        own_cpus = False
    return default_workers() if own_cpus else default_workers(cluster.local_world_size)


def run_as_cluster_rank(cluster, train_kwargs, device, timeout=DEFAULT_TIMEOUT):
    """Train as the rank `cluster` (a distributed.cluster.ClusterRank) describes, in this
    process: the same path as a launched rank (run_rank). A failure is one line on stderr
    naming the rank, and the process ends with its exit code (128 + signal after a stop
    signal); returns 0 after a finished run."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # as launched ranks (docs/training.md)
    quiet_resource_tracker()
    spec = RankSpec(
        cluster.rank,
        cluster.world_size,
        device,
        cluster.master,
        timeout,
        train_kwargs,
        origin=f", {cluster.describe()}",
    )
    with held_stop_signals():
        code, report = run_rank(spec)
    if report is not None and report[0] != "signal":
        say(f"darknet-py: error: rank {cluster.rank}: {report[1]}", sys.stderr)
    if code:  # as a launched rank: no atexit work (loader threads, CUDA) may hang it
        sys.stderr.flush()
        os._exit(code)
    return code
