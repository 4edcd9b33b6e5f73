"""bench/learning/original/loss_curves.py reads both programs' logs (pjreddie's
`detector train` and `darknet-py train`) into the RESULTS.md rows."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "learning" / "original" / "loss_curves.py"


def load():
    spec = importlib.util.spec_from_file_location("loss_curves", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_logs_scores_and_tenths(tmp_path, capsys):
    # pjreddie's line has no images/s tail and comes between its Region/Loaded lines.
    pjreddie = ["Loaded: 0.000030 seconds", "Region 16 Avg IOU: 0.1, Class: 0.5, count: 3"]
    pjreddie += [
        f"{i}: {float(i):f}, {float(i):f} avg, 0.001000 rate, 0.07 seconds, {32 * i} images"
        for i in range(1, 21)
    ]
    py = [
        f"{i}: {2.0 * i:f}, {2.0 * i:f} avg, 0.001000 rate, 0.02 seconds, {32 * i} images"
        f" | 1300.0 images/s, ETA 0:00:01"
        for i in range(1, 11)
    ]  # stopped at 10
    (tmp_path / "pjreddie_train_1.log").write_text("\n".join(pjreddie) + "\n")
    (tmp_path / "py_train_1.log").write_text("\n".join(py) + "\n")
    (tmp_path / "times.txt").write_text(
        "build rc=0 8s\nset 10s\npy train 1 rc=124 60s\npjreddie train 1 rc=0 90s\nmaps 95s\n"
    )
    (tmp_path / "map_of_pjreddie_1.log").write_text(
        "backup_pjreddie_1/shapes_final.weights\n mean average precision (mAP@0.50) = "
        "0.954400, or 95.44 % \n"
    )
    (tmp_path / "map_of_py_1.log").write_text("backup_py_1/shapes.backup\nerror: no weights\n")
    load().main(tmp_path, ["1"])
    out = capsys.readouterr().out
    assert "| pjreddie | 1 | 20 | 80 | 95.44 % | shapes_final.weights |" in out
    assert "| py | 1 | 10 | 50 | n/a | shapes.backup |" in out
    assert "(iterations 1-2 3-4 5-6" in out
    # tenths of the longest run: pjreddie's means are 1.5, 3.5, ...; py has none after 10
    assert "pjreddie 1: 1.50 3.50 5.50 7.50 9.50 11.50 13.50 15.50 17.50 19.50" in out
    assert "py mean: 3.00 7.00 11.00 15.00 19.00 - - - - -" in out
