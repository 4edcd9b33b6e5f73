"""Detection on a video file or a camera, as Darknet's `detector demo`, without a window.

Frames come from OpenCV's VideoCapture (a file, or camera N), go through the network as
`detect` runs it, and are written with their labelled boxes by OpenCV's VideoWriter at the
source's frame rate. Each frame prints one line: frame number (of how many, for a file),
the frames per second so far and what was found. Ctrl-C stops after the current frame and
finishes the output file, so it is a valid video of the frames done; the output appears
under its name only when it is complete (written to a temporary file, then renamed).
"""

import contextlib
import os
import sys
import time
from dataclasses import dataclass

import click

from .errors import DarknetError, UsageError
from .files import OverwriteError, atomic_output, first_free_run, refuse_overwrite, run_numbered
from .network import load_network
from .plurals import counted
from .predictions import _label, check_names, default_thresh, detector_layers, draw_detections

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".m4v", ".mpg", ".mpeg", ".webm", ".wmv")
# VideoWriter codecs by container; mp4v plays everywhere OpenCV's wheels can write.
FOURCC = {".avi": "MJPG", ".mkv": "MJPG"}
DEFAULT_FOURCC = "mp4v"
CAMERA_FPS = 25.0  # a camera that does not report its rate


class VideoError(DarknetError):
    """A video or camera that cannot be read, or an output that cannot be written."""


@dataclass
class VideoResult:
    frames: int = 0  # frames read, detected and written
    seconds: float = 0.0
    interrupted: bool = False
    out: str = None  # the finished output file, if any
    frame_size: tuple = (0, 0)  # width, height

    @property
    def fps(self):
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def is_video(path):
    return os.fspath(path).lower().endswith(VIDEO_SUFFIXES)


def check_output(out, overwrite=False):
    """Refuse an output that exists (unless overwrite) or that OpenCV cannot write."""
    try:
        refuse_overwrite([out], overwrite)
    except OverwriteError as e:
        raise VideoError(str(e)) from None
    if not is_video(out):
        raise VideoError(
            f"--out {out}: a video output needs a video extension "
            f"({', '.join(VIDEO_SUFFIXES[:3])}, ...)"
        )


@contextlib.contextmanager
def _quiet_stderr():
    """Silence what FFmpeg prints straight to file descriptor 2 while a source is opened:
    a bad file is reported in one line of ours instead."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (embedded): nothing to silence
        yield
        return
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def open_source(source):
    """A cv2.VideoCapture for a video path or a camera index, checked to deliver frames."""
    import cv2

    if isinstance(source, int):
        what = f"camera {source}"
    else:
        what = os.fspath(source)
        if not os.path.isfile(what):
            raise VideoError(f"{what}: video file not found")
    with _quiet_stderr():
        capture = cv2.VideoCapture(source)
    if not capture.isOpened():
        raise VideoError(
            f"{what}: cannot open it as a video (not a video, or a format OpenCV cannot decode)"
            if not isinstance(source, int)
            else f"{what}: cannot open the camera (no such device, or it is busy)"
        )
    return capture, what


def run_video(
    net,
    source,
    out=None,
    thresh=0.5,
    hier=0.5,
    nms=0.45,
    names=None,
    classes=None,
    overwrite=False,
    max_frames=None,
    log=print,
    on_frame=None,
):
    """Detect on every frame of `source` (a video path, or an int: a camera index) and write
    the frames with labelled boxes to `out` (None: print only). Stops at the end of the
    file, after max_frames, or on Ctrl-C (KeyboardInterrupt, here or from on_frame(index,
    detections)): the output is finished either way. Returns a VideoResult."""
    import cv2

    if out is not None:
        check_output(out, overwrite)
    capture, what = open_source(source)
    result = VideoResult()
    loop = dict(
        thresh=thresh,
        hier=hier,
        nms=nms,
        names=names,
        classes=classes,
        max_frames=max_frames,
        log=log,
        on_frame=on_frame,
    )
    try:
        ok, frame = capture.read()
        if not ok:
            raise VideoError(f"{what}: no frame could be read")
        result.frame_size = frame.shape[1::-1]
        total = 0 if isinstance(source, int) else int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        if out is None:
            _detect_frames(net, capture, frame, None, total, result, **loop)
        else:
            suffix = os.path.splitext(out)[1].lower()
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            with atomic_output(out) as tmp:
                writer = cv2.VideoWriter(
                    tmp,
                    cv2.VideoWriter_fourcc(*FOURCC.get(suffix, DEFAULT_FOURCC)),
                    capture.get(cv2.CAP_PROP_FPS) or CAMERA_FPS,
                    frame.shape[1::-1],
                )
                if not writer.isOpened():
                    raise VideoError(
                        f"{out}: OpenCV cannot write this video format (use .mp4 or .avi)"
                    )
                try:
                    _detect_frames(net, capture, frame, writer, total, result, **loop)
                finally:
                    writer.release()  # writes the container's index: a playable file
            result.out = out
    finally:
        capture.release()
    log(
        f"{counted(result.frames, 'frame')} in {result.seconds:.1f} s ({result.fps:.1f} FPS)"
        f"{'; interrupted' if result.interrupted else ''}"
        f"{f'; wrote {out}' if result.out else ''}"
    )
    return result


def check_output_json(path, overwrite):
    try:
        refuse_overwrite([path], overwrite)
    except OverwriteError as e:
        raise VideoError(str(e)) from None


def write_frames_json(path, source, result, frames, names, settings):
    """--json for a video: every frame's detections (pixels of the frame and relative)."""
    import json

    from .predictions import detections_to_json

    width, height = result.frame_size
    content = {
        "video": source if isinstance(source, str) else f"camera {source}",
        "width": width,
        "height": height,
        **settings,
        "frames": [
            {"frame": index, "detections": detections_to_json(dets, width, height, names)}
            for index, dets in frames
        ],
    }
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=1)
        f.write("\n")


def _detect_frames(
    net,
    capture,
    frame,
    writer,
    total,
    result,
    thresh,
    hier,
    nms,
    names,
    classes,
    max_frames,
    log,
    on_frame,
):
    """The loop: detect, draw, write and report each frame until the source ends, the frame
    limit, or Ctrl-C (which is recorded in result, not raised)."""

    started = time.perf_counter()
    try:
        while frame is not None:
            dets = net.detect(frame, thresh=thresh, hier=hier, nms=nms)
            if writer is not None:
                writer.write(draw_detections(frame, dets, names, classes=classes))
            result.frames += 1
            result.seconds = time.perf_counter() - started
            of = f"/{total} ({100 * result.frames / total:.0f}%)" if total > 0 else ""
            found = ", ".join(_label(d, names) for d in dets)
            plural = "" if len(dets) == 1 else "s"
            log(
                f"frame {result.frames}{of}: {result.fps:.1f} FPS, {len(dets)} object{plural}"
                f"{': ' + found if found else ''}"
            )
            if on_frame is not None:
                on_frame(result.frames, dets)
            if max_frames is not None and result.frames >= max_frames:
                break
            ok, frame = capture.read()
            frame = frame if ok else None
    except KeyboardInterrupt:
        result.interrupted = True
        result.seconds = time.perf_counter() - started


DEFAULT_OUT = "predictions.mp4"


def detect_video_command(
    cfg,
    weights,
    inputs,
    camera,
    out,
    json_file,
    settings,
    names,
    device,
    overwrite=False,
    darknet=None,
):
    """`darknet-py detect` on one video file or a camera (dispatched from cli.py)."""
    if camera is not None and inputs:
        raise UsageError("give a video file or --camera N, not both")
    if camera is None and len(inputs) != 1:
        raise UsageError("give one video file at a time (without images)")
    # The default output is numbered past earlier runs' (predictions-2.mp4, ...).
    out = (
        out if out is not None else first_free_run(lambda run: [run_numbered(DEFAULT_OUT, run)])[0]
    )
    source = camera if camera is not None else inputs[0]
    check_output(out, overwrite)  # before the network loads: fail fast
    if json_file is not None:
        check_output_json(json_file, overwrite)
    if camera is None:
        open_source(source)[0].release()
    net = load_network(cfg, weights, batch=1, device=device, darknet=darknet, engine="numpy")
    heads = detector_layers(net)
    if not heads:
        raise UsageError(f"{cfg}: the network has no [yolo], [region] or [detection] layer")
    net.names = names = check_names(names, heads[-1].classes, weights, cfg, warn_missing=False)
    if settings.get("thresh") is None:  # detect's default: the flavour's (.25 in the fork)
        settings = dict(settings, thresh=default_thresh(net))
    frames = []
    result = run_video(
        net,
        source,
        out,
        names=names,
        classes=heads[-1].classes,
        overwrite=overwrite,
        log=click.echo,
        **settings,
        on_frame=lambda index, dets: frames.append((index, dets)),
    )
    if json_file is not None:
        write_frames_json(json_file, source, result, frames, names, settings)
        click.echo(
            f"darknet-py: wrote {json_file} (detections of {counted(len(frames), 'frame')})",
            err=True,
        )
