"""Bad input, one table: every case must give exit code 2, one error line (ours, or click's
for an option value) with the words listed, no traceback, and leave every file in its
folder as it was (no output written, nothing replaced, nothing deleted)."""

import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import DOG, P1_CFG, P1_WEIGHTS, P2_CFG, P2_WEIGHTS, needs_shared, run_in_process

TINY_CFG = """[net]
batch=1
width=8
height=8
channels=3
{net}
[convolutional]
filters={filters}
size=3
stride=1
pad=1
activation=leaky

[avgpool]

[softmax]
"""

TINY_DETECTOR = """[net]
batch=2
width=32
height=32
channels=3
max_batches=10

[convolutional]
filters=7
size=1
stride=1
activation=linear

[yolo]
mask=0
anchors={anchors}
classes=2
num=1
"""


def tiny_cfg(folder, name="bad.cfg", net="", filters="4"):
    path = folder / name
    path.write_text(TINY_CFG.format(net=net, filters=filters))
    return path


def weights_bytes(body_bytes, seen64=True):
    """A weights header (0.2.0 with a 64-bit seen, or 0.1.0 with a 32-bit one) and then
    body_bytes bytes of zeros."""
    head = struct.pack("<3i", 0, 2 if seen64 else 1, 0)
    head += struct.pack("<Q", 0) if seen64 else struct.pack("<i", 0)
    return head + bytes(body_bytes)


def png_header(width, height):
    import zlib

    def chunk(kind, body):
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


class Folder:
    """The files a case works on, made fresh in tmp_path for each case."""

    def __init__(self, root):
        self.root = root

    def file(self, name, data):
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
        return path

    def copy(self, source, name=None):
        return Path(shutil.copyfile(source, self.root / (name or Path(source).name)))

    def directory(self, name):
        path = self.root / name
        path.mkdir()
        return path

    def fifo(self, name="pipe"):
        path = self.root / name
        os.mkfifo(path)
        return path

    def detector_data(self, labels):
        """A .data file whose train list holds two copies of dog.jpg with these labels."""
        lines = []
        for i in range(2):
            image = self.copy(DOG, f"img{i}.jpg")
            self.file(f"img{i}.txt", labels)
            lines.append(str(image))
        train = self.file("train.list", "\n".join(lines) + "\n")
        names = self.file("two.names", "a\nb\n")
        return self.file(
            "det.data", f"classes=2\ntrain={train}\nnames={names}\nbackup={self.root}/backup\n"
        )


def snapshot(root):
    """Every entry under root: kind, size, mtime and content hash (not for pipes)."""
    seen = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha1(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
        seen[str(path.relative_to(root))] = (
            stat.S_IFMT(info.st_mode),
            info.st_size,
            info.st_mtime_ns,
            digest,
        )
    return seen


def train_over_an_earlier_run(f):
    """`train --clear` where an earlier run left its final and 100th-iteration weights."""
    for name in ("d_final.weights", "d_100.weights"):
        f.file(f"backup/{name}", b"earlier run")
    cfg = f.file(
        "d.cfg", TINY_DETECTOR.format(anchors="10,14").replace("max_batches=10", "max_batches=200")
    )
    return ["train", cfg, f.detector_data("0 .5 .5 .2 .2\n"), "--clear"]


# Each case: (id, function of a Folder returning the arguments, words the error must hold).
# Words may be callables of the Folder (paths made for the case).
CASES = [
    # ---- weights files: read checks before any float is read --------------------------
    (
        "weights-shorter-than-header",
        lambda f: ["detect", P2_CFG, f.file("w.weights", weights_bytes(0)[:17]), DOG],
        ["w.weights", "not a Darknet weights file"],
    ),
    (
        "weights-13-bytes-test",
        lambda f: ["test", P1_CFG, f.file("w.weights", weights_bytes(0)[:13]), DOG],
        ["w.weights", "not a Darknet weights file"],
    ),
    (
        "weights-not-whole-floats-detect",
        lambda f: ["detect", P2_CFG, f.file("w.weights", weights_bytes(4 * 100 + 3)), DOG],
        ["w.weights", "403 bytes", "whole number of floats"],
    ),
    (
        "weights-not-whole-floats-test",
        lambda f: ["test", P1_CFG, f.file("w.weights", weights_bytes(7, seen64=False)), DOG],
        ["w.weights", "whole number of floats"],
    ),
    (
        "weights-not-whole-floats-partial",
        lambda f: [
            "partial",
            P1_CFG,
            f.file("w.weights", weights_bytes(9)),
            f.root / "out.weights",
            2,
        ],
        ["w.weights", "whole number of floats"],
    ),
    (
        "weights-not-whole-floats-train",
        lambda f: [
            "train",
            tiny_cfg(f.root),
            f.detector_data("0 .5 .5 .2 .2\n"),
            "--weights",
            f.file("w.weights", weights_bytes(5)),
        ],
        ["w.weights", "whole number of floats"],
    ),
    (
        "weights-is-a-directory",
        lambda f: ["detect", P2_CFG, f.directory("adir"), DOG],
        ["adir", "is a directory"],
    ),
    # ---- numbers in cfgs: file, line and key --------------------------------------------
    (
        "cfg-width-inf",
        lambda f: [
            "info",
            f.file("n.cfg", TINY_CFG.format(net="", filters="4").replace("width=8", "width=inf")),
        ],
        ["n.cfg:3: width:", "finite"],
    ),
    (
        "cfg-filters-nan",
        lambda f: ["info", tiny_cfg(f.root, filters="nan")],
        ["bad.cfg:8: filters:", "finite"],
    ),
    (
        "cfg-filters-1e400",
        lambda f: ["info", tiny_cfg(f.root, filters="1e400")],
        ["bad.cfg:8: filters:", "finite"],
    ),
    (
        "cfg-filters-minus-inf-in-test",
        lambda f: ["test", tiny_cfg(f.root, filters="-inf"), P1_WEIGHTS, DOG],
        ["bad.cfg:8: filters:", "finite"],
    ),
    (
        "cfg-filters-abc",
        lambda f: ["info", tiny_cfg(f.root, filters="abc")],
        ["bad.cfg:8: filters:", "expected an integer", "'abc'"],
    ),
    (
        "cfg-int-beyond-c-int",
        lambda f: ["info", tiny_cfg(f.root, filters="99999999999")],
        ["bad.cfg:8: filters:", "out of range"],
    ),
    (
        "cfg-learning-rate-nan",
        lambda f: ["info", tiny_cfg(f.root, net="learning_rate=nan")],
        ["bad.cfg:6: learning_rate:", "finite"],
    ),
    (
        "cfg-channels-0",
        lambda f: [
            "info",
            f.file(
                "c.cfg", TINY_CFG.format(net="", filters="4").replace("channels=3", "channels=0")
            ),
        ],
        ["c.cfg:5: channels:", "at least 1"],
    ),
    (
        "cfg-batch-0",
        lambda f: [
            "info",
            f.file("b.cfg", TINY_CFG.format(net="", filters="4").replace("batch=1", "batch=0")),
        ],
        ["b.cfg:2: batch:"],
    ),
    (
        "cfg-more-memory-than-the-machine",
        lambda f: ["test", tiny_cfg(f.root, filters="2000000000"), P1_WEIGHTS, DOG],
        ["bad.cfg", "GiB of memory at batch 1", "more than this machine"],
    ),
    (
        "cfg-negative-anchor",
        lambda f: ["info", f.file("d.cfg", TINY_DETECTOR.format(anchors="-10,14"))],
        ["d.cfg:16: anchors:", "above 0"],
    ),
    # ---- images ------------------------------------------------------------------------
    (
        "image-header-claims-100000x100000",
        lambda f: [
            "detect",
            P2_CFG,
            P2_WEIGHTS,
            f.file("huge.png", png_header(100000, 100000)),
            "--out",
            "none",
        ],
        ["huge.png", "100000 x 100000 pixels"],
    ),
    (
        "image-truncated-jpeg",
        lambda f: ["test", P1_CFG, P1_WEIGHTS, f.file("cut.jpg", DOG.read_bytes()[:40000])],
        ["cut.jpg", "truncated JPEG"],
    ),
    (
        "image-is-a-directory",
        lambda f: ["detect", P2_CFG, P2_WEIGHTS, f.root, "--out", "none"],
        ["is a directory"],
    ),
    (
        "image-is-a-device",
        lambda f: ["test", P1_CFG, P1_WEIGHTS, "/dev/zero"],
        ["/dev/zero", "not a regular file"],
    ),
    (
        "image-empty-file",
        lambda f: ["test", P1_CFG, P1_WEIGHTS, f.file("e.jpg", b"")],
        ["e.jpg", "empty"],
    ),
    # ---- meaningless runs ----------------------------------------------------------------
    (
        "thresh-nan",
        lambda f: ["detect", P2_CFG, P2_WEIGHTS, DOG, "--thresh", "nan"],
        ["--thresh", "nan"],
    ),
    ("nms-nan", lambda f: ["detect", P2_CFG, P2_WEIGHTS, DOG, "--nms", "nan"], ["--nms", "nan"]),
    (
        "test-on-a-detector",
        lambda f: ["test", P2_CFG, P2_WEIGHTS, DOG],
        ["p2_tinyyolo.cfg", "detector", "darknet-py detect"],
    ),
    (
        "train-data-without-boxes",
        lambda f: [
            "train",
            f.file("d.cfg", TINY_DETECTOR.format(anchors="10,14")),
            f.detector_data(""),
        ],
        ["none of the 2 training images has a labelled box", "img0.txt"],
    ),
    # ---- outputs that exist are not replaced --------------------------------------------
    (
        "detect-out-exists",
        lambda f: ["detect", P2_CFG, P2_WEIGHTS, DOG, "--out", f.file("mine.jpg", b"my picture")],
        ["mine.jpg", "already exists", "--overwrite"],
    ),
    (
        "detect-json-exists",
        lambda f: [
            "detect",
            P2_CFG,
            P2_WEIGHTS,
            DOG,
            "--out",
            "none",
            "--json",
            f.file("mine.json", "{}"),
        ],
        ["mine.json", "already exists", "--overwrite"],
    ),
    (
        "partial-out-exists",
        lambda f: ["partial", P1_CFG, P1_WEIGHTS, f.file("mine.weights", b"my weights"), 2],
        ["mine.weights", "already exists", "--overwrite"],
    ),
    (
        "train-final-and-numbered-weights-exist",
        train_over_an_earlier_run,
        ["d_final.weights", "d_100.weights", "already exist", "--overwrite"],
    ),
]


@needs_shared
@pytest.mark.parametrize("make_args, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_error_and_touches_no_file(tmp_path, make_args, words):
    folder = Folder(tmp_path / "case")
    folder.root.mkdir()
    args = [str(a) for a in make_args(folder)]
    if args[0] in ("detect", "test", "train"):
        args += ["--device", "cpu"]
    before = snapshot(tmp_path)
    r = run_in_process(args, cwd=tmp_path)
    assert r.code == 2, r
    assert "Traceback" not in r.out + r.err, r
    # click's own line for an option value it refuses, else ours
    errors = [
        line for line in r.err.splitlines() if line.startswith(("darknet-py: error: ", "Error: "))
    ]
    assert len(errors) == 1, r
    for word in words:
        assert word in errors[0], (word, r)
    assert snapshot(tmp_path) == before, "files changed"


@needs_shared
@pytest.mark.parametrize(
    "command, cfg, weights, options",
    [("detect", P2_CFG, P2_WEIGHTS, ["--out", "none"]), ("test", P1_CFG, P1_WEIGHTS, [])],
)
def test_a_named_pipe_is_refused_without_waiting_on_it(tmp_path, command, cfg, weights, options):
    """A real process, with a time limit: opening a pipe nobody writes to blocks forever."""
    folder = Folder(tmp_path)
    image_pipe, weights_pipe = folder.fifo("image.pipe"), folder.fifo("weights.pipe")
    for args in ([cfg, weights, image_pipe], [cfg, weights_pipe, DOG]):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "darknet_py",
                command,
                *map(str, args),
                "--device",
                "cpu",
                *options,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert r.returncode == 2, r
        assert "pipe" in r.stderr and "not a regular file" in r.stderr, r
        assert "Traceback" not in r.stderr, r


@pytest.mark.parametrize(
    "anchors,num,words",
    [
        (
            "10,14,23",
            2,
            "3 values given but num=2 anchors take 4; anchors are width,height pairs; "
            "the missing values are 0.5",
        ),
        ("10,14,23,27", 3, "4 values given but num=3 anchors take 6; the missing values are 0.5"),
        ("10,14,23,27,5", 2, "5 values given but num=2 anchors take 4; the rest are ignored"),
    ],
)
def test_anchor_lists_that_do_not_match_num_are_warned_about(tmp_path, anchors, num, words):
    """Darknet reads the first 2*num values and leaves missing ones at 0.5; the fork's own
    stock cfgs have both kinds of list, so these are warnings naming the line, not errors."""
    cfg = tmp_path / "d.cfg"
    cfg.write_text(TINY_DETECTOR.format(anchors=anchors).replace("num=1", f"num={num}"))
    r = run_in_process(["info", cfg])
    assert r.code == 0, r.err
    assert f"d.cfg:16: anchors: {words}" in r.err
