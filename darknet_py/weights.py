"""Darknet .weights files, read and written byte for byte.

Layout: int32 major, minor, revision; `seen` as uint64 when major*10+minor >= 2
(and both < 1000), else int32; then float32 parameters, layer by layer in
network order, each layer's arrays in the order its params() lists them.
Files with major or minor > 1000 store connected weights transposed.
"""

import os
import stat
import struct
import threading
import warnings
from dataclasses import dataclass

import numpy as np

from .errors import DarknetError, DarknetWarning
from .files import atomic_output, check_input_file
from .layers.convolutional import ConvolutionalLayer
from .plurals import counted

# The AlexeyAB fork writes its weights headers as 0.2.5 (the original, and converters, 0.2.0).
FORK_WEIGHTS_HEADER = (0, 2, 5)


class WeightsError(DarknetError):
    pass


class WeightsWarning(DarknetWarning):
    """A weights file that loads but holds something suspicious (NaN or infinite values)."""


def _header_layout(major, minor):
    seen_is_64 = (major * 10 + minor) >= 2 and major < 1000 and minor < 1000
    return seen_is_64, (major > 1000 or minor > 1000)


def _layers_upto(net, cutoff):
    n = len(net.layers) if cutoff is None else min(int(cutoff), len(net.layers))
    return [l for l in net.layers[:n] if not l.section.get_int("dontload", 0)]


def _arrays(layer):
    """(name, array) pairs of a layer as the file stores them (dontloadscales drops BN)."""
    params = layer.params()
    if layer.section.get_int("dontloadscales", 0):
        params = [
            (n, a) for n, a in params if n not in ("scales", "rolling_mean", "rolling_variance")
        ]
    return params


def _connected_shape(layer, name, arr):
    """(inputs, outputs) when `arr` is the weights of a [connected] layer (or of a recurrent
    layer's inner one), stored transposed under the headers with a part > 1000; else None."""
    if name != "weights":
        return None
    for owner in layer.param_owners():
        if owner.type == "connected" and owner.weights is arr:
            return owner.inputs, owner.outputs
    return None


def floats_needed(net, cutoff=None):
    return sum(a.size for l in _layers_upto(net, cutoff) for _, a in _arrays(l))


def read_header(f, path):
    head = f.read(12)
    if len(head) < 12:
        raise WeightsError(
            f"{path}: not a Darknet weights file ({len(head)} bytes, "
            f"shorter than the 12-byte header)"
        )
    major, minor, revision = struct.unpack("<3i", head)
    seen_is_64, transpose = _header_layout(major, minor)
    raw = f.read(8 if seen_is_64 else 4)
    if 0 < len(raw) < (8 if seen_is_64 else 4):
        raise WeightsError(
            f"{path}: not a Darknet weights file (its header ends inside the "
            f"{8 if seen_is_64 else 4}-byte image count)"
        )
    seen = struct.unpack("<Q" if seen_is_64 else "<i", raw)[0] if raw else 0
    return (major, minor, revision), seen, transpose, 12 + (8 if seen_is_64 else 4)


def _read_floats(path, need=None, at_least=False):
    """(header, seen, transpose, float32 data, header bytes) of a weights file. need: the
    floats the network wants (at_least: or more), for the sizes an error about a cut-off
    file gives."""
    path = os.fspath(path)
    check_input_file(path, "weights file", WeightsError)
    with open(path, "rb") as f:
        header, seen, transpose, offset = read_header(f, path)
        body = _read_rest(f)
    if len(body) % 4:
        raise WeightsError(
            f"{path}: {len(body)} bytes after the header is not a whole "
            f"number of floats: a cut-off download or a damaged file"
            + (
                f" ({_sizes(offset + len(body), offset, need, at_least)})"
                if need is not None
                else ""
            )
        )
    return header, seen, transpose, body.view("<f4"), offset


def _read_rest(f):
    """The rest of an open file as a uint8 array. Read straight into a NumPy array: a
    bytes object of the same size costs three times as long to fill on a machine where
    fresh pages are dear (NumPy asks for huge pages; 35 MB: ~10 ms against ~40)."""
    size = max(os.fstat(f.fileno()).st_size - f.tell(), 0)
    body = np.empty(size, np.uint8)
    filled = 0
    while filled < size:  # a file that shrank since its size was read gives what it has
        got = f.readinto(memoryview(body)[filled:])
        if not got:
            return body[:filled]
        filled += got
    rest = f.read()  # a file that grew since: the whole of it, as a read to the end would
    return np.concatenate([body, np.frombuffer(rest, np.uint8)]) if rest else body


def _sizes(found_bytes, offset, need, at_least=False):
    """'the file is N bytes where this cfg's weights are M': expected vs found size."""
    expected = offset + 4 * need
    return (
        f"the file is {found_bytes:,} bytes where this cfg's weights are "
        f"{'at least ' if at_least else ''}{expected:,}"
    )


def peek_header(path):
    """(major, minor, revision) of a weights file, or None when it is missing, short or not
    a regular file (opening a named pipe would wait for a writer; loading reports it)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(os.fspath(path), "rb") as f:
            head = f.read(12)
    except OSError:
        return None
    return struct.unpack("<3i", head) if len(head) == 12 else None


def load_weights(net, path, cutoff=None, allow_partial=False, transfer=False, defer=False):
    """Load parameters into the network's layers [0, cutoff).

    The file must hold exactly the floats those layers need (more is fine when a
    cutoff is given, as with Darknet's `partial`). With allow_partial, a file that
    ends on a layer boundary (a pretrained backbone such as darknet53.conv.74)
    fills the layers it covers and returns how many layers that was. With transfer,
    a file trained for another class count (see transfer_weights) loads the layers
    whose shapes match and returns a TransferReport instead. With defer (load_network,
    when ONNX Runtime will serve the network from its cache), the checked values wait in
    a PendingParameters until a parameter is first read."""
    path = os.fspath(path)
    layers = _layers_upto(net, cutoff)
    need = floats_needed(net, cutoff)
    header, seen, transpose, data, offset = _read_floats(path, need, cutoff is not None)
    have = data.size
    if have != need and cutoff is None:
        layout = class_count_layout(net, have)
        if layout is not None and transfer:
            return _load_transfer(net, path, layout, header, transpose, data)
        if layout is not None and not (allow_partial and have < need):
            raise WeightsError(f"{path}: {layout.describe(net)}. {layout.remedy(net, path)}")
    if have < need and allow_partial:
        boundary, covered = 0, 0
        for layer in layers:
            nxt = boundary + sum(a.size for _, a in _arrays(layer))
            if nxt > have:
                break
            boundary, covered = nxt, covered + 1
        if boundary != have:
            raise WeightsError(
                f"{path}: has {have} floats, which does not end on a layer "
                f"boundary of this network (it needs {need}): a cut-off "
                f"download ({_sizes(offset + 4 * have, offset, need)}), or "
                f"weights of another cfg?"
            )
        layers = layers[:covered]
    elif have < need or (have > need and cutoff is None):
        more = "fewer" if have < need else "more"
        # A download cut short is as likely as a wrong cfg: say both, with the sizes.
        sizes = _sizes(offset + 4 * have, offset, need, cutoff is not None)
        cut = f"a cut-off download ({sizes}), or " if have < need else ""
        raise WeightsError(
            f"{path}: has {have} floats after its header but the network "
            f"{'up to layer ' + str(cutoff) + ' ' if cutoff is not None else ''}needs {need} "
            f"({more} than needed: {cut}is this the weights file for this cfg? To start from "
            f"the first layers of another network's weights, cut them with `darknet-py "
            f"partial THAT.cfg {path} OUT N`)"
        )
    all_finite = bool(np.isfinite(data).all())
    if defer and all_finite and PendingParameters.possible(net, layers):
        PendingParameters(net, layers, data, transpose)
    else:
        pos = 0
        for layer in layers:
            pos = _write_layer(net, layer, data, pos, transpose, None if all_finite else path)
    net.params_changed()
    net.seen = int(seen)
    net.weights_header = header
    return len(layers)


def _write_layer(net, layer, data, pos, transpose, check_finite_in=None):
    """Write one layer's arrays from data[pos:]; returns the position after them. With
    check_finite_in (the file's path), NaN/Inf values are warned about per array."""
    for name, arr in _arrays(layer):
        values = data[pos : pos + arr.size]
        pos += arr.size
        if check_finite_in and not np.isfinite(values).all():
            warnings.warn(
                WeightsWarning(
                    f"{check_finite_in}: layer {layer.index} [{layer.type}] {name}: "
                    f"{int((~np.isfinite(values)).sum())} of {counted(values.size, 'value')} "
                    f"{'is' if (~np.isfinite(values)).sum() == 1 else 'are'} NaN or "
                    f"infinite (weights saved from a diverged run?)"
                ),
                stacklevel=3,
            )
        shape = _connected_shape(layer, name, arr) if transpose else None
        if shape:
            values = values.reshape(shape).T
        net.be.write(arr, values)
    return pos


class PendingParameters:
    """A weights file's values, read and checked, not yet written into the layers' arrays.
    load_network leaves them so where ONNX Runtime serves the network from its cache: the
    NumPy copy of the parameters may never be read, and writing it is a pass over fresh
    memory as large as the file (yolov4: 245 MB, 0.2-1.4 s on a 2-core VM). The arrays
    stay allocated (untouched zeros cost no memory) but leave their layers' attributes, so
    that the first read of any of them (layer.weights, params(), an export, a NumPy
    forward, training) finds Layer.__getattr__, which writes them all and puts them back."""

    def __init__(self, net, layers, data, transpose):
        self.data, self.lock = data, threading.Lock()
        self.held = []  # (layer, attribute, array, transposed shape) in the file's order
        for layer in layers:
            for name, arr in _arrays(layer):
                shape = _connected_shape(layer, name, arr) if transpose else None
                self.held.append((layer, name, arr, shape))
        self.be = net.be
        self.names = {}  # id(layer) -> the attributes it waits for (Layer.__getattr__)
        for layer, name, _, _ in self.held:
            del layer.__dict__[name]
            layer.__dict__["pending_parameters"] = self
            self.names.setdefault(id(layer), set()).add(name)

    @staticmethod
    def possible(net, layers):
        """Whether every parameter to load is its layer's own attribute, with no class
        attribute of that name behind it and no other layer holding the same array."""
        if net.be.name != "cpu" or any(getattr(l, "share", None) is not None for l in net.layers):
            return False
        for layer in layers:
            arrays = _arrays(layer)
            if len({name for name, _ in arrays}) != len(arrays):
                return False
            for name, arr in arrays:
                if layer.__dict__.get(name) is not arr or any(
                    name in vars(cls) for cls in type(layer).__mro__
                ):
                    return False
        return True

    def write(self):
        """Write the values into the arrays, then give the layers their attributes back
        (in that order: another thread never reads an array before it holds the file's
        values; it waits here)."""
        with self.lock:
            if self.data is None:
                return
            pos = 0
            for _, _, arr, shape in self.held:
                values = self.data[pos : pos + arr.size]
                pos += arr.size
                self.be.write(arr, values.reshape(shape).T if shape else values)
            for layer, name, arr, _ in self.held:
                layer.__dict__[name] = arr
                layer.__dict__.pop("pending_parameters", None)
            self.data, self.names = None, {}


def write_pending_parameters(net):
    """Write the parameters load_network left pending, if any (for code that walks a
    layer's attributes without reading them one by one)."""
    for layer in net.layers:
        pending = layer.__dict__.get("pending_parameters")
        if pending is not None:
            pending.write()
            return


# ---- transfer: weights trained for another class count --------------------------------------
# The heads whose convolution before them has n * (classes + extra) filters.
TRANSFER_HEADS = ("yolo", "gaussian_yolo", "region")


@dataclass
class ClassCountLayout:
    """A weights file that holds this cfg's layers trained for `classes` classes: only the
    convolutions feeding the detection heads (`head_convs`: layer -> floats in the file)
    differ from this network."""

    classes: int
    head_convs: dict

    def describe(self, net):
        heads = [net.layers[i + 1] for i in self.head_convs]
        return (
            f"holds this cfg's layers trained for {self.classes} classes, but the "
            f"cfg's [{heads[0].section.header}] layers have classes={heads[0].classes}: layer"
            f"{'s' if len(heads) > 1 else ''} {_index_list(self.head_convs)} "
            f"(the convolution{'s' if len(heads) > 1 else ''} before "
            f"{'them' if len(heads) > 1 else 'it'}) differ"
        )

    def remedy(self, net, path):
        first = min(self.head_convs)
        return (
            f"To fine-tune from it, train with --weights {path} (the layers that match "
            f"are loaded; Python: load_network(..., transfer=True)), or cut the "
            f"{counted(first, 'layer')} before the first difference: `darknet-py partial "
            f"{net.path} {path} OUT {first}`"
        )


@dataclass
class TransferReport:
    """What transfer loading did: layer indices loaded and left at their random start."""

    classes: int  # the class count the file was trained for
    loaded: list
    not_loaded: list

    def lines(self, path):
        return [
            f"{path}: weights trained for {counted(self.classes, 'class', 'classes')}; "
            f"loaded the {counted(len(self.loaded), 'layer')} whose shapes match "
            f"({_index_list(self.loaded)})",
            f"layers {_index_list(self.not_loaded)} differ in shape and start from "
            f"random values (Darknet's initialisation)",
        ]


def _index_list(indices):
    """'0-14, 17, 19-21' for sorted layer indices."""
    runs, indices = [], sorted(indices)
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def class_count_layout(net, have):
    """The ClassCountLayout under which a file of `have` floats is this network trained for
    another class count, or None. Each [yolo]/[Gaussian_yolo]/[region] head has n anchors
    and reads a convolution with n * (classes + extra) filters, so the file's size is this
    network's plus (classes - this network's classes) * the head convolutions' floats per
    class."""
    heads = [l for l in net.layers if l.type in TRANSFER_HEADS]
    if not heads or len({h.classes for h in heads}) != 1:
        return None
    per_class = {}  # head convolution -> (its floats here, its floats per class)
    for head in heads:
        conv = net.layers[head.index - 1] if head.index else None
        if not isinstance(conv, ConvolutionalLayer) or conv.filters != head.out_c:
            return None
        if any(
            conv in getattr(l, "sources", ()) or getattr(l, "source", None) is conv
            for l in net.layers
        ):  # another consumer would change shape too
            return None
        if conv.section.get_int("dontload", 0) or conv.section.get_int("dontloadscales", 0):
            return None
        floats = sum(a.size for _, a in _arrays(conv))
        per_class[conv.index] = (floats, floats // conv.filters * head.n)
    extra = have - floats_needed(net)
    step = sum(p for _, p in per_class.values())
    more_classes = extra // step
    if extra == 0 or extra % step or heads[0].classes + more_classes < 1:
        return None
    return ClassCountLayout(
        heads[0].classes + more_classes,
        {i: floats + more_classes * p for i, (floats, p) in per_class.items()},
    )


def _load_transfer(net, path, layout, header, transpose, data):
    loaded, not_loaded, pos = [], [], 0
    for layer in _layers_upto(net, None):
        if not _arrays(layer):
            continue
        if layer.index in layout.head_convs:
            pos += layout.head_convs[layer.index]  # keeps its random initialisation
            not_loaded.append(layer.index)
        else:
            pos = _write_layer(net, layer, data, pos, transpose)
            loaded.append(layer.index)
    assert pos == data.size, "class_count_layout accounted for every float"
    net.seen = 0  # the file's image count belongs to the other task
    net.weights_header = header
    return TransferReport(layout.classes, loaded, not_loaded)


def save_weights(net, path, cutoff=None):
    """Write the layers [0, cutoff) atomically, in the header format the network was loaded
    with (so an unchanged network saves the same bytes it loaded)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise WeightsError(
            f"{path}: is a directory; give the weights file's name "
            f"(e.g. {os.path.join(path, 'my.weights')})"
        )
    major, minor, revision = getattr(net, "weights_header", (0, 2, 0))
    seen = int(net.seen)
    if getattr(net, "darknet", "original") == "alexeyab":
        # The fork writes its own version and `seen` as whole iterations (its save_weights
        # sets seen = cur_iteration * batch * subdivisions).
        major, minor, revision = FORK_WEIGHTS_HEADER
        seen = net.iteration * net.images_per_iteration
    seen_is_64, transpose = _header_layout(major, minor)
    chunks = [
        struct.pack("<3i", major, minor, revision),
        struct.pack("<Q" if seen_is_64 else "<i", seen),
    ]
    for layer in _layers_upto(net, cutoff):
        for name, arr in _arrays(layer):
            values = net.be.to_host(arr).astype("<f4")
            shape = _connected_shape(layer, name, arr) if transpose else None
            if shape:
                values = values.reshape(shape[::-1]).T.reshape(-1)
            chunks.append(values.tobytes())
    with atomic_output(path, kind="weights") as tmp, open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
