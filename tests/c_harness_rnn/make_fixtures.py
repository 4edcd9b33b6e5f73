"""Make tests/fixtures/recurrent/rnn*.npz: tiny recurrent networks run by the C Darknets.

Builds harness.c against the CPU builds of both Darknets (their trees are not part of this
repository: pass --orig and --fork), writes each case's cfg, weights (random, from
darknet-py) and inputs, runs the harness, and packs what it dumped:
    python tests/c_harness_rnn/make_fixtures.py --orig /work/cbuild/darknet-orig \
        --fork /work/cbuild/darknet-ab [CASE ...]
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from darknet_py.cfg import parse_cfg_text  # noqa: E402
from darknet_py.network import Network  # noqa: E402

NET = """[net]
inputs={inputs}
batch={batch}
time_steps={steps}
subdivisions=1
learning_rate=0.1
momentum=0.9
decay=0.001
"""
CONNECTED_IN = "[connected]\noutput={n}\nactivation=leaky\n"
HEAD = "[connected]\noutput={classes}\nactivation=linear\n[softmax]\n"

# name -> (flavour, inputs, sequences per batch, steps, recurrent section(s))
CASES = {
    "rnn": ("original", 6, 2, 3, "[rnn]\noutput=5\nactivation=leaky\n"),
    "rnn_bn_shortcut": (
        "original",
        6,
        4,
        3,
        "[rnn]\noutput=5\nactivation=tanh\nbatch_normalize=1\nshortcut=1\n",
    ),
    "rnn_fork_hidden": (
        "alexeyab",
        6,
        2,
        3,
        "[rnn]\noutput=5\nhidden=4\nactivation=leaky\nlogistic=1\n",
    ),
    "rnn_fork_bn": (
        "alexeyab",
        6,
        4,
        3,
        "[rnn]\noutput=5\nhidden=4\nactivation=leaky\nbatch_normalize=1\nshortcut=1\n",
    ),
    "gru": ("original", 6, 2, 3, "[gru]\noutput=5\n"),
    "gru_tanh_bn": ("original", 6, 4, 3, "[gru]\noutput=5\ntanh=1\nbatch_normalize=1\n"),
    "gru_fork": ("alexeyab", 6, 2, 3, "[gru]\noutput=4\n"),
    "lstm": ("original", 6, 2, 3, "[lstm]\noutput=5\n"),
    "lstm_bn": ("original", 6, 4, 3, "[lstm]\noutput=5\nbatch_normalize=1\n"),
    "lstm_fork": ("alexeyab", 6, 2, 3, "[lstm]\noutput=4\n"),
    "crnn": (
        "original",
        24,
        2,
        3,
        "[crnn]\nhidden_filters=3\noutput_filters=2\nactivation=leaky\n",
    ),
    "crnn_bn_shortcut": (
        "original",
        24,
        3,
        2,
        "[crnn]\nhidden_filters=3\noutput_filters=2\n"
        "activation=tanh\nbatch_normalize=1\nshortcut=1\n",
    ),
    "conv_lstm": ("alexeyab", 24, 2, 3, "[conv_lstm]\noutput=2\nsize=3\npad=1\n"),
    "conv_lstm_peephole_bn": (
        "alexeyab",
        24,
        2,
        3,
        "[conv_lstm]\noutput=2\nsize=3\npad=1\npeephole=1\nbatch_normalize=1\nactivation=leaky\n",
    ),
    # (output = the input's 2 channels: the C backward writes the w gates' deltas into the
    # input's delta, past its end where they are larger)
    "conv_lstm_clamped": (
        "alexeyab",
        24,
        2,
        2,
        "[conv_lstm]\noutput=2\nsize=1\npeephole=1\nstate_constrain=1\n",
    ),
    "history": ("alexeyab", 24, 2, 3, "[history]\nhistory_size=3\n"),
    "history_one_step": ("alexeyab", 24, 3, 1, "[history]\nhistory_size=2\n"),
    "implicit": ("alexeyab", 24, 2, 1, "[implicit]\nfilters=5\natoms=2\n"),
    "crnn_fork_plain": (
        "alexeyab",
        24,
        2,
        3,
        "[crnn]\nhidden=3\noutput=2\nsize=3\npad=1\nactivation=leaky\n",
    ),
    "crnn_fork": (
        "alexeyab",
        24,
        2,
        3,
        "[crnn]\nhidden=3\noutput=2\nsize=3\npad=1\nactivation=leaky\nbatch_normalize=1\n",
    ),
}


def build_harness(orig, fork, tmp):
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "harness.c")
    exe = {
        "original": os.path.join(tmp, "harness_orig"),
        "alexeyab": os.path.join(tmp, "harness_fork"),
    }
    subprocess.run(
        [
            "gcc",
            "-O2",
            f"-I{orig}/include",
            f"-I{orig}/src",
            src,
            f"{orig}/libdarknet.a",
            "-lm",
            "-pthread",
            "-o",
            exe["original"],
        ],
        check=True,
    )
    objs = [o for o in sorted(glob.glob(f"{fork}/obj/*.o")) if not o.endswith("/darknet.o")]
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-DFORK",
            f"-I{fork}/include",
            f"-I{fork}/src",
            src,
            *objs,
            "-lm",
            "-pthread",
            "-lstdc++",
            "-o",
            exe["alexeyab"],
        ],
        check=True,
    )
    return exe


# The fork divides by the number of layers wider and taller than 1 pixel while parsing
# (SIGFPE without one): its cases start with a 1x1 convolution of a 3x2 image.
FORK_FIRST = "[convolutional]\nfilters=1\nsize=1\nactivation=linear\n"


IMAGE_FIRST = "[convolutional]\nfilters=2\nsize=1\nactivation=leaky\n"


def case_cfg(flavour, inputs, seqs, steps, body):
    net = NET.format(inputs=inputs, batch=seqs, steps=steps)
    # a 4x3x2 image; a 1x1 convolution first (see FORK_FIRST)
    if body.startswith(("[crnn]", "[conv_lstm]", "[history]", "[implicit]")):
        assert inputs == 24
        net = net.replace("inputs=24\n", "width=4\nheight=3\nchannels=2\n")
        return net + IMAGE_FIRST + body + HEAD.format(classes=6)
    if flavour == "alexeyab":
        assert inputs == 6
        net = net.replace("inputs=6\n", "width=3\nheight=2\nchannels=1\n") + FORK_FIRST
    return net + CONNECTED_IN.format(n=inputs) + body + HEAD.format(classes=inputs)


def random_weights(cfg_text, flavour, path, rng):
    net = Network(parse_cfg_text(cfg_text, "case.cfg"), "case.cfg", darknet=flavour)
    for layer in net.layers:
        for name, array in layer.params():
            if name == "rolling_variance":
                values = rng.uniform(0.5, 1.5, array.size)
            elif name == "scales":
                values = rng.uniform(0.8, 1.2, array.size)
            else:
                values = rng.uniform(-0.5, 0.5, array.size)
            net.be.write(array, values)
    net.save_weights(path)


def make_case(name, exe, out_dir, tmp):
    flavour, inputs, seqs, steps, body = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    cfg_text = case_cfg(flavour, inputs, seqs, steps, body)
    work = os.path.join(tmp, name)
    os.makedirs(work, exist_ok=True)
    paths = {k: os.path.join(work, k) for k in ("case.cfg", "w.weights", "x.bin", "y.bin")}
    with open(paths["case.cfg"], "w") as f:
        f.write(cfg_text)
    random_weights(cfg_text, flavour, paths["w.weights"], rng)
    rows = seqs * steps
    classes = 6
    x = np.eye(inputs, dtype=np.float32)[rng.integers(0, inputs, rows)]
    x += rng.uniform(-0.2, 0.2, x.shape).astype(np.float32)  # not only one-hot rows
    y = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, rows)]
    x.tofile(paths["x.bin"])
    y.tofile(paths["y.bin"])
    run = subprocess.run(
        [exe[flavour], paths["case.cfg"], paths["w.weights"], paths["x.bin"], paths["y.bin"], work],
        stderr=subprocess.PIPE,
        text=True,
    )
    if run.returncode:
        sys.exit(f"{name}: the harness failed:\n{run.stderr}")
    arrays = {
        "cfg": np.frombuffer(cfg_text.encode(), np.uint8),
        "flavour": np.array(flavour),
        "weights": np.fromfile(paths["w.weights"], np.uint8),
        "x": x,
        "y": y,
        "updated": np.fromfile(os.path.join(work, "updated.weights"), np.uint8),
    }
    for f in sorted(os.listdir(work)):
        if f.endswith(".bin") and f not in ("x.bin", "y.bin"):
            arrays[f[:-4]] = np.fromfile(os.path.join(work, f), np.float32)
    out = os.path.join(out_dir, f"rnn_{name}.npz" if not name.startswith("rnn") else f"{name}.npz")
    np.savez_compressed(out, **arrays)
    print(f"{out}: {os.path.getsize(out)} bytes")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--orig", required=True)
    p.add_argument("--fork", required=True)
    p.add_argument("--work", help="keep the C runs here (default: a temporary folder)")
    p.add_argument("cases", nargs="*")
    args = p.parse_args()
    out_dir = os.path.join(ROOT, "tests", "fixtures", "recurrent")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.work or tmp
        exe = build_harness(args.orig, args.fork, tmp)
        for name in args.cases or CASES:
            make_case(name, exe, out_dir, tmp)


if __name__ == "__main__":
    main()
