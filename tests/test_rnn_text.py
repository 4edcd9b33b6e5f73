"""`darknet-py rnn train` / `rnn generate` end to end on the CPU, and their data and
sampling rules against loop transcriptions of Darknet's examples/rnn.c."""

import os

import numpy as np
import pytest
from click.testing import CliRunner

from darknet_py.cli import cli
from darknet_py.network import load_network
from darknet_py.rnn_text import sample, text_batch
from darknet_py.weights import floats_needed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = os.path.join(ROOT, "cfg", "char-pattern.cfg")
TEXT = os.path.join(ROOT, "cfg", "char-pattern.txt")


def runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 keeps stderr apart already
        return CliRunner()


def test_text_batch_is_darknets_get_rnn_data():
    text = np.frombuffer(b"hello, world", np.uint8)
    offsets = np.array([0, 5, 11])
    want_offsets = offsets.copy()
    streams, steps, chars = 3, 4, 128
    x_ref = np.zeros(streams * steps * chars, np.float32)
    y_ref = np.zeros_like(x_ref)
    for i in range(streams):  # get_rnn_data's loops
        for j in range(steps):
            curr = int(text[want_offsets[i] % text.size])
            nxt = int(text[(want_offsets[i] + 1) % text.size])
            x_ref[(j * streams + i) * chars + curr] = 1
            y_ref[(j * streams + i) * chars + nxt] = 1
            want_offsets[i] = (want_offsets[i] + 1) % text.size
    x, y = text_batch(text, offsets, chars, steps)
    assert np.array_equal(x.reshape(-1), x_ref) and np.array_equal(y.reshape(-1), y_ref)
    assert np.array_equal(offsets, want_offsets)


class FixedDraw:
    def __init__(self, r):
        self.r = r

    def uniform(self, lo, hi):
        return self.r


@pytest.mark.parametrize("r", [0.0, 0.1, 0.35, 0.5, 0.99999, 1.0])
def test_sample_is_darknets_sample_array(r):
    probs = np.array([0.3, 0.00005, 0.2, 0.0, 0.49995], np.float32)
    a = np.where(probs < 1e-4, 0, probs).astype(np.float64)  # test_char_rnn's floor
    a /= a.sum()
    left, want = r, len(a) - 1
    for i, v in enumerate(a):  # sample_array's loop
        left -= v
        if left <= 0:
            want = i
            break
    assert sample(probs, FixedDraw(r)) == want


def test_rnn_train_then_generate(tmp_path):
    backup = tmp_path / "backup"
    result = runner().invoke(
        cli,
        [
            "rnn",
            "train",
            CFG,
            TEXT,
            "--device",
            "cpu",
            "--max-batches",
            "3",
            "--backup",
            str(backup),
        ],
    )
    assert result.exit_code == 0, result.output + result.stderr
    lines = [l for l in result.stderr.splitlines() if l[:1].isdigit()]
    assert [l.split(":")[0] for l in lines] == ["1", "2", "3"]
    assert "chars/s" in lines[-1] and "avg" in lines[-1]
    final = backup / "char-pattern_final.weights"
    assert final.stat().st_size == 20 + 4 * floats_needed(load_network(CFG, device="cpu"))
    # the same run again refuses to replace its final weights
    again = runner().invoke(
        cli,
        [
            "rnn",
            "train",
            CFG,
            TEXT,
            "--device",
            "cpu",
            "--max-batches",
            "3",
            "--backup",
            str(backup),
        ],
    )
    assert again.exit_code == 2 and "char-pattern_final.weights" in again.stderr

    args = [
        "rnn",
        "generate",
        CFG,
        str(final),
        "--device",
        "cpu",
        "--seed-text",
        "one\\n",
        "--length",
        "25",
        "--srand",
        "7",
    ]
    first = runner().invoke(cli, args)
    assert first.exit_code == 0, first.stderr
    out = first.stdout_bytes
    assert out.startswith(b"one\n") and len(out) == 4 + 25 + 1 and out.endswith(b"\n")
    assert runner().invoke(cli, args).stdout_bytes == out  # --srand makes it repeatable


def test_rnn_train_refuses_bytes_outside_the_alphabet(tmp_path):
    cfg = tmp_path / "small.cfg"
    cfg.write_text(
        open(CFG).read().replace("inputs=256", "inputs=128").replace("output=256", "output=128")
    )
    text = tmp_path / "t.txt"
    text.write_bytes(b"ab\xc3\xa9cd")
    result = runner().invoke(
        cli,
        ["rnn", "train", str(cfg), str(text), "--device", "cpu", "--backup", str(tmp_path / "b")],
    )
    assert result.exit_code == 2
    assert f"{text}: byte 2 has value 195" in result.stderr


def test_rnn_generate_refuses_a_non_character_network(tmp_path):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("[net]\ninputs=8\n[connected]\noutput=4\n[softmax]\n")
    weights = tmp_path / "c.weights"
    weights.write_bytes(
        np.array([0, 2, 0], "<i4").tobytes() + bytes(8) + np.zeros(36, "<f4").tobytes()
    )
    result = runner().invoke(cli, ["rnn", "generate", str(cfg), str(weights), "--device", "cpu"])
    assert result.exit_code == 2 and "character network" in result.stderr


def test_rnn_train_interrupt_saves_a_backup_that_resumes(tmp_path):
    from darknet_py.rnn_text import train_text

    lines = []

    def log(line):
        lines.append(line)
        if line.startswith("2:"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_text(CFG, TEXT, backup_dir=str(tmp_path), max_batches=5, device="cpu", log=log)
    backup = tmp_path / "char-pattern.backup"
    assert backup.exists() and "resume with" in lines[-1] and str(backup) in lines[-1]
    resumed = []
    train_text(
        CFG,
        TEXT,
        weights=str(backup),
        backup_dir=str(tmp_path),
        max_batches=5,
        device="cpu",
        overwrite=True,
        log=resumed.append,
    )
    steps = [l.split(":")[0] for l in resumed if l[:1].isdigit()]
    assert steps == ["3", "4", "5"]  # the backup holds 2 iterations


def test_darknets_rnn_forms_are_translated():
    from darknet_py.darknet_forms import translate

    out, note = translate(["rnn", "train", "a.cfg", "w.weights", "-file", "t.txt", "-clear"])
    assert out == ["rnn", "train", "a.cfg", "t.txt", "--weights", "w.weights", "--clear"]
    assert note.startswith("running `darknet-py rnn train a.cfg t.txt")
    out, _ = translate(
        [
            "rnn",
            "generate",
            "a.cfg",
            "w.weights",
            "-len",
            "50",
            "-seed",
            "ab",
            "--device",
            "cpu",
            "-temp",
            ".5",
            "-srand",
            "3",
        ]
    )
    assert out == [
        "rnn",
        "generate",
        "a.cfg",
        "w.weights",
        "--length",
        "50",
        "--seed-text",
        "ab",
        "--device",
        "cpu",
        "--temp",
        ".5",
        "--srand",
        "3",
    ]
    # without -file, Darknet's default text; our own form passes unchanged
    assert translate(["rnn", "train", "a.cfg", "-clear"])[0][3] == "data/shakespeare.txt"
    assert translate(["rnn", "train", "a.cfg", "t.txt"]) == (
        ["rnn", "train", "a.cfg", "t.txt"],
        None,
    )


CHAR_COST_CFG = """[net]
inputs=8
batch=4
subdivisions=1
time_steps=2
learning_rate={rate}
momentum=0
decay=0
max_batches=3
policy=constant

[rnn]
output=6
activation=tanh

[connected]
output=8
activation=linear

[softmax]
"""


def test_rnn_train_accepts_softmax_then_cost(tmp_path):
    cfg = tmp_path / "char-cost.cfg"
    cfg.write_text(CHAR_COST_CFG.format(rate=0.1) + "\n[cost]\n")
    text = tmp_path / "t.txt"
    text.write_bytes(b"\x01\x02\x03\x04\x05\x06\x07" * 3)
    result = runner().invoke(
        cli,
        ["rnn", "train", str(cfg), str(text), "--device", "cpu", "--backup", str(tmp_path / "b")],
    )
    assert result.exit_code == 0, result.stderr
    assert [l.split(":")[0] for l in result.stderr.splitlines() if l[:1].isdigit()] == [
        "1",
        "2",
        "3",
    ]
    assert (tmp_path / "b" / "char-cost_final.weights").exists()


def test_softmax_then_cost_trains_as_darknet(tmp_path):
    """Darknet's [cost] after [softmax]: its sse delta (truth - p) adds to the softmax's
    cross-entropy delta (the same truth - p), so one pass moves every weight as the
    network without [cost] does at twice the rate (decay and momentum 0); the loss is the
    mean of the two layers' costs."""
    with_cost, without = tmp_path / "with.cfg", tmp_path / "without.cfg"
    with_cost.write_text(CHAR_COST_CFG.format(rate=0.1) + "\n[cost]\n")
    without.write_text(CHAR_COST_CFG.format(rate=0.2))
    x = np.eye(8, dtype=np.float32)[[1, 2, 3, 4]]
    y = np.eye(8, dtype=np.float32)[[2, 3, 4, 5]]
    # A pass of 4 rows: 2 streams of time_steps=2 (the cfg's batch=4 would be 8 rows).
    nets = [load_network(str(cfg), device="cpu", seed=3, batch=4) for cfg in (with_cost, without)]
    start = [np.array(a) for layer in nets[0].layers[:2] for _, a in layer.params()]
    cost = nets[0].train_pass(x, y)
    nets[1].train_pass(x, y)
    p = nets[0].layer_output(2)
    xent = -np.sum(y * np.log(p))
    sse = np.sum((y - p) ** 2)
    assert cost == pytest.approx((xent + sse) / 2, rel=1e-5)
    moved = [np.array(a) for layer in nets[0].layers[:2] for _, a in layer.params()]
    assert not all(np.allclose(a, b) for a, b in zip(start, moved))
    for a, b in zip(nets[0].layers[:2], nets[1].layers[:2]):
        for (name, pa), (_, pb) in zip(a.params(), b.params()):
            assert np.allclose(pa, pb, rtol=1e-6, atol=1e-7), name
