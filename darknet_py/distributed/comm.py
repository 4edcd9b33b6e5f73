"""The communicator: what data-parallel training needs from a transport (sums and
broadcasts of a backend's arrays, barriers), and its TCP implementation.

`TcpCommunicator` joins processes on one or several hosts over TCP (the NumPy backend's
transport; CUDA ranks rendezvous through one and keep it for barriers, see nccl.py).
"""

import selectors
import socket
import struct
import threading
import time

import numpy as np

from .. import precision as precisions

DEFAULT_TIMEOUT = 600.0  # seconds a collective waits for a peer before giving up
CONNECT_TIMEOUT = 120.0  # seconds the ranks have to find rank 0 at start
_HEADER = struct.Struct("!cQ")  # message kind, payload bytes


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


class Communicator:
    """What data-parallel training needs from a transport. Arrays are a backend's arrays
    (`be`): sums and broadcasts happen in place; every rank calls every collective in the
    same order with arrays of the same sizes."""

    rank = 0
    world_size = 1

    def all_reduce_sum(self, be, arrays):
        """Sum every rank's arrays into them, in place. The arrays are fp32, or all of one
        16-bit storage (be.storage_zeros' fp16 or bf16 arrays: the 16-bit exchange)."""
        raise NotImplementedError

    def start_all_reduce_sum(self, be, arrays):
        """all_reduce_sum begun behind the caller (the work queued on the backend so far
        first); returns what to wait() on before the arrays are read again. Ranks start
        and wait for their sums in the same order. Here the sum runs at once; NCCL runs it
        on a stream of its own (nccl.py)."""
        self.all_reduce_sum(be, arrays)
        return Done()

    def broadcast(self, be, arrays, root=0):
        raise NotImplementedError

    def barrier(self, timeout=None):
        raise NotImplementedError

    def abort(self):
        """Stop at once (after an error): peers waiting on this rank get an error."""

    def sum_value(self, be, value):
        """The sum over the ranks of one number (a loss)."""
        return self.sum_values(be, [value])[0]

    def sum_values(self, be, values):
        """The sums over the ranks of a few numbers, in one collective."""
        buffer = be.from_host(np.array(values, dtype=np.float32))
        self.all_reduce_sum(be, [buffer])
        return [float(v) for v in be.to_host(buffer)]


class Done:
    """A start_all_reduce_sum that has already ended."""

    def wait(self):
        pass


class DeviceThread:
    """work() on a thread of its own, with `context` (a CUDA context, or None) current
    there too: communication started while the rank's main thread goes on. wait() joins
    it and raises what work() raised."""

    def __init__(self, work, context, name):
        self._error = None
        self._thread = threading.Thread(
            target=self._run, args=(work, context), name=name, daemon=True
        )
        self._thread.start()

    def _run(self, work, context):
        if context is not None:
            context.push()
        try:
            work()
        except BaseException as e:  # raised again in wait()
            self._error = e
        finally:
            if context is not None:
                context.pop()

    def is_alive(self):
        return self._thread.is_alive()

    def wait(self):
        self._thread.join()
        if self._error is not None:
            raise self._error


def _flatten(be, arrays):
    return (
        np.concatenate([be.to_host(a).reshape(-1) for a in arrays])
        if arrays
        else np.zeros(0, np.float32)
    )


def _storage_of(be, arrays):
    """The storage the arrays of a sum share (fp32, fp16 or bf16)."""
    storages = {be.storage_of(a) for a in arrays} if hasattr(be, "storage_of") else set()
    if len(storages) > 1:
        raise ValueError(
            f"all_reduce_sum: arrays kept at {', '.join(sorted(storages))}: one storage per sum"
        )
    return storages.pop() if storages else precisions.DEFAULT


def to_wire(values, storage):
    """float32 values (already rounded to `storage`) as the bytes a sum sends: 4 bytes a
    value for fp32, the 16 bits themselves for fp16 and bf16."""
    if storage == "fp16":
        return values.astype(np.float16).tobytes()
    if storage == "bf16":
        return (
            (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16)
            .astype(np.uint16)
            .tobytes()
        )
    return np.ascontiguousarray(values, np.float32).tobytes()


def from_wire(data, storage):
    """to_wire's bytes back as float32 values (16-bit ones widened exactly)."""
    if storage in ("fp16", "bf16"):
        wire = np.float16 if storage == "fp16" else np.uint16  # bf16's bits
        return precisions.widened(np.frombuffer(data, wire))
    return np.frombuffer(data, np.float32)


def sum_in_order(parts, storage):
    """The sum of `parts` (float32 arrays, rank order). A 16-bit sum is rounded to its
    storage after every addition, as NCCL's ring adds 16-bit values hop by hop, so that
    the CPU ranks see the rounding GPU ranks do (docs/training.md)."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
        if storage != precisions.DEFAULT:
            with np.errstate(over="ignore", invalid="ignore"):
                total = precisions.round_to(total, storage)
    return total


def _unflatten(be, arrays, flat):
    offset = 0
    for a in arrays:
        be.write(a, flat[offset : offset + a.size])
        offset += a.size


class TcpCommunicator(Communicator):
    """Ranks talking over TCP, rank 0 in the middle: it listens at `master`, receives
    every rank's buffer, sums them in rank order (so every rank gets the same bits) and
    sends the sum back. Fine for the NumPy backend's speeds; GPUs use NCCL."""

    def __init__(
        self, rank, world_size, master, timeout=DEFAULT_TIMEOUT, connect_timeout=CONNECT_TIMEOUT
    ):
        self.rank, self.world_size = int(rank), int(world_size)
        self.timeout = timeout
        host, port = master if isinstance(master, tuple) else parse_master(master)
        self.peers = {}  # rank 0: {rank: socket}; others: {0: socket}
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
                    raise CommError(
                        f"rank 0: rank{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(str, missing))} did not connect within "
                        f"{connect_timeout:.0f} s"
                    ) from None
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(self.timeout)
                rank, world = struct.unpack("!II", self._recv_exact(conn, 8, "?"))
                if world != self.world_size or not 0 < rank < world or rank in self.peers:
                    conn.close()
                    raise CommError(
                        f"rank 0: a process joined as rank {rank} of {world}, "
                        f"but this run has {self.world_size} ranks (check "
                        f"--nodes, --node-rank and the device count of each node)"
                    )
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
                    raise CommError(
                        f"rank {self.rank}: cannot reach rank 0 at {host}:{port} "
                        f"({e.strerror or e})"
                    ) from None
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
            raise CommError(
                f"rank {peer} did not answer rank {self.rank} within "
                f"{self.timeout:.0f} s (communication timeout)"
            ) from None
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
            raise CommError(
                f"rank {peer} did not take rank {self.rank}'s data within "
                f"{self.timeout:.0f} s (communication timeout)"
            ) from None
        except OSError:
            raise CommError(
                f"rank {peer} ended (its connection to rank {self.rank} closed)"
            ) from None

    def _recv(self, peer, kind, nbytes):
        conn = self.peers[peer]
        got_kind, size = _HEADER.unpack(self._recv_exact(conn, _HEADER.size, peer))
        if got_kind != kind or size != nbytes:
            raise CommError(
                f"rank {peer} is out of step with rank {self.rank} (sent "
                f"{got_kind!r} of {size} bytes, expected {kind!r} of {nbytes})"
            )
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
                    raise CommError(
                        f"rank {late[0]} did not answer rank 0 within "
                        f"{timeout:.0f} s (communication timeout)"
                    )
                for key, _ in selector.select(left):
                    rank = key.data
                    try:
                        pending[rank] += self._recv_some(
                            key.fileobj, need - len(pending[rank]), rank
                        )
                    except BlockingIOError:
                        continue
                    if len(pending[rank]) == need:
                        selector.unregister(key.fileobj)
                    if len(pending[rank]) >= _HEADER.size:
                        got_kind, size = _HEADER.unpack_from(pending[rank])
                        if got_kind != kind or size != nbytes:
                            raise CommError(
                                f"rank {rank} is out of step with rank 0 (sent {got_kind!r} "
                                f"of {size} bytes, expected {kind!r} of {nbytes})"
                            )
        finally:
            selector.close()
            for conn in self.peers.values():
                conn.setblocking(True)
                conn.settimeout(self.timeout)
        return {rank: bytes(b[_HEADER.size :]) for rank, b in pending.items()}

    # -- collectives --
    def all_reduce_sum(self, be, arrays):
        if self.world_size == 1:
            return
        storage = _storage_of(be, arrays)
        mine = to_wire(_flatten(be, arrays).astype(np.float32, copy=False), storage)
        if self.rank == 0:
            received = self._gather_at_root(b"S", len(mine), self.timeout)
            parts = [from_wire(mine, storage)] + [
                from_wire(received[rank], storage) for rank in sorted(received)
            ]
            total = to_wire(sum_in_order(parts, storage), storage)
            for rank in sorted(self.peers):
                self._send(rank, b"s", total)
        else:
            self._send(0, b"S", mine)
            total = self._recv(0, b"s", len(mine))
        _unflatten(be, arrays, from_wire(total, storage))

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
            _unflatten(
                be, arrays, np.frombuffer(self._recv(0, b"B", flat.nbytes), dtype=np.float32)
            )

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
