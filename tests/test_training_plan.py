"""The training plan (training/plan.py) on its own: what a run will do, decided and checked
before anything is trained or written."""

import os

import pytest
from helpers import Lines, data_file, write_classifier_cfg

from darknet_py.training.plan import plan_training
from darknet_py.training.stops import TrainError
from darknet_py.weights import save_weights


def test_a_fresh_run_plans_its_outputs_without_writing_them(bars, tmp_path):
    backup = tmp_path / "backup"
    cfg = write_classifier_cfg(tmp_path, max_batches=6)
    plan = plan_training(cfg, data_file(bars, backup), device="cpu", map_eval=True, log=Lines())
    assert (plan.task, plan.start_iteration, plan.classes) == ("classifier", 0, 2)
    assert plan.net.options.max_batches == 6 and plan.replaced == []
    assert plan.map_every == 100  # 40 images, 8 per iteration: at least 100
    files = plan.checkpoints
    assert files.final == str(backup / "tiny_final.weights")
    assert files.backup == str(backup / "tiny.backup")
    assert files.numbered(3) == str(backup / "tiny_3.weights")
    assert (files.last, files.best) == (
        str(backup / "tiny_last.weights"),
        str(backup / "tiny_best.weights"),
    )
    assert files.chart == str(backup / "chart_tiny.png")
    assert os.listdir(backup) == []  # created, nothing in it
    assert plan.metric_name == "top-1" and plan.loader_args["task"] == "classifier"


def test_the_plan_resumes_where_a_backup_stopped_and_refuses_what_it_would_replace(bars, tmp_path):
    backup = tmp_path / "backup"
    data = data_file(bars, backup)
    cfg = write_classifier_cfg(tmp_path, max_batches=6)
    fresh = plan_training(cfg, data, device="cpu", log=Lines())
    fresh.net.seen = 3 * fresh.net.images_per_iteration
    save_weights(fresh.net, fresh.checkpoints.backup)
    resumed = plan_training(cfg, data, weights=fresh.checkpoints.backup, device="cpu", log=Lines())
    assert resumed.start_iteration == 3 and resumed.replaced == []
    # a fresh start would replace the backup (and the final weights an earlier run wrote)
    (backup / "tiny_final.weights").write_bytes(b"earlier")
    with pytest.raises(
        TrainError,
        match=r"tiny_final.weights, .*tiny.backup: already exist; "
        r"not replacing them.*give --weights .*tiny.backup",
    ):
        plan_training(cfg, data, device="cpu", log=Lines())
    log = Lines()
    replacing = plan_training(cfg, data, device="cpu", overwrite=True, log=log)
    assert set(replacing.replaced) == {
        str(backup / "tiny_final.weights"),
        str(backup / "tiny.backup"),
    }
    assert any("--overwrite: this run will replace" in line for line in log)
    assert (backup / "tiny_final.weights").read_bytes() == b"earlier"
    with pytest.raises(TrainError, match=r"already trained for 3 iterations.*--clear"):
        plan_training(
            cfg, data, weights=fresh.checkpoints.backup, max_batches=3, device="cpu", log=Lines()
        )
