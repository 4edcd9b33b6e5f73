"""ONNX export (darknet_py/export): every stock cfg of both Darknets that darknet-py runs,
exported with random weights at a small input size, passes onnx.checker and gives in ONNX
Runtime what darknet-py's own forward gives (within 1e-4 of each output's largest value);
the layer functions one by one on options the stock cfgs do not reach; --decode against
the heads' own detections. Skipped, with the reason, where onnx/onnxruntime are missing."""

import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.network import Network

onnx = pytest.importorskip(
    "onnx", reason="the onnx extra is not installed (pip install 'darknet-cfg-runner[onnx]')"
)
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

from darknet_py.export import ExportError  # noqa: E402
from darknet_py.export.check import (  # noqa: E402
    CHECK_TOLERANCE,
    compare,
    relative_difference,
    session,
)
from darknet_py.export.model import export_model  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SIZES = (32, 64, 96, 128, 160, 224, 256)  # the first input size the network builds at
# Left out for time unless DARKNET_TEST_ALL_CFGS=1 (as tests/test_fold_stock_cfgs.py):
# networks with more parameters than this or more BFLOPs at the size they run (YOLOv1,
# VGG-16, the P6/P7 networks). All of them passed when this test was written.
EVERY_CFG = os.environ.get("DARKNET_TEST_ALL_CFGS", "") not in ("", "0")
MAX_WEIGHTS = float("inf") if EVERY_CFG else 1e9
MAX_BFLOPS = float("inf") if EVERY_CFG else 1.0


def _cfgs():
    files = [
        f for d in ("darknet-cfg", "darknet-cfg-ab") for f in sorted((SHARED / d).glob("*.cfg"))
    ]
    texts = {f.read_text() for f in files if f.parent.name == "darknet-cfg"}
    files = [f for f in files if f.parent.name == "darknet-cfg" or f.read_text() not in texts]
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no stock cfgs in {SHARED}"))]
    return [pytest.param(f, id=f"{f.parent.name}/{f.name}") for f in files]


def network_from_text(text, path="<cfg>", size=None, allocate=True, batch=1):
    if size is not None:
        text = re.sub(r"(?m)^\s*width\s*=\s*\d+", f"width={size}", text)
        text = re.sub(r"(?m)^\s*height\s*=\s*\d+", f"height={size}", text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Network(
            parse_cfg_text(text, str(path)),
            str(path),
            batch=batch,
            allocate=allocate,
            random_init=False,
        )


def randomize(net, rng):
    """Random parameters, cheaply (slices of one random pool), weights scaled by
    1/sqrt(fan-in) and batch norm given a positive variance, so values stay in range."""
    pool = rng.standard_normal(1 << 20).astype(np.float32)
    for layer in net.layers:
        for name, arr in layer.params():
            values = np.resize(np.roll(pool, -int(rng.integers(0, pool.size))), arr.size)
            if name == "weights":
                values = values * (1.0 / np.sqrt(max(1, arr.size // max(1, layer.out_c))))
            elif name == "rolling_variance":
                values = 0.5 + np.abs(values)
            elif name == "scales":
                values = 1.0 + 0.2 * values
            else:
                values = 0.1 * values
            net.be.write(arr, values)
    net.params_changed()


def small_network(text, path):
    """The network at the first input size it builds at (its own with connected or local
    layers, which fix the input size), or None where darknet-py refuses the cfg."""
    try:
        shapes = network_from_text(text, path, allocate=False)
    except CfgError:
        return None
    size = None
    if not any(layer.type in ("connected", "local") for layer in shapes.layers):
        for size in SIZES:
            try:
                network_from_text(text, path, size, allocate=False)
                break
            except CfgError:
                continue
    shapes = network_from_text(text, path, size, allocate=False)
    if sum(getattr(layer, "nweights", 0) for layer in shapes.layers) > MAX_WEIGHTS:
        pytest.skip("too many parameters for a quick test (DARKNET_TEST_ALL_CFGS=1 runs it)")
    if shapes.bflops > MAX_BFLOPS:
        pytest.skip(
            f"{shapes.bflops:.1f} BFLOPs at its smallest size: too slow for a quick "
            f"test (DARKNET_TEST_ALL_CFGS=1 runs it)"
        )
    return network_from_text(text, path, size)


def assert_exports_exactly(net, seed=1, batch=1, **options):
    """Export (dynamic batch), onnx.checker, and ONNX Runtime against net.predict on a
    random batch."""
    rng = np.random.default_rng(seed)
    randomize(net, rng)
    model = export_model(net, batch=None, **options)
    onnx.checker.check_model(model)
    x = rng.random((batch,) + net.input_shape, dtype=np.float32)
    differences = compare(net, session(model.SerializeToString()), x)
    for name, diff in differences.items():
        assert diff < CHECK_TOLERANCE, f"{name}: {diff:.2e}"
    return model


@pytest.mark.parametrize("path", _cfgs())
def test_stock_cfg_exports_and_ort_equals_forward(path):
    net = small_network(path.read_text(), path)
    if net is None:
        pytest.skip("darknet-py refuses this cfg")
    assert_exports_exactly(net)


# ---- the layer functions on options the stock cfgs leave out -----------------------------------
def cfg(net, *sections, flavour=None):
    text = "[net]\n" + net + "\n" + "\n".join(sections)
    n = network_from_text(text, batch=2)
    if flavour is not None:
        assert n.darknet == flavour
    return n


def conv(filters, size=3, stride=1, activation="leaky", extra=""):
    return (
        f"[convolutional]\nbatch_normalize=1\nfilters={filters}\nsize={size}\n"
        f"stride={stride}\npad=1\nactivation={activation}\n{extra}\n"
    )


ACTIVATIONS = (
    "logistic",
    "relu",
    "relie",
    "linear",
    "ramp",
    "tanh",
    "plse",
    "leaky",
    "elu",
    "loggy",
    "stair",
    "hardtan",
    "lhtan",
    "selu",
    "relu6",
    "revleaky",
    "gelu",
    "swish",
    "mish",
    "hard_mish",
    "normalize_channels",
    "normalize_channels_softmax",
    "normalize_channels_softmax_maxval",
)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation(activation):
    # a wide input range (weights scaled up) reaches every branch (plse's +-4, mish's +-20)
    net = cfg(
        "width=12\nheight=10\nchannels=3",
        "[convolutional]\nfilters=6\nsize=3\nstride=1\npad=1\nactivation=linear",
        f"[convolutional]\nfilters=5\nsize=1\nstride=1\nactivation={activation}",
    )
    rng = np.random.default_rng(2)
    randomize(net, rng)
    spread = 3 if activation.startswith("normalize_channels") else 30  # exp() overflows
    net.be.write(net.layers[0].weights, spread * rng.standard_normal(net.layers[0].nweights))
    net.params_changed()
    model = export_model(net, batch=None)
    x = rng.random((2,) + net.input_shape, dtype=np.float32)
    differences = compare(net, session(model.SerializeToString()), x)
    assert differences["output"] < CHECK_TOLERANCE, differences


CASES = {
    # convolutions: groups, dilation, the fork's stride_x/stride_y, share_index
    "conv_groups_dilation": (
        "width=20\nheight=18\nchannels=4",
        conv(8, extra="groups=2\ndilation=2"),
        conv(6, size=1),
    ),
    "conv_stride_xy": (
        "width=20\nheight=18\nchannels=3",
        conv(3, extra="stride_x=2\nstride_y=1"),
        conv(3, extra="share_index=-1"),
    ),
    "conv_no_bn_stride": (
        "width=17\nheight=15\nchannels=3",
        "[convolutional]\nfilters=5\nsize=3\nstride=2\npad=0\nactivation=leaky",
    ),
    # pooling: Darknet's padding (stride 1 and odd sizes), maxpool_depth, local_avgpool
    "maxpool_stride1": (
        "width=13\nheight=11\nchannels=3",
        conv(4),
        "[maxpool]\nsize=2\nstride=1",
        "[maxpool]\nsize=3\nstride=2",
        "[maxpool]\nsize=5\nstride=1\npadding=4",
    ),
    "maxpool_xy_depth": (
        "width=16\nheight=12\nchannels=3",
        conv(7),
        "[maxpool]\nsize=2\nstride_x=2\nstride_y=1",
        "[maxpool]\nmaxpool_depth=1\nout_channels=3",
    ),
    "maxpool_padding_big": (
        "width=9\nheight=9\nchannels=3",
        conv(4),
        "[maxpool]\nsize=2\nstride=2\npadding=4",
    ),
    "local_avgpool": (
        "width=13\nheight=11\nchannels=3",
        conv(4),
        "[local_avgpool]\nsize=3\nstride=2",
        "[avgpool]",
    ),
    # moving values
    "route_groups": (
        "width=8\nheight=8\nchannels=3",
        conv(8),
        conv(4),
        "[route]\nlayers=-1,-2\ngroups=2\ngroup_id=1",
        conv(3),
    ),
    "shortcut_original_sizes": (
        "width=16\nheight=16\nchannels=3",
        conv(6),
        conv(4, stride=2),
        "[shortcut]\nfrom=-2\nalpha=0.5\nbeta=2\nactivation=leaky",
        conv(8, stride=2),
        "[upsample]\nstride=4",
        "[shortcut]\nfrom=-4\nactivation=linear",
    ),
    "shortcut_original_sample": (
        "width=16\nheight=16\nchannels=3",
        conv(5, stride=2),
        conv(6),
        "[upsample]\nstride=2",
        "[shortcut]\nfrom=-3\nalpha=0.7",
    ),
    "shortcut_fork_weighted": (
        "width=8\nheight=8\nchannels=3",
        conv(6),
        conv(4),
        conv(6),
        "[shortcut]\nfrom=-2,-3\nweights_type=per_channel\n"
        "weights_normalization=softmax\nactivation=mish",
        "[shortcut]\nfrom=-4\nweights_type=per_feature\nweights_normalization=relu",
    ),
    "upsample_scale_reverse": (
        "width=10\nheight=10\nchannels=3",
        conv(4),
        "[upsample]\nstride=2\nscale=0.5",
        "[upsample]\nstride=-4\nscale=0.3",
    ),
    "reorg_original": (
        "width=12\nheight=12\nchannels=4",
        conv(8),
        "[reorg]\nstride=2",
        conv(4),
        "[reorg]\nstride=2\nreverse=1",
        "[reorg]\nflatten=1",
        "[reorg]\nflatten=1\nreverse=1",
        "[reorg]\nextra=5",
    ),
    "reorg3d": ("width=12\nheight=12\nchannels=3", conv(4), "[reorg3d]\nstride=2", conv(5)),
    "crop_dropout_softmax": (
        "width=14\nheight=12\nchannels=3",
        "[crop]\ncrop_height=10\ncrop_width=9",
        conv(6),
        "[dropout]\nprobability=0.3",
        "[avgpool]",
        "[softmax]\ngroups=2\ntemperature=2",
    ),
    "connected_bn_batchnorm_local": (
        "width=9\nheight=9\nchannels=3",
        conv(4),
        "[batchnorm]",
        "[local]\nsize=3\nstride=1\npad=1\nfilters=3\nactivation=leaky",
        "[connected]\noutput=7\nbatch_normalize=1\nactivation=relu",
        "[connected]\noutput=5\nactivation=linear",
        "[softmax]",
        "[cost]",
    ),
    "sam_scale_channels_empty": (
        "width=8\nheight=8\nchannels=3",
        conv(6),
        conv(6, activation="logistic"),
        "[sam]\nfrom=-2",
        "[empty]",
        "[avgpool]",
        conv(6, size=1),
        "[scale_channels]\nfrom=-3",
        conv(1, size=1, activation="logistic"),
        "[scale_channels]\nfrom=-2\nscale_wh=1",
    ),
    # heads
    "region_softmax": (
        "width=8\nheight=8\nchannels=3",
        conv(2 * (5 + 3), size=1, activation="linear"),
        "[region]\nanchors=1,1,2,3\nclasses=3\nnum=2\nsoftmax=1",
    ),
    "yolo_scale_xy_new_coords": (
        "width=8\nheight=8\nchannels=3",
        conv(2 * 8, size=1, activation="linear"),
        "[yolo]\nmask=0,1\nanchors=2,3,4,5,6,7\nnum=3\nclasses=3\nscale_x_y=1.1",
        "[route]\nlayers=-2",
        conv(2 * 8, size=1, activation="logistic"),
        "[yolo]\nmask=1,2\nanchors=2,3,4,5,6,7\nnum=3\nclasses=3\nnew_coords=1\nscale_x_y=2.0",
    ),
    "gaussian_yolo": (
        "width=8\nheight=8\nchannels=3",
        conv(2 * 12, size=1, activation="linear"),
        "[Gaussian_yolo]\nmask=0,1\nanchors=2,3,4,5\nnum=2\nclasses=3\nscale_x_y=1.05",
    ),
    "detection_v1": (
        "width=14\nheight=14\nchannels=3",
        conv(4, stride=2),
        "[connected]\noutput=" + str(2 * 2 * (2 * 5 + 3)) + "\nactivation=linear",
        "[detection]\nclasses=3\ncoords=4\nrescore=1\nside=2\nnum=2\nsoftmax=1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_options(case):
    assert_exports_exactly(cfg(*CASES[case]), batch=2)


# ---- --decode, --nms, fp16 --------------------------------------------------------------------
def run_model(model, x):
    sess = session(model.SerializeToString())
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"input": x})))


@pytest.mark.parametrize("case", ["region_softmax", "yolo_scale_xy_new_coords"])
def test_decode_gives_the_heads_detections(case):
    """boxes and scores against each head's own detections() (thresh 0, boxes relative to
    the network input), image by image, in Darknet's order."""
    net = cfg(*CASES[case])
    rng = np.random.default_rng(3)
    randomize(net, rng)
    x = rng.random((2,) + net.input_shape, dtype=np.float32)
    got = run_model(export_model(net, batch=None, decode=True), x)
    net.predict(x)
    c, neth, netw = net.input_shape
    for b in range(2):
        dets = []
        for layer in (l for l in net.layers if l.type in ("yolo", "region")):
            out = net.layer_output(layer.index)[b].reshape(-1)
            dets += layer.detections(out, netw, neth, netw, neth, 0.0, relative=True, letter=False)
        boxes = np.array([d.box for d in dets])
        scores = np.array([d.probs for d in dets])
        assert got["boxes"].shape[1:] == boxes.shape and got["scores"].shape[1:] == scores.shape
        assert relative_difference(got["boxes"][b], boxes) < CHECK_TOLERANCE
        assert relative_difference(got["scores"][b], scores) < CHECK_TOLERANCE


def test_nms_keeps_what_darknets_default_nms_keeps():
    from darknet_py.boxes import do_nms_sort

    net = cfg(*CASES["yolo_scale_xy_new_coords"])
    rng = np.random.default_rng(4)
    randomize(net, rng)
    x = rng.random((1,) + net.input_shape, dtype=np.float32)
    got = run_model(export_model(net, batch=1, nms=True, thresh=0.3, nms_thresh=0.45), x)
    net.predict(x)
    c, neth, netw = net.input_shape
    dets = []
    for layer in (l for l in net.layers if l.type == "yolo"):
        dets += layer.detections(
            net.layer_output(layer.index)[0].reshape(-1),
            netw,
            neth,
            netw,
            neth,
            0.3,
            relative=True,
            letter=False,
        )
    do_nms_sort(dets, 3, 0.45)
    kept = {
        (int(k), tuple(np.round(np.float64(d.box), 3)))
        for d in dets
        for k in np.flatnonzero(d.probs > 0.3)
    }
    boxes = got["boxes"][0]
    selected = {(int(k), tuple(np.round(np.float64(boxes[i]), 3))) for _, k, i in got["selected"]}
    assert kept and selected == kept


def test_fp16_export_is_within_its_measured_error():
    net = cfg(*CASES["route_groups"])
    rng = np.random.default_rng(5)
    randomize(net, rng)
    model = export_model(net, batch=None, precision="fp16")
    onnx.checker.check_model(model)
    x = rng.random((2,) + net.input_shape, dtype=np.float32)
    try:
        sess = session(model.SerializeToString())
    except Exception as e:  # an ONNX Runtime build without fp16 CPU kernels
        pytest.skip(f"ONNX Runtime cannot run fp16 on this CPU: {str(e)[:100]}")
    assert compare(net, sess, x)["output"] < 2e-2


def test_refused_layers_and_options_say_which():
    net = cfg(
        "width=9\nheight=9\nchannels=3", conv(4), "[local_avgpool]\nsize=2\nstride=2\npadding=4"
    )
    with pytest.raises(ExportError, match=r"layer 1 \[local_avgpool\]: padding=4"):
        export_model(net)
    gaussian = cfg(*CASES["gaussian_yolo"])
    with pytest.raises(ExportError, match=r"layer 1 \[gaussian_yolo\]: --decode covers"):
        export_model(gaussian, decode=True)
    diou = cfg(
        "width=8\nheight=8\nchannels=3",
        conv(16, size=1, activation="linear"),
        "[yolo]\nmask=0,1\nanchors=2,3,4,5\nnum=2\nclasses=3\nnms_kind=diounms",
    )
    with pytest.raises(ExportError, match="nms_kind=diounms compares DIoU"):
        export_model(diou, nms=True)
    with pytest.raises(ExportError, match="need a detector"):
        export_model(cfg(*CASES["local_avgpool"]), decode=True)


@pytest.mark.parametrize("opset", [13, 18, "newest"])
def test_opsets_from_13_to_the_newest(opset):
    """Reductions moved their axes from attribute to input at 13 and 18."""
    opset = onnx.defs.onnx_opset_version() if opset == "newest" else opset
    net = cfg(
        *CASES["maxpool_xy_depth"][:-1],
        "[maxpool]\nmaxpool_depth=1\nout_channels=3",
        "[convolutional]\nfilters=4\nsize=1\nactivation=normalize_channels_softmax_maxval",
    )
    assert_exports_exactly(net, batch=2, opset=opset)
    with pytest.raises(ExportError, match="--opset 12: use 13"):
        export_model(net, opset=12)


def test_class_trees_export_their_softmax_per_group(tmp_path):
    """[softmax] and [region] with tree= (tests/fixtures/tree/small.tree, 15 classes):
    the raw outputs equal darknet-py's; --decode, which cannot walk a tree, is refused."""
    import shutil

    shutil.copy(Path(__file__).parent / "fixtures" / "tree" / "small.tree", tmp_path)
    softmax = network_from_text(
        "[net]\nwidth=1\nheight=1\nchannels=15\n[softmax]\ntemperature=2\ntree=small.tree\n",
        tmp_path / "s.cfg",
    )
    assert softmax.hierarchy is not None
    assert_exports_exactly(softmax, batch=2)
    region = network_from_text(
        "[net]\nwidth=8\nheight=8\nchannels=3\n"
        "[convolutional]\nfilters=40\nsize=3\nstride=2\npad=1\n"
        "activation=linear\n[region]\nanchors=1,1,2,2\nclasses=15\n"
        "coords=4\nnum=2\nsoftmax=1\ntree=small.tree\n",
        tmp_path / "r.cfg",
    )
    assert region.layers[-1].hierarchy is not None
    assert_exports_exactly(region, batch=2)
    with pytest.raises(ExportError, match=r"--decode cannot walk a class tree"):
        export_model(region, batch=None, decode=True)


@pytest.mark.parametrize(
    "section",
    [
        "[activation]\nactivation=mish",
        "[logistic]",
        "[l2norm]",
        "[lrn]\nsize=5\nalpha=0.3\nbeta=0.75\nkappa=2",
        "[lrn]\nsize=3\nalpha=0.01",
        "[deconv]\nfilters=3\nsize=4\nstride=2\npadding=1\nactivation=leaky",
        "[deconv]\nfilters=2\nsize=3\nstride=1\npad=1\nbatch_normalize=1\nactivation=linear",
    ],
)
def test_issue_23s_layers_export(section):
    net = network_from_text(
        "[net]\nwidth=6\nheight=5\nchannels=3\n[convolutional]\nfilters=4\n"
        f"size=3\nstride=1\npad=1\nactivation=leaky\n{section}\n"
    )
    assert_exports_exactly(net, batch=2)


def test_recurrent_layers_are_refused_by_name():
    net = network_from_text(
        "[net]\ninputs=8\nbatch=1\n[rnn]\noutput=4\nhidden=4\nactivation=leaky\n"
    )
    with pytest.raises(ExportError, match=r"layer 0 \[rnn\]: ONNX export does not cover"):
        export_model(net, batch=None)
