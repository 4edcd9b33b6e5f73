"""ONNX Runtime as the CPU engine: a network's inference served by its ONNX export.

load_network(engine=...) attaches an OnnxRuntimeEngine to a CPU network (attach, which
darknet_py installs into darknet_py.network: that package stands on a lower floor):
  "auto" (None)  ONNX Runtime when it is installed and a weights file was loaded, else
                 NumPy; a network ONNX cannot serve (a layer export does not cover, a
                 difference over the check's tolerance) falls back to NumPy, saying why;
  "onnxruntime"  ONNX Runtime or an error;
  "numpy"        darknet-py's NumPy backend: Darknet's exact arithmetic.
The engine is made on the first inference (training never needs it): the network is
exported with a dynamic batch, checked against NumPy's forward on a random input (as
`darknet-py export` checks) and cached with ONNX Runtime's optimised form of it
(cache.py); a later load of the same cfg and weights reads the optimised model and skips
the export, the check and the optimisation (onnx is not even imported). The engine writes
the raw outputs (every detection head, or the output layer) into those layers' output
buffers, where detect(), classify() and the validation code read them. Training leaves
ONNX Runtime for good (the weights move); parameters changed by hand (params_changed,
load_weights) are exported again, in memory."""

import importlib.util
import os
import sys
import warnings

import click
import numpy as np

from . import PIP_COMMAND, EngineCacheWarning, ExportError, cache, require
from .check import CHECK_TOLERANCE, compare, session
from .model import output_layers

ENGINES = ("auto", "numpy", "onnxruntime")
QUIET_KEY = "darknet_py.quiet"  # click's ctx.meta: the command's --quiet (engine_option)
# The graphs the engine tries, in order: Winograd where it pays, then plain Conv.
ENGINE_GRAPH_FORMS = ("auto", None)


class OnnxRuntimeEngine:
    """ONNX Runtime serving one network's inference (Network.inference_engine)."""

    name = "onnxruntime"

    def __init__(self, net, key, required, threads=None):
        self.key = key  # the cache entry's name; None: export in memory
        self.required = required  # --engine onnxruntime: a failure is an error
        self.threads = threads
        self.session = None
        self.where = None  # how the model came: "cached", "exported", ...
        self.shape = net.input_shape
        self.outputs = output_layers(net)

    def params_changed(self):
        """The parameters are not the weights file's any more: export them again."""
        self.key, self.session = None, None

    def prepare(self, net):
        """Export (or read the cached export), check, and start the session; True when
        ONNX Runtime serves `net`. Where it cannot, the network falls back to NumPy
        (net.engine_note says why), or with `required` an ExportError says why."""
        if self.session is not None:
            return True
        net.inference_engine = None  # the check runs NumPy's forward
        try:
            self.session = self._session(net)
        except Exception as e:  # the default engine falls back to NumPy, saying why
            if self.required:
                if isinstance(e, ExportError):
                    raise ExportError(f"--engine onnxruntime: {e}") from None
                raise
            net.engine_note = f"inference on NumPy: {_reason(e)}"
            return False
        net.inference_engine = self
        return True

    def _session(self, net):
        """The session on the cached, already optimised model; else on the cached export
        (optimised now, and that saved); else on a new export, once it passed the check
        (then both cached). A damaged cache file is made again, with a warning."""
        if not self.key:
            return self._export(net, None, None)
        ort = require("onnxruntime")
        tag = cache.runtime_tag(ort.__version__)
        optimized = cache.optimized_path(self.key, tag)
        if os.path.exists(optimized):
            try:
                sess = session(optimized, self.threads, optimize=False)
                cache.mark_used(optimized)
                self.where = f"its optimised export read from {optimized}"
                return sess
            except Exception as e:  # damaged: optimise the export again
                _warn_damaged(optimized, e, "optimised again")
                cache.remove(optimized)
        data = cache.read_entry(self.key)
        if data is not None:
            staged = cache.stage_optimized(self.key, tag)
            try:
                sess, staged = self._optimizing_session(data, staged)
            except Exception as e:  # damaged: export again and replace it
                _warn_damaged(cache.entry_path(self.key), e, "exported again")
            else:
                saved = staged and cache.keep_optimized(staged, self.key, tag)
                if saved:
                    cache.trim(self.key)
                self.where = f"its export read from {cache.entry_path(self.key)}" + (
                    f", optimised and saved in {saved}" if saved else ""
                )
                return sess
        return self._export(net, self.key, tag)

    def _export(self, net, key, tag):
        """Export the network, check it against NumPy and cache it under key (with its
        optimised form) when the key names an entry. The engine's graph has Winograd
        convolutions where they pay (winograd.py); should that form miss the check (its
        rounding differs from the direct product's), the plain export is checked instead."""
        from .model import export_model

        for form in ENGINE_GRAPH_FORMS:
            data = export_model(net, batch=None, winograd=form).SerializeToString()
            entry = cache.StagedEntry(key, data) if key else None  # written meanwhile
            staged = cache.stage_optimized(key, tag) if key else None
            try:
                sess, staged = self._optimizing_session(data, staged)
                x = np.random.default_rng(0).random((1,) + net.input_shape, dtype=np.float32)
                diffs = compare(net, sess, x)
                worst = max(diffs, key=diffs.get)
                if not diffs[worst] < CHECK_TOLERANCE:
                    raise ExportError(
                        f"ONNX Runtime differs from NumPy by {diffs[worst]:.2e} "
                        f"(over {CHECK_TOLERANCE:g}) on {worst}"
                    )
            except BaseException as e:
                cache.discard_staged(staged)
                if entry:
                    entry.discard()
                if isinstance(e, ExportError) and form is not None:
                    continue
                raise
            break
        path = entry.keep() if entry else None
        if path and staged:
            cache.keep_optimized(staged, key, tag)
        else:
            cache.discard_staged(staged)
        if path:
            cache.trim(key)
        self.where = (
            f"exported, checked against NumPy and cached in {path}"
            if path
            else "exported and checked against NumPy in memory"
        )
        return sess

    def _optimizing_session(self, data, staged):
        """(session, staged): the session on data, its optimised model saved to staged; where
        that cannot be saved, the session alone (staged None)."""
        if staged:
            try:
                return session(data, self.threads, save_optimized=staged), staged
            except Exception:  # saving failed (a full disk, say), or the model is bad
                cache.discard_staged(staged)
        return session(data, self.threads), None

    def infer(self, net, x):
        """As Network.infer on x; False where NumPy must run it instead (the engine could
        not be made, or the network was resized since)."""
        if net.input_shape != self.shape:
            net.inference_engine = None
            net.engine_note = "inference on NumPy: the network was resized after loading"
            return False
        if not self.prepare(net):
            return False
        x = np.ascontiguousarray(net._as_network_input(x), dtype=np.float32)
        if len(x) != net.batch:
            net.set_batch(len(x))
        results = self.session.run([name for name, _ in self.outputs], {"input": x})
        for (_, layer), value in zip(self.outputs, results):
            net.be.write(layer.output, value.reshape(-1))
        net.engine_outputs = {layer.index for _, layer in self.outputs}
        return True


def _warn_damaged(path, error, remedy):
    detail = " ".join(str(error).split())
    warnings.warn(
        EngineCacheWarning(
            f"{path}: a damaged ONNX cache file ({type(error).__name__}: {detail[:200]}); {remedy}"
        ),
        stacklevel=3,
    )


def _reason(error):
    text = (
        str(error)
        if isinstance(error, ExportError)
        else f"ONNX Runtime could not serve the network ({type(error).__name__}: {error})"
    )
    return " ".join(text.split())


def onnxruntime_installed():
    """Whether ONNX Runtime can be imported (found, not imported: training never needs it)."""
    if "onnxruntime" in sys.modules:  # None there: an import that failed, or was blocked
        return sys.modules["onnxruntime"] is not None
    return importlib.util.find_spec("onnxruntime") is not None


def attach(net, engine, weights=None, seed=0, cutoff=None, transfer=False):
    """Put load_network's engine= into effect on a freshly loaded `net` (see the module
    docstring); the engine itself is made on the first inference."""
    if engine is None:
        engine = "auto"
    if engine not in ENGINES:
        raise ExportError(f"unknown engine '{engine}' (known: {', '.join(ENGINES)})")
    net.inference_engine = net.engine_note = None
    required = engine == "onnxruntime"
    if net.be.name != "cpu":
        if required:
            raise ExportError(f"--engine onnxruntime runs on the CPU, not on {net.be.name}")
        return
    if engine == "numpy":  # asked for: nothing to note
        return
    why = None if required else _why_numpy(net, weights)
    if why:
        net.engine_note = f"inference on NumPy ({why})"
        return
    if required:
        require("onnxruntime")
    net.inference_engine = OnnxRuntimeEngine(
        net, cache.entry_key(net, weights, seed, cutoff, transfer), required
    )


def served_from_cache(net, engine, weights, seed=0, cutoff=None, transfer=False):
    """Whether `engine` will serve this freshly built `net` from an optimised model already
    in the cache, so that load_network may leave the weights unwritten
    (weights.PendingParameters): nothing on that path reads them."""
    if engine not in (None, "auto", "onnxruntime") or net.be.name != "cpu":
        return False
    if cutoff is not None or transfer or _why_numpy(net, weights):
        return False
    if not os.path.isfile(weights):  # the loader refuses it by name (a pipe would block here)
        return False
    key = cache.entry_key(net, weights, seed, cutoff, transfer)
    if key is None:
        return False
    ort = require("onnxruntime")
    return os.path.exists(cache.optimized_path(key, cache.runtime_tag(ort.__version__)))


def _why_numpy(net, weights):
    """Why the default engine is NumPy for this network, or None."""
    if not onnxruntime_installed():
        return f"ONNX Runtime is not installed; {PIP_COMMAND} gives a faster CPU engine"
    if weights is None:
        return "random weights; ONNX Runtime serves a weights file"
    if net.precision != "fp32":
        return f"precision {net.precision} runs on NumPy"
    return None


def engine_device(engine, device):
    """The device to load a network on for `engine`: ONNX Runtime's is the CPU."""
    if engine != "onnxruntime":
        return device
    if device not in (None, "auto", "cpu"):
        raise ExportError(f"--engine onnxruntime runs on the CPU, not on --device {device}")
    return "cpu"


def describe(net):
    """The note line saying which engine serves the network's inference, made ready now
    (so the first image is not the one that waits for the export); None off the CPU."""
    engine = net.inference_engine
    if engine is not None and engine.prepare(net):
        return (
            f"inference on ONNX Runtime ({engine.where}; --engine numpy runs "
            f"Darknet's exact arithmetic)"
        )
    return net.engine_note


def load_with_engine(load, engine, device, quiet=None, **kwargs):
    """load(device=..., engine=..., **kwargs) (load_network, say), served by `engine`
    ("auto", "numpy" or "onnxruntime"), with one note on stderr saying which engine runs
    the CPU's inference (unless quiet; None: unless the command was given --quiet)."""
    if engine == "onnxruntime":
        require("onnxruntime")
    net = load(device=engine_device(engine, device), engine=engine, **kwargs)
    note = describe(net)
    if quiet is None:
        ctx = click.get_current_context(silent=True)
        quiet = bool(ctx is not None and (ctx.meta.get(QUIET_KEY) or ctx.params.get("quiet")))
    if note and not quiet:
        print(f"darknet-py: note: {note}", file=sys.stderr)
    return net
