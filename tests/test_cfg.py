"""The cfg parser: Darknet syntax, aliases, defaults, and errors that name file, line and key."""

import warnings

import pytest

from darknet_py.cfg import CfgError, CfgWarning, parse_cfg, parse_cfg_text
from darknet_py.network import Network, build_network

NET = "[net]\nbatch=2\nsubdivisions=1\nwidth=16\nheight=16\nchannels=3\n"


def build(text, path="t.cfg"):
    return Network(parse_cfg_text(text, path), path)


def error_of(text, path="t.cfg"):
    with pytest.raises(CfgError) as info:
        build(text, path)
    return info.value


def test_syntax_spaces_comments_and_aliases():
    text = (
        "# a comment\n[network]\n batch = 4 \nsubdivisions=2\nwidth= 8\nheight =8\n"
        "channels=3\n; another comment\n\n[conv]\nfilters=4\nsize=3\npad=1\n"
        "activation = leaky\n"
    )
    net = build(text)
    assert [s.type for s in parse_cfg_text(text)] == ["net", "convolutional"]
    assert net.layers[0].section.header == "conv"
    assert (net.batch, net.layers[0].activation, net.layers[0].padding) == (2, "leaky", 1)


def test_no_trailing_comments_as_in_darknet():
    # Darknet strips spaces and takes everything after '=' as the value.
    e = error_of(NET + "[conv]\nactivation=leaky # note\n")
    assert e.key == "activation" and e.line == 8 and "leaky#note" in str(e)


def test_net_batch_is_divided_by_subdivisions():
    net = build(
        NET.replace("batch=2", "batch=8").replace("subdivisions=1", "subdivisions=4")
        + "[max]\nsize=2\nstride=2\n[avg]\n[soft]\n"
    )
    assert net.batch == 2 and net.subdivisions == 4
    assert [l.type for l in net.layers] == ["maxpool", "avgpool", "softmax"]


def test_defaults_follow_darknet():
    net = build(NET + "[convolutional]\n[maxpool]\nstride=2\n")
    conv, pool = net.layers
    assert (conv.filters, conv.size, conv.stride, conv.padding, conv.activation) == (
        1,
        1,
        1,
        0,
        "logistic",
    )
    assert (pool.size, pool.stride, pool.padding) == (2, 2, 1)
    assert net.options.learning_rate == pytest.approx(0.001)
    assert net.options.momentum == pytest.approx(0.9)
    assert net.options.decay == pytest.approx(0.0001)


def test_unknown_section_names_file_and_line():
    e = error_of(NET + "\n[convolution]\nfilters=2\n", "my.cfg")
    assert e.line == 8 and "my.cfg:8" in str(e) and "unknown section [convolution]" in str(e)


def test_unsupported_darknet_section_is_called_so():
    e = error_of(NET + "[contrastive]\nclasses=4\n")
    assert "does not support" in str(e) and e.line == 7


def test_malformed_lines():
    assert "expected key=value" in str(error_of(NET + "[conv]\nfilters 4\n"))
    assert "malformed section header" in str(error_of(NET + "[conv\n"))
    assert "before the first" in str(error_of("batch=1\n" + NET))


def test_wrong_type_names_key_and_line():
    e = error_of(NET + "[conv]\nfilters=four\n")
    assert (e.line, e.key) == (8, "filters") and "expected an integer, got 'four'" in str(e)
    e = error_of(NET.replace("batch=2", "batch=2") + "[conv]\n[soft]\ntemperature=hot\n")
    assert e.key == "temperature" and "expected a number" in str(e)
    e = error_of(NET + "[conv]\n[route]\nlayers=-1,x\n")
    assert e.key == "layers" and e.line == 9


def test_unknown_activation_is_an_error_not_relu():
    e = error_of(NET + "[conv]\nactivation=swishy\n")
    assert e.key == "activation" and "unknown activation 'swishy'" in str(e)


def test_route_and_shortcut_index_out_of_range():
    e = error_of(NET + "[conv]\nfilters=2\n[route]\nlayers=-3\n")
    assert e.key == "layers" and e.line == 10 and "out of range" in str(e)
    e = error_of(NET + "[conv]\nfilters=2\n[route]\nlayers=1\n")
    assert "out of range" in str(e)


def test_unknown_option_warns_with_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(NET + "[conv]\nfilters=2\nfilter_size=3\n")
    messages = [str(w.message) for w in caught if issubclass(w.category, CfgWarning)]
    assert any("t.cfg:9: filter_size" in m for m in messages), messages


def test_first_section_must_be_net():
    e = error_of("[conv]\nfilters=1\n")
    assert "first section must be [net]" in str(e)


def test_missing_input_size():
    e = error_of("[net]\nbatch=1\n[conv]\n")
    assert "no input size" in str(e)


def test_steps_policy_needs_matching_scales():
    e = error_of(NET + "policy=steps\nsteps=10,20\nscales=.1\n[conv]\n")
    assert e.key == "scales" and "2 steps but 1 scale" in str(e)


def test_missing_file():
    with pytest.raises(CfgError) as info:
        parse_cfg("/nonexistent/x.cfg")
    assert "/nonexistent/x.cfg" in str(info.value) and "not found" in str(info.value)


def test_groups_must_divide_channels():
    e = error_of(NET + "[conv]\nfilters=4\ngroups=2\n")
    assert e.key == "groups" and "must divide" in str(e)


def test_build_network_allocates_nothing(tmp_path):
    cfg = tmp_path / "x.cfg"
    cfg.write_text(NET + "[conv]\nfilters=4\n")
    assert build_network(cfg).layers[0].output is None
    sections = parse_cfg_text(NET + "[conv]\nfilters=4\nsize=3\nstride=2\npad=1\n")
    built = Network(sections, "t.cfg", allocate=False)
    layer = built.layers[0]
    assert layer.output is None
    assert (layer.out_c, layer.out_h, layer.out_w) == (4, 8, 8)
    # 2 * filters * size^2 * c * out_h * out_w
    assert layer.bflops == pytest.approx(2 * 4 * 9 * 3 * 8 * 8 / 1e9)


def test_numbers_are_read_as_atoi_and_atof_read_them_with_a_warning():
    text = NET + (
        "[conv]\nfilters=40#32\nsize=3\npad=1\n[conv]\nfilters=8\n"
        "[route]\nlayers=-1,0###P6\n[soft]\ntemperature=1.5x\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = build(text)
    assert net.layers[0].filters == 40
    assert net.layers[2].out_c == 40 + 8  # route of layers -1 and 0
    messages = [str(w.message) for w in caught if issubclass(w.category, CfgWarning)]
    assert "t.cfg:8: filters: '40#32' read as 40" in messages[0]
    assert "t.cfg:14: layers: '-1,0###P6' read as 0" in messages[1]
    assert "t.cfg:16: temperature: '1.5x' read as 1.5" in messages[2]


@pytest.mark.parametrize(
    "value, words",
    [
        ("inf", "finite"),
        ("-inf", "finite"),
        ("nan", "finite"),
        ("1e400", "finite"),
        ("2147483648", "out of range"),
        ("4.5", "expected an integer"),
        ("abc", "expected an integer"),
    ],
)
def test_numbers_that_mean_nothing_are_errors_naming_the_line(value, words):
    e = error_of(NET + f"[conv]\nfilters={value}\n")
    assert (e.line, e.key) == (8, "filters") and words in str(e)


def test_a_utf8_byte_order_mark_is_accepted_and_sizes_below_1_name_their_line(tmp_path):
    path = tmp_path / "bom.cfg"
    path.write_bytes(("\ufeff" + NET + "[conv]\nfilters=2\n").encode("utf-8"))
    assert build_network(path).layers[0].filters == 2
    e = error_of(NET.replace("channels=3", "channels=0") + "[conv]\n")
    assert (e.line, e.key) == (6, "channels") and "at least 1" in str(e)
