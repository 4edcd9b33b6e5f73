"""The rules for files every command shares (darknet_py/files.py) and how images are read
(darknet_py/image.py): refused inputs, outputs never replaced by accident, atomic writes."""

import errno
import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from darknet_py import image as image_module
from darknet_py.files import (
    OverwriteError,
    atomic_output,
    check_input_file,
    refuse_overwrite,
    remove_stale_temporaries,
)
from darknet_py.image import ImageError, ImageWarning, decode_image, image_size, load_image

DOG = Path(__file__).resolve().parents[1].parent / "shared" / "images" / "dog.jpg"
needs_dog = pytest.mark.skipif(not DOG.is_file(), reason=f"{DOG} not found")


def test_check_input_file_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    cases = {
        tmp_path / "none": "thing not found",
        tmp_path: "is a directory",
        tmp_path / "pipe": "not a regular file",
        "/dev/null": "not a regular file",
    }
    for path, words in cases.items():
        with pytest.raises(ValueError, match=words):
            check_input_file(path, "thing", ValueError)
    (tmp_path / "ok").write_text("x")
    assert check_input_file(tmp_path / "ok", "thing", ValueError) == str(tmp_path / "ok")
    # the file's kind named once: "weights file" is not "weights file file"
    for what, noun in (("weights file", "the weights file"), ("image", "the image file")):
        with pytest.raises(ValueError) as refused:
            check_input_file(tmp_path, what, ValueError)
        assert str(refused.value) == f"{tmp_path}: is a directory, not {noun}"


def test_refuse_overwrite_names_existing_outputs_unless_told(tmp_path):
    mine = tmp_path / "mine.jpg"
    mine.write_text("x")
    refuse_overwrite([tmp_path / "new.jpg"], overwrite=False)
    refuse_overwrite([mine], overwrite=True)
    with pytest.raises(OverwriteError, match=r"mine.jpg: already exists.*--overwrite"):
        refuse_overwrite([tmp_path / "new.jpg", mine], overwrite=False)


def test_atomic_output_replaces_in_one_step_and_names_the_real_path_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with atomic_output(target) as tmp:
        assert os.path.basename(tmp).startswith(f".output-{os.getpid()}-")
        Path(tmp).write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing visible until the end
    assert target.read_bytes() == b"new"
    with pytest.raises(OSError) as caught:  # a full disk, say
        with atomic_output(target):
            raise OSError(errno.ENOSPC, "No space left on device", "/somewhere/.output-1-x")
    assert caught.value.filename == str(target) and caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_stale_temporaries_go_live_ones_and_other_files_stay(tmp_path):
    dead = tmp_path / ".weights-999999999-abc"  # no such process
    live = tmp_path / f".weights-{os.getppid()}-abc"  # a running process is writing it
    old = tmp_path / f".chart-{os.getppid()}-abc.png"  # ... but not for an hour and more
    earlier_version = tmp_path / ".weights-k2x_9qzd"  # mkstemp's name, no process id
    other = tmp_path / ".weights-notes"
    for path in (dead, live, old, earlier_version, other):
        path.write_bytes(b"x")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted(
        [str(dead), str(old), str(earlier_version)]
    )
    assert live.exists() and other.exists()


# ---- images ------------------------------------------------------------------------------
@needs_dog
def test_image_size_reads_headers_without_decoding(tmp_path):
    data = DOG.read_bytes()
    assert image_size(data) == (768, 576)
    for ext in (".png", ".bmp", ".gif"):
        ok, encoded = cv2.imencode(ext, np.zeros((7, 5, 3), np.uint8))
        if ok:
            assert image_size(encoded.tobytes()) == (5, 7), ext
    assert image_size(b"not an image") is None


@needs_dog
def test_a_huge_image_is_decoded_reduced_and_reports_its_own_size(monkeypatch):
    full, size = decode_image(DOG)
    assert size == (768, 576) and full.shape == (576, 768, 3)
    monkeypatch.setattr(image_module, "DECODE_PIXELS", 768 * 576 // 10)  # > 1/4, < 1/2
    reduced, size = decode_image(DOG)
    assert size == (768, 576) and reduced.shape == (576 // 4, 768 // 4, 3)
    # libjpeg's reduced decoding is its DCT scaling: close to a resize of the full image.
    small = cv2.resize(full, (192, 144), interpolation=cv2.INTER_AREA)
    assert np.abs(small.astype(int) - reduced.astype(int)).mean() < 4


@needs_dog
def test_decoder_messages_become_one_warning_not_raw_stderr(tmp_path, capfd):
    data = bytearray(DOG.read_bytes())
    for i in range(20000, 20400, 7):  # damage inside the scan data; the file stays whole
        data[i] = (data[i] * 31 + 7) & 0xFF
    path = tmp_path / "damaged.jpg"
    path.write_bytes(bytes(data))
    with pytest.warns(ImageWarning, match=r"damaged.jpg: the decoder says: Corrupt JPEG"):
        img = load_image(path)
    assert img.shape == (3, 576, 768)
    assert capfd.readouterr().err == ""  # nothing reached file descriptor 2


@needs_dog
def test_truncated_and_bogus_images_are_errors(tmp_path):
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(DOG.read_bytes()[:50000])
    with pytest.raises(ImageError, match="cut.jpg: truncated JPEG"):
        load_image(cut)
    trailing = tmp_path / "trailing.jpg"  # bytes after the end marker are fine
    trailing.write_bytes(DOG.read_bytes() + b"camera data")
    assert load_image(trailing).shape == (3, 576, 768)
    wide = tmp_path / "wide.bmp"
    ok, encoded = cv2.imencode(".bmp", np.zeros((2, 2, 3), np.uint8))
    header = bytearray(encoded.tobytes())
    header[18:22] = (200000).to_bytes(4, "little")
    header[22:26] = (200000).to_bytes(4, "little")
    wide.write_bytes(bytes(header))
    with pytest.raises(ImageError, match="200000 x 200000 pixels"):
        load_image(wide)
