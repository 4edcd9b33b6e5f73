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

# name -> (harness, [net] shape (c, h, w), batch, layer sections, truth kind)
FIXTURES = {
    "activation": ("orig", (3, 5, 5), 2, """
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
""", "uniform"),
    "logistic": ("orig", (3, 4, 4), 2, """
[convolutional]
filters=3
size=3
stride=1
pad=1
activation=linear

[logistic]
""", "binary"),
    "l2norm": ("orig", (3, 4, 4), 2, """
[convolutional]
filters=4
size=3
stride=1
pad=1
activation=linear

[l2norm]

[cost]
""", "uniform"),
    "lrn": ("orig", (3, 4, 4), 2, """
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
""", "uniform"),
    "deconv": ("orig", (3, 4, 4), 2, """
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
""", "uniform"),
}


def build(harness, orig, ab, workdir):
    exe = workdir / harness
    src = HERE / f"{harness}_step.c"
    if harness == "orig":
        cmd = ["gcc", "-O2", f"-I{orig}/include", str(src), f"{orig}/libdarknet.a"]
    else:
        objs = sorted(str(p) for p in (Path(ab) / "obj").glob("*.o") if p.name != "darknet.o")
        cmd = ["gcc", "-O2", f"-I{ab}/include", f"-I{ab}/src", str(src)] + objs + ["-lstdc++"]
    subprocess.run(cmd + ["-lm", "-pthread", "-o", str(exe)], check=True)
    return exe


def truth_values(kind, rng, n):
    if kind == "binary":
        return (rng.uniform(size=n) < 0.5).astype(np.float32)
    return rng.uniform(0.0, 1.0, n).astype(np.float32)


def make(name, exe, workdir):
    harness, (c, h, w), batch, layers, truth_kind = FIXTURES[name]
    cfg = NET.format(batch=batch, c=c, h=h, w=w) + layers
    d = workdir / name
    d.mkdir()
    (d / "net.cfg").write_text(cfg)
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.uniform(-1.0, 1.0, (batch, c, h, w)).astype(np.float32)
    x.tofile(d / "input.f32")
    # The truth size is the last layer's outputs: the harness reads as many as it needs.
    truth = truth_values(truth_kind, rng, batch * 4096)
    truth.tofile(d / "truth.f32")
    log = subprocess.run([str(exe), str(d / "net.cfg"), str(d / "input.f32"),
                          str(d / "truth.f32"), str(d)], capture_output=True, text=True)
    if log.returncode:
        sys.exit(f"{name}: harness failed:\n{log.stderr}")
    last = max(int(f.stem.split("_")[1]) for f in d.glob("out_*.f32"))
    truths = (d / f"out_{last}.f32").stat().st_size // 4
    arrays = {"cfg": np.array(cfg), "input": x, "truth": truth[:truths],
              "weights0": np.frombuffer((d / "weights0.weights").read_bytes(), np.uint8),
              "weights1": np.frombuffer((d / "weights1.weights").read_bytes(), np.uint8),
              "cost": np.fromfile(d / "cost_0.f32", np.float32)}
    for f in sorted(d.glob("*_*.f32")):
        if not f.name.startswith("cost"):
            arrays[f.stem] = np.fromfile(f, np.float32)
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    print(f"{name}: {(OUT / f'{name}.npz').stat().st_size} bytes, cost {arrays['cost'][0]:.6g}")


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
