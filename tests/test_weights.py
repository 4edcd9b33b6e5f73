"""Darknet .weights I/O: exact bytes, header versions, sizes, cutoffs."""

import struct
from pathlib import Path

import numpy as np
import pytest

from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network
from darknet_py.weights import WeightsError, floats_needed, load_weights, save_weights

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(), reason=f"Darknet fixtures not found at {FIXTURES}"
)

CFG = """[net]
batch=1
width=6
height=6
channels=2
[convolutional]
batch_normalize=1
filters=3
size=3
pad=1
activation=leaky
[convolutional]
filters=2
size=1
activation=linear
[connected]
output=5
activation=linear
"""
# conv0: 3 biases + 3*3 BN + 2*3*9 weights = 66; conv1: 2 + 3*2 = 8; conn: 5 + 72*5 = 365
NEEDED = 66 + 8 + 365


def make_net(seed=0):
    return Network(parse_cfg_text(CFG, "w.cfg"), "w.cfg", seed=seed)


def write_file(path, floats, major=0, minor=2, revision=0, seen=7):
    seen_64 = (major * 10 + minor) >= 2 and major < 1000 and minor < 1000
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", major, minor, revision))
        f.write(struct.pack("<Q" if seen_64 else "<i", seen))
        f.write(np.asarray(floats, dtype="<f4").tobytes())


def test_floats_needed_matches_darknet_layout():
    assert floats_needed(make_net()) == NEEDED
    assert floats_needed(make_net(), cutoff=1) == 66


def test_save_then_load_gives_identical_bytes(tmp_path):
    src = tmp_path / "a.weights"
    rng = np.random.default_rng(1)
    write_file(src, rng.standard_normal(NEEDED), seen=123456789012)
    net = make_net()
    load_weights(net, src)
    assert net.seen == 123456789012
    out = tmp_path / "b.weights"
    save_weights(net, out)
    assert out.read_bytes() == src.read_bytes()


def test_values_land_in_darknet_order(tmp_path):
    src = tmp_path / "a.weights"
    write_file(src, np.arange(NEEDED))
    net = make_net()
    load_weights(net, src)
    conv = net.layers[0]
    be = net.be
    assert be.to_host(conv.biases).tolist() == [0, 1, 2]
    assert be.to_host(conv.scales).tolist() == [3, 4, 5]
    assert be.to_host(conv.rolling_mean).tolist() == [6, 7, 8]
    assert be.to_host(conv.rolling_variance).tolist() == [9, 10, 11]
    assert be.to_host(conv.weights)[0] == 12
    conn = net.layers[2]
    assert be.to_host(conn.biases).tolist() == [74, 75, 76, 77, 78]
    assert be.to_host(conn.weights)[0] == 79


@pytest.mark.parametrize("major,minor,header_bytes", [(0, 1, 16), (0, 2, 20), (1, 0, 20)])
def test_seen_width_depends_on_version(tmp_path, major, minor, header_bytes):
    src = tmp_path / "v.weights"
    write_file(src, np.ones(NEEDED), major=major, minor=minor, seen=42)
    assert src.stat().st_size == header_bytes + 4 * NEEDED
    net = make_net()
    load_weights(net, src)
    assert net.seen == 42
    out = tmp_path / "o.weights"
    save_weights(net, out)
    assert out.read_bytes() == src.read_bytes()


def test_transposed_connected_format(tmp_path):
    rng = np.random.default_rng(2)
    plain = rng.standard_normal(NEEDED).astype(np.float32)
    conn_w = plain[74 + 5 :].reshape(5, 72)  # outputs x inputs, as Darknet holds it
    transposed = plain.copy()
    transposed[74 + 5 :] = conn_w.T.reshape(-1)  # the old format stores inputs x outputs
    a, b = tmp_path / "plain.weights", tmp_path / "old.weights"
    write_file(a, plain)
    write_file(b, transposed, major=0, minor=1001)
    n1, n2 = make_net(), make_net()
    load_weights(n1, a)
    load_weights(n2, b)
    np.testing.assert_array_equal(
        n1.be.to_host(n1.layers[2].weights), n2.be.to_host(n2.layers[2].weights)
    )


@pytest.mark.parametrize("count,word", [(NEEDED - 1, "fewer"), (NEEDED + 3, "more")])
def test_wrong_size_says_both_counts(tmp_path, count, word):
    src = tmp_path / "bad.weights"
    write_file(src, np.ones(count))
    with pytest.raises(WeightsError) as info:
        load_weights(make_net(), src)
    msg = str(info.value)
    assert f"has {count} floats" in msg and f"needs {NEEDED}" in msg and word in msg
    assert str(src) in msg


def test_cutoff_loads_a_prefix_and_allows_longer_files(tmp_path):
    src = tmp_path / "a.weights"
    write_file(src, np.arange(NEEDED))
    net = make_net()
    load_weights(net, src, cutoff=2)
    assert net.be.to_host(net.layers[1].biases).tolist() == [66, 67]
    part = tmp_path / "part.weights"
    save_weights(net, part, cutoff=1)
    assert part.stat().st_size == 20 + 4 * 66


def test_partial_backbone_on_layer_boundary(tmp_path):
    src = tmp_path / "backbone.weights"
    write_file(src, np.arange(66 + 8))
    net = make_net()
    with pytest.raises(WeightsError):
        load_weights(net, src)
    assert load_weights(net, src, allow_partial=True) == 2
    write_file(src, np.arange(70))
    with pytest.raises(WeightsError, match="layer boundary"):
        load_weights(net, src, allow_partial=True)


def test_missing_and_truncated_files(tmp_path):
    with pytest.raises(WeightsError, match="not found"):
        load_weights(make_net(), tmp_path / "none.weights")
    short = tmp_path / "short.weights"
    short.write_bytes(b"\0" * 5)
    with pytest.raises(WeightsError, match="header"):
        load_weights(make_net(), short)


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    out = tmp_path / "net.weights"
    out.write_bytes(b"old")
    save_weights(make_net(), out)
    assert out.stat().st_size == 20 + 4 * NEEDED
    assert [p.name for p in tmp_path.iterdir()] == ["net.weights"]


@needs_fixtures
@pytest.mark.parametrize("name", ["p1_classifier", "p2_tinyyolo"])
def test_fixture_weights_round_trip(tmp_path, name):
    import darknet_py as dn

    src = FIXTURES / name / f"{name}.weights"
    net = dn.load_network(FIXTURES / name / f"{name}.cfg", src)
    out = tmp_path / "copy.weights"
    net.save_weights(out)
    assert out.read_bytes() == src.read_bytes()


def test_nan_and_inf_weights_load_with_a_warning_naming_the_layer(tmp_path):
    from darknet_py.weights import WeightsWarning

    values = np.ones(NEEDED, dtype=np.float32)
    values[66 + 3] = np.nan  # layer 1: its 2 biases, then its weights
    values[66 + 8 + 10] = np.inf  # the connected layer
    path = tmp_path / "bad.weights"
    write_file(path, values)
    with pytest.warns(WeightsWarning) as caught:
        load_weights(make_net(), path)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "layer 1 [convolutional] weights: 1 of 6 values is NaN or infinite" in messages[0]
    assert "layer 2 [connected]" in messages[1] and str(path) in messages[1]


@pytest.mark.parametrize(
    "body, words",
    [(13 - 12, "header"), (19 - 12, "header"), (4 * NEEDED + 2, "not a whole number of floats")],
)
def test_header_and_body_sizes_are_checked_before_reading(tmp_path, body, words):
    path = tmp_path / "cut.weights"
    path.write_bytes(struct.pack("<3i", 0, 2, 0) + bytes(body))
    with pytest.raises(WeightsError, match=words):
        load_weights(make_net(), path)
