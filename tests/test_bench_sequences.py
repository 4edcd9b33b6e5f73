"""`darknet-py bench` on recurrent cfgs: the batch holds whole sequences of time_steps rows,
by default one sequence, and the forward in 4 parts is timed only when each part does."""

import json

from test_cli import run_in_process

from darknet_py.bench import parts_of_whole_sequences, sequence_rows
from darknet_py.network import load_network

RNN_CFG = """[net]
inputs=6
batch={steps}
time_steps={steps}

[{kind}]
output=5
activation=leaky

[connected]
output=6
activation=linear

[softmax]
"""


def bench(cfg, tmp_path, *options):
    out = tmp_path / "bench.json"
    r = run_in_process(
        [
            "bench",
            cfg,
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--json",
            out,
            "--overwrite",
            *options,
        ]
    )
    assert "Traceback" not in r.err
    return r, (json.loads(out.read_text()) if r.code == 0 else None)


def test_bench_without_batch_times_one_sequence(tmp_path):
    cfg = tmp_path / "rnn.cfg"
    cfg.write_text(RNN_CFG.format(kind="rnn", steps=16))
    r, figures = bench(cfg, tmp_path)
    assert r.code == 0, r.err
    assert figures["batch"] == 16
    assert r.out.splitlines()[0].startswith(f"{cfg}: batch 16, cpu,")


def test_bench_batch_whose_quarters_cut_a_sequence_times_the_rest(tmp_path):
    """32 rows of 16-step sequences: 4 parts of 8 rows would cut both sequences, so the
    forward in parts is left out (it used to end in a ValueError traceback)."""
    for kind in ("rnn", "lstm", "gru"):
        cfg = tmp_path / f"{kind}.cfg"
        cfg.write_text(RNN_CFG.format(kind=kind, steps=16))
        r, figures = bench(cfg, tmp_path, "--batch", "32", "--train")
        assert r.code == 0, (kind, r.err)
        assert figures["batch"] == 32 and figures["train_step_ms"] > 0
        assert "forward_in_parts_ms" not in figures and "in 4 parts" not in r.out


def test_bench_batch_of_whole_sequence_quarters_times_the_parts(tmp_path):
    cfg = tmp_path / "rnn.cfg"
    cfg.write_text(RNN_CFG.format(kind="rnn", steps=8))
    r, figures = bench(cfg, tmp_path, "--batch", "32")
    assert r.code == 0, r.err
    assert figures["forward_in_parts_ms"] > 0
    assert any(line.startswith("  in 4 parts:") for line in r.out.splitlines())


def test_bench_refuses_a_given_batch_that_cuts_a_sequence(tmp_path):
    cfg = tmp_path / "rnn.cfg"
    cfg.write_text(RNN_CFG.format(kind="rnn", steps=16))
    r, _ = bench(cfg, tmp_path, "--batch", "40")
    assert r.code == 2
    assert r.err.strip().splitlines() == [
        f"darknet-py: error: {cfg}: layer 0 [rnn] runs time_steps=16: give --batch a "
        f"multiple of 16 (--batch 16 is one sequence), not 40"
    ]


def test_parts_of_whole_sequences(tmp_path):
    cfg = tmp_path / "rnn.cfg"
    cfg.write_text(RNN_CFG.format(kind="rnn", steps=8))
    for batch, part in ((8, None), (16, None), (32, 8), (40, None), (64, 16), (96, 24)):
        net = load_network(str(cfg), batch=batch, device="cpu")
        assert sequence_rows(net.layers) == 8
        assert parts_of_whole_sequences(net) == part, batch
    assert sequence_rows([layer for layer in net.layers if layer.type != "rnn"]) == 1
