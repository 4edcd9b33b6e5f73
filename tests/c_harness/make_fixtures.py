"""Build the C Darknets' reference fixtures of darknet-py's layer tests (tests/fixtures/layers).

For each fixture below: write its cfg, an input and a truth, build the harness against the
C Darknet's CPU build (tests/c_harness/<harness>.c), run it, and pack what it dumped (the
initial and the updated .weights, every layer's inference and training output and delta, the
cost) into tests/fixtures/layers/<name>.npz. tests/test_layers_c_fixtures.py reads them.

usage: python tests/c_harness/make_fixtures.py [--orig DIR] [--ab DIR] [NAME ...]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "fixtures" / "layers"

NET = """[net]
batch={batch}
subdivisions=1
height={h}
width={w}
channels={c}
learning_rate=0.1
momentum=0.9
decay=0.0005
"""

# Odd weight counts (k = 27, 5, 27) and no padding in the xnor layers: a binarized dot
# product is then never an exact tie at 0, whose rounding residue's sign (which the next
# binarization reads) depends on the order of additions. No [maxpool] after them either:
# their outputs take few values, and which of two equal maxima gets the delta depends on it.
XNOR_LAYERS = """
[convolutional]
batch_normalize=1
filters=3
size=3
stride=1
pad=1
activation=leaky

[convolutional]
xnor=1
batch_normalize=1
filters=5
size=3
stride=1
activation=leaky{bin_output}

[convolutional]
xnor=1
filters=3
size=1
stride=1
activation=linear

[convolutional]
xnor=1
filters=2
size=3
stride=1
activation=linear

[cost]
"""

# name -> (harness, [net] shape (c, h, w), batch, layer sections, truth kind)
FIXTURES = {
    "activation": (
        "orig",
        (3, 5, 5),
        2,
        """
[convolutional]
filters=4
size=3
stride=1
pad=1
activation=linear

[activation]
activation=elu

[activation]
activation=leaky

[activation]

[cost]
""",
        "uniform",
    ),
    "logistic": (
        "orig",
        (3, 4, 4),
        2,
        """
[convolutional]
filters=3
size=3
stride=1
pad=1
activation=linear

[logistic]
""",
        "binary",
    ),
    "l2norm": (
        "orig",
        (3, 4, 4),
        2,
        """
[convolutional]
filters=4
size=3
stride=1
pad=1
activation=linear

[l2norm]

[cost]
""",
        "uniform",
    ),
    "lrn": (
        "orig",
        (3, 4, 4),
        2,
        """
[convolutional]
filters=7
size=3
stride=1
pad=1
activation=linear

[lrn]
size=3
alpha=0.5
beta=0.75
kappa=1

[normalization]
size=5
alpha=0.2
beta=0.5
kappa=2

[cost]
""",
        "uniform",
    ),
    "deconv": (
        "orig",
        (3, 4, 4),
        2,
        """
[convolutional]
filters=3
size=1
stride=1
activation=linear

[deconvolutional]
batch_normalize=1
filters=4
size=4
stride=2
pad=1
activation=leaky

[deconv]
filters=2
size=3
stride=1
padding=1
activation=linear

[cost]
""",
        "uniform",
    ),
    "xnor": ("orig", (3, 8, 8), 2, XNOR_LAYERS.format(bin_output=""), "uniform"),
    "xnor_ab": ("ab", (3, 8, 8), 2, XNOR_LAYERS.format(bin_output="\nbin_output=1"), "uniform"),
}
# the fork's [activation] and [lrn] (the fork has no [logistic], [l2norm] or deconvolution)
FIXTURES["activation_ab"] = ("ab",) + FIXTURES["activation"][1:]
FIXTURES["lrn_ab"] = ("ab",) + FIXTURES["lrn"][1:]


# The fork's CPU forward of an xnor convolution binarizes its weights with the whole layer's
# weight count as one filter's size (reading and writing past the arrays for every filter but
# the first); its GPU build, and the original Darknet, pass a filter's size. The fork's
# fixtures are made with that one call corrected, built from a copy of its source.
FORK_XNOR_CALL = "binarize_weights(l.weights, l.n, l.nweights, l.binary_weights);"
FORK_XNOR_FIXED = "binarize_weights(l.weights, l.n, l.nweights / l.n, l.binary_weights);"


def fork_objects(ab, workdir):
    """The fork's object files, convolutional_layer.o rebuilt with FORK_XNOR_FIXED."""
    src = (Path(ab) / "src" / "convolutional_layer.c").read_text()
    if src.count(FORK_XNOR_CALL) != 1:
        sys.exit("the fork's convolutional_layer.c is not the one this script knows")
    fixed = workdir / "convolutional_layer.c"
    fixed.write_text(src.replace(FORK_XNOR_CALL, FORK_XNOR_FIXED))
    obj = workdir / "convolutional_layer.o"
    subprocess.run(
        [
            "gcc",
            f"-I{ab}/include",
            f"-I{ab}/src",
            f"-I{ab}/3rdparty/stb/include",
            "-Wno-unused-result",
            "-fPIC",
            "-Ofast",
            "-c",
            str(fixed),
            "-o",
            str(obj),
        ],
        check=True,
    )
    return [str(obj)] + sorted(
        str(p)
        for p in (Path(ab) / "obj").glob("*.o")
        if p.name not in ("darknet.o", "convolutional_layer.o")
    )


def build(harness, orig, ab, workdir):
    exe = workdir / harness
    src = HERE / f"{harness}_step.c"
    if harness == "orig":
        cmd = ["gcc", "-O2", f"-I{orig}/include", str(src), f"{orig}/libdarknet.a"]
    else:
        objs = fork_objects(ab, workdir)
        cmd = ["gcc", "-O2", f"-I{ab}/include", f"-I{ab}/src", str(src)] + objs + ["-lstdc++"]
    subprocess.run(cmd + ["-lm", "-pthread", "-o", str(exe)], check=True)
    return exe


def truth_values(kind, rng, n):
    if kind == "binary":
        return (rng.uniform(size=n) < 0.5).astype(np.float32)
    return rng.uniform(0.0, 1.0, n).astype(np.float32)


def xnor_inputs(cfg):
    """Indexes of the layers whose outputs an xnor layer binarizes."""
    layers = cfg.split("\n[")[1:]  # the text of each section after [net]
    return [i - 1 for i, text in enumerate(layers) if "xnor=1" in text and i > 0]


def ties_at_zero(arrays, cfg):
    """Whether a value an xnor layer binarizes is a rounding residue (|v| < 1e-4 max|v|):
    its sign, which the binarization reads, would depend on the order of additions."""
    for i in xnor_inputs(cfg):
        for prefix in ("infer", "out"):
            v = np.abs(arrays[f"{prefix}_{i}"])
            if v.min() < 1e-4 * v.max():
                return True
    return False


def run_harness(name, exe, d, cfg, seed):
    harness, (c, h, w), batch, layers, truth_kind = FIXTURES[name]
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (batch, c, h, w)).astype(np.float32)
    x.tofile(d / "input.f32")
    # The truth size is the last layer's outputs: the harness reads as many as it needs.
    truth = truth_values(truth_kind, rng, batch * 4096)
    truth.tofile(d / "truth.f32")
    log = subprocess.run(
        [str(exe), str(d / "net.cfg"), str(d / "input.f32"), str(d / "truth.f32"), str(d)],
        capture_output=True,
        text=True,
    )
    if log.returncode:
        sys.exit(f"{name}: harness failed:\n{log.stderr}")
    last = max(int(f.stem.split("_")[1]) for f in d.glob("out_*.f32"))
    truths = (d / f"out_{last}.f32").stat().st_size // 4
    arrays = {
        "cfg": np.array(cfg),
        "input": x,
        "truth": truth[:truths],
        "weights0": np.frombuffer((d / "weights0.weights").read_bytes(), np.uint8),
        "weights1": np.frombuffer((d / "weights1.weights").read_bytes(), np.uint8),
        "cost": np.fromfile(d / "cost_0.f32", np.float32),
    }
    for f in sorted(d.glob("*_*.f32")):
        if not f.name.startswith("cost"):
            arrays[f.stem] = np.fromfile(f, np.float32)
    return arrays


def make(name, exe, workdir):
    _, (c, h, w), batch, layers, _ = FIXTURES[name]
    cfg = NET.format(batch=batch, c=c, h=h, w=w) + layers
    d = workdir / name
    d.mkdir()
    (d / "net.cfg").write_text(cfg)
    first = sum(map(ord, name))
    for seed in range(first, first + 100):  # the first input without ties (see ties_at_zero)
        arrays = run_harness(name, exe, d, cfg, seed)
        if not ties_at_zero(arrays, cfg):
            break
    else:
        sys.exit(f"{name}: every input gave a binarized value at a rounding residue")
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    print(
        f"{name}: {(OUT / f'{name}.npz').stat().st_size} bytes, input seed {seed}, "
        f"cost {arrays['cost'][0]:.6g}"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--orig", default="/work/cbuild/darknet-orig")
    p.add_argument("--ab", default="/work/cbuild/darknet-ab")
    p.add_argument("names", nargs="*", default=list(FIXTURES))
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        exes = {}
        for name in a.names:
            harness = FIXTURES[name][0]
            if harness not in exes:
                exes[harness] = build(harness, a.orig, a.ab, tmp)
            make(name, exes[harness], tmp)


if __name__ == "__main__":
    main()
