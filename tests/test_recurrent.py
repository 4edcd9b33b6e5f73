"""Recurrent layers against the C Darknets (fixtures from tests/c_harness_rnn): two
inference passes (the hidden state carried between them), then one training pass and
update: every layer's output and delta, the cost, and the updated weights file."""

import glob
import os

import numpy as np
import pytest
from test_layers_gradcheck import GradCheck

from darknet_py.network import load_network

FIXTURES = sorted(
    glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "recurrent", "*.npz"))
)
TOL = 1e-4
# Layers whose backward is empty in the C CPU code (darknet-py runs the original's GPU
# backward): the fixture's deltas below them and their updated weights are not compared.
EMPTY_C_BACKWARD = ("gru",)


def fixture_ids():
    return [os.path.basename(f)[:-4] for f in FIXTURES]


def run_case(path, tmp_path, device):
    ref = np.load(path)
    cfg, weights = tmp_path / "case.cfg", tmp_path / "case.weights"
    cfg.write_bytes(ref["cfg"].tobytes())
    weights.write_bytes(ref["weights"].tobytes())
    # the fork's fixtures come from its CPU build: the "alexeyab-cpu" rules
    flavour = {"alexeyab": "alexeyab-cpu"}.get(str(ref["flavour"]), str(ref["flavour"]))
    net = load_network(str(cfg), str(weights), device=device, darknet=flavour, engine="numpy")
    return ref, net


def body(raw):
    """The floats of a weights file (header: 3 ints and a 64-bit seen)."""
    return np.frombuffer(raw.tobytes()[20:], "<f4")


def check_case(path, tmp_path, device):
    ref, net = run_case(path, tmp_path, device)
    x, y = ref["x"].reshape((-1,) + net.input_shape), ref["y"]
    np.testing.assert_allclose(net.predict(x).reshape(-1), ref["pred1"], atol=TOL, rtol=TOL)
    # the second pass starts from the state the first one left
    np.testing.assert_allclose(net.predict(x).reshape(-1), ref["pred2"], atol=TOL, rtol=TOL)
    net.train_iteration(x, y)
    empty = [l.index for l in net.layers if l.type in EMPTY_C_BACKWARD]
    compared = max(empty) + 1 if empty else 0  # the first layer whose delta is Darknet's
    for i in range(len(net.layers)):
        np.testing.assert_allclose(
            net.layer_output(i).reshape(-1),
            ref[f"out_{i}"],
            atol=TOL,
            rtol=TOL,
            err_msg=f"layer {i} output",
        )
        if i >= compared:
            np.testing.assert_allclose(
                net.layer_delta(i).reshape(-1),
                ref[f"delta_{i}"],
                atol=TOL,
                rtol=TOL,
                err_msg=f"layer {i} delta",
            )
    saved = tmp_path / "updated.weights"
    net.save_weights(str(saved))
    got, want = body(np.fromfile(saved, np.uint8)), body(ref["updated"])
    pos = 0
    for layer in net.layers:
        for name, array in layer.params():
            part = slice(pos, pos + array.size)
            pos += array.size
            if layer.index < compared:
                continue
            np.testing.assert_allclose(
                got[part],
                want[part],
                atol=TOL,
                rtol=TOL,
                err_msg=f"layer {layer.index} {name} after the update",
            )
    assert pos == want.size
    assert net.cost == pytest.approx(float(ref["cost"][0]), rel=1e-4)


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_ids())
def test_recurrent_matches_darknet_cpu(path, tmp_path):
    check_case(path, tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("path", FIXTURES, ids=fixture_ids())
def test_recurrent_matches_darknet_cuda(path, tmp_path):
    check_case(path, tmp_path, "cuda")


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_ids())
def test_recurrent_weights_round_trip(path, tmp_path):
    """Loading and saving an untrained network gives the C file back byte for byte."""
    ref, net = run_case(path, tmp_path, "cpu")
    out = tmp_path / "again.weights"
    net.save_weights(str(out))
    assert out.read_bytes() == ref["weights"].tobytes()


# ---- gradient checks (float64) of backward passes that are true gradients ------------------
class RecurrentGradCheck(GradCheck):
    """GradCheck that also checks the inner layers' updates and restarts every recurrent
    layer from a zero state before each forward (a [gru] carries its state across calls)."""

    def forward(self):
        for layer in self.net.layers:
            if hasattr(layer, "reset_state"):
                layer.reset_state()
        super().forward()

    def _inner_layers(self):
        for layer in self.net.layers:
            for inner in getattr(layer, "inner", []):
                yield f"{layer.index}.{inner.name}", inner.layer

    def analytic(self):
        for _, layer in self._inner_layers():
            for name in ("bias_updates", "weight_updates", "scale_updates"):
                if getattr(layer, name, None) is not None:
                    self.be.fill(getattr(layer, name), 0.0)
        grads = super().analytic()
        for key, layer in self._inner_layers():
            for update, param in (("bias_updates", "biases"), ("weight_updates", "weights")):
                grads[f"{key}.{param}"] = -self.be.to_host(getattr(layer, update))
        return grads

    def _array(self, key):
        parts = key.split(".")
        if len(parts) == 3:
            return getattr(dict(self._inner_layers())[f"{parts[0]}.{parts[1]}"], parts[2])
        return super()._array(key)


def recurrent_net(body, steps=3, seqs=2, inputs=4):
    return (
        f"[net]\nbatch={seqs}\ntime_steps={steps}\nwidth={inputs}\nheight=1\n"
        f"channels=1\n\n[connected]\noutput=4\nactivation=tanh\n\n{body}"
    )


@pytest.mark.parametrize("tanh", [0, 1])
def test_gru_backward_is_the_gradient(tanh):
    """The original's GPU backward_gru_layer_gpu, which darknet-py runs, is exact."""
    check = RecurrentGradCheck(recurrent_net(f"[gru]\noutput=3\ntanh={tanh}\n"))
    check.check(
        expect=["input", "0.weights"]
        + [f"1.{g}.weights" for g in ("uz", "ur", "uh", "wz", "wr", "wh")]
    )


def test_update_buffers_reach_the_inner_layers():
    """Data-parallel training combines every inner layer's updates and statistics."""
    from darknet_py.cfg import parse_cfg_text
    from darknet_py.network import Network

    net = Network(
        parse_cfg_text(recurrent_net("[rnn]\noutput=3\nbatch_normalize=1\n[gru]\noutput=2\n"))
    )
    x = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0, 1]]
    net.train_iteration(x, np.zeros((6, 2), np.float32))
    updates, statistics = net.update_buffers()
    rnn, gru = net.layers[1].inner, net.layers[2].inner
    assert len(updates) == 2 + 3 * 3 + 6 * 2 and len(statistics) == 3 * 2
    assert updates[2] is rnn[0].layer.bias_updates and statistics[0] is rnn[0].layer.rolling_mean
    assert updates[-1] is gru[-1].layer.weight_updates


def test_transposed_weights_files_transpose_the_inner_connected_layers(tmp_path):
    """Headers with a part > 1000 store [connected] weights transposed, inner ones too."""
    from darknet_py.cfg import parse_cfg_text
    from darknet_py.network import Network

    cfg = recurrent_net("[rnn]\noutput=3\n")
    net = Network(parse_cfg_text(cfg), seed=1)
    net.weights_header = (1001, 0, 0)
    path = tmp_path / "t.weights"
    net.save_weights(str(path))
    data = np.frombuffer(path.read_bytes()[16:], "<f4")  # 32-bit seen under this header
    inner = net.layers[1].inner[0].layer  # input_layer: 4 -> 3
    start = 4 + 16 + 3  # [connected] 4->4, then its biases
    stored = data[start : start + 12].reshape(inner.inputs, inner.outputs)
    assert np.array_equal(stored.T.reshape(-1), inner.weights)
    again = Network(parse_cfg_text(cfg), seed=2)
    again.load_weights(str(path))
    for (_, a), (_, b) in zip(net.layers[1].params(), again.layers[1].params()):
        assert np.array_equal(a, b)


def test_resize_keeps_the_inner_layers_parameters():
    """A [crnn] in a multi-scale (random=1) network keeps its convolutions' weights across
    resize; a [rnn] after a size-dependent input cannot be resized."""
    from darknet_py.cfg import parse_cfg_text
    from darknet_py.network import Network, NetworkError

    net = Network(
        parse_cfg_text(
            "[net]\nwidth=4\nheight=4\nchannels=2\nbatch=1\ntime_steps=2\n"
            "[crnn]\nhidden_filters=2\noutput_filters=3\n"
        )
    )
    before = [i.layer.weights for i in net.layers[0].inner]
    net.resize(6, 6)
    assert all(i.layer.weights is w for i, w in zip(net.layers[0].inner, before))
    assert net.predict(np.ones((2, 2, 6, 6), np.float32)).shape == (2, 3, 6, 6)
    rnn = Network(
        parse_cfg_text("[net]\nwidth=4\nheight=4\nchannels=1\nbatch=1\n[rnn]\noutput=3\n")
    )
    with pytest.raises(NetworkError, match="weights sized by its input"):
        rnn.resize(6, 6)
