"""Adam (``adam=1`` in [net], with ``B1``, ``B2``, ``eps``) as the GPU builds of both Darknets
update with it (their CPU builds have no Adam).

Both GPU builds run adam_update_gpu (src/blas_kernels.cu) on a parameter w, its
accumulated update d (minus the gradient summed over the iteration's images), and its
moments m and v, zero at the start:

    d += -decay * batch * w             (biases and batch-norm scales too)
    m  = B1 * m + (1 - B1) * d
    v  = B2 * v + (1 - B2) * d * d
    w += rate * (m / (1 - B1^t)) / (sqrt(v / (1 - B2^t)) + eps)
    d  = 0

with the rate of the learning-rate policy itself (not divided by the batch, as SGD's is).
They differ in t and in which layers use it:

* pjreddie/darknet: t counts the updates this process made (network.c: ``++*net.t``
  before each update, from 0 when the network is built, so 1 at the first); convolutional,
  connected and deconvolutional layers, and the connected layers inside rnn, gru and lstm.
  Its crnn would run Adam on inner convolutions it gave no Adam state (it fails there);
  darknet-py gives them one and says so.
* the AlexeyAB fork: t is get_current_batch, the iteration count from ``seen`` (so it
  goes on from where loaded weights were); only [convolutional] layers (its make_*
  functions give Adam state to no other layer; connected, recurrent and crnn layers keep
  SGD with momentum).

Neither Darknet saves m and v in .weights: a run that resumes starts them from zero, and
so does darknet-py.
"""

import numpy as np

# The layer types whose parameters each Darknet's GPU build updates with Adam.
ADAM_LAYERS = {
    "original": frozenset(
        {"convolutional", "connected", "deconvolutional", "rnn", "gru", "lstm", "crnn"}
    ),
    "alexeyab": frozenset({"convolutional"}),
}
# Darknet's parse_net_options defaults (eps: pjreddie .0000001, the fork .000001).
DEFAULT_EPS = {"original": 1e-7, "alexeyab": 1e-6}


def flavour_rules(darknet):
    """ "alexeyab" for the fork's flavours ("alexeyab", "alexeyab-cpu"), else "original"."""
    return "alexeyab" if str(darknet).startswith("alexeyab") else "original"


def read_adam(s, darknet):
    """(B1, B2, eps) of a [net] section with adam=1, checked (errors name the line)."""
    b1 = s.get_float("B1", 0.9)
    b2 = s.get_float("B2", 0.999)
    eps = s.get_float("eps", DEFAULT_EPS[flavour_rules(darknet)])
    for key, value in (("B1", b1), ("B2", b2)):
        if not 0 <= value < 1:  # 1 - B^t would be 0: the bias correction divides by it
            raise s.error(f"must be at least 0 and below 1, got {value:g}", key)
    if not eps > 0:
        raise s.error(f"must be above 0, got {eps:g}", "eps")
    return b1, b2, eps


class Adam:
    """A network's Adam state: the hyper-parameters, the moments of every parameter it
    updates (made at the first update, on the backend) and the one backend array the
    update reads its rate and t from (written before each update, so that a step
    replayed as a graph follows the policy and the count)."""

    def __init__(self, be, darknet, b1, b2, eps):
        self.be, self.rules = be, flavour_rules(darknet)
        self.b1, self.b2, self.eps = float(b1), float(b2), float(eps)
        self.layers = ADAM_LAYERS[self.rules]
        self.updates = 0  # pjreddie's *net.t: updates made by this process
        self.step = be.zeros(2)  # (learning rate, t)
        self._moments = {}  # id(parameter) -> (parameter, m, v)

    def uses(self, layer):
        """Whether this Darknet updates `layer`'s parameters with Adam."""
        return layer.type in self.layers

    def write_step(self, rate, iteration):
        """Before an update: count it and write (rate, t) where the update reads them.
        `iteration` is the network's get_current_batch (seen // images per iteration)."""
        self.updates += 1
        t = self.updates if self.rules == "original" else iteration
        self.be.write(self.step, [rate, t])
        return t

    def moments(self, param):
        """(m, v) of a parameter array, zero at first."""
        found = self._moments.get(id(param))
        if found is None or found[0] is not param:
            found = self._moments[id(param)] = (
                param,
                self.be.zeros(param.size),
                self.be.zeros(param.size),
            )
        return found[1], found[2]

    def update(self, be, args, param, update):
        """One parameter's Adam step (adam_update_gpu), its accumulated update zeroed."""
        m, v = self.moments(param)
        # Darknet's -decay*batch: a float times an int, in float
        decay = float(np.float32(args.decay) * np.float32(args.batch))
        be.adam_update(
            param, update, m, v, self.step, self.b1, self.b2, self.eps, decay, skip=args.skip
        )
