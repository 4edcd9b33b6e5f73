"""The Network's inference front end: predict and infer on float images or photos
(letterboxed on the backend from their uint8 bytes), predict_in_parts (copies hidden
behind the layers), layer outputs, detect and classify, and ONNX Runtime serving inference
on the CPU where load_network attached it (export/engine.py).

A mixin of darknet_py.network.Network, which composes it with the planner and the
executor: its methods read and write the Network's state through self.
"""

import os

import numpy as np

from .. import precision as precisions
from ..backends.pinning import unpin_nothing
from ..image import decode_image
from ..layers.nhwc_forward import is_nhwc
from ..layout_plan import nchw_output
from ..net_options import NetworkError
from ..ops.nhwc.numpy import pixel_pitch
from ..output_plan import output_is_shared
from ..predictions import as_image, classify, detect, detect_batch, detector_layers
from .arguments import whole_number

# predict() of a float batch of at most this many bytes runs as one graph with its copies
# (_predict_whole_call); a larger one is staged by threads beside the copy engine
# (backends/cuda_transfer.py), which a single copy from page-locked memory would not beat.
WHOLE_CALL_MAX_BYTES = 8 << 20


class _WholeCall:
    """Page-locked host buffers of predict()'s whole-call graph: its input and the output
    layer's values, in the output array's own dtype (16-bit storage widened after)."""

    def __init__(self, be, shape, output):
        self.output = output
        self.host_in = np.empty(shape, dtype=be.dtype)
        self.host_out = np.empty(output.size, dtype=output.dtype)
        self._unpin = [be.pin(self.host_in), be.pin(self.host_out)]
        # A GPU's graph can record copies from and to page-locked memory only; where the
        # driver refused to lock them, predict() takes the staged path instead.
        self.usable = be.name == "cpu" or unpin_nothing not in self._unpin

    def close(self):
        for unpin in self._unpin:
            unpin()
        self._unpin = []


class NetworkInference:
    """Inference on a Network (see the module's docstring)."""

    # ONNX Runtime serving inference on the CPU (export/engine.py; load_network's engine=),
    # else None: the backend runs it. engine_note: why NumPy serves it, where it does.
    inference_engine = None

    engine_note = None

    _whole_call = None  # _WholeCall: predict()'s page-locked buffers, made at first use

    # The layers whose outputs the last inference wrote when ONNX Runtime ran it (its
    # outputs: the heads, or the output layer); None: every layer's (the backend ran it).
    engine_outputs = None

    def predict(self, x):
        """Inference on x float32 (N, C, H, W) in [0, 1]; returns the network's output: the
        last layer that is not a [cost] layer (Darknet's get_network_output_layer; a cost
        layer's output is its per-element error). Photos (a path, an OpenCV BGR uint8
        (H, W, 3) array, a list of them, or an (N, H, W, 3) uint8 array) are letterboxed
        to the network size: on the backend, from their uint8 bytes (infer_photos)."""
        photos = self.as_photos(x)
        if photos is not None:
            self.infer_photos(photos)
            return self.layer_output(self.output_index)
        if self.inference_engine is None:
            x = self._as_network_input(x)
            if x.nbytes <= WHOLE_CALL_MAX_BYTES and self.capturable:
                return self._predict_whole_call(x)
        self.infer(x)
        return self.layer_output(self.output_index)

    def _predict_whole_call(self, x):
        """predict() of a small float batch as one step: the input's copy from page-locked
        host memory, the layers and the output's copy back, replayed as one graph (a batch
        of one spends more in the copies' separate calls and staging than in its layers)."""
        be, layer = self.be, self.layers[self.output_index]
        n = len(x)
        if n != self.batch:
            self._allocate(n, self.train_buffers)
        if self._input_buf is None or self._input_buf.size != x.size:
            self._input_buf = be.zeros(x.size)
        call = self._whole_call
        if call is None or call.host_in.shape != x.shape or call.output is not layer.output:
            if call is not None:
                call.close()
            call = self._whole_call = _WholeCall(be, x.shape, layer.output)
        if not call.usable:
            self.infer(x)
            return self.layer_output(self.output_index)
        np.copyto(call.host_in, x)
        net_input = self._input_buf

        def step():
            be.upload_from(net_input, call.host_in)
            self._forward_layers(net_input, False)
            be.download_into(layer.output, call.host_out)

        self.truth = self.truth_host = None
        self.train, self._net_input = False, net_input  # as the step sets them eagerly
        # Kind "predict": dropped with the other forwards when the parameters move. The
        # graph holds the buffers it copies from and to.
        self.graphs.run(
            "predict",
            ("whole call", self.batch, self.fold_batchnorm),
            (net_input, call),
            step,
            self.layers,
        )
        be.synchronize()
        self.collect_costs()
        out = precisions.widened(call.host_out)  # 16-bit storage as float32
        if out is call.host_out:  # the backend's own floats: a copy the next call leaves
            out = out.copy()
        return out.reshape(layer.output_shape(n))

    def infer_photos(self, photos, letter=True):
        """infer() on photos: OpenCV BGR uint8 (H, W, 3) arrays of any sizes, or one
        (N, H, W, 3) uint8 array, for a 3-channel network. Their bytes are uploaded as they
        are (a quarter of the float input's) on the copy stream, then converted and
        letterboxed (letter) or resized into the network input on the backend
        (letterbox_images: image.py's arithmetic, its bits)."""
        if self.input_shape[0] != 3 or len(self.input_shape) != 3:
            raise ValueError(
                f"infer_photos: the network takes {self.input_shape} inputs, not 3-channel images"
            )
        if not len(photos):
            raise ValueError("infer_photos: no images")
        one_array = isinstance(photos, np.ndarray)
        for photo in [photos] if one_array else photos:
            if not (
                isinstance(photo, np.ndarray)
                and photo.dtype == np.uint8
                and photo.size
                and photo.ndim == (4 if one_array else 3)
                and photo.shape[-1] == 3
            ):
                got = (
                    f"{photo.dtype} of shape {photo.shape}"
                    if isinstance(photo, np.ndarray)
                    else type(photo).__name__
                )
                raise ValueError(
                    f"infer_photos takes OpenCV BGR uint8 (H, W, 3) photos or one "
                    f"(N, H, W, 3) uint8 array; got {got}"
                )
        if len(photos) != self.batch:
            self._allocate(len(photos), self.train_buffers)
        staged = self._upload_photos(photos)
        self._run_photos(staged, letter)
        self.be.finish_upload(staged[1])

    def _upload_photos(self, photos):
        """(backend uint8 array, its upload, the photos' shapes): the photos' bytes, copied
        on the copy stream after the work queued so far."""
        host = (
            photos
            if isinstance(photos, np.ndarray)
            else np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in photos])
        )
        array, upload = self.be.upload_bytes_async(np.ascontiguousarray(host))
        return array, upload, [p.shape[:2] for p in photos]

    def _run_photos(self, staged, letter):
        """The layers on the photos of staged (_upload_photos), letterboxed into the input
        once their upload has landed."""
        array, upload, shapes = staged
        _, height, width = self.input_shape
        self.truth = self.truth_host = None
        buf = self._input_buf
        if buf is None or buf.size != len(shapes) * self.inputs:
            buf = self._input_buf = self.be.zeros(len(shapes) * self.inputs)
        self.be.wait_upload(upload)
        offsets = np.cumsum([0] + [h * w * 3 for h, w in shapes[:-1]])
        first = self.layers[0]
        if is_nhwc(first) and first.layout.input_boundary and first.c == 3:
            # issue 42: letterboxed straight into the first convolution's NHWC input; a
            # step of its own (its recorded graph converts no fp32 input)
            self.be.letterbox_images_nhwc(
                array, shapes, offsets, width, height, letter, first.nhwc_input, pixel_pitch(3)
            )

            def step():
                first.nhwc_input_ready = True
                self._forward_layers(buf, False)

            self._run_step(
                "predict", (self.batch, self.fold_batchnorm, "nhwc photos"), buf, False, step
            )
            self._net_input = None  # buf holds no image: infer() must be given one
            self.collect_costs()
            return
        self.be.letterbox_images(array, shapes, offsets, width, height, letter, buf)
        self._run_step(
            "predict",
            (self.batch, self.fold_batchnorm),
            buf,
            False,
            lambda: self._forward_layers(buf, False),
        )
        self.collect_costs()

    def _predict_photos_in_parts(self, photos, part):
        """predict_in_parts for photos: part k+1's bytes copy while part k's layers run,
        and part k's output comes back while part k+1's run."""
        output, result, rows, parts = self._parts_of(photos, part)
        staged, pending = [self._upload_photos(parts[0])], None
        for k in range(len(parts)):
            if k + 1 < len(parts):  # queued before part k's layers: copies beside them
                staged.append(self._upload_photos(parts[k + 1]))
            self._run_photos(staged[k], True)
            if pending is not None:
                self.be.finish_download(pending)
            pending = self.be.download_async(output, rows[k * part : (k + 1) * part])
        self.be.finish_download(pending)
        for _, upload, _ in staged:
            self.be.finish_upload(upload)
        return result.astype(self.be.dtype, copy=False)

    def as_photos(self, x):
        """x as a list of BGR uint8 (H, W, 3) photos (paths decoded) or an (N, H, W, 3)
        uint8 array, when it is photos a 3-channel network can take from their bytes;
        None for anything else (float input, other channel counts), and where ONNX Runtime
        serves inference (it takes the float input sized on the host)."""
        if (
            len(self.input_shape) != 3
            or self.input_shape[0] != 3
            or self.inference_engine is not None
        ):
            return None
        if isinstance(x, np.ndarray):
            if x.dtype == np.uint8 and x.ndim == 4 and x.shape[3] == 3:
                return x
            return [x] if x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3 else None
        items = list(x) if isinstance(x, (list, tuple)) else [x]
        photos = []
        for item in items:
            if isinstance(item, (str, os.PathLike)):
                item = decode_image(item, 3)[0]
            if not (
                isinstance(item, np.ndarray)
                and item.dtype == np.uint8
                and item.ndim == 3
                and item.shape[2] == 3
                and item.size
            ):
                return None
            photos.append(item)
        return photos or None

    def predict_in_parts(self, x, part):
        """predict(x) for many images, run `part` images at a time so that the copies hide
        behind the layers: while the device runs one part, the next part's input is staged
        and uploaded (prefetch, on the copy stream) and the previous part's output taken
        (download_async). Returns what predict(x) returns; the network is left at batch
        `part` (its layers' outputs hold the last part). Photos (as predict takes them) go
        up as their bytes, letterboxed on the backend (infer_photos)."""
        part = whole_number(part, "predict_in_parts' part")
        photos = self.as_photos(x)
        if photos is not None:
            return self._predict_photos_in_parts(photos, part)
        x = np.ascontiguousarray(self._as_network_input(x), dtype=np.float32)
        output, result, rows, parts = self._parts_of(x, part)
        pending = None
        self.prefetch(parts[0])
        for k, images in enumerate(parts):
            # Part k+1's upload waits for the work queued before it: queued before part k's
            # layers (from the second part on), it runs beside them.
            if k and k + 1 < len(parts):
                self.prefetch(parts[k + 1])
            self.infer(images)  # takes its prefetched upload
            if k == 0 and len(parts) > 1:
                self.prefetch(parts[1])
            if pending is not None:
                self.be.finish_download(pending)
            pending = self.be.download_async(output, rows[k * part : (k + 1) * part])
        self.be.finish_download(pending)
        self.finish_prefetch()
        return result.astype(self.be.dtype, copy=False)

    def _parts_of(self, x, part):
        """predict_in_parts' start: the network at batch `part`; (the output layer's
        output for a part, the result array for all of x, its rows per image, x's parts)."""
        if len(x) % part:
            raise ValueError(f"{len(x)} images do not split into parts of {part}")
        self.set_batch(part)
        layer = self.layers[self.output_index]
        output = layer.output[: part * layer.outputs]
        result = np.empty(layer.output_shape(len(x)), dtype=output.dtype)
        parts = [x[start : start + part] for start in range(0, len(x), part)]
        return output, result, result.reshape(len(x), -1), parts

    def infer(self, x=None):
        """Inference on x as predict runs it, every output left on the backend (read the
        ones needed with layer_output): no copy back, no wait for the device. x=None runs
        again on the input staged last (what `bench` times as the GPU-only forward)."""
        if (
            x is not None
            and self.inference_engine is not None
            and self.inference_engine.infer(self, x)
        ):
            return
        if x is None:
            net_input = self._net_input
            if net_input is None:
                raise NetworkError("infer() without an input: no input was staged before")
        else:
            net_input = self._stage(self._as_network_input(x), None, False)
        self._run_step(
            "predict",
            (self.batch, self.fold_batchnorm),
            net_input,
            False,
            lambda: self._forward_layers(net_input, False),
        )
        self.collect_costs()

    @property
    def engine(self):
        """What serves inference: "onnxruntime", "numpy" or the GPU backend's name ("cuda").
        Asking makes ONNX Runtime's engine ready (its export, or the cached one)."""
        if self.inference_engine is not None and self.inference_engine.prepare(self):
            return self.inference_engine.name
        return "numpy" if self.be.name == "cpu" else self.be.name

    def _as_network_input(self, x):
        """predict's input as float32 (N, C, H, W): a photo (a path, or an OpenCV (H, W, 3)
        uint8 array) is letterboxed to the network size for you; an array of another shape
        is refused with the shape expected."""
        from ..image import letterbox

        if len(self.input_shape) == 1:  # [net] inputs=N without an image size (rnn.cfg)
            x = np.asarray(x, dtype=np.float32)
            rows = x[None] if x.ndim == 1 else x
            if rows.ndim != 2 or rows.shape[1] != self.inputs:
                raise ValueError(
                    f"predict takes float32 rows of {self.inputs} inputs, shape "
                    f"(N, {self.inputs}); got shape {x.shape}"
                )
            return rows
        channels, height, width = self.input_shape
        if isinstance(x, (str, os.PathLike)) or (
            getattr(x, "dtype", None) == np.uint8 and np.ndim(x) in (2, 3)
        ):
            x = letterbox(as_image(x, channels), width, height)
        x = np.asarray(x, dtype=np.float32)
        given = x.shape
        if x.ndim == 2 and x.shape[1] == self.inputs:  # flat rows, as Darknet's float *input
            x = x.reshape((len(x),) + tuple(self.input_shape))
        if x.ndim == len(self.input_shape):
            x = x[None]
        if x.ndim != 4 or x.shape[1:] != (channels, height, width):
            raise ValueError(
                f"predict takes float32 images of shape (N, {channels}, {height}, {width}) "
                f"(RGB, 0-1), or a photo (a path or an OpenCV (H, W, 3) uint8 array) that it "
                f"letterboxes; got shape {given} (letter-box a photo yourself with "
                f"darknet_py.letterbox(load_image(path), {width}, {height}))"
            )
        return x

    def layer_output(self, i):
        """Layer i's output from the last forward, as a host array (N, C, H, W) or (N, n)."""
        layer = self.layers[i]
        if self.engine_outputs is not None and layer.index not in self.engine_outputs:
            raise NetworkError(
                f"layer {layer.index} [{layer.type}]: ONNX Runtime ran the last inference and "
                f"gives only the outputs of layers {sorted(self.engine_outputs)}; load the "
                f"network with engine=\"numpy\" for every layer's"
            )
        if getattr(self, "train_buffers", False) and output_is_shared(layer):
            raise NetworkError(
                f"layer {i}: its output shares an array with other layers' and "
                f"lives only while its readers use it; set "
                f"net.share_outputs = False before training to read it"
            )
        output = layer.output
        if is_nhwc(layer):  # kept NHWC at 16 bits: NCHW fp32 as every other layer's
            output = nchw_output(layer, self.be)
        return self.be.to_host(output).reshape(layer.output_shape(self.batch))

    # ---- applications ---------------------------------------------------------------
    def detect(self, image, thresh=0.5, hier=0.5, nms=0.45, batch=8):
        """Detections on an image (a path, a Darknet (3, H, W) float image, or an OpenCV
        BGR uint8 (H, W, 3) array), highest score first: each has .name, .score, .xyxy
        (pixels of the original image) and .box (relative centre x, y, w, h). Given a list
        of images, a list of such lists, `batch` images per forward pass. See
        predictions.py."""
        if isinstance(image, (list, tuple)):
            return detect_batch(
                self,
                list(image),
                thresh=thresh,
                hier=hier,
                nms=nms,
                batch=whole_number(batch, "detect's batch"),
            )
        return detect(self, image, thresh=thresh, hier=hier, nms=nms)

    def classify(self, image, top=5):
        """[(class_id, prob, name), ...] for the `top` most probable classes."""
        if detector_layers(self):
            raise ValueError(f"{self.path}: the network is a detector; use detect()")
        return classify(self, image, top=top)
