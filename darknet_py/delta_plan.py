"""Deltas shared between layers whose lifetimes do not overlap (training memory).

Numbering the backward's steps by the layer whose backward runs (they run from the last
layer down), layer i's delta is live from the step of its first writer, the highest-index
layer whose backward writes into it (i + 1, which gets it as net.delta, and the [route],
[shortcut], [sam], [scale_channels] layers that name it), down to step i, its own backward;
outside these steps nothing reads or writes it. Layers whose intervals do not meet can
keep their deltas in one array (each a view of its first batch * outputs floats).

Darknet zeroes every delta before a pass (Network._forward_layers); a shared delta is
zeroed instead right before the backward of its first writer, so that every layer reads
the values it read from a private delta, bit for bit.

A layer keeps a private delta where this is not known to hold: loss layers (their forward
writes the delta), recurrent layers (their steps carry deltas), layers whose type is not
in SHARED_TYPES, the previous layer of a layer whose type is not in CONSUMER_TYPES (its
backward may touch net.delta outside the plan's rules) and every layer such a layer
refers to, layers at or below a stopbackward (the backward never reaches them), and all of
them in the fork's CPU flavour (its passes keep adding to some deltas, Layer.fork_train).
"""

import bisect
from dataclasses import dataclass, field

from .layers.base import Layer

# Layers whose forward and update never touch their own delta and whose delta is
# Layer.allocate's batch * outputs floats.
SHARED_TYPES = frozenset(
    {
        "convolutional",
        "connected",
        "batchnorm",
        "maxpool",
        "local_avgpool",
        "avgpool",
        "route",
        "shortcut",
        "upsample",
        "dropout",
        "activation",
        "empty",
        "sam",
        "scale_channels",
        "reorg",
        "reorg3d",
        "l2norm",
        "normalization",
        "deconvolutional",
        "local",
        "implicit",
    }
)
# Layers whose backward writes only into net.delta and the deltas of the layers they name
# (named_sources), and whose forward touches no delta but maybe their own.
CONSUMER_TYPES = SHARED_TYPES | {
    "yolo",
    "gaussian_yolo",
    "region",
    "detection",
    "softmax",
    "cost",
    "logistic",
}


@dataclass
class DeltaPlan:
    """Which layers share which array, and where a shared delta is zeroed. Indices are
    layer indices; sizes are floats per image (times the batch on the backend)."""

    floats: list  # each layer's delta, per image
    live: dict = field(default_factory=dict)  # shared layer -> (own step, first writer)
    buffer_of: dict = field(default_factory=dict)  # shared layer -> its array's number
    buffer_floats: list = field(default_factory=list)  # each array's size, per image
    zero_before: dict = field(default_factory=dict)  # step -> layers zeroed before it

    @property
    def private(self):
        """The layers keeping a delta of their own."""
        return [i for i in range(len(self.floats)) if i not in self.buffer_of]

    @property
    def saved_floats(self):
        """Floats per image the sharing saves against a private delta for every layer."""
        return sum(self.floats[i] for i in self.buffer_of) - sum(self.buffer_floats)

    def users(self, buffer):
        return sorted(i for i, b in self.buffer_of.items() if b == buffer)


def named_sources(layer):
    """The earlier layers (besides the previous one) whose deltas a CONSUMER_TYPES layer's
    backward writes into."""
    sources = list(getattr(layer, "sources", None) or [])
    source = getattr(layer, "source", None)
    if isinstance(source, Layer) and source not in sources:
        sources.append(source)
    return sources


def referred_layers(layer):
    """Every layer a layer holds in an attribute (alone, or in a list or tuple)."""
    found = []
    for value in vars(layer).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        found += [v for v in items if isinstance(v, Layer) and v is not layer]
    return found


def _private_layers(layers):
    """Indices of the layers that must keep a private delta (see the module's docstring)."""
    private = {l.index for l in layers if l.type not in SHARED_TYPES or l.stepped}
    stops = [l.index for l in layers if l.stopbackward]
    if stops:
        private.update(range(max(stops) + 1))
    for layer in layers:
        if layer.type not in CONSUMER_TYPES:
            private.update(l.index for l in referred_layers(layer))
            if layer.index:
                private.add(layer.index - 1)
    return private


def first_writers(layers):
    """For each layer, the highest index whose backward writes into its delta (its own
    index where none does)."""
    first = [l.index for l in layers]
    for layer in layers:
        targets = named_sources(layer) if layer.type in CONSUMER_TYPES else referred_layers(layer)
        if layer.index:
            targets = targets + [layers[layer.index - 1]]
        for target in targets:
            first[target.index] = max(first[target.index], layer.index)
    return first


def plan_deltas(layers, share=True):
    """The DeltaPlan of `layers` (a Network's, in order). share=False: every delta private.
    Arrays are coloured largest user first: each goes to the first array whose users'
    intervals it does not meet, or a new one, so an array's size is its first user's."""
    plan = DeltaPlan(floats=[l.outputs for l in layers])
    if not share:
        return plan
    private = _private_layers(layers)
    first = first_writers(layers)
    plan.live = {i: (i, first[i]) for i in range(len(layers)) if i not in private}
    plan.buffer_of, plan.buffer_floats = place_in_arrays(
        {i: (live,) for i, live in plan.live.items()}, plan.floats
    )
    for i in plan.buffer_of:  # in the order they were placed
        plan.zero_before.setdefault(first[i], []).append(i)
    return plan


def place_in_arrays(intervals, floats):
    """(buffer_of, buffer_floats): layers placed in shared arrays by their time intervals
    ({layer index: tuple of (low, high)}, low <= high, both ends live), largest first
    (floats: per layer): each goes to the first array whose users' intervals it meets none
    of, or a new one, so an array's size is its first user's. The delta and output plans'
    colouring.

    The intervals of an array's users never meet, so each array keeps them sorted
    (ArrayTimes) and tells whether an interval meets one of them in a bisection, not a scan
    of all of them: the plan of a 20,000-layer network takes a moment, not minutes."""
    buffer_of, buffer_floats, arrays = {}, [], []
    for i in sorted(intervals, key=lambda i: (-floats[i], i)):
        mine = merged(intervals[i])
        number = next((n for n, times in enumerate(arrays) if not times.meets(mine)), None)
        if number is None:
            number = len(arrays)
            arrays.append(ArrayTimes())
            buffer_floats.append(floats[i])
        arrays[number].add(mine)
        buffer_of[i] = number
    return buffer_of, buffer_floats


def merged(intervals):
    """The same steps as `intervals` in disjoint intervals, sorted (an array's users'
    intervals must not meet one another, a layer's own included)."""
    out = []
    for low, high in sorted(intervals):
        if low > high:
            raise ValueError(f"interval ({low}, {high}): low > high")
        if out and low <= out[-1][1]:
            out[-1][1] = max(out[-1][1], high)
        else:
            out.append([low, high])
    return out


class ArrayTimes:
    """The steps at which one shared array is in use: disjoint intervals sorted by their
    start (so their ends are sorted too), in chunks of at most 2 * CHUNK so that an
    insertion moves a chunk's entries, not all of them."""

    CHUNK = 256

    def __init__(self):
        self.firsts = []  # each chunk's first start
        self.chunks = []  # [(starts, ends)]

    def _reach(self, step):
        """The end of the last interval starting at or before `step` (None: none does)."""
        c = bisect.bisect_right(self.firsts, step) - 1
        if c < 0:
            return None
        lows, highs = self.chunks[c]
        return highs[bisect.bisect_right(lows, step) - 1]

    def meets(self, intervals):
        """Whether any of `intervals` shares a step with one in use: the last interval
        starting at or before an interval's end is the one that reaches furthest."""
        for low, high in intervals:
            reach = self._reach(high)
            if reach is not None and reach >= low:
                return True
        return False

    def add(self, intervals):
        for low, high in intervals:
            if not self.chunks:
                self.firsts.append(low)
                self.chunks.append(([low], [high]))
                continue
            c = max(bisect.bisect_right(self.firsts, low) - 1, 0)
            lows, highs = self.chunks[c]
            at = bisect.bisect_right(lows, low)
            lows.insert(at, low)
            highs.insert(at, high)
            self.firsts[c] = lows[0]
            if len(lows) > 2 * self.CHUNK:
                half = self.CHUNK
                self.chunks[c : c + 1] = [(lows[:half], highs[:half]), (lows[half:], highs[half:])]
                self.firsts.insert(c + 1, lows[half])


def share_delta_arrays(layers, be, batch, share):
    """The DeltaPlan of `layers` (share=False: every delta private), its arrays made on
    `be` for `batch` images, each shared layer given its view as Layer.shared_delta (its
    allocate takes it as its delta)."""
    plan = plan_deltas(layers, share)
    give_views(layers, be, batch, plan, "shared_delta")
    return plan


def give_views(layers, be, batch, plan, attribute):
    """Make a plan's arrays (buffer_floats, stored as its buffer_storage says where it has
    one: output_plan's) on `be` for `batch` images and set `attribute`
    of each layer in it (buffer_of) to its view, of every other layer to None (set on each
    layer: Network.resize copies what one lacks). Network._allocate let the old go."""
    storages = getattr(plan, "buffer_storage", None) or ["fp32"] * len(plan.buffer_floats)
    arrays = [
        be.storage_zeros(batch * n, stored) for n, stored in zip(plan.buffer_floats, storages)
    ]
    for layer in layers:
        number = plan.buffer_of.get(layer.index)
        setattr(
            layer, attribute, None if number is None else arrays[number][: batch * layer.outputs]
        )


def zeroing_steps(layers, plan):
    """{backward step: the allocated shared deltas to zero right before it}."""
    return {step: [layers[i].delta for i in shared] for step, shared in plan.zero_before.items()}


def overlapping_users(plan):
    """Pairs of layers placed in one array whose live intervals meet (none, if the plan is
    right)."""
    pairs = []
    for number in range(len(plan.buffer_floats)):
        members = plan.users(number)
        for k, i in enumerate(members):
            for j in members[k + 1 :]:
                (a, b), (c, d) = plan.live[i], plan.live[j]
                if a <= d and c <= b:
                    pairs.append((i, j))
    return pairs
