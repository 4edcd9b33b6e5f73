"""Training, validation and anchors: Darknet's schedules, resume, checkpoints, metrics."""

import math
import os
import re

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import (
    CLASSIFIER_CFG,
    NO_BN_CFG,
    Lines,
    data_file,
    digit_set,
    host_params,
    unit_rolling_variance,
    weights_floats,
    write_classifier_cfg,
)

from darknet_py import optimizer
from darknet_py.cfg import parse_cfg_text
from darknet_py.cli import cli
from darknet_py.network import Network
from darknet_py.train import (
    TrainError,
    cfg_base,
    detector_snapshot_due,
    multiscale_size,
    resize_network,
    train,
)
from darknet_py.validate import (
    class_average_precision,
    mean_average_precision,
    top_k_hits,
    top_k_indexes,
    voc_ap,
)
from darknet_py.weights import load_weights

# ---- learning-rate policies (Darknet's get_current_rate) ----------------------------------


def rate(policy_lines, batch_num, max_batches=1000, rng=None, base=0.1):
    section = parse_cfg_text("[net]\n" + policy_lines)[0]
    return optimizer.current_rate(base, optimizer.read_policy(section), batch_num, max_batches, rng)


def test_constant_policy():
    assert rate("policy=constant", 0) == rate("policy=constant", 12345) == 0.1


def test_step_policy_multiplies_by_scale_every_step():
    assert rate("policy=step\nstep=100\nscale=.5", 99) == pytest.approx(0.1)
    assert rate("policy=step\nstep=100\nscale=.5", 100) == pytest.approx(0.05)
    assert rate("policy=step\nstep=100\nscale=.5", 250) == pytest.approx(0.025)


def test_steps_policy_applies_each_scale_from_its_step_on():
    p = "policy=steps\nsteps=100,200\nscales=.1,.5"
    assert rate(p, 99) == pytest.approx(0.1)
    assert rate(p, 100) == pytest.approx(0.01)  # Darknet: steps[i] > batch stops, so = applies
    assert rate(p, 199) == pytest.approx(0.01)
    assert rate(p, 200) == pytest.approx(0.005)


def test_exp_poly_and_sigmoid_policies():
    assert rate("policy=exp\ngamma=.99", 10) == pytest.approx(0.1 * 0.99**10)
    # poly: lr * (1 - batch/max_batches)^power
    assert rate("policy=poly\npower=4", 500, max_batches=1000) == pytest.approx(0.1 / 16)
    assert rate("policy=poly\npower=1", 250, max_batches=1000) == pytest.approx(0.075)
    # sigmoid: lr / (1 + exp(gamma * (batch - step))): half the rate at the step
    assert rate("policy=sigmoid\ngamma=.1\nstep=50", 50) == pytest.approx(0.05)
    assert rate("policy=sigmoid\ngamma=.1\nstep=50", 60) == pytest.approx(0.1 / (1 + math.e))


def test_random_policy_draws_from_the_seeded_generator():
    u = np.random.default_rng(3).random()
    got = rate("policy=random\npower=2", 7, rng=np.random.default_rng(3))
    assert got == pytest.approx(0.1 * u * u)


def test_burn_in_ramps_with_power_before_any_policy():
    p = "policy=steps\nsteps=10\nscales=.1\nburn_in=100\npower=4"
    assert rate(p, 0) == 0
    assert rate(p, 50) == pytest.approx(0.1 * 0.5**4)  # the steps scale is not applied
    assert rate(p, 100) == pytest.approx(0.01)  # after burn-in: the policy
    assert rate("policy=constant\nburn_in=10\npower=1", 5) == pytest.approx(0.05)


def fork_sgdr_rate(base, rate_min, cycle, mult, batch_num):
    """The fork's get_current_rate SGDR case, statement by statement."""
    last_iteration_start, cycle_size = 0, cycle
    while last_iteration_start + cycle_size < batch_num:
        last_iteration_start += cycle_size
        cycle_size *= mult
    return rate_min + 0.5 * (base - rate_min) * (
        1 + math.cos((batch_num - last_iteration_start) * 3.14159265 / cycle_size)
    )


def test_sgdr_policy_follows_the_forks_cosine_with_restarts():
    p = "policy=sgdr\nsgdr_cycle=10\nsgdr_mult=3\nlearning_rate_min=.001"
    for n in range(0, 200):
        assert rate(p, n) == pytest.approx(fork_sgdr_rate(0.1, 0.001, 10, 3, n), rel=1e-6), n
    assert rate(p, 0) == pytest.approx(0.1)
    assert rate(p, 10) == pytest.approx(0.001)  # a cycle's end is still in that cycle
    assert rate(p, 11) == pytest.approx(fork_sgdr_rate(0.1, 0.001, 30, 3, 1))  # restart
    assert rate(p, 40) == pytest.approx(0.001)  # the second cycle is 3x longer


def test_sgdr_defaults_to_one_cycle_over_max_batches_and_ramps_in_burn_in():
    assert rate("policy=sgdr", 500, max_batches=1000) == pytest.approx(
        0.00001 + 0.5 * (0.1 - 0.00001)
    )
    p = "policy=sgdr\nsgdr_cycle=100\nburn_in=50\npower=1"
    assert rate(p, 25) == pytest.approx(0.05)
    assert rate(p, 60) == pytest.approx(fork_sgdr_rate(0.1, 0.00001, 100, 2, 60))


def test_sgdr_refuses_cycles_that_never_end_and_warns_about_steps():
    from darknet_py.cfg import CfgError

    for lines, key in (("sgdr_cycle=0", "sgdr_cycle"), ("sgdr_mult=0", "sgdr_mult")):
        with pytest.raises(CfgError) as e:
            rate("policy=sgdr\n" + lines, 5)
        assert e.value.key == key and "must be at least 1" in str(e.value)
    with pytest.warns(UserWarning, match="steps: does not change the rate with policy=sgdr"):
        assert rate("policy=sgdr\nsgdr_cycle=10\nsteps=4", 5) == pytest.approx(
            fork_sgdr_rate(0.1, 0.00001, 10, 2, 5)
        )


def test_network_rate_follows_seen_batch_and_subdivisions():
    net = Network(
        parse_cfg_text(
            CLASSIFIER_CFG.format(batch=8, subdivisions=2, momentum=0.9, max_batches=20)
        ),
        "t.cfg",
    )
    net.seen = 8 * 15  # 15 updates of 8 images (2 passes of 4)
    assert net.iteration == 15
    assert net.learning_rate == pytest.approx(0.05 * (1 - 15 / 20) ** 2)


# ---- subdivisions ---------------------------------------------------------------------------
def test_subdivisions_accumulate_gradients_into_one_update(tmp_path):
    # No batch norm here: its statistics are per pass, so halves would differ by design.
    text = NO_BN_CFG
    halves = Network(
        parse_cfg_text(text.format(batch=8, subdivisions=2, momentum=0.9, max_batches=10)),
        "a.cfg",
        seed=5,
    )
    whole = Network(
        parse_cfg_text(text.format(batch=8, subdivisions=1, momentum=0.9, max_batches=10)),
        "b.cfg",
        seed=5,
    )
    rng = np.random.default_rng(1)
    x = rng.random((8, 1, 12, 12)).astype(np.float32)
    truth = np.eye(2, dtype=np.float32)[rng.integers(0, 2, 8)]
    before = whole.be.to_host(whole.layers[0].weights)
    for step in range(3):
        halves.train_pass(x[:4], truth[:4])
        if step == 0:  # no update until the last pass of the iteration
            np.testing.assert_array_equal(halves.be.to_host(halves.layers[0].weights), before)
            assert halves.last_rate is None
        halves.train_pass(x[4:], truth[4:])
        whole.train_pass(x, truth)
        assert halves.seen == whole.seen == 8 * (step + 1)
        assert halves.iteration == whole.iteration == step + 1
    for a, b in zip(halves.layers, whole.layers):
        for (name, pa), (_, pb) in zip(a.params(), b.params()):
            np.testing.assert_allclose(
                halves.be.to_host(pa), whole.be.to_host(pb), rtol=1e-5, atol=1e-6, err_msg=name
            )
    assert not np.allclose(whole.be.to_host(whole.layers[0].weights), before)


# ---- training runs ------------------------------------------------------------------------
def test_training_counts_seen_saves_it_and_prints_darknet_lines(bars, tmp_path):
    cfg = write_classifier_cfg(tmp_path)
    lines = Lines()
    result = train(
        cfg, data_file(bars, tmp_path / "backup"), seed=1, device="cpu", log=lines, workers=2
    )
    assert result.iterations == 6 and result.seen == 6 * 8
    seen, _ = weights_floats(result.final_weights)
    assert seen == 48
    assert result.final_weights == os.path.join(str(tmp_path / "backup"), "tiny_final.weights")
    # Darknet's classifier line, then our rate and ETA
    pattern = re.compile(
        r"^(\d+), (\d+\.\d{3}): (\d+\.\d{6}), (\d+\.\d{6}) avg, "
        r"(\d+\.\d{6}) rate, \d+\.\d{6} seconds, (\d+) images \| .* ETA "
    )
    rows = [pattern.match(line) for line in lines if pattern.match(line)]
    assert [int(m.group(1)) for m in rows] == [1, 2, 3, 4, 5, 6]
    assert [int(m.group(6)) for m in rows] == [8 * i for i in range(1, 7)]
    assert rows[0].group(2) == f"{8 / 40:.3f}"  # epochs: seen / train images
    losses = [float(m.group(3)) for m in rows]
    avg = losses[0]
    for loss, m in zip(losses, rows):  # avg = .9 avg + .1 loss
        avg = avg * 0.9 + loss * 0.1
        assert float(m.group(4)) == pytest.approx(avg, abs=2e-6)
    assert [h[1] for h in result.losses] == pytest.approx(losses, abs=1e-6)
    # the rate printed is the one for the next update, as get_current_rate after training
    assert float(rows[2].group(5)) == pytest.approx(0.05 * (1 - 3 / 6) ** 2, abs=1e-6)


def test_stopped_and_resumed_run_matches_an_uninterrupted_one(bars, tmp_path):
    cfg = write_classifier_cfg(tmp_path, max_batches=6)
    whole = train(
        cfg, data_file(bars, tmp_path / "whole"), seed=3, device="cpu", log=Lines(), workers=2
    )

    def stop_at_3(result):
        if result.iterations == 3:
            raise KeyboardInterrupt

    lines = Lines()
    data = data_file(bars, tmp_path / "parts")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, data, seed=3, device="cpu", log=lines, workers=2, on_iteration=stop_at_3)
    backup = str(tmp_path / "parts" / "tiny.backup")
    assert any(f"saved {backup}" in line and "--weights" in line for line in lines)
    seen, _ = weights_floats(backup)
    assert seen == 3 * 8
    assert not os.path.exists(tmp_path / "parts" / "tiny_final.weights")

    lines = Lines()
    resumed = train(cfg, data, weights=backup, seed=3, device="cpu", log=lines, workers=2)
    assert any("Resuming at iteration 3" in line for line in lines)
    first = next(line for line in lines if re.match(r"^\d+, ", line))
    assert first.startswith("4, ")
    assert [h[0] for h in resumed.losses] == [4, 5, 6]
    # same iteration, same loss (same batches, same weights), same rate from there on
    assert [h[1] for h in resumed.losses] == pytest.approx(
        [h[1] for h in whole.losses[3:]], rel=1e-5
    )
    seen_a, a = weights_floats(whole.final_weights)
    seen_b, b = weights_floats(resumed.final_weights)
    assert seen_a == seen_b == 48
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_resuming_at_max_batches_points_to_clear(bars, tmp_path):
    cfg = write_classifier_cfg(tmp_path, max_batches=2)
    data = data_file(bars, tmp_path / "backup")
    done = train(cfg, data, seed=0, device="cpu", log=Lines(), workers=2)
    with pytest.raises(TrainError, match=r"already trained for 2 iterations.*--clear"):
        train(cfg, data, weights=done.final_weights, device="cpu", log=Lines())
    runner = CliRunner()
    out = runner.invoke(
        cli, ["train", cfg, data, "--weights", done.final_weights, "--device", "cpu"]
    )
    assert out.exit_code == 2
    assert "--clear" in out.output and out.output.count("\n") == 1
    # --clear trains the same weights again from iteration 0, saying what it replaces
    lines = Lines()
    with pytest.raises(TrainError, match=r"tiny_final.weights.*--overwrite"):
        train(cfg, data, weights=done.final_weights, clear=True, device="cpu", log=lines)
    again = train(
        cfg,
        data,
        weights=done.final_weights,
        clear=True,
        device="cpu",
        log=lines,
        workers=2,
        overwrite=True,
    )
    assert again.losses[0][0] == 1 and again.iterations == 2
    assert any("replac" in line for line in lines)


def test_a_fresh_run_does_not_silently_replace_an_earlier_one(bars, tmp_path):
    cfg = write_classifier_cfg(tmp_path, max_batches=1)
    data = data_file(bars, tmp_path / "backup")
    train(cfg, data, device="cpu", log=Lines(), workers=2)
    final = tmp_path / "backup" / "tiny_final.weights"
    stamp = final.stat().st_mtime_ns
    with pytest.raises(TrainError, match=r"tiny_final.weights.*--overwrite"):
        train(cfg, data, device="cpu", log=Lines())
    assert final.stat().st_mtime_ns == stamp
    train(cfg, data, device="cpu", log=Lines(), overwrite=True, workers=2)
    assert final.stat().st_mtime_ns != stamp


def test_classifier_checkpoints_backup_epochs_final_and_chart(bars, tmp_path):
    # 40 images, 8 per iteration: an epoch every 5 iterations; a backup every 100.
    cfg = write_classifier_cfg(tmp_path, batch=8, subdivisions=1, max_batches=105, momentum=0.9)
    backup = tmp_path / "backup"
    result = train(
        cfg,
        data_file(bars, backup),
        seed=0,
        device="cpu",
        log=Lines(),
        log_every=50,
        workers=2,
        map_eval=True,
        map_every=50,
    )
    files = set(os.listdir(backup))
    assert {
        "tiny.backup",
        "tiny_final.weights",
        "chart_tiny.png",
        "tiny_best.weights",
        "tiny_last.weights",
    } <= files
    # a classifier's --map score is its top-1; evaluated every 50 and at the end
    assert [i for i, _ in result.scores] == [50, 100, 105]
    assert result.best_score == max(score for _, score in result.scores)
    assert {f"tiny_{epoch}.weights" for epoch in range(1, 22)} <= files  # Darknet: per epoch
    assert "tiny_22.weights" not in files
    assert weights_floats(backup / "tiny.backup")[0] == 100 * 8  # saved at 100
    assert weights_floats(backup / "tiny_3.weights")[0] == 15 * 8  # after epoch 3
    chart = cv2.imread(str(backup / "chart_tiny.png"))
    assert chart is not None and chart.shape == (600, 1000, 3)
    assert (chart < 128).any() and (chart > 200).mean() > 0.5  # ink on white
    # and it has learnt the bars
    runner = CliRunner()
    out = runner.invoke(
        cli, ["valid", cfg, data_file(bars, backup), result.final_weights, "--device", "cpu"]
    )
    assert out.exit_code == 0, out.output
    last = out.output.strip().splitlines()[-1]
    m = re.fullmatch(r"top-1: (\d\.\d{4}) top-2: (\d\.\d{4})", last)
    assert m and float(m.group(1)) >= 0.9 and float(m.group(2)) == 1.0


def test_detector_snapshot_schedule_matches_train_detector():
    due = [i for i in range(1, 30001) if detector_snapshot_due(i)]
    assert due == list(range(100, 1000, 100)) + [10000, 20000, 30000]


def test_multiscale_sizes_scale_darknets_rule():
    # A 416 network with stride 32: Darknet's (rand() % 10 + 10) * 32, i.e. 320..608.
    sizes = {multiscale_size(416, 416, 32, i * 10, 10**6, seed=0)[0] for i in range(200)}
    assert sizes == set(range(320, 609, 32))
    # the same draw for every iteration of a block of 10, whatever run asks
    assert len({multiscale_size(416, 416, 32, i, 10**6, seed=4) for i in range(30, 40)}) == 1
    # the last 200 iterations at the largest size
    assert multiscale_size(416, 416, 32, 9850, 10000, seed=0) == (608, 608)
    # small networks get proportionally small sizes, still multiples of the stride
    small = {multiscale_size(64, 64, 16, i * 10, 10**6, seed=1) for i in range(100)}
    assert {w for w, _ in small} == {48, 64, 80, 96} and all(w == h for w, h in small)


# ---- a tiny detector ------------------------------------------------------------------------
DETECTOR_CFG = """
[net]
batch=4
subdivisions=2
width=32
height=32
channels=3
learning_rate=0.001
momentum=0.9
decay=0.0005
max_batches=1000
policy=constant
flip=0

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=45
size=1
stride=1
pad=1
activation=linear

[yolo]
mask=0,1,2
anchors=8,8, 12,12, 16,16
classes=10
num=3
jitter=.1
random={random}
"""


@pytest.fixture(scope="module")
def canvases(tmp_path_factory):
    root = tmp_path_factory.mktemp("canvases")
    return digit_set(root / "set", 8, 4)


def test_detector_checkpoints_and_multiscale(canvases, tmp_path):
    cfg = tmp_path / "det.cfg"
    cfg.write_text(DETECTOR_CFG.format(random=1))
    lines = Lines()
    with np.errstate(over="ignore", invalid="ignore"):  # an untrained head's exp() overflows
        result = train(
            str(cfg),
            canvases,
            device="cpu",
            log=lines,
            log_every=100,
            verbose=False,
            max_batches=100,
            overwrite=True,
            workers=2,
            map_eval=True,
            map_every=50,
        )
    backup = os.path.dirname(result.final_weights)
    files = set(os.listdir(backup))
    assert {
        "det.backup",
        "det_100.weights",
        "det_final.weights",
        "chart_det.png",
        "det_best.weights",
        "det_last.weights",
    } <= files
    # --map: evaluated at the cfg size between multi-scale iterations, at 50 and 100
    assert [i for i, _ in result.scores] == [50, 100]
    assert all(0 <= score <= 1 for _, score in result.scores)
    assert sum(line.startswith("mAP@0.5 = ") for line in lines) == 2
    assert weights_floats(os.path.join(backup, "det_last.weights"))[0] == 100 * 4
    assert weights_floats(os.path.join(backup, "det_100.weights"))[0] == 100 * 4
    assert any(
        re.fullmatch(
            r"100: \d+\.\d{6}, \d+\.\d{6} avg, 0\.001000 rate, \d+\.\d{6} "
            r"seconds, 400 images \| .*",
            line,
        )
        for line in lines
    )
    # random=1: a new size every 10 iterations; the last 200 run at the largest (48 here)
    assert "Resizing: 48 x 48" in lines
    assert all(math.isfinite(h[1]) for h in result.losses)


def test_resize_network_keeps_parameters_and_updates(tmp_path):
    net = Network(parse_cfg_text(DETECTOR_CFG.format(random=1)), "det.cfg", seed=2)
    x = np.random.default_rng(0).random((2, 3, 32, 32)).astype(np.float32)
    truth = np.zeros((2, 450), np.float32)
    truth[:, :5] = [0.5, 0.5, 0.3, 0.3, 1]
    net.train_pass(x, truth)
    before = host_params(net)
    updates = net.be.to_host(net.layers[0].weight_updates).copy()
    resize_network(net, 48, 48)
    assert net.input_shape == (3, 48, 48) and net.layers[-1].w == 12
    for layer in net.layers:
        for name, arr in layer.params():
            np.testing.assert_array_equal(net.be.to_host(arr), before[(layer.index, name)])
    np.testing.assert_array_equal(net.be.to_host(net.layers[0].weight_updates), updates)
    big = np.random.default_rng(1).random((2, 3, 48, 48)).astype(np.float32)
    assert math.isfinite(net.train_pass(big, truth))


def test_partial_weights_load_with_a_notice_and_start_at_zero(canvases, tmp_path):
    cfg = tmp_path / "det.cfg"
    cfg.write_text(DETECTOR_CFG.format(random=0))
    net = Network(parse_cfg_text(DETECTOR_CFG.format(random=0)), str(cfg), seed=9)
    net.seen = 12345
    partial = str(tmp_path / "det.conv.2")
    net.save_weights(partial, cutoff=2)
    lines = Lines()
    result = train(
        str(cfg),
        canvases,
        weights=partial,
        device="cpu",
        log=lines,
        verbose=False,
        max_batches=1,
        overwrite=True,
        workers=2,
    )
    assert any("pretrained weights for layers 0-0 of 6" in line for line in lines)
    assert result.losses[0][0] == 1  # counted from 0, not from 12345 images
    check = Network(parse_cfg_text(DETECTOR_CFG.format(random=0)), str(cfg), seed=1)
    assert load_weights(check, partial, allow_partial=True) == 2


def test_detector_valid_prints_map_line(canvases, tmp_path):
    cfg = tmp_path / "det.cfg"
    cfg.write_text(DETECTOR_CFG.format(random=0))
    weights = str(tmp_path / "det.weights")
    net = Network(parse_cfg_text(DETECTOR_CFG.format(random=0)), str(cfg))
    unit_rolling_variance(net)
    net.save_weights(weights)
    out = CliRunner().invoke(
        cli,
        [
            "valid",
            str(cfg),
            canvases,
            weights,
            "--device",
            "cpu",
            "--results-dir",
            str(tmp_path / "results"),
        ],
    )
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert re.fullmatch(r"mAP@0\.5: \d\.\d{4}", lines[-1])
    assert any(re.match(r"class +\d+ digit\d: AP ", line) for line in lines)


# ---- metrics ------------------------------------------------------------------------------
def test_voc_all_point_ap_by_hand():
    # ranked: hit, miss, hit, of 3 objects -> recall 1/3, 1/3, 2/3; precision 1, 1/2, 2/3.
    # All-point: precision made non-increasing from the right (1, 2/3, 2/3), area
    # 1/3 * 1 + 1/3 * 2/3 = 5/9; the unreached last third adds nothing.
    assert voc_ap([1 / 3, 1 / 3, 2 / 3], [1, 0.5, 2 / 3]) == pytest.approx(5 / 9)
    assert voc_ap([0.5, 1.0], [1.0, 1.0]) == pytest.approx(1.0)
    assert voc_ap([], []) == 0.0


def test_map_matches_a_hand_computed_case():
    a, b, c = (0.25, 0.25, 0.2, 0.2), (0.75, 0.75, 0.2, 0.2), (0.5, 0.5, 0.1, 0.1)
    truths = {0: np.array([a + (0,), b + (0,)]), 1: np.array([c + (0,), (0.5, 0.5, 0.5, 0.5, 1)])}
    detections = [
        (0, 0, 0.9, a),  # hit a
        (0, 0, 0.8, (0.26, 0.25, 0.2, 0.2)),  # a again: a duplicate is a false positive
        (1, 0, 0.7, c),  # hit c
        (1, 1, 0.6, (0.5, 0.375, 0.5, 0.25)),  # IoU exactly 0.5: a hit (VOC: >= .5)
        (1, 1, 0.95, (0.7, 0.3, 0.2, 0.2)),  # nowhere near: a miss ranked first
        (0, 2, 0.5, a),  # class 2 has no objects: not scored
    ]
    mean, aps, counts = mean_average_precision(detections, truths, 3)
    assert counts == [3, 1, 0]
    assert aps[0] == pytest.approx(5 / 9)  # b never found
    assert aps[1] == pytest.approx(0.5)  # recall 1 reached at precision 1/2
    assert aps[2] is None
    assert mean == pytest.approx((5 / 9 + 0.5) / 2)
    ap, tp, fp = class_average_precision(
        [(0, 0.9, (0.5, 0.5, 0.2, 0.2))], {0: np.array([[0.5, 0.62, 0.2, 0.2]])}
    )
    assert (ap, tp, fp) == (0.0, 0, 1)  # IoU 0.25: a miss


def test_top_k_breaks_ties_toward_the_lower_class_like_darknet():
    scores = np.array([[0.4, 0.4, 0.2], [0.1, 0.3, 0.6]])
    np.testing.assert_array_equal(top_k_indexes(scores, 2), [[0, 1], [2, 1]])
    assert list(top_k_hits(scores, [1, 1], 1)) == [False, False]
    assert list(top_k_hits(scores, [1, 1], 2)) == [True, True]


# ---- anchors and the command line -----------------------------------------------------------
def test_anchors_command_prints_the_cfg_line(canvases):
    out = CliRunner().invoke(
        cli, ["anchors", canvases, "--num", "3", "--width", "32", "--height", "32"]
    )
    assert out.exit_code == 0, out.output
    first = out.output.splitlines()[0]
    assert re.fullmatch(r"anchors = \d+,\d+, \d+,\d+, \d+,\d+", first)
    sizes = [int(v) for v in re.findall(r"\d+", first)]
    areas = [w * h for w, h in zip(sizes[0::2], sizes[1::2])]
    assert areas == sorted(areas) and max(sizes) <= 32


def test_train_errors_are_one_line(tmp_path):
    cfg = write_classifier_cfg(tmp_path)
    out = CliRunner().invoke(cli, ["train", cfg, str(tmp_path / "missing.data")])
    assert out.exit_code == 2
    assert out.output.startswith("darknet-py: error: ") and out.output.count("\n") == 1


def test_cfg_base_is_darknets_basecfg():
    assert cfg_base("cfg/yolov3-tiny.cfg") == "yolov3-tiny"
    assert cfg_base("/x/y/net") == "net"


# ---- the NumPy maxpool's fast path (non-overlapping windows), added for training speed -----
def darknet_maxpool(x, size, stride, padding):
    """forward_maxpool_layer's loops: windows from -padding/2, strict '>' keeps the first max."""
    b, c, h, w = x.shape
    oh, ow = (h + padding - size) // stride + 1, (w + padding - size) // stride + 1
    out = np.zeros((b, c, oh, ow), np.float32)
    idx = np.zeros((b, c, oh, ow), np.int64)
    flat = x.reshape(-1)
    for k in range(b):
        for ch in range(c):
            for i in range(oh):
                for j in range(ow):
                    best, best_i = -np.inf, -1
                    for n in range(size):
                        for m in range(size):
                            y, xx = (
                                -(padding // 2) + i * stride + n,
                                -(padding // 2) + j * stride + m,
                            )
                            index = ((k * c + ch) * h + y) * w + xx
                            val = flat[index] if 0 <= y < h and 0 <= xx < w else -np.inf
                            if val > best:
                                best, best_i = val, index
                    out[k, ch, i, j], idx[k, ch, i, j] = best, best_i
    return out, idx


@pytest.mark.parametrize(
    "shape,size,stride,padding",
    [
        ((2, 3, 6, 8), 2, 2, 1),  # the usual: fast path
        ((1, 2, 7, 5), 2, 2, 0),  # odd sizes, last row/column dropped: fast path
        ((1, 2, 6, 6), 3, 3, 2),  # 3x3/3 starting at -1: general path
        ((1, 2, 5, 5), 2, 1, 1),  # overlapping (yolov3-tiny's 2x2/1): general path
    ],
)
def test_numpy_maxpool_matches_darknets_loops(shape, size, stride, padding):
    from darknet_py.backends import NumpyBackend

    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, shape).astype(np.float32)  # small integers: many ties
    want, want_idx = darknet_maxpool(x, size, stride, padding)
    be = NumpyBackend()
    out = be.zeros(want.size)
    idx = be.int_zeros(want.size)
    be.maxpool_forward(
        x.reshape(-1), shape[0], shape[1], shape[2], shape[3], size, stride, padding, out, idx
    )
    np.testing.assert_array_equal(out, want.reshape(-1))
    np.testing.assert_array_equal(idx, want_idx.reshape(-1))


# ---- runs that must stop, and files a run must not replace ---------------------------------
def test_a_diverging_run_stops_keeps_the_good_backup_and_writes_no_final(bars, tmp_path):
    backup_dir = tmp_path / "backup"
    data = data_file(bars, backup_dir)
    cfg = write_classifier_cfg(tmp_path, max_batches=2)
    train(cfg, data, device="cpu", log=Lines(), workers=2)
    good = backup_dir / "tiny.backup"
    os.replace(backup_dir / "tiny_final.weights", good)  # a good backup at iteration 2
    stamp = good.stat().st_mtime_ns
    wild = write_classifier_cfg(
        tmp_path,
        max_batches=50,
        text=CLASSIFIER_CFG.replace("learning_rate=0.05", "learning_rate=1e30"),
    )
    with pytest.raises(TrainError) as caught:
        train(wild, data, weights=str(good), device="cpu", log=Lines(), workers=2)
    message = str(caught.value)
    assert "diverged at iteration" in message and "learning_rate" in message
    assert "burn_in" in message and "iteration 2) is kept" in message
    assert good.stat().st_mtime_ns == stamp
    assert not (backup_dir / "tiny_final.weights").exists()
    # through the CLI: exit code 2, one line
    out = CliRunner().invoke(
        cli, ["train", wild, data, "--weights", str(good), "--device", "cpu", "--quiet"]
    )
    assert out.exit_code == 2 and "diverged" in out.output and "Traceback" not in out.output


def test_sigterm_saves_the_backup_as_ctrl_c_does(bars, tmp_path):
    import signal

    def term_at_3(result):
        if result.iterations == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    lines = Lines()
    data = data_file(bars, tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        train(
            write_classifier_cfg(tmp_path),
            data,
            device="cpu",
            log=lines,
            workers=2,
            on_iteration=term_at_3,
        )
    assert any(line.startswith("Terminated (SIGTERM) at iteration 3: saved") for line in lines)
    assert weights_floats(str(tmp_path / "backup" / "tiny.backup"))[0] == 3 * 8
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after training


def test_numbered_weights_of_an_earlier_run_are_not_replaced(bars, tmp_path):
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    epoch_1 = backup_dir / "tiny_1.weights"  # 40 images, 8 per iteration: epoch 1 at 5
    epoch_1.write_bytes(b"earlier")
    stale = backup_dir / ".weights-999999999-abcd"  # no such process: an interrupted save
    stale.write_bytes(b"x")
    data = data_file(bars, backup_dir)
    with pytest.raises(TrainError, match=r"tiny_1.weights: already exists.*--overwrite"):
        train(write_classifier_cfg(tmp_path, max_batches=6), data, device="cpu", log=Lines())
    assert epoch_1.read_bytes() == b"earlier"
    assert not stale.exists()
    result = train(
        write_classifier_cfg(tmp_path, max_batches=6),
        data,
        device="cpu",
        log=Lines(),
        overwrite=True,
        workers=2,
    )
    assert weights_floats(str(epoch_1))[0] > 0 and result.final_weights


def test_burn_in_beyond_max_batches_and_late_steps_warn(bars, tmp_path):
    text = CLASSIFIER_CFG.replace(
        "policy=poly\n", "policy=steps\nsteps=3,100\nscales=.1,.1\nburn_in=10\n"
    )
    lines = Lines()
    train(
        write_classifier_cfg(tmp_path, max_batches=2, text=text),
        data_file(bars, tmp_path / "b"),
        device="cpu",
        log=lines,
        workers=2,
    )
    assert any("burn_in=10 is not below max_batches=2" in line for line in lines)
    assert any("steps=3,100 at or beyond max_batches=2" in line for line in lines)
