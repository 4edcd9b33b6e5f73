"""The data-parallel policy training follows (see the package docstring): the update
hook that sums the ranks' gradients, and what train() asks about the run it is part of
(which rank writes, its shard of the images, its loader seed)."""

import numpy as np

from ..processes import trace_start
from . import buckets as bucketing
from .comm import DeviceThread


class DataParallel:
    """The hook Network.update calls (net.data_parallel): sums the ranks' accumulated
    updates, averages the rolling statistics, and after the update leaves the momentum on
    rank 0 only (see the module docstring)."""

    def __init__(self, comm, bucket_bytes=None, exchange=None):
        """bucket_bytes: the gradient buckets' size (0: one sum after the backward; None:
        DARKNET_BUCKET_MB's); exchange: "auto" or "fp32" (None: DARKNET_EXCHANGE's). See
        buckets.py."""
        self.comm = comm
        self.rank, self.world_size = comm.rank, comm.world_size
        self._sending = None  # send_parameters' broadcast (a DeviceThread), until arrived()
        self.bucket_bytes = bucketing.bucket_bytes() if bucket_bytes is None else int(bucket_bytes)
        self.exchange_setting = bucketing.exchange_setting() if exchange is None else exchange
        self._buckets = None  # the network's GradientBuckets, made at its first pass

    def attach(self, net):
        """Make `net` a replica: rank 0's parameters on every rank, updates summed from
        now on. Call after loading weights and before training."""
        self.send_parameters(net)
        self.arrived(net)

    def send_parameters(self, net):
        """attach() in two halves, for a rank whose communicator may still be connecting
        (NCCL's start and its first connections take ~1.2 s on 4 GPUs): rank 0's
        parameters are broadcast from a thread of its own while the rank starts its data
        loader, and arrived() waits for them before the first pass (0.3 s sooner on 4 GPUs).
        Nothing may read or write the parameters in between."""
        net.data_parallel = self
        arrays = [a for layer in net.layers for _, a in layer.params()]
        self._sending = DeviceThread(
            lambda: self.comm.broadcast(net.be, arrays),
            getattr(net.be, "context", None),
            name="darknet-py parameters from rank 0",
        )

    def arrived(self, net):
        """Wait for send_parameters' broadcast to be queued (later work on the backend's
        stream runs after it) and raise what it raised."""
        if self._sending is not None:
            sending, self._sending = self._sending, None
            sending.wait()
            net.params_changed()

    def buckets(self, net):
        """The bucket plan for net's training passes (made at the first, after the update
        buffers exist; made again if they were replaced); None without buckets."""
        if self._sending is not None:  # a pass ran on parameters not yet rank 0's
            raise RuntimeError("send_parameters() without arrived() before training")
        if not self.bucket_bytes or self.world_size == 1:
            return None
        if self._buckets is None or not self._buckets.matches(net):
            storage = bucketing.exchange_storage(net.precision, self.exchange_setting)
            self._buckets = bucketing.GradientBuckets(net, self.comm, self.bucket_bytes, storage)
        return self._buckets

    def reduce(self, net):
        """Without buckets: every gradient summed after the backward, in one collective."""
        if self._sending is not None:  # a pass ran on parameters not yet rank 0's
            raise RuntimeError("send_parameters() without arrived() before training")
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
        self.data_parallel = None  # attach()'s, for a rank of a data-parallel run

    @property
    def writer(self):
        """Only rank 0 writes weights, charts and logs."""
        return self.rank == 0

    def attach(self, net):
        """Start making `net` a replica (DataParallel.send_parameters); arrived() before
        its first pass."""
        if self.comm is not None:
            self.data_parallel = DataParallel(self.comm)
            self.data_parallel.send_parameters(net)
            trace_start("parameters from rank 0 on their way")

    def arrived(self, net):
        if self.comm is not None:
            self.data_parallel.arrived(net)
            trace_start("parameters from rank 0 arrived")

    def shard(self, paths):
        return shard(paths, self.rank, self.world_size)

    def seed(self, seed):
        return rank_seed(seed, self.rank, self.world_size)

    def mean_and_any(self, net, value, flags):
        """The mean over the ranks of `value` (a loss) and, for each of `flags` (booleans
        every rank passes in the same order), whether it is set on any rank: the ranks
        decide together, in the sum the loss takes anyway, whether to stop or save."""
        if self.comm is None:
            return value, [bool(f) for f in flags]
        sums = self.comm.sum_values(net.be, [value] + [float(bool(f)) for f in flags])
        return sums[0] / self.world_size, [s > 0 for s in sums[1:]]

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
