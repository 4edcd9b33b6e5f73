"""Softmax trees (tree=) against pjreddie Darknet's C code: the tree file's reading, the
classifier's truth (fill_hierarchy), [softmax] tree= forward and its masked loss, the
hierarchy products and top prediction, the [region] tree class delta and decoding.
The reference values are tests/fixtures/tree/tree_reference.npz, made by
tests/c_harness/make_tree_fixture.py from a CPU build of Darknet."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.losses.region import RegionClasses, RegionHead, region_loss
from darknet_py.network import Network
from darknet_py.tree import (
    NO_TRUTH,
    TreeArrays,
    TreeError,
    fill_hierarchy,
    hierarchy_predictions,
    hierarchy_top_prediction,
    read_tree,
)

HERE = Path(__file__).resolve().parent
TREE = HERE / "fixtures" / "tree" / "small.tree"
REF = dict(np.load(HERE / "fixtures" / "tree" / "tree_reference.npz"))
K = 15  # classes in small.tree
F32 = np.float32


def build(tmp_path, text, name="tree.cfg"):
    shutil.copy(TREE, tmp_path / "small.tree")
    path = tmp_path / name
    path.write_text(text)
    return Network(parse_cfg_text(text, str(path)), str(path), batch=None)


def test_read_tree_as_darknet():
    hier = read_tree(TREE)
    assert hier.n == K and hier.names[9] == "terrier"
    for key in ("parent", "child", "group", "group_offset", "group_size"):
        np.testing.assert_array_equal(getattr(hier, key), REF[key], err_msg=key)
    np.testing.assert_array_equal(hier.leaf, REF["leaf"].astype(bool))


def test_bad_tree_files_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.tree"
    bad.write_text("a -1\nb 5\n")
    with pytest.raises(TreeError, match=r"bad.tree:2: parent 5 is not an earlier line"):
        read_tree(bad)
    bad.write_text("a -1\nb x\n")
    with pytest.raises(TreeError, match=r"bad.tree:2: parent 'x' is not a line number"):
        read_tree(bad)
    with pytest.raises(TreeError, match="missing.tree"):
        read_tree(tmp_path / "missing.tree")


def test_fill_hierarchy_as_darknet():
    truth = np.zeros((4, K), dtype=F32)
    for row, classes in enumerate(((9,), (13,), (2,), (4, 12))):
        truth[row, list(classes)] = 1
    np.testing.assert_array_equal(
        fill_hierarchy(truth, read_tree(TREE)), REF["fill_hierarchy"].reshape(4, K)
    )
    assert NO_TRUTH in REF["fill_hierarchy"]


def test_hierarchy_predictions_and_top_prediction_as_darknet():
    hier = read_tree(TREE)
    rows = REF["hier_input"].reshape(K, 3).T  # the harness interleaves 3 rows (stride 3)
    full = hierarchy_predictions(rows, hier)
    np.testing.assert_array_equal(full, REF["hier_all"].reshape(K, 3).T)
    np.testing.assert_array_equal(
        hierarchy_predictions(rows, hier, only_leaves=True), REF["hier_leaves"].reshape(K, 3).T
    )
    top = [
        hierarchy_top_prediction(full[r], hier, t) for r in range(3) for t in REF["top_thresholds"]
    ]
    assert top == REF["top"].tolist()
    assert len(set(top)) > 3  # the thresholds stop the walk at different depths


SOFTMAX_CFG = """[net]
width=1
height=1
channels=15
[softmax]
temperature=2
tree=small.tree
"""


def test_softmax_layer_tree_forward_as_darknet(tmp_path):
    net = build(tmp_path, SOFTMAX_CFG)
    net.set_batch(3)
    out = net.predict(REF["softmax_input"].reshape(3, 15, 1, 1))
    np.testing.assert_allclose(
        np.asarray(out).reshape(-1), REF["softmax_output"], rtol=2e-6, atol=1e-7
    )
    # each sibling group sums to one
    out = np.asarray(out).reshape(3, K)
    hier = net.hierarchy
    for first, size in zip(hier.group_offset, hier.group_size):
        np.testing.assert_allclose(out[:, first : first + size].sum(axis=1), 1, rtol=1e-6)


def test_softmax_tree_loss_ignores_groups_without_truth(tmp_path):
    be = NumpyBackend()
    net = build(tmp_path, SOFTMAX_CFG)
    layer = net.layers[0]
    layer.allocate(be, 2, True)
    x = be.from_host(REF["softmax_input"][: 2 * K])
    truth = fill_hierarchy(np.eye(K, dtype=F32)[[10, 13]], net.hierarchy).reshape(-1)

    class State:  # what a layer's forward reads from the network
        input, train, delta = x, True, None

    State.be, State.truth = be, be.from_host(truth)
    layer.forward(State)
    p = layer.output
    want = np.where(truth == NO_TRUTH, 0, truth - p)
    np.testing.assert_allclose(layer.delta, want, rtol=0, atol=1e-7)
    loss = np.where((truth != 0) & (truth != NO_TRUTH), -truth * np.log(p), 0)
    np.testing.assert_allclose(layer.loss, loss, rtol=1e-6)
    assert (layer.delta[truth == NO_TRUTH] == 0).all() and (truth == NO_TRUTH).sum() > 10


def test_region_tree_class_delta_as_darknet():
    """delta_region_class's tree branch: two truths of one image at cells 1 and 2 of a
    1x4 grid (stride 4 between class planes)."""
    hier = read_tree(TREE)
    be = NumpyBackend()
    tree = TreeArrays(be, hier)
    out = np.zeros((1, 1, 5 + K, 1, 4), dtype=F32)
    out[0, 0, 5:, 0, :] = REF["class_output"].reshape(K, 4)
    delta = np.zeros_like(out)
    from darknet_py.losses.region import _tree_class_deltas

    avg_cat = _tree_class_deltas(
        delta, out, tree, [0, 0], [0, 0], [0, 0], [1, 2], [10, 12], F32(1.5)
    )
    np.testing.assert_array_equal(delta[0, 0, 5:, 0, :].reshape(-1), REF["class_delta"])
    assert avg_cat == pytest.approx(float(REF["class_avg_cat"][0]), rel=1e-6)


REGION_CFG = """[net]
width=3
height=2
channels=40
[region]
anchors={anchors}
classes=15
coords=4
num=2
softmax=1
tree=small.tree
"""


def test_region_tree_detections_as_darknet(tmp_path):
    anchors = ",".join(f"{v:.9g}" for v in REF["region_biases"])
    net = build(tmp_path, REGION_CFG.format(anchors=anchors))
    layer = net.layers[0]
    np.testing.assert_array_equal(layer.biases, REF["region_biases"])
    dets = layer.detections(
        REF["region_output"], 640, 480, 96, 64, 0.4, relative=True, letter=True, hier=0.45
    )
    boxes = np.array([d.box for d in dets], dtype=F32)
    np.testing.assert_allclose(boxes.reshape(-1), REF["region_boxes"], rtol=1e-6)
    np.testing.assert_array_equal([d.objectness for d in dets], REF["region_objectness"])
    probs = np.array([d.probs for d in dets])
    np.testing.assert_array_equal(probs.reshape(-1), REF["region_probs"])
    assert (probs > 0).sum(axis=1).max() == 1 and (probs > 0).any()  # one class a box


def test_region_tree_forward_and_loss(tmp_path):
    """[region] tree=: the class planes hold a softmax per sibling group; in training the
    class delta at the truth's anchor and cell follows the tree (and nowhere else)."""
    net = build(tmp_path, REGION_CFG.format(anchors="1,1,2,2"))
    net.set_batch(1)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, 40, 2, 3)).astype(F32)
    out = np.asarray(net.predict(x)).reshape(2, 5 + K, 6)
    hier = net.hierarchy or net.layers[0].hierarchy
    for first, size in zip(hier.group_offset, hier.group_size):
        np.testing.assert_allclose(out[:, 5 + first : 5 + first + size].sum(axis=1), 1, rtol=1e-6)
    be = NumpyBackend()
    layer = net.layers[0]
    head = RegionHead(1, 2, 2, 3, K, 1, 0, 1, 0.6, 1, 5, 1, 1)
    truth = np.zeros(30 * 5, dtype=F32)
    truth[:5] = (0.5, 0.7, 0.4, 0.5, 10)  # cell (1, 1), class retriever
    delta, scalars = np.zeros(out.size, dtype=F32), np.zeros(7)
    classes = RegionClasses(None, TreeArrays(be, hier))
    region_loss(head, out.reshape(-1), truth, 5, layer.biases, 20000, delta, scalars, classes)
    d = delta.reshape(2, 5 + K, 2, 3)[:, 5:]
    touched = np.argwhere(d != 0)  # (anchor, class, row, column)
    assert len({int(a) for a in touched[:, 0]}) == 1  # one anchor
    assert {(int(r), int(c)) for r, c in touched[:, 2:]} == {(1, 1)}  # the truth's cell
    path = {10, 3, 0}
    siblings = {c for c in range(K) if hier.group[c] in {hier.group[p] for p in path}}
    assert set(touched[:, 1]) == siblings


def test_missing_tree_file_is_a_cfg_error(tmp_path):
    path = tmp_path / "t.cfg"
    path.write_text(SOFTMAX_CFG.replace("small.tree", "data/9k.tree"))
    with pytest.raises(CfgError, match=r"t.cfg:7: tree: data/9k.tree: no such file"):
        Network(parse_cfg_text(path.read_text(), str(path)), str(path))


def test_tree_size_must_match_classes(tmp_path):
    with pytest.raises(
        CfgError,
        match=r":7: tree: .*small.tree has 15 classes but the layer "
        r"gets 16 inputs",
    ):
        build(tmp_path, SOFTMAX_CFG.replace("channels=15", "channels=16"))


def test_classifier_with_a_tree_trains_and_predicts_leaves(bars, tmp_path):
    """A classifier whose [softmax] has tree=: the loader's truth is Darknet's
    fill_hierarchy of the label, training runs, and predict ranks the leaves' P(class)."""
    from helpers import CLASSIFIER_CFG, Lines, write_classifier_cfg

    from darknet_py.data.loader import DataLoader
    from darknet_py.predictions import classify
    from darknet_py.train import train

    (tmp_path / "lines.tree").write_text("line -1\nhoriz 0\nvert 0\n")
    (tmp_path / "lines.names").write_text("line\nhoriz\nvert\n")
    text = CLASSIFIER_CFG.replace("filters=2\n", "filters=3\n").replace(
        "[softmax]", "[softmax]\ntree=lines.tree"
    )
    assert "tree=lines.tree" in text and "filters=3" in text
    cfg = write_classifier_cfg(tmp_path, text=text, max_batches=4)
    data = tmp_path / "lines.data"
    data.write_text(
        f"classes=3\ntrain={bars}/train.list\nvalid={bars}/valid.list\n"
        f"names={tmp_path}/lines.names\nbackup={tmp_path}/backup/\n"
    )
    hier = read_tree(tmp_path / "lines.tree")
    paths = (bars / "train.list").read_text().split()[:4]
    with DataLoader(
        paths,
        task="classifier",
        width=12,
        height=12,
        batch=4,
        classes=3,
        labels=["line", "horiz", "vert"],
        channels=1,
        workers=0,
        seed=0,
        sampling="shuffle",
        hierarchy=hier,
    ) as loader:
        _, truth = next(iter(loader))
    want = [[1, 1, 0] if "horiz" in p else [1, 0, 1] for p in paths]
    assert sorted(map(list, truth)) == sorted(want)
    result = train(cfg, str(data), seed=1, device="cpu", log=Lines(), workers=0)
    assert result.iterations == 4
    from darknet_py.network import load_network

    net = load_network(cfg, result.final_weights, device="cpu", engine="numpy")
    image = (bars / "valid.list").read_text().split()[0]
    top = classify(net, image, top=3)
    assert top[-1][0] == 0 and top[-1][1] == 0  # the inner class is zeroed
    assert sorted(i for i, _, _ in top[:2]) == [1, 2]
    assert top[0][1] + top[1][1] == pytest.approx(1, rel=1e-5)
