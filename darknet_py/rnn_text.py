"""Darknet's `rnn train` and `rnn generate` (examples/rnn.c): character models on bytes.

A character network reads one-hot bytes (its [net] inputs= is the alphabet size, 256 for
any byte) and ends in a [softmax] over the same alphabet, trained to give the next byte.

Training (train_char_rnn): a pass reads time_steps bytes from each of [net] batch= streams
(batch / subdivisions), each stream at its own offset in the text; the rows are step-major
(row t * streams + s is stream s's byte at step t), the truth is the byte after each. After
every iteration each stream jumps to a random offset with probability 1/64. Loss is the
pass's cost over its rows.

Generation (test_char_rnn): the network runs one byte at a time (batch 1, time_steps 1),
its hidden state carried from byte to byte; the seed text is fed first, then each next
byte is drawn from the softmax at temperature T after zeroing probabilities below 1e-4
(Darknet's sample_array: subtract the probabilities from a uniform draw in order and take
the byte where it falls to 0 or below).
"""

import glob
import os
import sys
import time

import numpy as np

from .backends import get_backend
from .cfg import parse_cfg
from .errors import DarknetError
from .files import OutputClaims, check_input_file, refuse_overwrite
from .network import Network, load_network, weights_flavour
from .plurals import counted
from .training.stops import single_row_batch_norm

RESET_CHANCE = 64  # a stream jumps to a new offset once in 64 iterations
BACKUP_EVERY = 100  # <cfg>.backup
NUMBERED_EVERY = 10000  # <cfg>_<iteration>.weights
PROB_FLOOR = 1e-4  # generate: probabilities below it are not drawn


class TextError(DarknetError):
    """A problem with the text or the network's fit to it (one line, exit code 2)."""


def read_text(path, alphabet):
    """The bytes of a training text, checked to fit the network's alphabet."""
    check_input_file(path, "text file", TextError)
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), np.uint8)
    if data.size < 2:
        raise TextError(f"{path}: the text needs at least 2 bytes, it has {data.size}")
    bad = np.flatnonzero((data == 0) | (data >= alphabet))
    if bad.size:
        raise TextError(
            f"{path}: byte {bad[0]} has value {data[bad[0]]}, outside the "
            f"network's alphabet 1..{alphabet - 1} (its [net] inputs={alphabet}; "
            f"Darknet stops on it too)"
        )
    return data


def check_char_network(net):
    """A character network reads inputs= one-hot bytes and outputs as many probabilities:
    its output layer (the last one before any [cost], as Darknet's network output) is a
    [softmax]. A [cost] after it trains too, as in both Darknets: its squared error joins
    the softmax's cross-entropy in the loss and its delta adds to the softmax's."""
    out = net.layers[net.output_index]
    if net.inputs != out.outputs or out.type != "softmax":
        raise TextError(
            f"{net.path}: a character network needs [net] inputs= equal to the "
            f"output size and a [softmax] output layer (it has {net.inputs} "
            f"inputs, {out.outputs} outputs, output layer {out.index} "
            f"[{out.type}])"
        )


def text_batch(text, offsets, alphabet, steps):
    """Darknet's get_rnn_data: one-hot x and next-byte y, step-major; moves the offsets."""
    streams = len(offsets)
    x = np.zeros((steps * streams, alphabet), np.float32)
    y = np.zeros_like(x)
    for t in range(steps):
        rows = t * streams + np.arange(streams)
        x[rows, text[offsets % text.size]] = 1.0
        y[rows, text[(offsets + 1) % text.size]] = 1.0
        offsets[:] = (offsets + 1) % text.size
    return x, y


class Backups:
    """Where `rnn train` writes: <dir>/<cfg>.backup, <cfg>_<i>.weights, <cfg>_final.weights."""

    def __init__(self, cfg, directory, overwrite, log=print):
        self.base = os.path.join(directory, os.path.splitext(os.path.basename(cfg))[0])
        self.overwrite = overwrite
        os.makedirs(directory, exist_ok=True)
        claimed = [self.base + ".backup", self.base + "_final.weights"]
        refuse_overwrite(claimed, overwrite)
        if overwrite:  # the numbered weights of an earlier run too
            claimed += glob.glob(glob.escape(self.base) + "_[0-9]*.weights")
        # What is there now is this run's to replace; a file that appears under one of
        # its names later is not (save writes beside it).
        self.claims = OutputClaims(log)
        self.claims.claim(claimed)

    def save(self, net, name, log):
        path = self.claims.target(f"{self.base}{name}")
        net.save_weights(path)
        self.claims.wrote(path)
        log(f"saved {path}")
        return path


def load_for_training(cfg, weights, clear, seed, device, darknet):
    net = load_network(
        cfg, weights, device=device, seed=seed, darknet=darknet, engine="numpy"
    )  # training: Darknet's arithmetic
    check_char_network(net)
    if clear:
        net.seen = 0
    frozen = [l for l in net.layers if getattr(l, "frozen", False)]
    if frozen:
        print(
            f"darknet-py: warning: {cfg}: layer {frozen[0].index} [{frozen[0].type}] never "
            f"updates its weights in the {net.darknet} Darknet, and here neither (see "
            f"docs/rnn.md)",
            file=sys.stderr,
        )
    cause = single_row_batch_norm(net)
    if cause:
        print(f"darknet-py: warning: {cause}", file=sys.stderr)
    return net


def train_text(
    cfg,
    text_path,
    weights=None,
    backup_dir="backup",
    max_batches=None,
    seed=0,
    clear=False,
    device="auto",
    darknet=None,
    overwrite=False,
    log=print,
):
    """Train a character network on a text file as Darknet's train_char_rnn does; returns
    the path of the final weights. max_batches overrides the cfg's."""
    net = load_for_training(cfg, weights, clear, seed, device, darknet)
    alphabet, steps = net.inputs, net.options.time_steps
    text = read_text(text_path, alphabet)
    backups = Backups(cfg, backup_dir, overwrite, log)
    rng = np.random.default_rng(seed)
    streams = net.batch // steps
    offsets = rng.integers(0, text.size, streams)
    total = max_batches or net.options.max_batches
    if total <= net.iteration:
        raise TextError(
            f"{cfg}: max_batches={total} is already reached (the weights have "
            f"{counted(net.iteration, 'iteration')}); give --max-batches or "
            f"--clear"
        )
    log(
        f"{cfg}: learning rate {net.options.learning_rate:g}, momentum "
        f"{net.options.momentum:g}, decay {net.options.decay:g}, inputs {alphabet}, "
        f"{counted(streams, 'stream')} x {counted(steps, 'step')}, text {text_path}: "
        f"{counted(text.size, 'byte')}"
    )
    try:
        _train_loop(net, text, offsets, rng, total, backups, cfg, log)
    except KeyboardInterrupt:
        path = backups.save(net, ".backup", log)
        log(
            f"interrupted at iteration {net.iteration}; resume with: darknet-py rnn train "
            f"{cfg} {text_path} --weights {path} --overwrite"
        )
        raise
    return backups.save(net, "_final.weights", log)


def _train_loop(net, text, offsets, rng, total, backups, cfg, log):
    """Darknet's train_char_rnn loop: one pass an iteration, progress, backups."""
    alphabet, steps, streams = net.inputs, net.options.time_steps, len(offsets)
    avg, start, i = -1.0, time.time(), net.iteration
    first = i
    while net.iteration < total:
        i += 1
        tick = time.time()
        x, y = text_batch(text, offsets, alphabet, steps)
        loss = net.train_pass(x, y) / len(x)
        if not np.isfinite(loss):
            cause = single_row_batch_norm(net)
            advice = f"the cause: {cause}" if cause else f"lower learning_rate in {cfg}"
            raise TextError(
                f"iteration {i}: the loss is {loss} (diverged); {advice}; the last backup is kept"
            )
        avg = loss if avg < 0 else 0.9 * avg + 0.1 * loss
        wall = time.time() - tick
        eta = (time.time() - start) / max(1, net.iteration - first) * (total - net.iteration)
        log(
            f"{i}: {loss:f}, {avg:f} avg, {net.last_rate or net.learning_rate:f} rate, "
            f"{wall:f} seconds, {net.iteration * len(x) / text.size:f} epochs | "
            f"{len(x) / wall:.0f} chars/s, ETA {eta:.0f} s"
        )
        jump = rng.integers(0, RESET_CHANCE, streams) == 0
        offsets[jump] = rng.integers(0, text.size, int(jump.sum()))
        if i % NUMBERED_EVERY == 0:
            backups.save(net, f"_{i}.weights", log)
        if i % BACKUP_EVERY == 0:
            backups.save(net, ".backup", log)


def generation_network(cfg, weights, device, darknet, temp):
    """The network with batch 1 and time_steps 1 (one byte a call), softmax at `temp`."""
    sections = parse_cfg(cfg)
    for key, value in (("batch", "1"), ("subdivisions", "1"), ("time_steps", "1")):
        option = sections[0].options.get(key)
        if option is not None:
            option.value = value
    if darknet is None:
        darknet = weights_flavour(weights)
    net = Network(sections, cfg, backend=get_backend(device), darknet=darknet, random_init=False)
    net.load_weights(weights)
    check_char_network(net)
    for layer in net.layers:
        if layer.type == "softmax":
            layer.temperature = temp
    return net


def sample(probs, rng):
    """Darknet's sample_array after test_char_rnn zeroes the small probabilities."""
    p = np.where(probs < PROB_FLOOR, 0.0, probs).astype(np.float64)
    r = rng.uniform(0.0, 1.0) * p.sum()  # = a uniform draw against p / sum(p)
    below = np.flatnonzero(np.cumsum(p) >= r)
    return int(below[0]) if below.size else p.size - 1


def generate_text(
    cfg,
    weights,
    seed_text="\n\n",
    length=1000,
    temp=0.7,
    rseed=None,
    device="auto",
    darknet=None,
    write=None,
):
    """Darknet's test_char_rnn: feed seed_text, then draw `length` bytes; `write` receives
    each byte (bytes object) as it comes. Returns all bytes written."""
    if temp <= 0:
        raise TextError(f"--temp must be positive, got {temp:g}")
    net = generation_network(cfg, weights, device, darknet, temp)
    alphabet = net.inputs
    seed = seed_text.encode("utf-8") if isinstance(seed_text, str) else bytes(seed_text)
    bad = [b for b in seed if b == 0 or b >= alphabet]
    if bad:
        raise TextError(
            f"the seed text has byte {bad[0]}, outside the network's alphabet 1..{alphabet - 1}"
        )
    rng = np.random.default_rng(int(time.time()) if rseed is None else rseed)
    out = bytearray()
    write = write or (lambda b: None)
    x = np.zeros((1, alphabet), np.float32)

    def emit(c):
        out.append(c)
        write(bytes([c]))

    def step(c):
        x[0, c] = 1.0
        probs = net.predict(x)[0]
        x[0, c] = 0.0
        return probs

    for c in seed[:-1]:
        step(c)
        emit(c)
    c = seed[-1] if seed else 0  # Darknet starts from byte 0 without a seed
    if seed:
        emit(c)
    for _ in range(length):
        c = sample(step(c), rng)
        emit(c)
    return bytes(out)
