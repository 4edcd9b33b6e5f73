"""A data-parallel run's output on the streams of a one-process run: rank 0's warnings on
stderr, its progress and notes on stdout (they all went to stdout)."""

from helpers import darknet_py, data_file, finish, write_run_cfg

from darknet_py.distributed.launcher import rank_log

BURN_IN_WARNING = (
    "darknet-py: warning: {cfg}: burn_in=100 is not below max_batches=2: "
    "the learning rate ramps up from 0 for the whole run and never reaches "
    "learning_rate=0.05"
)


def test_rank_log_puts_warnings_on_stderr_and_the_rest_on_stdout(capsys):
    rank_log("darknet-py: warning: tiny.cfg: something to know")
    rank_log("1, 0.500: 0.685988, 0.685988 avg, 0.000000 rate")
    rank_log("darknet-py: note: --overwrite: this run will replace x")
    out, err = capsys.readouterr()
    assert err == "darknet-py: warning: tiny.cfg: something to know\n"
    assert out == (
        "1, 0.500: 0.685988, 0.685988 avg, 0.000000 rate\n"
        "darknet-py: note: --overwrite: this run will replace x\n"
    )


def test_two_ranks_write_warnings_to_stderr_as_one_process_does(bars, tmp_path):
    """A one-process run of this cfg writes these two warnings to stderr (log_line)."""
    cfg = write_run_cfg(tmp_path, max_batches=2)
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace("[net]", "[net]\nburn_in=100", 1))
    code, out, err = finish(
        darknet_py("train", cfg, data_file(bars, tmp_path / "backup"), "--ranks", 2)
    )
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("darknet-py: warning")] == [
        BURN_IN_WARNING.format(cfg=cfg),
        f"darknet-py: warning: {cfg}: steps=3 at or beyond max_batches=2: the rate never "
        f"changes there",
    ]
    assert "darknet-py: warning" not in out
    assert any(line.startswith("2, ") for line in out.splitlines()), out
