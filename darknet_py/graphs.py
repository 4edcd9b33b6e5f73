"""Network steps replayed as graphs (backend.capture): a training pass or a forward at a
fixed batch is launched as one recorded graph instead of hundreds of kernel launches.

Each kind of step (its key: what it is, its batch and the buffers it reads) runs eagerly
the first time, so that lazily made arrays (scratch buffers, batch norm folded into the
weights) exist; the second time it is captured and replayed, and from then on replayed.
A step that cannot be captured runs eagerly from then on. What changes from step to step
(the input, the truth, the learning rate, dropout's seed) is written into fixed backend
arrays before the step, never baked into it; host-side effects of the step (loss layers
marking their figures pending) are redone after each replay.

A step may come in pieces with host work between them (a data-parallel pass starts the
sums of the gradients its backward has completed, network/executor.py's train_pass): each
piece is recorded as a graph of its own and the work between runs, never recorded, after
each piece's replay.

DARKNET_CUDA_GRAPHS=0 turns replays off (every step eager).
"""

import os
import sys

from .backends import GraphCaptureError

_SEEN = "seen once"  # ran eagerly once: capture next time
_EAGER = "eager"  # capture failed: always eager


def graphs_enabled():
    return os.environ.get("DARKNET_CUDA_GRAPHS", "1") != "0"


def run_pieces(step, between=None):
    """step(), or each of its pieces (a list) in turn with between(k) after piece k."""
    pieces = step if isinstance(step, (list, tuple)) else [step]
    for k, piece in enumerate(pieces):
        piece()
        if between is not None:
            between(k)


class _Replay:
    def __init__(self, graphs, pending, held):
        self.graphs = graphs  # one per piece of the step
        self.pending = pending  # the loss layers whose figures the step leaves to collect
        self.held = held  # the buffers the key names: alive while the graph is


class StepGraphs:
    """The recorded steps of one network, by key."""

    def __init__(self, be):
        self.be = be
        self.enabled = graphs_enabled()
        self._entries = {}
        self.captured = 0  # graphs recorded so far
        self.replayed = 0  # steps run as a replay
        self.fallback = None  # why the last failed capture failed

    def run(self, kind, key, held, step, layers, between=None):
        """Run step() (which queues the work of a step whose kernels depend only on
        `key` and on the arrays `held`), as a replay when possible. step may be a list of
        pieces, between(k) run on the host after piece k (run_pieces)."""
        full_key = (kind, key, tuple(id(a) for a in held))
        entry = self._entries.get(full_key)
        if entry is None or entry is _EAGER:
            if entry is None:
                self._entries[full_key] = _SEEN
            run_pieces(step, between)
            return
        if entry is _SEEN:
            pieces = step if isinstance(step, (list, tuple)) else [step]
            try:
                # Every piece recorded before any replays: recording runs none of them.
                graphs = [self.be.capture(piece) for piece in pieces]
            except GraphCaptureError as e:
                self._entries[full_key] = _EAGER
                if self.fallback is None:
                    print(f"darknet-py: running steps without CUDA graphs: {e}", file=sys.stderr)
                self.fallback = str(e)
                run_pieces(step, between)
                return
            self.captured += 1
            entry = self._entries[full_key] = _Replay(
                graphs, [layer for layer in layers if layer.pending], held
            )
        run_pieces(entry.graphs, between)
        self.replayed += 1
        for layer in entry.pending:
            layer.pending = True

    def drop(self, kind=None):
        """Forget the recorded steps (of one kind): the arrays they use are gone or their
        kernels would read stale derived values."""
        for key in [k for k in self._entries if kind is None or k[0] == kind]:
            del self._entries[key]
