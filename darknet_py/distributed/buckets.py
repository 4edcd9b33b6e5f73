"""Gradient buckets: the ranks' gradients summed while the backward still runs, as
PyTorch's DistributedDataParallel does.

The accumulated updates (the gradient buffers Network.update_buffers lists) are grouped,
in reverse layer order, into buckets of about DARKNET_BUCKET_MB megabytes (25 by default),
each one flat array: the layers' update buffers become views into it, so a bucket is one
collective (and, in a 16-bit exchange, one packing launch) however many arrays it holds.
A bucket is complete once the backward has passed the lowest layer that writes into it;
during the last pass of an iteration the network runs its backward in pieces that end at
those layers (Network.train_pass) and starts each completed bucket's sum between them, so
the sums of the upper layers' gradients overlap the backward of the lower ones. The update
waits for every bucket. The batch-norm rolling statistics (complete since the forward) go
with the first bucket, in fp32, and are averaged as before.

Under fp16 and bf16 training the buckets are exchanged in 16 bits (DARKNET_EXCHANGE=fp32
keeps fp32): each is rounded into a 16-bit copy, summed, and widened back before the
update. fp16 gradients carry the loss scale, so small values survive the rounding; the
copy holds gradient / world_size (divided before rounding, multiplied back after), so that
NCCL's fp16 sum of the ranks' values, rounded hop by hop in fp16, cannot overflow where
the fp32 sum would not. bf16 has fp32's exponent range and is not divided. The loss
scaler then looks at the summed gradients, the same bits on every rank, so every rank
skips the same steps. docs/training.md gives the measured effect on the weights.

DARKNET_BUCKET_MB=0 turns the buckets off: one sum of the unflattened arrays after the
backward (DataParallel.reduce), in fp32.
"""

import os

from .. import precision as precisions

BUCKET_MB_ENV = "DARKNET_BUCKET_MB"
EXCHANGE_ENV = "DARKNET_EXCHANGE"
DEFAULT_BUCKET_MB = 25.0
EXCHANGES = ("auto", "fp32")  # auto: 16 bits under fp16/bf16 training, else fp32
# Network._UPDATE_BUFFER's values: where a layer keeps an accumulated update.
UPDATE_ATTRIBUTES = ("bias_updates", "scale_updates", "weight_updates")


def bucket_bytes(environ=os.environ):
    """The bucket size DARKNET_BUCKET_MB asks for, in bytes (0: no buckets); ValueError
    with what is wrong."""
    text = environ.get(BUCKET_MB_ENV, "").strip()
    if not text:
        return int(DEFAULT_BUCKET_MB * 2**20)
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0 or mb == float("inf"):
        raise ValueError(
            f"{BUCKET_MB_ENV}={text}: expected megabytes of gradients per bucket "
            f"(a number >= 0; 0 sums every gradient after the backward)"
        )
    return int(mb * 2**20)


def exchange_setting(environ=os.environ):
    """DARKNET_EXCHANGE: auto (the default) or fp32; ValueError otherwise."""
    text = environ.get(EXCHANGE_ENV, "").strip().lower() or "auto"
    if text not in EXCHANGES:
        raise ValueError(
            f"{EXCHANGE_ENV}={text}: expected {' or '.join(EXCHANGES)} (auto "
            f"exchanges 16-bit gradients under fp16/bf16 training)"
        )
    return text


def exchange_storage(precision, setting="auto"):
    """The storage the gradients travel in: fp16 or bf16 for a network trained in that
    precision (unless the setting is fp32), else fp32."""
    if setting == "fp32":
        return precisions.DEFAULT
    return precision if precision in precisions.HALF_STORAGE else precisions.DEFAULT


class Bucket:
    """Update buffers summed together: `entries` [(array, size)] in reverse layer order,
    one flat array once made (`flat`), complete after the backward of layer
    `ready_after`."""

    def __init__(self, entries, ready_after):
        self.entries = entries
        self.ready_after = ready_after
        self.size = sum(size for _, size in entries)
        self.flat = None  # the fp32 array the entries' views live in
        self.packed = None  # its 16-bit copy, in a 16-bit exchange

    @property
    def arrays(self):
        return [array for array, _ in self.entries]


def update_buffer_writers(net):
    """{id(array): [array, [(owner, attribute)], lowest writer]} for every update buffer:
    the objects that hold it (a layer sharing another's parameters holds its owner's), and
    the lowest index of a layer whose backward writes into it."""
    found = {}
    for index, layer in enumerate(net.layers):
        for owner in layer.param_owners():
            for attribute in UPDATE_ATTRIBUTES:
                array = getattr(owner, attribute, None)
                if array is not None:
                    record = found.setdefault(id(array), [array, [], index])
                    record[1].append((owner, attribute))
                    record[2] = min(record[2], index)
    return found


def plan_buckets(net, cap_bytes, value_bytes=4):
    """The buckets of net's update buffers: reverse layer order, each at most cap_bytes
    (value_bytes a value) unless one array alone is larger (then it is a bucket of its
    own); every buffer in exactly one. Each bucket's ready_after is the lowest layer that
    writes into one of its arrays."""
    writers = update_buffer_writers(net)
    updates = net.update_buffers()[0]
    buckets, entries, used, ready = [], [], 0, None
    for array in reversed(updates):
        nbytes = array.size * value_bytes
        if entries and used + nbytes > cap_bytes:
            buckets.append(Bucket(entries, ready))
            entries, used, ready = [], 0, None
        entries.append((array, array.size))
        used += nbytes
        lowest = writers[id(array)][2]
        ready = lowest if ready is None else min(ready, lowest)
    if entries:
        buckets.append(Bucket(entries, ready))
    return buckets


class GradientBuckets:
    """One network's bucket plan and the exchange it runs each iteration (DataParallel
    makes it at the first training pass and keeps it while the update buffers stay)."""

    def __init__(self, net, comm, cap_bytes, storage):
        self.comm, self.storage = comm, storage
        self.world_size = comm.world_size
        be = net.be
        value_bytes = 2 if storage != precisions.DEFAULT else 4
        self.buckets = plan_buckets(net, cap_bytes, value_bytes)
        writers = update_buffer_writers(net)
        for bucket in self.buckets:  # the update buffers become views of one flat array
            bucket.flat = be.zeros(bucket.size)
            offset, views = 0, []
            for array, size in bucket.entries:
                view = bucket.flat[offset : offset + size]
                be.copy(array, view)  # what earlier passes accumulated
                for owner, attribute in writers[id(array)][1]:
                    setattr(owner, attribute, view)
                views.append((view, size))
                offset += size
            bucket.entries = views
            if storage != precisions.DEFAULT:
                bucket.packed = be.storage_zeros(bucket.size, storage)
        self.views = [a for b in self.buckets for a in b.arrays]
        self.statistics = net.update_buffers()[1]
        # Where the backward is split (descending layer indices, the last the lowest layer
        # the backward reaches) and the buckets started after each piece.
        end = net.backward_end
        stops = sorted({max(b.ready_after, end) for b in self.buckets} | {end}, reverse=True)
        self.stops = tuple(stops)
        self.starts = [
            [b for b in self.buckets if max(b.ready_after, end) == stop] for stop in stops
        ]
        self._pending = []
        # Packing: fp16 values divided by the rank count so that their sum cannot overflow.
        self.pack_scale = 1.0 / self.world_size if storage == "fp16" else 1.0
        net.graphs.drop("train")  # recorded passes wrote into the old buffers

    def matches(self, net):
        """Whether net's update buffers are still the views this plan made."""
        updates = net.update_buffers()[0]
        return len(updates) == len(self.views) and all(
            a is b for a, b in zip(reversed(updates), self.views)
        )

    def start(self, net, piece):
        """Start the sums of the buckets the backward completed with piece `piece` (the
        statistics with the first)."""
        be = net.be
        if piece == 0 and self.statistics:
            self._pending.append((None, self.comm.start_all_reduce_sum(be, self.statistics)))
        for bucket in self.starts[piece]:
            if bucket.packed is not None:
                be.round_scaled(bucket.flat, bucket.packed, self.pack_scale)
                sent = bucket.packed
            else:
                sent = bucket.flat
            self._pending.append((bucket, self.comm.start_all_reduce_sum(be, [sent])))

    def finish(self, net):
        """Wait for every sum; the gradients widened back and the statistics averaged."""
        be = net.be
        pending, self._pending = self._pending, []
        for bucket, started in pending:
            started.wait()
            if bucket is None:
                for array in self.statistics:
                    be.scal(1.0 / self.world_size, array)
            elif bucket.packed is not None:
                be.widen_scaled(bucket.packed, bucket.flat, 1.0 / self.pack_scale)
        if len(pending) != len(self.buckets) + bool(self.statistics):
            raise RuntimeError(
                f"{len(pending)} of the iteration's sums were started, "
                f"{len(self.buckets) + bool(self.statistics)} planned"
            )
