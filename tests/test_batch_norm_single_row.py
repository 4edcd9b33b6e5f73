"""Batch norm over a single row per channel (a recurrent cfg with batch=1, a [connected]
layer trained one image at a time): its variance is 0/0, so the loss is nan at once. The
start warns naming the cfg line, and the divergence names the cause instead of the
learning rate."""

import pytest
from click.testing import CliRunner
from helpers import Lines, data_file

from darknet_py.cli import cli
from darknet_py.network import load_network
from darknet_py.train import TrainError, train
from darknet_py.training.stops import single_row_batch_norm

GRU_CFG = """[net]
subdivisions=1
inputs=128
batch={batch}
time_steps=1
learning_rate=0.1
max_batches=3

[gru]
batch_normalize=1
output=8

[connected]
output=128
activation=linear

[softmax]
"""

CLASSIFIER_CFG = """[net]
batch={batch}
subdivisions=1
width=12
height=12
channels=1
learning_rate=0.05
max_batches=2

[convolutional]
filters=4
size=3
stride=1
pad=1
activation=leaky

[avgpool]

[connected]
output=2
batch_normalize=1
activation=linear

[softmax]
"""


def runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 keeps stderr apart already
        return CliRunner()


def rnn_train(tmp_path, batch):
    cfg = tmp_path / "gru.cfg"
    cfg.write_text(GRU_CFG.format(batch=batch))
    text = tmp_path / "text.txt"
    text.write_bytes(b"abcdefgh " * 20)
    result = runner().invoke(
        cli,
        [
            "rnn",
            "train",
            str(cfg),
            str(text),
            "--device",
            "cpu",
            "--backup",
            str(tmp_path / "backup"),
        ],
    )
    return cfg, result


def test_rnn_train_names_single_row_batch_norm_at_start_and_at_divergence(tmp_path):
    cfg, result = rnn_train(tmp_path, batch=1)
    assert result.exit_code == 2
    cause = (
        f"{cfg}:10: layer 0 [gru] batch-normalizes 1 row per time step (batch / "
        f"subdivisions = 1): the variance of a single row is 0/0, so the loss is nan "
        f"from the first iteration; raise batch= to 2 or more times subdivisions, or set "
        f"batch_normalize=0"
    )
    lines = result.stderr.splitlines()
    assert lines[0] == f"darknet-py: warning: {cause}"
    assert lines[-1] == (
        f"darknet-py: error: iteration 1: the loss is nan (diverged); the "
        f"cause: {cause}; the last backup is kept"
    )
    assert "learning_rate" not in result.stderr and "Traceback" not in result.stderr


def test_rnn_train_with_two_rows_per_step_has_no_warning(tmp_path):
    _, result = rnn_train(tmp_path, batch=2)
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr and "batch-normalizes" not in result.stderr
    assert (tmp_path / "backup" / "gru_final.weights").exists()


@pytest.mark.parametrize(
    "batch,steps,found", [(1, 1, True), (2, 1, False), (1, 4, True), (2, 4, False)]
)
def test_single_row_batch_norm_counts_rows_per_time_step(tmp_path, batch, steps, found):
    cfg = tmp_path / "gru.cfg"
    cfg.write_text(GRU_CFG.format(batch=batch).replace("time_steps=1", f"time_steps={steps}"))
    net = load_network(str(cfg), device="cpu")
    assert (single_row_batch_norm(net) is not None) == found
    without = tmp_path / "plain.cfg"
    without.write_text(cfg.read_text().replace("batch_normalize=1\n", ""))
    assert single_row_batch_norm(load_network(str(without), device="cpu")) is None


def test_train_warns_and_names_the_cause_when_it_diverges(bars, tmp_path):
    cfg = tmp_path / "one.cfg"
    cfg.write_text(CLASSIFIER_CFG.format(batch=1))
    lines = Lines()
    with pytest.raises(TrainError) as caught:
        train(str(cfg), data_file(bars, tmp_path / "backup"), device="cpu", log=lines, workers=1)
    cause = (
        f"{cfg}:21: layer 2 [connected] batch-normalizes 1 value per channel (batch / "
        f"subdivisions = 1, 1x1 outputs): the variance of a single row is 0/0, so "
        f"the loss is nan from the first iteration; raise batch= to 2 or more times "
        f"subdivisions, or set batch_normalize=0"
    )
    assert f"darknet-py: warning: {cause}" in lines
    assert str(caught.value).endswith(f"no weights were saved. The cause: {cause}")
    cfg.write_text(CLASSIFIER_CFG.format(batch=2))
    lines = Lines()
    result = train(
        str(cfg), data_file(bars, tmp_path / "backup2"), device="cpu", log=lines, workers=1
    )
    assert result.iterations == 2 and not any("batch-normalizes" in line for line in lines)
