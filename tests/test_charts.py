"""Training charts: one per cfg, the whole history after a resume, written like the weights."""

import json
import os
import stat

import cv2
import pytest
from helpers import Lines, data_file, write_classifier_cfg

from darknet_py.train import train


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_resumed_chart_shows_the_whole_run_and_each_cfg_has_its_own(bars, tmp_path):
    backup = tmp_path / "backup"
    data = data_file(bars, backup)
    cfg = write_classifier_cfg(tmp_path, max_batches=6)

    def stop_at_3(result):
        if result.iterations == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, data, seed=3, device="cpu", log=Lines(), workers=2, on_iteration=stop_at_3)
    history = json.loads((backup / "tiny.history.json").read_text())
    first_part = [row[:2] for row in history["losses"]]
    assert [i for i, _ in first_part] == [1, 2, 3]
    part_chart = cv2.imread(str(backup / "chart_tiny.png"))

    resumed = train(
        cfg, data, weights=str(backup / "tiny.backup"), seed=3, device="cpu", log=Lines(), workers=2
    )
    assert [h[0] for h in resumed.losses] == [4, 5, 6]  # this run's iterations
    history = json.loads((backup / "tiny.history.json").read_text())
    assert [row[0] for row in history["losses"]] == [1, 2, 3, 4, 5, 6]
    assert [row[:2] for row in history["losses"][:3]] == first_part
    assert [row[1] for row in history["losses"][3:]] == [h[1] for h in resumed.losses]
    chart = cv2.imread(str(backup / "chart_tiny.png"))
    assert chart.shape == part_chart.shape and (chart != part_chart).any()

    # Another cfg training into the same backup directory gets its own chart.
    other = write_classifier_cfg(tmp_path, name="other.cfg", max_batches=2)
    train(other, data, seed=0, device="cpu", log=Lines(), workers=2)
    files = sorted(os.listdir(backup))
    assert {"chart_tiny.png", "chart_other.png", "other.history.json"} <= set(files)
    assert "chart.png" not in files
    assert not [f for f in files if f.startswith(".")]  # no temporary file left behind
    # Charts and histories get the mode the weights files get (not mkstemp's 0600).
    umask = os.umask(0)
    os.umask(umask)
    expected = 0o666 & ~umask
    for name in ("chart_tiny.png", "tiny.history.json", "tiny_final.weights"):
        assert mode(backup / name) == expected, name


def test_a_fresh_run_keeps_an_earlier_runs_chart_and_history(bars, tmp_path):
    backup = tmp_path / "backup"
    data = data_file(bars, backup)
    cfg = write_classifier_cfg(tmp_path, max_batches=1)
    train(cfg, data, device="cpu", log=Lines(), workers=2)
    for name in ("tiny.backup", "tiny_final.weights"):
        (backup / name).unlink(missing_ok=True)
    from darknet_py.train import TrainError

    with pytest.raises(
        TrainError, match=r"chart_tiny.png, .*tiny.history.json: already exist.*--overwrite"
    ):
        train(cfg, data, device="cpu", log=Lines())
