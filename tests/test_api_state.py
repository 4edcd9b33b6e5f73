"""The Python API never half-changes a network: every argument of a state-changing call is
checked first, and a refused call leaves seen, iteration, the learning rate, the batch,
the images per pass and per iteration, the parameters and the buffers as they were."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

import darknet_py.network as network_module
from darknet_py import build_network, load_network
from darknet_py.network import NetworkError
from darknet_py.weights import WeightsError

# 8 images an iteration in 2 passes of 4; the rate drops tenfold at iteration 10, so a
# call that moved the iteration count would show in the rate.
CLASSIFIER_CFG = """[net]
batch=8
subdivisions=2
width=8
height=8
channels=3
learning_rate=0.001
momentum=0.9
decay=0.0005
policy=steps
steps=10
scales=.1
max_batches=100
[convolutional]
batch_normalize=1
filters=4
size=3
pad=1
activation=leaky
[avgpool]
[softmax]
"""

# A [yolo] detector of 2 classes, 2 images a pass.
DETECTOR_CFG = """[net]
batch=2
width=16
height=16
channels=3
learning_rate=0.001
max_batches=100
[convolutional]
filters=21
size=1
activation=linear
[yolo]
mask=0,1,2
anchors=2,3, 4,5, 6,7
classes=2
num=3
"""


def write_and_load(tmp_path, text, name="net.cfg", **kwargs):
    cfg = tmp_path / name
    cfg.write_text(text)
    return load_network(str(cfg), device="cpu", seed=2, **kwargs)


def classifier_batch(images, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((images, 3, 8, 8), dtype=np.float32)
    return x, np.eye(4, dtype=np.float32)[rng.integers(0, 4, images)]


def trained_classifier(tmp_path, name="net.cfg"):
    """The issue's network: 3 iterations of 8 images done (seen 24)."""
    net = write_and_load(tmp_path, CLASSIFIER_CFG, name)
    for step in range(3):
        net.train_iteration(*classifier_batch(8, seed=step))
    return net


def state(net):
    """Everything a call may change: counters, sizes, parameters and update buffers."""
    arrays = {}
    for layer in net.layers:
        for owner in layer.param_owners():
            for name, array in owner.params():
                arrays[(owner.index, name)] = net.be.to_host(array).copy()
            for name in ("weight_updates", "bias_updates", "scale_updates"):
                if getattr(owner, name, None) is not None:
                    arrays[(owner.index, name)] = net.be.to_host(getattr(owner, name)).copy()
    return dict(
        seen=net.seen,
        iteration=net.iteration,
        rate=net.learning_rate,
        batch=net.batch,
        images_per_pass=net.images_per_pass,
        images_per_iteration=net.images_per_iteration,
        input_shape=net.input_shape,
        layers=list(net.layers),
        train_buffers=net.train_buffers,
        prefetched=len(net._prefetched),
        switches=(net.share_deltas, net.share_outputs, net.fold_batchnorm, net.half_outputs),
        arrays=arrays,
    )


def assert_unchanged(net, before):
    after = state(net)
    for key in before:
        if key != "arrays":
            assert after[key] == before[key], key
    assert after["arrays"].keys() == before["arrays"].keys()
    for key, array in before["arrays"].items():
        np.testing.assert_array_equal(after["arrays"][key], array, err_msg=str(key))


def refused(net, call, error, message):
    """call() raises `error` whose message matches `message` (a full line), and leaves
    every piece of the network's state as it was."""
    before = state(net)
    with pytest.raises(error) as info:
        call()
    assert re.fullmatch(message, str(info.value)), str(info.value)
    assert "\n" not in str(info.value)
    assert_unchanged(net, before)


# ---- the two cases -----------------------------------------------------------------
def test_another_image_count_is_refused_naming_the_count_wanted(tmp_path):
    net = trained_classifier(tmp_path)
    assert (net.seen, net.iteration, net.learning_rate) == (24, 3, pytest.approx(0.001))
    x, truth = classifier_batch(2)
    refused(
        net,
        lambda: net.train_iteration(x, truth),
        ValueError,
        re.escape(
            "train_iteration takes 8 images (subdivisions=2 passes of "
            "net.images_per_pass=4), got 2; load_network's batch= sets the images "
            "per pass"
        ),
    )
    refused(
        net,
        lambda: net.train_pass(x, truth),
        ValueError,
        re.escape(
            "train_pass takes 4 images (net.images_per_pass), got 2; "
            "load_network's batch= sets the images per pass"
        ),
    )
    x, truth = classifier_batch(16)  # two iterations' worth is no more one iteration
    refused(
        net,
        lambda: net.train_iteration(x, truth),
        ValueError,
        r"train_iteration takes 8 images .*, got 16; .*",
    )
    assert (net.seen, net.iteration, net.learning_rate) == (24, 3, pytest.approx(0.001))


def test_a_wrong_input_shape_is_refused_before_seen_moves(tmp_path):
    net = trained_classifier(tmp_path)
    truth = classifier_batch(4)[1]
    for step, images in (("train_pass", 4), ("train_iteration", 8)):
        for shape in ((images, 3, 9, 9), (images, 8, 8, 3), (images, 100), (images * 192,)):
            x = np.zeros(shape, np.float32)
            refused(
                net,
                lambda: getattr(net, step)(x, np.tile(truth, (images // 4, 1))),
                ValueError,
                re.escape(
                    f"{step} takes images of shape ({images}, 3, 8, 8) "
                    f"or flat rows ({images}, 192); got shape {shape}"
                ),
            )
    assert (net.seen, net.iteration) == (24, 3)


def test_refused_calls_leave_the_training_exactly_as_without_them(tmp_path):
    """A network that had every refusal below trains on, bit for bit, as its twin."""
    net, twin = trained_classifier(tmp_path, "a.cfg"), trained_classifier(tmp_path, "b.cfg")
    x, truth = classifier_batch(8, seed=7)
    attempts = [
        lambda: net.train_iteration(x[:2], truth[:2]),
        lambda: net.train_pass(x, truth),
        lambda: net.train_pass(x[:4, :, :7], truth[:4]),
        lambda: net.train_pass((x[:4] * 255).astype(np.uint8), truth[:4]),
        lambda: net.train_iteration(x, truth[:, :3]),
        lambda: net.train_iteration(x, truth[:7]),
        lambda: net.forward(x[:, :2], truth, train=True),
        lambda: net.set_batch(0),
        lambda: net.resize(0, 8),
        lambda: net.predict_in_parts(x[:, :, :4], 4),
    ]
    for attempt in attempts:
        with pytest.raises(ValueError):
            attempt()
    losses = [n.train_iteration(x, truth) for n in (net, twin)]
    assert losses[0] == losses[1]
    assert (net.seen, net.iteration) == (twin.seen, twin.iteration) == (32, 4)
    assert_unchanged(net, state(twin) | {"layers": list(net.layers)})


# ---- what else a training step checks --------------------------------------------------------
def test_training_input_must_be_float_images(tmp_path):
    net = trained_classifier(tmp_path)
    x, truth = classifier_batch(4)
    refused(
        net,
        lambda: net.train_pass((x * 255).astype(np.uint8), truth),
        ValueError,
        re.escape(
            "train_pass takes float images (N, 3, 8, 8) with values in [0, 1]; got "
            "dtype uint8 (uint8 pixels: divide them by 255)"
        ),
    )
    refused(
        net,
        lambda: net.train_pass(x.astype(np.int32), truth),
        ValueError,
        re.escape(
            "train_pass takes float images (N, 3, 8, 8) with values in [0, 1]; got dtype int32"
        ),
    )
    net.train_pass(x.astype(np.float64), truth)  # any float is fine: converted to float32
    assert net.seen == 28


def test_truth_rows_are_checked_before_anything_changes(tmp_path):
    net = trained_classifier(tmp_path)
    x, truth = classifier_batch(8)
    refused(
        net,
        lambda: net.train_iteration(x, truth[:, :3]),
        ValueError,
        re.escape(
            "truth of shape (8, 3) for 8 images: this network wants (8, 4): per "
            "image the 4 values its [softmax] layer 2 is trained towards (one-hot: 1 "
            "at the image's class)"
        ),
    )
    refused(
        net,
        lambda: net.train_pass(x[:4], truth[:3]),
        ValueError,
        r"truth of shape \(3, 4\) for 4 images: .*",
    )


def test_a_bad_class_id_is_refused_before_the_network_is_resized_for_the_step(tmp_path):
    """The [yolo] head's class check reads the truth's own rows: the network is still
    sized for the 1-image predict before it, and stays so."""
    net = write_and_load(tmp_path, DETECTOR_CFG)
    rng = np.random.default_rng(1)
    x = rng.random((2, 3, 16, 16), dtype=np.float32)
    truth = np.zeros((2, 90 * 5), np.float32)
    truth[:, :5] = [0.5, 0.5, 0.2, 0.3, 1]
    net.train_pass(x, truth)
    net.predict(x[:1])
    assert net.batch == 1
    truth[1, 5:10] = [0.3, 0.3, 0.1, 0.1, 2]  # image 2's second box: class 2 of 0..1
    refused(
        net,
        lambda: net.train_pass(x, truth),
        ValueError,
        re.escape("a truth box has class 2 but [yolo] layer 1 has classes=2 (ids 0..1)"),
    )
    assert (net.seen, net.batch) == (2, 1)
    truth[1, 9] = 1
    net.train_pass(x, truth)
    assert (net.seen, net.batch) == (4, 2)


def test_a_data_parallel_iteration_says_the_count_on_each_process(tmp_path):
    net = trained_classifier(tmp_path)
    net.data_parallel = SimpleNamespace(world_size=2)  # only its size is read here
    seen = net.seen
    with pytest.raises(
        ValueError,
        match=re.escape(
            "train_iteration takes 8 images (subdivisions=2 passes of net.images_per_pass=4 "
            "on each of 2 processes), got 16"
        ),
    ):
        net.train_iteration(*classifier_batch(16))
    assert net.seen == seen


def test_a_network_built_without_arrays_refuses_to_train(tmp_path):
    cfg = tmp_path / "net.cfg"
    cfg.write_text(CLASSIFIER_CFG)
    net = build_network(str(cfg))
    with pytest.raises(
        NetworkError, match="built without its arrays .*load it with load_network to train it"
    ):
        net.train_pass(*classifier_batch(4))
    assert net.seen == 0


def test_a_refusal_for_memory_comes_before_seen_moves(tmp_path, monkeypatch):
    net = write_and_load(tmp_path, CLASSIFIER_CFG)  # its first step allocates training's
    monkeypatch.setattr(network_module, "host_memory_bytes", lambda: 1)
    refused(
        net,
        lambda: net.train_pass(*classifier_batch(4)),
        NetworkError,
        r".*needs about .* GiB of memory at batch 4 for training, more than this "
        r"machine's 0\.0 GiB; .*",
    )


# ---- the other state-changing methods ------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "4", None])
def test_set_batch_takes_a_whole_number(tmp_path, value):
    net = trained_classifier(tmp_path)
    refused(
        net,
        lambda: net.set_batch(value),
        ValueError,
        re.escape(f"set_batch's batch must be a whole number of at least 1, got {value!r}"),
    )
    net.set_batch(np.int64(3))
    assert net.batch == 3 and net.images_per_pass == 4  # inference sizes leave the pass


def test_resize_refusals_leave_the_network(tmp_path, monkeypatch):
    net = trained_classifier(tmp_path)
    x = classifier_batch(2)[0]
    want = net.predict(x).copy()
    refused(
        net,
        lambda: net.resize(0, 8),
        ValueError,
        re.escape("resize's width must be a whole number of at least 1, got 0"),
    )
    refused(
        net,
        lambda: net.resize(16, 12.5),
        ValueError,
        re.escape("resize's height must be a whole number of at least 1, got 12.5"),
    )
    monkeypatch.setattr(network_module, "host_memory_bytes", lambda: 1)
    # Refused after the new layers are built and before they replace the old (it was
    # refused in their allocation, which left layers of the new size without parameters).
    refused(net, lambda: net.resize(64, 64), NetworkError, r".*needs about .* GiB of memory .*")
    monkeypatch.undo()
    assert (net.options.width, net.options.height, net.options.inputs) == (8, 8, 192)
    np.testing.assert_array_equal(net.predict(x), want)


def test_inference_refusals_leave_the_batch(tmp_path):
    net = trained_classifier(tmp_path)
    x = classifier_batch(4)[0]
    net.predict(x[:1])
    refused(
        net,
        lambda: net.forward(x[:, :, :4]),
        ValueError,
        re.escape("input has shape (4, 3, 4, 8); the network needs (N, 3, 8, 8)"),
    )
    refused(
        net,
        lambda: net.forward(x, np.zeros((3, 5), np.float32), train=True),
        ValueError,
        re.escape("truth has shape (3, 5), which is not rows for 4 images"),
    )
    refused(net, lambda: net.predict(x[:, :2]), ValueError, r"predict takes float32 images .*")
    refused(
        net,
        lambda: net.predict_in_parts(x[:, :, :4], 2),
        ValueError,
        r"predict takes float32 images .*got shape \(4, 3, 4, 8\).*",
    )
    refused(
        net,
        lambda: net.predict_in_parts(x, 0),
        ValueError,
        re.escape("predict_in_parts' part must be a whole number of at least 1, got 0"),
    )
    refused(
        net,
        lambda: net.predict_in_parts(x, 3),
        ValueError,
        re.escape("4 images do not split into parts of 3"),
    )
    refused(
        net,
        lambda: net.infer_photos([np.zeros((5, 6, 3), np.float32)]),
        ValueError,
        re.escape(
            "infer_photos takes OpenCV BGR uint8 (H, W, 3) photos or one (N, H, W, "
            "3) uint8 array; got float32 of shape (5, 6, 3)"
        ),
    )
    refused(
        net,
        lambda: net.infer_photos(np.zeros((2, 5, 6), np.uint8)),
        ValueError,
        r"infer_photos takes .*; got uint8 of shape \(2, 5, 6\)",
    )
    assert net.batch == 1


def test_detect_reads_every_image_before_resizing(tmp_path):
    from darknet_py.image import ImageError

    net = write_and_load(tmp_path, DETECTOR_CFG)
    image = np.full((20, 30, 3), 90, np.uint8)
    net.detect(image)
    assert net.batch == 1
    refused(
        net,
        lambda: net.detect([image, str(tmp_path / "missing.jpg")]),
        ImageError,
        r".*missing\.jpg.*",
    )
    refused(
        net,
        lambda: net.detect([image, image], batch=0),
        ValueError,
        re.escape("detect's batch must be a whole number of at least 1, got 0"),
    )
    assert len(net.detect([image, image, image], batch=2)) == 3


def test_prefetch_refused_for_its_truth_starts_no_upload(tmp_path, monkeypatch):
    net = trained_classifier(tmp_path)
    x = classifier_batch(4)[0]
    uploads = []
    upload_async = net.be.upload_async
    monkeypatch.setattr(
        net.be, "upload_async", lambda host: uploads.append(host.shape) or upload_async(host)
    )
    refused(net, lambda: net.prefetch(x, [["a"]]), ValueError, r".*'a'.*")
    assert uploads == []  # an upload nobody waits for would hold x's memory
    net.prefetch(x)
    assert uploads == [x.shape] and len(net._prefetched) == 1


@pytest.mark.parametrize(
    "name", ["share_deltas", "share_outputs", "fold_batchnorm", "half_outputs"]
)
def test_switches_take_true_or_false(tmp_path, name):
    net = trained_classifier(tmp_path)
    for value in ("false", 2, None):
        refused(
            net,
            lambda: setattr(net, name, value),
            ValueError,
            re.escape(f"net.{name} takes True or False, got {value!r}"),
        )
    setattr(net, name, np.bool_(not getattr(net, name)))
    setattr(net, name, 1)
    assert getattr(net, name) is True


def test_weights_refusals_leave_the_parameters_and_seen(tmp_path):
    net = trained_classifier(tmp_path)
    path = tmp_path / "net.weights"
    net.save_weights(str(path))
    refused(
        net,
        lambda: net.load_weights(str(path), cutoff=-1),
        ValueError,
        re.escape("load_weights' cutoff must be a whole number of at least 0, got -1"),
    )
    refused(
        net,
        lambda: net.save_weights(str(tmp_path / "b.weights"), cutoff=1.5),
        ValueError,
        re.escape("save_weights' cutoff must be a whole number of at least 0, got 1.5"),
    )
    assert not (tmp_path / "b.weights").exists()
    cut = tmp_path / "cut.weights"
    cut.write_bytes(path.read_bytes()[:-8])  # a download cut short: all checked first
    refused(net, lambda: net.load_weights(str(cut)), WeightsError, r".*cut-off download.*")


def test_load_network_batch_is_a_whole_number(tmp_path):
    cfg = tmp_path / "net.cfg"
    cfg.write_text(CLASSIFIER_CFG)
    for value in (0, 2.0, True):
        with pytest.raises(
            ValueError,
            match=re.escape(f"batch must be a whole number of at least 1, got {value!r}"),
        ):
            load_network(str(cfg), batch=value)
    net = load_network(str(cfg), batch=2)
    assert (net.images_per_pass, net.images_per_iteration) == (2, 4)
    net.train_iteration(*classifier_batch(4))
    assert (net.seen, net.iteration) == (4, 1)
