"""The default CPU engine (export/engine.py, export/cache.py): ONNX Runtime when it is
installed (the network exported once, checked, cached outside the user's folders), NumPy
when it is not or the network does not export, one note saying which; training and
--engine numpy run darknet-py's own arithmetic."""

import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import darknet_py
from darknet_py.export import EngineCacheWarning
from darknet_py.export import engine as engine_module
from darknet_py.export import model as model_module
from darknet_py.export.check import CHECK_TOLERANCE, relative_difference

pytest.importorskip("onnx", reason="onnx is not installed (pip install onnx onnxruntime)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

from helpers import DETECTOR_CFG, unit_rolling_variance, untrained_detector  # noqa: E402
from test_cli import run_in_process  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
TINY_CFG = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
TINY_WEIGHTS = SHARED / "weights" / "yolov3-tiny.weights"
DOG = SHARED / "images" / "dog.jpg"

CRNN_CFG = """[net]
width=8
height=8
channels=3
batch=1
time_steps=1

[crnn]
output_filters=4
hidden_filters=4
activation=leaky

[avgpool]

[softmax]
"""


def wider_detector(directory, seed=4):
    """untrained_detector with 32 filters: weights arrays over 1 KiB, which the optimised
    model keeps in a file of their own."""
    cfg = directory / "wide.cfg"
    cfg.write_text(DETECTOR_CFG.replace("filters=4\n", "filters=32\n", 1))
    net = darknet_py.load_network(str(cfg), seed=seed)
    unit_rolling_variance(net)
    weights = str(directory / "wide.weights")
    net.save_weights(weights)
    return str(cfg), weights


@pytest.fixture
def exports(monkeypatch):
    """Counts the engine's exports (a cached model is read, not exported)."""
    calls = []
    real = model_module.export_model

    def counting(*args, **kwargs):
        calls.append(args[0].path)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "export_model", counting)
    return calls


@pytest.fixture
def checks(monkeypatch):
    """Counts the engine's checks against NumPy's forward."""
    calls = []
    real = engine_module.compare

    def counting(net, sess, x):
        calls.append(net.path)
        return real(net, sess, x)

    monkeypatch.setattr(engine_module, "compare", counting)
    return calls


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("DARKNET_ONNX_CACHE", str(path))
    return path


def photo(directory, seed=0):
    path = directory / "photo.png"
    cv2.imwrite(str(path), np.random.default_rng(seed).integers(0, 256, (40, 50, 3), np.uint8))
    return str(path)


def head_outputs(net, image):
    net.predict(image)
    return [net.layer_output(layer.index) for layer in net.layers if layer.type == "yolo"]


def test_the_default_is_onnxruntime_and_agrees_with_numpy(tmp_path, cache, exports):
    cfg, weights = untrained_detector(tmp_path)
    image = photo(tmp_path)
    net = darknet_py.load_network(cfg, weights, device="cpu")
    assert exports == []  # made on the first inference, not at load (training never needs it)
    assert net.engine == "onnxruntime" and len(exports) == 1
    reference = darknet_py.load_network(cfg, weights, device="cpu", engine="numpy")
    assert reference.engine == "numpy"
    got, want = head_outputs(net, image), head_outputs(reference, image)
    assert all(relative_difference(g, w) < CHECK_TOLERANCE for g, w in zip(got, want))
    assert not all(np.array_equal(g, w) for g, w in zip(got, want))  # another arithmetic
    found = net.detect(image, thresh=0.1)
    assert found and [d.name for d in found] == [
        d.name for d in reference.detect(image, thresh=0.1)
    ]
    # the cache is ours, never beside the user's files
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cache",
        "det.cfg",
        "det.weights",
        "photo.png",
    ]
    assert len(list(cache.glob("*.onnx"))) == 1


def test_numpy_when_onnxruntime_is_not_installed(tmp_path, cache, monkeypatch, exports):
    cfg, weights = untrained_detector(tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    net = darknet_py.load_network(cfg, weights, device="cpu")
    assert net.engine == "numpy" and "ONNX Runtime is not installed" in net.engine_note
    net.predict(photo(tmp_path))
    assert exports == [] and not cache.exists()
    r = run_in_process(
        ["detect", cfg, weights, photo(tmp_path), "--out", "none", "--device", "cpu"]
    )
    assert r.code == 0, r.err
    assert [l for l in r.err.splitlines() if "inference on" in l] == [
        "darknet-py: note: inference on NumPy (ONNX Runtime is not installed; pip install "
        "onnx onnxruntime gives a faster CPU engine)"
    ]


def test_the_cache_is_reused_and_a_changed_weights_file_is_exported_again(
    tmp_path, cache, exports, checks
):
    cfg, weights = untrained_detector(tmp_path)
    image = photo(tmp_path)
    first = head_outputs(darknet_py.load_network(cfg, weights, device="cpu"), image)
    assert len(exports) == 1 and len(checks) == 1
    second = darknet_py.load_network(cfg, weights, device="cpu")
    # read from the cache: neither exported nor checked again
    assert second.engine == "onnxruntime" and len(exports) == 1 and len(checks) == 1
    assert all(np.array_equal(a, b) for a, b in zip(first, head_outputs(second, image)))
    # new weights in the same file (same size): exported again, and the new ones are served
    net = darknet_py.load_network(cfg, seed=9, engine="numpy")
    for layer in net.layers:
        if getattr(layer, "batch_normalize", 0):
            net.be.write(layer.rolling_variance, np.ones(layer.out_c))
    net.save_weights(weights)
    changed = darknet_py.load_network(cfg, weights, device="cpu")
    got = head_outputs(changed, image)
    assert len(exports) == 2 and len(checks) == 2 and len(list(cache.glob("*.onnx"))) == 2
    want = head_outputs(darknet_py.load_network(cfg, weights, device="cpu", engine="numpy"), image)
    assert all(relative_difference(g, w) < CHECK_TOLERANCE for g, w in zip(got, want))
    assert not all(np.allclose(a, b) for a, b in zip(first, got))


def test_a_damaged_cache_file_is_made_again_with_a_warning(tmp_path, cache, exports, checks):
    cfg, weights = untrained_detector(tmp_path)
    x = np.random.default_rng(5).random((1, 3, 32, 32), dtype=np.float32)
    want = darknet_py.load_network(cfg, weights, device="cpu").predict(x).copy()
    (entry,) = cache.glob("*.onnx")
    (optimized,) = (cache / "optimized").glob("*.onnx")
    # the optimised model damaged: optimised again from the entry, not exported or checked
    optimized.write_bytes(b"not a model")
    with pytest.warns(
        EngineCacheWarning, match=f"{optimized}: a damaged ONNX cache file .*; optimised again"
    ):
        net = darknet_py.load_network(cfg, weights, device="cpu")
        assert net.engine == "onnxruntime"
    assert (len(exports), len(checks)) == (1, 1) and optimized.stat().st_size > 1000
    assert np.array_equal(net.predict(x), want)
    # both damaged: exported and checked again, both replaced
    entry.write_bytes(b"not a model either")
    optimized.write_bytes(b"")
    with pytest.warns(EngineCacheWarning) as caught:
        net = darknet_py.load_network(cfg, weights, device="cpu")
        assert net.engine == "onnxruntime"
    assert [str(w.message).split(":")[0] for w in caught] == [str(optimized), str(entry)]
    assert str(caught[1].message).endswith("exported again")
    assert (len(exports), len(checks)) == (2, 2) and entry.stat().st_size > 1000
    assert np.array_equal(net.predict(x), want)
    # the CLI: one warning line, and the command does its work
    entry.write_bytes(b"")
    optimized.unlink()
    r = run_in_process(
        ["detect", cfg, weights, photo(tmp_path), "--out", "none", "--device", "cpu"]
    )
    assert r.code == 0, r.err
    lines = [l for l in r.err.splitlines() if "ONNX cache" in l]
    assert len(lines) == 1, r.err
    (line,) = lines
    assert line.startswith(f"darknet-py: warning: {entry}: a damaged ONNX cache file (")
    assert line.endswith("; exported again")
    assert "Traceback" not in r.err and "inference on ONNX Runtime (exported" in r.err


def test_a_cache_hit_runs_the_optimised_model_on_tuned_sessions(
    tmp_path, cache, monkeypatch, exports, checks
):
    import onnxruntime as ort

    from darknet_py.export.check import physical_cores

    monkeypatch.delenv("DARKNET_CPU_THREADS", raising=False)
    cfg, weights = wider_detector(tmp_path)
    x = np.random.default_rng(6).random((1, 3, 32, 32), dtype=np.float32)
    first = darknet_py.load_network(cfg, weights, device="cpu")
    want = first.predict(x).copy()
    options = first.inference_engine.session.get_session_options()
    assert options.intra_op_num_threads == physical_cores() >= 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ONNX Runtime's optimised model, its weights in a file of their own beside it
    (optimized,) = (cache / "optimized").glob("*.onnx")
    (weights_file,) = (cache / "optimized").glob("*.data")
    assert optimized.name.startswith(next(cache.glob("*.onnx")).stem + "-" + ort.__version__)
    assert weights_file.stat().st_size >= 32 * 3 * 3 * 3 * 4  # the first layer's weights
    assert sorted(p.name for p in (cache / "optimized").iterdir()) == sorted(
        [optimized.name, weights_file.name]
    )  # no staging file left behind
    monkeypatch.setenv("DARKNET_CPU_THREADS", "1")
    second = darknet_py.load_network(cfg, weights, device="cpu")
    assert second.engine == "onnxruntime" and (len(exports), len(checks)) == (1, 1)
    assert second.inference_engine.where == f"its optimised export read from {optimized}"
    options = second.inference_engine.session.get_session_options()
    assert options.intra_op_num_threads == 1
    # already optimised: loaded as it is
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert np.array_equal(second.predict(x), want)


def test_physical_cores_counts_the_cores_this_process_may_use(monkeypatch):
    from darknet_py.export.check import intra_op_threads, physical_cores

    if physical_cores() is None:
        pytest.skip("no CPU topology in /sys on this machine")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.delenv("DARKNET_CPU_THREADS", raising=False)
    assert physical_cores() == 1 and intra_op_threads() == 1
    monkeypatch.setenv("DARKNET_CPU_THREADS", "3")
    assert intra_op_threads() == 3


def test_the_cache_follows_the_weights_bytes_not_their_file(tmp_path, cache, exports, checks):
    import shutil

    cfg, weights = untrained_detector(tmp_path)
    x = np.random.default_rng(7).random((1, 3, 32, 32), dtype=np.float32)
    want = darknet_py.load_network(cfg, weights, device="cpu").predict(x).copy()
    copy = tmp_path / "copy.weights"  # the same bytes elsewhere: the same entry
    shutil.copy(weights, copy)
    assert np.array_equal(darknet_py.load_network(cfg, copy, device="cpu").predict(x), want)
    assert (len(exports), len(checks)) == (1, 1)
    # other bytes of the same size with the old modification time put back: a new entry
    before = os.stat(weights)
    data = bytearray(Path(weights).read_bytes())
    data[-4:] = np.float32(0.75).tobytes()  # the last layer's last weight
    Path(weights).write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    net = darknet_py.load_network(cfg, weights, device="cpu")
    got = net.predict(x)
    assert net.engine == "onnxruntime" and (len(exports), len(checks)) == (2, 2)
    assert not np.array_equal(got, want)
    reference = darknet_py.load_network(cfg, weights, device="cpu", engine="numpy")
    assert relative_difference(got, reference.predict(x)) < CHECK_TOLERANCE


def test_a_weights_digest_is_remembered_until_the_file_changes(tmp_path, cache, monkeypatch):
    from darknet_py.export import cache as cache_module

    path = tmp_path / "w.weights"
    path.write_bytes(b"\0" * 4096)
    hashed = []
    real = cache_module.file_sha256
    monkeypatch.setattr(cache_module, "file_sha256", lambda p: hashed.append(p) or real(p))
    first = cache_module.weights_digest(path)
    cache_module.weights_digest(path)
    assert len(hashed) == 2  # just written: its times may not have moved yet, so not kept
    monkeypatch.setattr(cache_module, "_SETTLED_S", -1.0)
    assert cache_module.weights_digest(path) == first and len(hashed) == 3
    assert cache_module.weights_digest(path) == first and len(hashed) == 3  # remembered
    before = os.stat(path)
    path.write_bytes(b"\1" * 4096)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    changed = cache_module.weights_digest(path)
    assert len(hashed) == 4 and changed != first
    assert changed == cache_module.file_sha256(path)


def test_the_cache_keeps_to_its_bound_dropping_the_entries_used_longest_ago(
    tmp_path, cache, monkeypatch, exports
):
    from darknet_py.export import cache as cache_module

    image = photo(tmp_path)
    nets = {}
    for seed, name in enumerate("ab"):
        folder = tmp_path / name
        folder.mkdir()
        nets[name] = wider_detector(folder, seed)  # an export, an optimised model + weights

    def keys():
        return set(cache_module.entries())

    first = darknet_py.load_network(*nets["a"], device="cpu")
    head_outputs(first, image)
    (key_a,) = keys()
    size_a, used_a, paths_a = cache_module.entries()[key_a]
    assert len(paths_a) == 3 and size_a > 0  # .onnx, optimized/.onnx, optimized/.data
    # A bound that holds one entry: the second network's entry pushes the first one out,
    # whole; the one being served stays even where it alone is over the bound.
    monkeypatch.setenv("DARKNET_ONNX_CACHE_MB", str(1.5 * size_a / 2**20))
    head_outputs(darknet_py.load_network(*nets["b"], device="cpu"), image)
    (key_b,) = keys()
    assert key_b != key_a and not any(os.path.exists(p) for p in paths_a)
    monkeypatch.setenv("DARKNET_ONNX_CACHE_MB", "0")
    assert cache_module.trim(keep=key_b) == [] and keys() == {key_b}
    assert len(exports) == 2
    # a read marks its entry used: with room for two, a third drops the one read longest ago
    monkeypatch.setenv("DARKNET_ONNX_CACHE_MB", str(2.5 * size_a / 2**20))
    head_outputs(darknet_py.load_network(*nets["a"], device="cpu"), image)  # exported again
    assert len(exports) == 3 and keys() == {key_a, key_b}
    for key, when in ((key_a, 1), (key_b, 2)):  # both used long ago, a before b
        for path in cache_module.entries()[key][2]:
            os.utime(path, (when, when))
    darknet_py.load_network(*nets["a"], device="cpu").predict(image)  # a: read now
    assert len(exports) == 3
    folder = tmp_path / "c"
    folder.mkdir()
    head_outputs(darknet_py.load_network(*wider_detector(folder, 2), device="cpu"), image)
    assert key_a in keys() and key_b not in keys() and len(keys()) == 2


def test_a_cache_that_cannot_be_written_serves_from_memory(tmp_path, monkeypatch, exports):
    cfg, weights = untrained_detector(tmp_path)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("DARKNET_ONNX_CACHE", str(blocked / "cache"))
    image = photo(tmp_path)
    net = darknet_py.load_network(cfg, weights, device="cpu")
    assert net.engine == "onnxruntime"
    assert net.inference_engine.where == "exported and checked against NumPy in memory"
    want = head_outputs(darknet_py.load_network(cfg, weights, device="cpu", engine="numpy"), image)
    got = head_outputs(net, image)
    assert all(relative_difference(g, w) < CHECK_TOLERANCE for g, w in zip(got, want))
    assert darknet_py.load_network(cfg, weights, device="cpu").engine == "onnxruntime"
    assert len(exports) == 2  # nothing was cached: exported again
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")) == []


def test_a_staged_entry_is_put_in_place_or_dropped_whole(cache):
    from darknet_py.export import cache as cache_module

    kept = cache_module.StagedEntry("a" * 64, b"model bytes")
    assert kept.keep() == cache_module.entry_path("a" * 64)
    assert cache_module.read_entry("a" * 64) == b"model bytes"
    cache_module.StagedEntry("b" * 64, b"other bytes").discard()
    assert sorted(p.name for p in cache.iterdir()) == ["a" * 64 + ".onnx"]


def test_a_cache_bound_that_is_not_a_size_is_a_warning_and_the_default(monkeypatch):
    from darknet_py.export import cache as cache_module

    monkeypatch.setenv("DARKNET_ONNX_CACHE_MB", "lots")
    with pytest.warns(EngineCacheWarning, match="DARKNET_ONNX_CACHE_MB='lots' is not a size"):
        assert cache_module.limit_bytes() == cache_module.LIMIT_MB << 20
    monkeypatch.setenv("DARKNET_ONNX_CACHE_MB", "512")
    assert cache_module.limit_bytes() == 512 << 20


def test_a_cache_hit_does_not_import_onnx(tmp_path, cache):
    import subprocess

    cfg, weights = untrained_detector(tmp_path)
    assert darknet_py.load_network(cfg, weights, device="cpu").engine == "onnxruntime"
    code = (
        "import sys, darknet_py; "
        f"net = darknet_py.load_network({cfg!r}, {weights!r}, device='cpu'); "
        "print(net.engine, net.inference_engine.where.split(' from ')[0], "
        "'onnx' in sys.modules, 'darknet_py.export.layers' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [
        "onnxruntime",
        "its",
        "optimised",
        "export",
        "read",
        "False",
        "False",
    ]


def test_a_layer_onnx_cannot_export_falls_back_to_numpy_saying_why(tmp_path, cache):
    cfg = tmp_path / "crnn.cfg"
    cfg.write_text(CRNN_CFG)
    weights = tmp_path / "crnn.weights"
    darknet_py.load_network(str(cfg), seed=1).save_weights(str(weights))
    net = darknet_py.load_network(str(cfg), str(weights), device="cpu")
    image = photo(tmp_path)
    want = darknet_py.load_network(str(cfg), str(weights), device="cpu", engine="numpy").predict(
        image
    )
    assert np.array_equal(net.predict(image), want)
    assert net.engine == "numpy"
    assert net.engine_note == (
        "inference on NumPy: layer 0 [crnn]: ONNX export does not cover this layer type"
    )
    r = run_in_process(["test", cfg, weights, image, "--device", "cpu"])
    assert r.code == 0, r.err
    assert [l for l in r.err.splitlines() if "inference on" in l] == [
        f"darknet-py: note: {net.engine_note}"
    ]
    with pytest.raises(darknet_py.network.NetworkError, match=r"\[crnn\]"):
        darknet_py.load_network(str(cfg), str(weights), device="cpu", engine="onnxruntime").predict(
            image
        )


def test_training_runs_on_numpy_and_leaves_onnxruntime(tmp_path, cache):
    cfg, weights = untrained_detector(tmp_path)
    net = darknet_py.load_network(cfg, weights, device="cpu")
    reference = darknet_py.load_network(cfg, weights, device="cpu", engine="numpy")
    x = np.random.default_rng(1).random((1, 3, 32, 32), dtype=np.float32)
    truth = np.zeros((1, 90 * 5), np.float32)
    truth[0, :5] = (0.5, 0.5, 0.3, 0.3, 2)
    assert net.engine == "onnxruntime"
    assert net.train_pass(x, truth) == reference.train_pass(x, truth)
    assert net.engine == "numpy"
    assert np.array_equal(net.predict(x), reference.predict(x))


def test_hand_written_parameters_are_exported_again(tmp_path, cache, exports):
    cfg, weights = untrained_detector(tmp_path)
    net = darknet_py.load_network(cfg, weights, device="cpu")
    x = np.random.default_rng(2).random((1, 3, 32, 32), dtype=np.float32)
    before = net.predict(x).copy()
    net.layers[0].weights[:] *= 0.5
    net.params_changed()
    after = net.predict(x)
    assert net.engine == "onnxruntime" and len(exports) == 2
    want = darknet_py.load_network(cfg, weights, device="cpu", engine="numpy")
    want.layers[0].weights[:] *= 0.5
    want.params_changed()
    assert relative_difference(after, want.predict(x)) < CHECK_TOLERANCE
    assert not np.allclose(before, after)
    assert len(list(cache.glob("*.onnx"))) == 1  # the changed network is not cached


def test_the_cli_notes_the_engine_once_and_not_under_quiet(tmp_path, cache):
    cfg, weights = untrained_detector(tmp_path)
    images = [photo(tmp_path, 0), str(tmp_path / "second.png")]
    os.replace(images[0], images[1])
    images[0] = photo(tmp_path, 1)
    args = ["detect", cfg, weights, *images, "--out", "none", "--device", "cpu"]
    notes = {}
    for extra in ([], ["--engine", "numpy"], ["--quiet"]):
        r = run_in_process(args + extra)
        assert r.code == 0, r.err
        notes[tuple(extra)] = [l for l in r.err.splitlines() if "inference on" in l]
    (onnx,) = notes[()]
    assert onnx.startswith(
        "darknet-py: note: inference on ONNX Runtime (exported, checked "
        "against NumPy and cached in " + str(cache)
    )
    assert notes[("--engine", "numpy")] == []  # what was asked for runs: nothing to note
    assert notes[("--quiet",)] == []
    r = run_in_process(args)
    assert [l for l in r.err.splitlines() if "inference on" in l] == [
        f"darknet-py: note: inference on ONNX Runtime (its optimised export read from "
        f"{next((cache / 'optimized').glob('*.onnx'))}; --engine numpy runs Darknet's exact "
        f"arithmetic)"
    ]


def test_the_cache_lives_under_xdg_cache_home(tmp_path, monkeypatch):
    from darknet_py.export.cache import cache_dir

    monkeypatch.delenv("DARKNET_ONNX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == str(tmp_path / "darknet-py" / "onnx")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "darknet-py", "onnx")


@pytest.mark.skipif(not TINY_WEIGHTS.is_file(), reason=f"no real weights at {TINY_WEIGHTS}")
def test_real_yolov3_tiny_default_engine_agrees_with_numpy(cache):
    net = darknet_py.load_network(TINY_CFG, TINY_WEIGHTS, device="cpu", batch=1)
    reference = darknet_py.load_network(
        TINY_CFG, TINY_WEIGHTS, device="cpu", batch=1, engine="numpy"
    )
    got, want = head_outputs(net, str(DOG)), head_outputs(reference, str(DOG))
    assert net.engine == "onnxruntime"
    assert max(relative_difference(g, w) for g, w in zip(got, want)) < CHECK_TOLERANCE
    found, expected = net.detect(str(DOG)), reference.detect(str(DOG))
    assert len(found) == len(expected) >= 3
    for a, b in zip(found, expected):
        assert a.name == b.name and abs(a.score - b.score) < 1e-4
        assert np.allclose(a.xyxy, b.xyxy, atol=0.01)


def test_a_layer_onnxruntime_does_not_give_is_refused_not_stale(tmp_path, cache):
    cfg, weights = untrained_detector(tmp_path)
    net = darknet_py.load_network(cfg, weights, device="cpu")
    x = np.random.default_rng(3).random((1, 3, 32, 32), dtype=np.float32)
    net.predict(x)
    heads = [l.index for l in net.layers if l.type == "yolo"]
    assert net.layer_output(heads[-1]).shape[0] == 1
    with pytest.raises(
        darknet_py.network.NetworkError,
        match=r"layer 0 \[convolutional\]: ONNX Runtime ran the last inference"
        r".*engine=\"numpy\"",
    ):
        net.layer_output(0)
    net.forward(x, train=True, truth=np.zeros((1, 450), np.float32))  # the backend's pass
    assert net.layer_output(0).shape == (1, 4, 32, 32)


def test_map_and_valid_note_the_engine_and_map_quiet_drops_it(tmp_path, cache):
    from helpers import digit_set

    cfg, weights = untrained_detector(tmp_path)
    data = digit_set(tmp_path / "set", 1, 2)
    for args in (
        ["map", cfg, data, weights],
        ["valid", cfg, data, weights, "--results-dir", tmp_path / "results"],
    ):
        r = run_in_process(args + ["--device", "cpu"])
        assert r.code == 0, r.err
        assert len([l for l in r.err.splitlines() if "inference on ONNX Runtime" in l]) == 1
    quiet = run_in_process(["map", cfg, data, weights, "--device", "cpu", "--quiet"])
    assert quiet.code == 0 and "inference on" not in quiet.err, quiet.err


def cached_detector(directory):
    """A detector whose optimised model is in the cache: the first load's inference made
    it, so the next load_network leaves the weights pending."""
    cfg, weights = wider_detector(directory)
    darknet_py.load_network(cfg, weights, device="cpu").predict(
        np.zeros((1, 3, 32, 32), np.float32)
    )
    return cfg, weights


def pending(net):
    return [layer.index for layer in net.layers if "pending_parameters" in vars(layer)]


def same_parameters(net, reference):
    return all(
        np.array_equal(a, b)
        for layer, ref in zip(net.layers, reference.layers)
        for (_, a), (_, b) in zip(layer.params(), ref.params())
    )


def test_a_cache_hit_leaves_the_weights_unwritten_until_one_is_read(tmp_path, cache):
    cfg, weights = cached_detector(tmp_path)
    reference = darknet_py.load_network(cfg, weights, device="cpu", engine="numpy")
    assert pending(reference) == []
    net = darknet_py.load_network(cfg, weights, device="cpu")
    assert pending(net) and "weights" not in vars(net.layers[0])
    x = np.random.default_rng(3).random((1, 3, 32, 32), dtype=np.float32)
    got = net.predict(x).copy()
    assert pending(net)  # ONNX Runtime served it from the cache: nothing read them
    assert relative_difference(got, reference.predict(x)) < CHECK_TOLERANCE
    assert np.array_equal(net.layers[0].weights, reference.layers[0].weights)
    assert pending(net) == []  # the first read wrote them all
    assert same_parameters(net, reference)
    assert net.engine == "onnxruntime"  # reading is not changing: no export again


@pytest.mark.parametrize("use", ["train", "save", "resize", "numpy forward", "export"])
def test_every_use_of_pending_weights_sees_the_files_values(tmp_path, cache, use):
    cfg, weights = cached_detector(tmp_path)
    net = darknet_py.load_network(cfg, weights, device="cpu")
    reference = darknet_py.load_network(cfg, weights, device="cpu", engine="numpy")
    assert pending(net)
    x = np.random.default_rng(1).random((1, 3, 32, 32), dtype=np.float32)
    if use == "train":
        truth = np.zeros((1, 90 * 5), np.float32)
        truth[0, :5] = (0.5, 0.5, 0.3, 0.3, 2)
        assert net.train_pass(x, truth) == reference.train_pass(x, truth)
    elif use == "save":
        net.save_weights(tmp_path / "again.weights")
        assert (tmp_path / "again.weights").read_bytes() == Path(weights).read_bytes()
    elif use == "resize":
        net.resize(64, 64)
        reference.resize(64, 64)
    elif use == "numpy forward":
        net.inference_engine = None
        assert np.array_equal(net.predict(x), reference.predict(x))
    else:  # the cached model damaged and its export gone: exported again, from the file's values
        for path in cache.rglob("*"):
            if path.is_file():
                path.write_bytes(b"damaged")
        with pytest.warns(EngineCacheWarning):
            got = net.predict(x)
        assert relative_difference(got, reference.predict(x)) < CHECK_TOLERANCE
    assert pending(net) == []
    assert same_parameters(net, reference)


def test_threads_reading_pending_weights_at_once_all_see_the_files_values(tmp_path, cache):
    import threading

    cfg, weights = cached_detector(tmp_path)
    reference = darknet_py.load_network(cfg, weights, device="cpu", engine="numpy")
    convolutions = [l.index for l in reference.layers if l.type == "convolutional"][:2]
    for _ in range(5):
        net = darknet_py.load_network(cfg, weights, device="cpu")
        assert pending(net)
        start, seen = threading.Barrier(4), []

        def read(index):
            start.wait()
            seen.append((index, np.array(net.layers[index].weights)))

        threads = [threading.Thread(target=read, args=(convolutions[i % 2],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(seen) == 4
        for index, values in seen:
            assert np.array_equal(values, reference.layers[index].weights)
        assert pending(net) == []
