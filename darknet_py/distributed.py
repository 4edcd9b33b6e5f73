"""Data-parallel training: one process per device, the result of one device with the
combined batch.

Every process (a *rank*) holds the whole network, trains on its own images and, before
each update, the ranks sum their accumulated gradients, so every rank applies the same
update and the weights stay identical (Darknet's C code instead averages the weights
every few iterations, so its result depends on the GPU count).

Momentum lives in the update buffers (Darknet keeps `momentum * previous update` there
after each step): summing every rank's buffer would count it once per rank, so only rank
0 keeps it; the other ranks zero their buffers after each update, so they hold just
their own gradients when the next sum is taken. Batch-norm rolling statistics are
averaged. Batch statistics stay per rank (as Darknet's multi-GPU training and PyTorch's
DDP without SyncBatchNorm), so with batch norm the run matches one device only in
expectation; without it, to float32 rounding.

The transport is a Communicator: `TcpCommunicator` (processes on one or several hosts
over TCP; the NumPy backend) or `nccl.NcclCommunicator` (CUDA devices; it rendezvouses
through a TcpCommunicator and keeps it for barriers). `launch` starts the ranks of one
node and ends them all, with one line naming the rank, when one fails.
"""
import os
import selectors
import signal
import socket
import struct
import time
from dataclasses import dataclass

import numpy as np

DEFAULT_TIMEOUT = 600.0        # seconds a collective waits for a peer before giving up
CONNECT_TIMEOUT = 120.0        # seconds the ranks have to find rank 0 at start
_HEADER = struct.Struct("!cQ")  # message kind, payload bytes
EXIT_PEER_LOST = 3             # a rank that stopped because another one failed
REPORT_WAIT = 0.5              # seconds a rank gets to report its own failure


class CommError(Exception):
    """A collective failed: a peer ended, did not answer in time, or disagreed."""


def parse_master(text):
    """HOST:PORT -> (host, port), or ValueError with what is wrong."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--master {text!r}: expected HOST:PORT, e.g. 10.0.0.1:29500")
    return host.strip("[]"), int(port)


def free_port(host="127.0.0.1"):
    """A TCP port nothing listens on now (for a one-node run's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


# ---- the communicator interface -------------------------------------------------------------
class Communicator:
    """What data-parallel training needs from a transport. Arrays are a backend's arrays
    (`be`): sums and broadcasts happen in place; every rank calls every collective in the
    same order with arrays of the same sizes."""
    rank = 0
    world_size = 1

    def all_reduce_sum(self, be, arrays):
        raise NotImplementedError

    def broadcast(self, be, arrays, root=0):
        raise NotImplementedError

    def barrier(self, timeout=None):
        raise NotImplementedError

    def abort(self):
        """Stop at once (after an error): peers waiting on this rank get an error."""

    def sum_value(self, be, value):
        """The sum over the ranks of one number (a loss)."""
        buffer = be.from_host(np.array([value], dtype=np.float32))
        self.all_reduce_sum(be, [buffer])
        return float(be.to_host(buffer)[0])


def _flatten(be, arrays):
    return np.concatenate([be.to_host(a).reshape(-1) for a in arrays]) if arrays else \
        np.zeros(0, np.float32)


def _unflatten(be, arrays, flat):
    offset = 0
    for a in arrays:
        be.write(a, flat[offset:offset + a.size])
        offset += a.size


class TcpCommunicator(Communicator):
    """Ranks talking over TCP, rank 0 in the middle: it listens at `master`, receives
    every rank's buffer, sums them in rank order (so every rank gets the same bits) and
    sends the sum back. Fine for the NumPy backend's speeds; GPUs use NCCL."""

    def __init__(self, rank, world_size, master, timeout=DEFAULT_TIMEOUT,
                 connect_timeout=CONNECT_TIMEOUT):
        self.rank, self.world_size = int(rank), int(world_size)
        self.timeout = timeout
        host, port = master if isinstance(master, tuple) else parse_master(master)
        self.peers = {}          # rank 0: {rank: socket}; others: {0: socket}
        if self.world_size == 1:
            return
        if self.rank == 0:
            self._accept(host, port, connect_timeout)
        else:
            self._connect(host, port, connect_timeout)

    # -- rendezvous --
    def _accept(self, host, port, connect_timeout):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("" if host not in ("127.0.0.1", "localhost") else host, port))
        except OSError as e:
            listener.close()
            raise CommError(f"rank 0: cannot listen on port {port} ({e.strerror})") from None
        listener.listen(self.world_size)
        deadline = time.monotonic() + connect_timeout
        try:
            while len(self.peers) < self.world_size - 1:
                listener.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    missing = sorted(set(range(1, self.world_size)) - set(self.peers))
                    raise CommError(f"rank 0: rank{'s' if len(missing) > 1 else ''} "
                                    f"{', '.join(map(str, missing))} did not connect within "
                                    f"{connect_timeout:.0f} s") from None
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(self.timeout)
                rank, world = struct.unpack("!II", self._recv_exact(conn, 8, "?"))
                if world != self.world_size or not 0 < rank < world or rank in self.peers:
                    conn.close()
                    raise CommError(f"rank 0: a process joined as rank {rank} of {world}, "
                                    f"but this run has {self.world_size} ranks (check "
                                    f"--nodes, --node-rank and the device count of each node)")
                self.peers[rank] = conn
        finally:
            listener.close()
        for conn in self.peers.values():
            conn.sendall(b"ok")

    def _connect(self, host, port, connect_timeout):
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                conn = socket.create_connection((host, port), timeout=5)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise CommError(f"rank {self.rank}: cannot reach rank 0 at {host}:{port} "
                                    f"({e.strerror or e})") from None
                time.sleep(0.05)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        conn.sendall(struct.pack("!II", self.rank, self.world_size))
        if self._recv_exact(conn, 2, 0) != b"ok":
            raise CommError(f"rank {self.rank}: rank 0 refused this process")
        conn.settimeout(self.timeout)
        self.peers[0] = conn

    # -- messages --
    def _recv_some(self, conn, n, peer):
        """Up to n bytes from peer; its end or silence is a CommError naming it (a
        non-blocking socket with nothing yet raises BlockingIOError)."""
        try:
            chunk = conn.recv(min(n, 1 << 20))
        except socket.timeout:
            raise CommError(f"rank {peer} did not answer rank {self.rank} within "
                            f"{self.timeout:.0f} s (communication timeout)") from None
        except (ConnectionResetError, BrokenPipeError):
            chunk = b""
        except BlockingIOError:
            raise
        except OSError as e:
            raise CommError(f"rank {peer}: connection lost ({e.strerror})") from None
        if not chunk:
            raise CommError(f"rank {peer} ended (its connection to rank {self.rank} closed)")
        return chunk

    def _recv_exact(self, conn, n, peer):
        chunks, got = [], 0
        while got < n:
            chunks.append(self._recv_some(conn, n - got, peer))
            got += len(chunks[-1])
        return b"".join(chunks)

    def _send(self, peer, kind, payload=b""):
        try:
            self.peers[peer].sendall(_HEADER.pack(kind, len(payload)) + payload)
        except socket.timeout:
            raise CommError(f"rank {peer} did not take rank {self.rank}'s data within "
                            f"{self.timeout:.0f} s (communication timeout)") from None
        except OSError:
            raise CommError(f"rank {peer} ended (its connection to rank {self.rank} "
                            f"closed)") from None

    def _recv(self, peer, kind, nbytes):
        conn = self.peers[peer]
        got_kind, size = _HEADER.unpack(self._recv_exact(conn, _HEADER.size, peer))
        if got_kind != kind or size != nbytes:
            raise CommError(f"rank {peer} is out of step with rank {self.rank} (sent "
                            f"{got_kind!r} of {size} bytes, expected {kind!r} of {nbytes})")
        return self._recv_exact(conn, nbytes, peer)

    def _gather_at_root(self, kind, nbytes, timeout):
        """Rank 0: every other rank's next message, read as they come, so that a rank that
        ends is reported at once whichever rank it is."""
        pending = {rank: bytearray() for rank in self.peers}
        need = _HEADER.size + nbytes
        selector = selectors.DefaultSelector()
        for rank, conn in self.peers.items():
            conn.setblocking(False)
            selector.register(conn, selectors.EVENT_READ, rank)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while any(len(b) < need for b in pending.values()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    late = [r for r, b in pending.items() if len(b) < need]
                    raise CommError(f"rank {late[0]} did not answer rank 0 within "
                                    f"{timeout:.0f} s (communication timeout)")
                for key, _ in selector.select(left):
                    rank = key.data
                    try:
                        pending[rank] += self._recv_some(key.fileobj,
                                                         need - len(pending[rank]), rank)
                    except BlockingIOError:
                        continue
                    if len(pending[rank]) == need:
                        selector.unregister(key.fileobj)
                    if len(pending[rank]) >= _HEADER.size:
                        got_kind, size = _HEADER.unpack_from(pending[rank])
                        if got_kind != kind or size != nbytes:
                            raise CommError(
                                f"rank {rank} is out of step with rank 0 (sent {got_kind!r} "
                                f"of {size} bytes, expected {kind!r} of {nbytes})")
        finally:
            selector.close()
            for conn in self.peers.values():
                conn.setblocking(True)
                conn.settimeout(self.timeout)
        return {rank: bytes(b[_HEADER.size:]) for rank, b in pending.items()}

    # -- collectives --
    def all_reduce_sum(self, be, arrays):
        if self.world_size == 1:
            return
        flat = _flatten(be, arrays).astype(np.float32, copy=False)
        if self.rank == 0:
            total = flat.copy()
            received = self._gather_at_root(b"S", flat.nbytes, self.timeout)
            for rank in sorted(received):
                total += np.frombuffer(received[rank], dtype=np.float32)
            for rank in sorted(self.peers):
                self._send(rank, b"s", total.tobytes())
        else:
            self._send(0, b"S", flat.tobytes())
            total = np.frombuffer(self._recv(0, b"s", flat.nbytes), dtype=np.float32)
        _unflatten(be, arrays, total)

    def broadcast(self, be, arrays, root=0):
        if self.world_size == 1:
            return
        if root != 0:
            raise ValueError("TcpCommunicator broadcasts from rank 0")
        flat = _flatten(be, arrays).astype(np.float32, copy=False)
        if self.rank == 0:
            for rank in sorted(self.peers):
                self._send(rank, b"B", flat.tobytes())
        else:
            _unflatten(be, arrays,
                       np.frombuffer(self._recv(0, b"B", flat.nbytes), dtype=np.float32))

    def broadcast_bytes(self, data, nbytes):
        """Rank 0's `data` (nbytes long) on every rank: NCCL's unique id goes this way."""
        if self.world_size == 1:
            return data
        if self.rank == 0:
            for rank in sorted(self.peers):
                self._send(rank, b"I", bytes(data))
            return bytes(data)
        return self._recv(0, b"I", nbytes)

    def barrier(self, timeout=None):
        """Wait until every rank is here (timeout None: as long as it takes, e.g. while
        rank 0 evaluates; a rank that ends still ends the wait at once)."""
        if self.world_size == 1:
            return
        if self.rank == 0:
            self._gather_at_root(b"W", 0, timeout)
            for rank in sorted(self.peers):
                self._send(rank, b"w")
        else:
            self._send(0, b"W")
            conn = self.peers[0]
            conn.settimeout(timeout)
            try:
                self._recv(0, b"w", 0)
            finally:
                conn.settimeout(self.timeout)

    def abort(self):
        for conn in self.peers.values():
            try:
                conn.close()
            except OSError:
                pass
        self.peers = {}

    close = abort


# ---- the training side ----------------------------------------------------------------------
class DataParallel:
    """The hook Network.update calls (net.data_parallel): sums the ranks' accumulated
    updates, averages the rolling statistics, and after the update leaves the momentum on
    rank 0 only (see the module docstring)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.world_size = comm.rank, comm.world_size

    def attach(self, net):
        """Make `net` a replica: rank 0's parameters on every rank, updates summed from
        now on. Call after loading weights and before training."""
        self.comm.broadcast(net.be, [a for layer in net.layers for _, a in layer.params()])
        net.params_changed()
        net.data_parallel = self

    def reduce(self, net):
        updates, statistics = net.update_buffers()
        self.comm.all_reduce_sum(net.be, updates + statistics)
        for array in statistics:
            net.be.scal(1.0 / self.world_size, array)

    def updated(self, net):
        if self.rank != 0:
            for array in net.update_buffers()[0]:
                net.be.fill(array, 0.0)


class Ranks:
    """What train() asks about the run it is part of; comm None: a single process."""

    def __init__(self, comm=None):
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self.world_size = comm.world_size if comm is not None else 1

    @property
    def writer(self):
        """Only rank 0 writes weights, charts and logs."""
        return self.rank == 0

    def attach(self, net):
        if self.comm is not None:
            DataParallel(self.comm).attach(net)

    def shard(self, paths):
        return shard(paths, self.rank, self.world_size)

    def seed(self, seed):
        return rank_seed(seed, self.rank, self.world_size)

    def mean(self, net, value):
        """The mean over the ranks of a number (each rank's loss per image)."""
        if self.comm is None:
            return value
        return self.comm.sum_value(net.be, value) / self.world_size

    def wait_for_writer(self):
        """The other ranks wait (as long as it takes) while rank 0 evaluates."""
        if self.comm is not None:
            self.comm.barrier(timeout=None)


def shard(paths, rank, world_size):
    """The training images of one rank: every world_size-th, starting at its rank."""
    return paths[rank::world_size]


def rank_seed(seed, rank, world_size):
    """The loader seed of one rank: the run's own seed for a single process (so one rank
    gives the same batches as training without --ranks), else one drawn from (seed, rank)."""
    if world_size == 1:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), 0x5EED, int(rank)]).generate_state(1)[0])


# ---- launching the ranks of one node --------------------------------------------------------
@dataclass
class RankSpec:
    """What one worker process needs to start."""
    rank: int
    world_size: int
    device: str             # "cpu" or "cuda:N"
    master: tuple           # (host, port) of rank 0's rendezvous
    timeout: float
    train_kwargs: dict


class LaunchError(Exception):
    """A rank failed or could not start: one line naming it."""


def _worker(spec, errors):
    """Body of a worker process: join, train, report a failure as one line through
    `errors` (a Pipe end) and the exit code."""
    import sys

    from .cli import describe_error, USER_ERRORS
    from .data.config import DataError
    from .train import TrainError, train
    from .validate import ValidationError

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the launcher decides what Ctrl-C does
    os.environ["NCCL_NVLS_ENABLE"] = "0"   # no NVLink SHARP multicast (see README)
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
    except (DataError, TrainError, ValidationError) + USER_ERRORS as e:
        code, report = 2, ("error", describe_error(e))
    except KeyboardInterrupt:
        code, report = 130, None
    except BaseException as e:   # a bug: keep its traceback on stderr
        import traceback
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
        from .backends import get_backend
        from .nccl import NcclCommunicator
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
    import multiprocessing

    from .train import Terminated

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
    from multiprocessing.connection import wait

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


__all__ = ["CommError", "Communicator", "DataParallel", "LaunchError", "Ranks",
           "TcpCommunicator", "connect", "launch", "parse_gpus", "parse_master", "rank_seed",
           "shard"]
