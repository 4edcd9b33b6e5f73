"""The C Darknets' stock recurrent cfgs build with the C code's shapes and weights sizes."""

import os

import pytest

from darknet_py.cfg import parse_cfg
from darknet_py.network import build_network, load_network, parse_net_options
from darknet_py.weights import floats_needed

STOCK = os.path.join(os.path.dirname(__file__), "fixtures", "recurrent", "stock")


def connected_floats(inputs, outputs, bn):
    return outputs + inputs * outputs + (3 * outputs if bn else 0)


def rnn_floats(inputs, hidden, outputs, bn):
    """make_rnn_layer's three connected layers, as save_weights writes them."""
    return (
        connected_floats(inputs, hidden, bn)
        + connected_floats(hidden, hidden, bn)
        + connected_floats(hidden, outputs, bn)
    )


# cfg -> (flavour, [(type, inputs, outputs)], time_steps, rows per pass)
CASES = {
    "orig-rnn.cfg": (
        "original",
        [("rnn", 256, 1024)] * 1
        + [("rnn", 1024, 1024)] * 2
        + [("connected", 1024, 256), ("softmax", 256, 256)],
        1,
        1,
    ),
    "orig-rnn.train.cfg": (
        "original",
        [("rnn", 256, 1024)]
        + [("rnn", 1024, 1024)] * 2
        + [("connected", 1024, 256), ("softmax", 256, 256)],
        576,
        128 * 576,
    ),
    "fork-rnn.cfg": (
        "alexeyab",
        [("rnn", 256, 1024)]
        + [("rnn", 1024, 1024)] * 2
        + [("connected", 1024, 256), ("softmax", 256, 256), ("cost", 256, 256)],
        1,
        1,
    ),
    "fork-rnn.train.cfg": (
        "alexeyab",
        [("rnn", 256, 1024)]
        + [("rnn", 1024, 1024)] * 2
        + [("connected", 1024, 256), ("softmax", 256, 256), ("cost", 256, 256)],
        576,
        128 * 576 // 8,
    ),
}


GRU_LAYERS = [("gru", 256, 256)] * 3 + [("connected", 256, 256), ("softmax", 256, 256)]
CASES["orig-gru.cfg"] = ("original", GRU_LAYERS, 1, 1)
CASES["fork-gru.cfg"] = (
    "alexeyab",
    [("gru", 256, 1024)]
    + [("gru", 1024, 1024)] * 2
    + [("connected", 1024, 256), ("softmax", 256, 256), ("cost", 256, 256)],
    1,
    1,
)

CASES["fork-lstm.train.cfg"] = (
    "alexeyab",
    [("lstm", 256, 1024)]
    + [("lstm", 1024, 1024)] * 2
    + [("connected", 1024, 256), ("softmax", 256, 256), ("cost", 256, 256)],
    576,
    128 * 576 // 8,
)

CASES["fork-crnn.train.cfg"] = (
    "alexeyab",
    [("connected", 256, 256), ("crnn", 256, 1024)]
    + [("crnn", 1024, 1024)] * 2
    + [("connected", 1024, 256), ("softmax", 256, 256), ("cost", 256, 256)],
    576,
    128 * 576 // 8,
)


@pytest.mark.parametrize("name", sorted(CASES))
def test_stock_rnn_cfgs_build_with_darknets_shapes(name):
    flavour, layers, steps, rows = CASES[name]
    net = build_network(os.path.join(STOCK, name), darknet=flavour)
    assert [(l.type, l.inputs, l.outputs) for l in net.layers] == layers
    options = parse_net_options(parse_cfg(os.path.join(STOCK, name))[0])
    assert options.time_steps == steps and options.batch == rows  # Darknet's net->batch
    first = next(l for l in net.layers if hasattr(l, "steps"))
    assert (first.steps, first.hidden) == (steps, first.outputs)


def test_stock_rnn_cfg_weights_size():
    net = load_network(os.path.join(STOCK, "orig-rnn.cfg"), device="cpu", darknet="original")
    want = (
        rnn_floats(256, 1024, 1024, True)
        + 2 * rnn_floats(1024, 1024, 1024, True)
        + connected_floats(1024, 256, False)
    )
    assert floats_needed(net) == want


def test_stock_gru_cfg_runs_and_trains_with_adam():
    """gru.cfg has adam=1: it runs (inference) and trains (tests/test_adam.py has Adam's
    arithmetic; here the stock network learns a repeated next character)."""
    import numpy as np

    net = load_network(os.path.join(STOCK, "orig-gru.cfg"), device="cpu")
    # six connected layers per [gru] (no batch norm), then the [connected]
    assert floats_needed(net) == 3 * 6 * connected_floats(256, 256, False) + connected_floats(
        256, 256, False
    )
    x = np.eye(256, dtype=np.float32)[[72]]
    first, second = net.predict(x).copy(), net.predict(x)
    assert abs(first.sum() - 1) < 1e-5 and not np.allclose(first, second)  # state carried
    truth = np.eye(256, dtype=np.float32)[[105]]
    losses = [net.train_iteration(x, truth) for _ in range(8)]
    assert net.adam is not None and net.adam.updates == 8
    assert losses[-1] < losses[0] * 0.5, losses


def test_conv_lstm_is_the_forks(tmp_path):
    from darknet_py.cfg import CfgError

    cfg = tmp_path / "c.cfg"
    cfg.write_text(
        "[net]\nwidth=4\nheight=4\nchannels=2\nbatch=1\ntime_steps=2\n"
        "[conv_lstm]\noutput=2\npad=1\npeephole=1\n"
    )
    net = build_network(str(cfg))
    assert net.darknet == "alexeyab"  # detected from the section
    assert [i.name for i in net.layers[0].inner] == [
        "vf",
        "vi",
        "vo",
        "wf",
        "wi",
        "wg",
        "wo",
        "uf",
        "ui",
        "ug",
        "uo",
    ]
    with pytest.raises(CfgError, match="use --darknet alexeyab"):
        build_network(str(cfg), darknet="original")
    cfg.write_text(cfg.read_text() + "bottleneck=1\n")
    with pytest.raises(CfgError, match="bottleneck"):
        build_network(str(cfg))
