"""Two runs with one backup directory: a weights file that appears under one of a run's
names after its start is never replaced; the run writes beside it and says so in one
line (files.OutputClaims, used by train's checkpoints and rnn train's backups)."""

import os

from helpers import Lines, data_file, write_classifier_cfg

from darknet_py.files import OutputClaims
from darknet_py.rnn_text import train_text
from darknet_py.train import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAR_CFG = os.path.join(ROOT, "cfg", "char-pattern.cfg")
CHAR_TEXT = os.path.join(ROOT, "cfg", "char-pattern.txt")


def write(path, text):
    """Another process's atomic write: a new file renamed into place."""
    with open(f"{path}.tmp", "w") as f:
        f.write(text)
    os.replace(f"{path}.tmp", path)


def test_claims_keep_what_appeared_since_and_follow_the_runs_own_writes(tmp_path):
    lines = Lines()
    claims = OutputClaims(lines)
    mine, theirs, kept = (str(tmp_path / n) for n in ("a.weights", "b.weights", "c.weights"))
    write(kept, "from before, --overwrite given")
    claims.claim([mine, theirs, kept])
    assert claims.target(mine) == mine and claims.target(kept) == kept
    write(mine, "the run's")
    claims.wrote(mine)
    write(theirs, "another run's")
    assert claims.target(mine) == mine  # its own file, written again
    assert claims.target(theirs) == str(tmp_path / "b-2.weights")
    assert lines == [
        f"darknet-py: warning: {theirs}: written by someone else since this "
        f"run started (another run with the same output directory?); not "
        f"replacing it, writing {tmp_path / 'b-2.weights'} instead"
    ]
    write(str(tmp_path / "b-2.weights"), "the run's")
    claims.wrote(str(tmp_path / "b-2.weights"))
    assert claims.target(theirs) == str(tmp_path / "b-2.weights")  # said once, kept
    assert claims.where(theirs) == str(tmp_path / "b-2.weights") and len(lines) == 1
    write(kept, "changed by someone else")
    assert claims.target(kept) == str(tmp_path / "c-2.weights")
    write(str(tmp_path / "d-2.weights"), "taken")
    write(str(tmp_path / "d.weights"), "taken too")
    assert claims.target(str(tmp_path / "d.weights")) == str(tmp_path / "d-3.weights")


class OtherRun(Lines):
    """A log that, at the run's first iteration line, writes `path` as a second run
    writing to the same backup directory would."""

    def __init__(self, path, first):
        super().__init__()
        self.path, self.first = path, first

    def __call__(self, line):
        super().__call__(line)
        if line.startswith(self.first) and not os.path.exists(self.path):
            write(self.path, "the other run's final weights")


def test_train_does_not_replace_a_final_weights_file_that_appeared_meanwhile(bars, tmp_path):
    cfg = write_classifier_cfg(tmp_path, max_batches=2)
    final = tmp_path / "backup" / "tiny_final.weights"
    log = OtherRun(final, "1, ")
    result = train(cfg, data_file(bars, tmp_path / "backup"), device="cpu", log=log, workers=1)
    assert final.read_text() == "the other run's final weights"
    moved = str(tmp_path / "backup" / "tiny_final-2.weights")
    assert result.final_weights == moved and os.path.getsize(moved) > 20
    said = [line for line in log if "written by someone else" in line]
    assert said == [
        f"darknet-py: warning: {final}: written by someone else since this run "
        f"started (another run with the same output directory?); not replacing "
        f"it, writing {moved} instead"
    ]
    assert f"Saved {moved} after 2 iterations (16 images)" in log


def test_rnn_train_does_not_replace_a_final_weights_file_that_appeared_meanwhile(tmp_path):
    final = tmp_path / "backup" / "char-pattern_final.weights"
    log = OtherRun(final, "1: ")
    path = train_text(
        CHAR_CFG,
        CHAR_TEXT,
        backup_dir=str(tmp_path / "backup"),
        max_batches=2,
        device="cpu",
        log=log,
    )
    assert final.read_text() == "the other run's final weights"
    assert path == str(tmp_path / "backup" / "char-pattern_final-2.weights")
    assert os.path.getsize(path) > 20 and log[-1] == f"saved {path}"
    assert sum("written by someone else" in line for line in log) == 1
