"""`darknet-py rnn train` / `rnn generate` end to end on the CPU, and their data and
sampling rules against loop transcriptions of Darknet's examples/rnn.c."""
import os

import numpy as np
import pytest
from click.testing import CliRunner

from darknet_py.cli import cli
from darknet_py.rnn_text import sample, text_batch
from darknet_py.weights import floats_needed
from darknet_py.network import load_network

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = os.path.join(ROOT, "cfg", "char-pattern.cfg")
TEXT = os.path.join(ROOT, "cfg", "char-pattern.txt")


def runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:   # click >= 8.2 keeps stderr apart already
        return CliRunner()


def test_text_batch_is_darknets_get_rnn_data():
    text = np.frombuffer(b"hello, world", np.uint8)
    offsets = np.array([0, 5, 11])
    want_offsets = offsets.copy()
    streams, steps, chars = 3, 4, 128
    x_ref = np.zeros(streams * steps * chars, np.float32)
    y_ref = np.zeros_like(x_ref)
    for i in range(streams):          # get_rnn_data's loops
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
    a = np.where(probs < 1e-4, 0, probs).astype(np.float64)   # test_char_rnn's floor
    a /= a.sum()
    left, want = r, len(a) - 1
    for i, v in enumerate(a):          # sample_array's loop
        left -= v
        if left <= 0:
            want = i
            break
    assert sample(probs, FixedDraw(r)) == want


def test_rnn_train_then_generate(tmp_path):
    backup = tmp_path / "backup"
    result = runner().invoke(cli, ["rnn", "train", CFG, TEXT, "--device", "cpu",
                                   "--max-batches", "3", "--backup", str(backup)])
    assert result.exit_code == 0, result.output + result.stderr
    lines = [l for l in result.stderr.splitlines() if l[:1].isdigit()]
    assert [l.split(":")[0] for l in lines] == ["1", "2", "3"]
    assert "chars/s" in lines[-1] and "avg" in lines[-1]
    final = backup / "char-pattern_final.weights"
    assert final.stat().st_size == 20 + 4 * floats_needed(load_network(CFG, device="cpu"))
    # the same run again refuses to replace its final weights
    again = runner().invoke(cli, ["rnn", "train", CFG, TEXT, "--device", "cpu",
                                  "--max-batches", "3", "--backup", str(backup)])
    assert again.exit_code == 2 and "char-pattern_final.weights" in again.stderr

    args = ["rnn", "generate", CFG, str(final), "--device", "cpu", "--seed-text", "one\\n",
            "--length", "25", "--srand", "7"]
    first = runner().invoke(cli, args)
    assert first.exit_code == 0, first.stderr
    out = first.stdout_bytes
    assert out.startswith(b"one\n") and len(out) == 4 + 25 + 1 and out.endswith(b"\n")
    assert runner().invoke(cli, args).stdout_bytes == out    # --srand makes it repeatable


def test_rnn_train_refuses_bytes_outside_the_alphabet(tmp_path):
    cfg = tmp_path / "small.cfg"
    cfg.write_text(open(CFG).read().replace("inputs=256", "inputs=128")
                   .replace("output=256", "output=128"))
    text = tmp_path / "t.txt"
    text.write_bytes(b"ab\xc3\xa9cd")
    result = runner().invoke(cli, ["rnn", "train", str(cfg), str(text), "--device", "cpu",
                                   "--backup", str(tmp_path / "b")])
    assert result.exit_code == 2
    assert f"{text}: byte 2 has value 195" in result.stderr


def test_rnn_generate_refuses_a_non_character_network(tmp_path):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("[net]\ninputs=8\n[connected]\noutput=4\n[softmax]\n")
    weights = tmp_path / "c.weights"
    weights.write_bytes(np.array([0, 2, 0], "<i4").tobytes() + bytes(8)
                        + np.zeros(36, "<f4").tobytes())
    result = runner().invoke(cli, ["rnn", "generate", str(cfg), str(weights), "--device",
                                   "cpu"])
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
    train_text(CFG, TEXT, weights=str(backup), backup_dir=str(tmp_path), max_batches=5,
               device="cpu", overwrite=True, log=resumed.append)
    steps = [l.split(":")[0] for l in resumed if l[:1].isdigit()]
    assert steps == ["3", "4", "5"]     # the backup holds 2 iterations


def test_darknets_rnn_forms_are_translated():
    from darknet_py.darknet_forms import translate
    out, note = translate(["rnn", "train", "a.cfg", "w.weights", "-file", "t.txt", "-clear"])
    assert out == ["rnn", "train", "a.cfg", "t.txt", "--weights", "w.weights", "--clear"]
    assert note.startswith("running `darknet-py rnn train a.cfg t.txt")
    out, _ = translate(["rnn", "generate", "a.cfg", "w.weights", "-len", "50", "-seed", "ab",
                        "--device", "cpu", "-temp", ".5", "-srand", "3"])
    assert out == ["rnn", "generate", "a.cfg", "w.weights", "--length", "50", "--seed-text",
                   "ab", "--device", "cpu", "--temp", ".5", "--srand", "3"]
    # without -file, Darknet's default text; our own form passes unchanged
    assert translate(["rnn", "train", "a.cfg", "-clear"])[0][3] == "data/shakespeare.txt"
    assert translate(["rnn", "train", "a.cfg", "t.txt"]) == (["rnn", "train", "a.cfg", "t.txt"],
                                                            None)
