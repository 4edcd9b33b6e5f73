"""The Network's executor: Darknet's forward/backward/update loop (network.c's
forward_network, backward_network, update_network, train_network). Staging the input and
truth (prefetched uploads too), the training steps (train_pass, train_iteration) and their
checks, the loss scaling and data-parallel hooks around the update, steps replayed as CUDA
graphs (graphs.py), and the costs the loss layers leave.

The state a layer sees during forward/backward (``input``, ``delta``, ``truth``,
``train``, ``workspace``) lives on the Network, and the loop sets it before each layer,
exactly as forward_network/backward_network do.

A mixin of darknet_py.network.Network, which composes it with the planner and the
inference front end: its methods read and write the Network's state through self.
"""

import warnings
from dataclasses import replace

import numpy as np

from .. import optimizer
from ..adam import Adam
from ..cfg import CfgWarning
from ..graphs import run_pieces
from ..layers.base import UpdateArgs
from ..layers.batchnorm import bn_rebuild_output
from ..net_options import NetworkError
from ..predictions import DETECTOR_TYPES

# The buffer each parameter's gradient accumulates in (Darknet's names).
_UPDATE_BUFFER = {"biases": "bias_updates", "scales": "scale_updates", "weights": "weight_updates"}


class NetworkExecutor:
    """The forward, backward and update of a Network (see the module's docstring)."""

    @property
    def images_per_iteration(self):
        """Images per weight update: the cfg's batch= (subdivisions passes), on every
        data-parallel rank together."""
        return self.images_per_pass * self.subdivisions * self.replicas

    @property
    def replicas(self):
        """Processes training this network together, each on its own images."""
        return 1 if self.data_parallel is None else self.data_parallel.world_size

    @property
    def iteration(self):
        """Darknet's get_current_batch: updates done so far, counted from `seen`."""
        return self.seen // self.images_per_iteration

    @property
    def learning_rate(self):
        return optimizer.current_rate(
            self.options.learning_rate,
            self.options.policy,
            self.iteration,
            self.options.max_batches,
            self.rng,
        )

    @property
    def truth_size(self):
        """Floats per box in a detector's truth buffer: x, y, w, h, class (the fork adds a
        track id)."""
        return 6 if self.darknet == "alexeyab" else 5

    @property
    def max_boxes(self):
        """Boxes per image in a detector's truth buffer (zero padded)."""
        return 200 if self.darknet == "alexeyab" else 90

    def _is_detector(self):
        return any(l.type in DETECTOR_TYPES for l in self.layers)

    def truth_for_network(self, truth):
        """A detector truth buffer with this network's fields per box (truth_size) from either
        Darknet's: 200 x 6 floats is the fork's layout, any other multiple of 5 is rows of
        (x, y, w, h, class) as the original and the data loader write them. The box count
        is kept (each head reads at most its own max); other truths pass unchanged."""
        truth = np.asarray(truth, dtype=np.float32)
        if truth.ndim != 2 or not self._is_detector():
            return truth
        width = truth.shape[1]
        fields = 6 if width == 200 * 6 else 5 if width % 5 == 0 else None
        if fields is None or fields == self.truth_size:
            return truth
        rows = truth.reshape(truth.shape[0], width // fields, fields)
        out = np.zeros(rows.shape[:2] + (self.truth_size,), dtype=np.float32)
        common = min(fields, self.truth_size)
        out[:, :, :common] = rows[:, :, :common]  # the fork's track id: 0
        return out.reshape(truth.shape[0], -1)

    def checked_truth(self, truth, n):
        """truth for n images as (n, floats per image) float32 rows, or a ValueError that
        gives the shape this network wants (a wrong one ended in NumPy's broadcast error, or
        was read as other images' values)."""
        truth = np.asarray(truth, dtype=np.float32)
        per_image = truth.size // n if n else 0
        rows_ok = truth.size == n * per_image and (truth.ndim < 2 or truth.shape[0] == n)
        if self._is_detector():
            head = next(l for l in reversed(self.layers) if l.type in DETECTOR_TYPES)
            grid = getattr(head, "truths", None) if head.type == "detection" else None
            fits = per_image > 0 and (
                per_image % 5 == 0 or per_image % self.truth_size == 0 or per_image == grid
            )
            fields = "x, y, w, h, class" + (", track id" if self.truth_size == 6 else "")
            want = (
                f"({n}, {self.max_boxes * self.truth_size}): {self.max_boxes} boxes of "
                f"({fields}) per image, zero padded (any whole number of boxes does)"
            )
        else:
            readers = [
                l
                for l in self.layers
                if l.type in ("softmax", "logistic", "cost") and not getattr(l, "noloss", 0)
            ]
            if not readers:
                return truth.reshape(n, -1)  # nothing reads it
            reader = readers[-1]
            fits = per_image == reader.outputs
            want = (
                f"({n}, {reader.outputs}): per image the {reader.outputs} values its "
                f"[{reader.type}] layer {reader.index} is trained towards"
                + (
                    " (one-hot: 1 at the image's class)"
                    if reader.type == "softmax" and self.hierarchy is None
                    else ""
                )
            )
        if not (rows_ok and fits):
            raise ValueError(
                f"truth of shape {truth.shape} for {n} image"
                f"{'s' if n != 1 else ''}: this network wants {want}"
            )
        return truth.reshape(n, -1)

    # How many prefetched batches are kept: the one a step is about to use and the next.
    PREFETCHED_KEPT = 2

    def prefetch(self, x, truth=None):
        """Start uploading a coming batch, x (N, C, H, W) and its truth rows, while the
        backend works on what is queued: a later forward or training pass on these arrays,
        or on row slices of them, waits for this upload instead of copying them again.
        The arrays must stay unchanged until then. The training loop hands batch k+1
        over before iteration k runs, so its copy overlaps k's compute (on the GPU, from
        the data loader's page-locked slots)."""
        # Both converted before either upload starts: a refused truth leaves no upload behind.
        hosts = [np.asarray(host, dtype=np.float32) for host in (x, truth) if host is not None]
        record = []
        for host in hosts:
            array, upload = self.be.upload_async(host)
            record.append((host, array, upload))
        self._prefetched.append(record)
        while len(self._prefetched) > self.PREFETCHED_KEPT:
            self._forget_prefetched()

    def _forget_prefetched(self):
        for _, _, upload in self._prefetched.pop(0):
            self.be.finish_upload(upload)  # its host memory may be reused after this

    def finish_prefetch(self):
        """Wait for every prefetched upload and forget them: call it before their host
        memory goes away (a data loader closing unpins and unmaps its slots)."""
        while self._prefetched:
            self._forget_prefetched()

    def _prefetched_rows(self, x):
        """The backend array holding x's values when x is a prefetched array or a run of
        rows of one (found by address: x must lie inside it), else None."""
        if not x.flags.c_contiguous or not x.size:
            return None
        start = x.__array_interface__["data"][0]
        for record in reversed(self._prefetched):
            for host, array, upload in record:
                first = host.__array_interface__["data"][0]
                offset, misaligned = divmod(start - first, host.itemsize)
                if not misaligned and 0 <= offset and offset + x.size <= host.size:
                    self.be.wait_upload(upload)
                    return array[offset : offset + x.size]
        return None

    def _upload(self, x, name, buf_attr, per_image):
        """x into the network's fixed buffer for it (copied from its prefetched upload
        when there is one): the buffers stay put, so a captured step can replay on them."""
        x = np.asarray(x, dtype=np.float32)
        n = x.shape[0] if x.ndim > 1 else 1
        if x.size != n * per_image:
            raise (
                self._input_shape_error(x.shape)
                if name == "input"
                else ValueError(f"{name} has shape {x.shape}; expected (N, {per_image})")
            )
        buf = getattr(self, buf_attr)
        if buf is None or buf.size != x.size:
            buf = self.be.zeros(x.size)
            setattr(self, buf_attr, buf)
        prefetched = self._prefetched_rows(x)
        if prefetched is None:
            self.be.write(buf, x)
        else:
            self.be.copy(prefetched, buf)
        return buf

    def _input_shape_error(self, shape):
        return ValueError(
            f"input has shape {shape}; the network needs "
            f"(N, {', '.join(map(str, self.input_shape))})"
        )

    def forward(self, x, truth=None, train=False):
        """Run every layer on host array x (N, C, H, W); returns nothing (read outputs with
        layer_output). With train=True, batch statistics are used and deltas zeroed."""
        if (
            not train
            and truth is None
            and self.inference_engine is not None
            and self.inference_engine.infer(self, x)
        ):
            return
        net_input = self._stage(x, truth, train)
        if train:
            self._write_step_seed()
        self._forward_layers(net_input, train)
        self.collect_costs()

    def _write_step_seed(self):
        """The step's part of every dropout layer's seed (the layer adds its own)."""
        seed = (int(self.seen) * 1000003 + int(self.seed or 0) * 104729) & 0xFFFFFFFF
        self.be.write(self.step_seed, [seed - (1 << 32) if seed >= 1 << 31 else seed])

    def _stage(self, x, truth, train):
        """Buffers for x's batch, x and truth uploaded: the network input on the backend."""
        # x and truth are checked before the buffers change: a refused call leaves them.
        x = np.asarray(x, dtype=np.float32)
        n = x.shape[0] if x.ndim > 1 else 1
        if x.size != n * self.inputs:
            raise self._input_shape_error(x.shape)
        truth_host = None
        if truth is not None:
            # The YOLO/region/detection losses read the host copy: no round trip from the GPU.
            truth_host = np.asarray(truth, dtype=np.float32)
            if truth_host.size % n:
                raise ValueError(
                    f"truth has shape {truth_host.shape}, which is not rows for "
                    f"{n} image{'s' if n != 1 else ''}"
                )
            truth_host = truth_host.reshape(n, -1)
            if train:
                for layer in self.layers:
                    layer.check_truth(self, truth_host)
        if train and not self._training_ready:
            self._prepare_training()
        if n != self.batch or (train and not self.train_buffers):
            self._allocate(n, train or self.train_buffers)
        net_input = self._upload(x, "input", "_input_buf", self.inputs)
        self.truth, self.truth_host = None, truth_host
        if truth_host is not None:
            self.truth = self._upload(truth_host, "truth", "_truth_buf", truth_host.shape[1])
        return net_input

    def _forward_layers(self, net_input, train):
        self.engine_outputs = None
        self.train = train
        self.input = net_input
        self.delta = None
        for layer in self.layers:
            # The fork's GPU build (and the original) clear every delta before a pass, its
            # CPU build only those of its l.train layers (see Layer.fork_train); a shared
            # delta is zeroed in the backward instead, before its first writer's.
            if (
                train
                and layer.delta is not None
                and layer.shared_delta is None
                and (layer.fork_train or not self.fork_cpu)
            ):
                self.be.fill(layer.delta, 0.0)
            layer.forward(self)
            self.input = layer.output
        self._net_input = net_input

    def _clear_fork_deltas(self):
        """At an iteration's first pass, zero the deltas that the fork's passes do not (its
        layers without l.train: route, upsample, ...; see Layer.fork_train). Its CPU build
        keeps adding to them from iteration to iteration, so that they grow without bound
        and yolov4-tiny does not learn (mAP 1% where its GPU build reaches 96%,
        bench/RESULTS.md); within an iteration its passes are followed as they are.
        Only for "alexeyab-cpu": the GPU build clears every delta before each pass."""
        if not self.fork_cpu:
            return
        for layer in self.layers:
            if layer.delta is not None and not layer.fork_train and layer.darknet == "alexeyab":
                self.be.fill(layer.delta, 0.0)

    def collect_costs(self):
        """After a training forward (and its backward and update): hand every loss layer
        the figures it left on the backend (one read each, the step's only waits on the
        device) and set self.cost, Darknet's mean over the layers that have a cost."""
        for layer in self.layers:
            if layer.pending:
                layer.pending = False
                layer.collect(self.be.to_host(layer.scalars))
        costs = [l.cost for l in self.layers if l.cost is not None]
        self.cost = float(sum(costs) / len(costs)) if costs and self.train else None

    def backward(self):
        """Darknet's backward_network: each layer gets the previous layer's output and delta."""
        self._backward_start()
        self._backward_layers(len(self.layers) - 1, 0)

    def _backward_start(self):
        if self.loss_scaler is not None:
            self.loss_scaler.scale_deltas(self)

    @property
    def backward_end(self):
        """The lowest layer the backward reaches: Darknet's stops below the last layer with
        stopbackward."""
        stops = [i for i, layer in enumerate(self.layers) if layer.stopbackward]
        return stops[-1] + 1 if stops else 0

    def _backward_layers(self, top, bottom):
        """The backward of layers top down to bottom (none below backward_end)."""
        for i in range(top, max(bottom, self.backward_end) - 1, -1):
            layer = self.layers[i]
            for delta in self._zero_before.get(i, ()):  # shared: zeroed as the forward did
                self.be.fill(delta, 0.0)
            for rebuilt in self._rebuild_before.get(i, ()):  # remade: output_plan.py
                bn_rebuild_output(rebuilt, self)
            if i == 0:
                self.input, self.delta = self._net_input, None
            else:
                prev = self.layers[i - 1]
                self.input, self.delta = prev.output, prev.delta
            layer.backward(self)

    def _train_pieces(self, net_input, stops):
        """A training pass (no update) as pieces run in turn: the forward and the backward
        down to layer stops[0], then down to each further stop (descending, the last
        backward_end)."""

        def first():
            self._forward_layers(net_input, True)
            self._backward_start()
            self._backward_layers(len(self.layers) - 1, stops[0])

        def down_to(k):
            return lambda: self._backward_layers(stops[k - 1] - 1, stops[k])

        return [first] + [down_to(k) for k in range(1, len(stops))]

    def _write_update_rate(self):
        """Write this iteration's learning rate / images per iteration for the update;
        returns the learning rate."""
        rate = self.learning_rate
        scale = self.fork_loss_scale
        if scale != 1.0:  # the fork's GPU update: float learning_rate = rate / loss_scale
            rate_scaled = float(np.float32(rate) / np.float32(scale))
        else:
            rate_scaled = rate
        self.be.write(self.update_rate, [rate_scaled / self.images_per_iteration])
        if self.adam is not None:
            self.adam.write_step(rate_scaled, self.iteration)
        return rate

    @property
    def fork_loss_scale(self):
        """The fork's [net] loss_scale as its GPU build trains with it (the [yolo] and
        [softmax] gradients times it, the rate and the weight decay's share divided by it);
        1 for the original, the fork's CPU build and fp16 training (whose own scaler reads it)."""
        if self.darknet != "alexeyab" or self.fork_cpu or self.loss_scaler is not None:
            return 1.0
        return self.options.loss_scale

    def _update_layers(self, skip=None):
        """Every layer's SGD step, or Adam's where its Darknet uses it (the rate and t written by
        _write_update_rate); none of them when the backend's flag `skip` (the loss scaler's
        found inf) is set as they run."""
        args = UpdateArgs(
            rate=self.update_rate,
            momentum=self.options.momentum,
            decay=self.options.decay * self.fork_loss_scale,
            batch=self.images_per_iteration,
            skip=skip,
        )
        # (adam_update_gpu's decay is not scaled by loss_scale)
        adam_args = (
            replace(args, adam=self.adam, decay=self.options.decay)
            if self.adam is not None
            else args
        )
        for layer in self.layers:
            if layer.fork_train or layer.darknet != "alexeyab":  # see Layer.fork_train
                layer.update(adam_args if self.adam is not None and self.adam.uses(layer) else args)

    def update_buffers(self):
        """(accumulated updates, batch-norm rolling statistics): the backend arrays that
        data-parallel replicas combine before an update, in a fixed order. Parameters
        without an update buffer (the fork's untrained BN beta) are not among them."""
        updates, statistics = [], []
        for layer in (owner for l in self.layers for owner in l.param_owners()):
            for name, _ in layer.params():
                if name.startswith("rolling_"):
                    statistics.append(getattr(layer, name))
                elif (buffer := getattr(layer, _UPDATE_BUFFER[name], None)) is not None:
                    updates.append(buffer)
        return updates, statistics

    def params_changed(self):
        """Call after writing parameters by hand: drops what was derived from them."""
        self.graphs.drop()
        self._params_updated()

    def _params_updated(self):
        """After a training pass (parameters and rolling statistics moved in place):
        inference's folded weights are stale, and with them the recorded forward passes
        that read them."""
        self.graphs.drop("predict")
        if self.inference_engine is not None:  # it exports the new values on its next run
            self.inference_engine.params_changed()
        for layer in self.layers:
            layer.params_changed()

    @property
    def capturable(self):
        """Whether a step may be replayed as a graph: every layer works on the backend alone.
        (A data-parallel pass replays its forward and backward only, the last pass of an
        iteration in pieces: the gradients' exchange and the update stay outside graphs.)"""
        return self.graphs.enabled and all(layer.capturable for layer in self.layers)

    def _run_step(self, kind, key, net_input, train, step, between=None):
        """step(): a forward (and backward, update) on net_input; replayed as a graph when
        the network allows it, for steps of the same kind, key and buffers. step may be a
        list of pieces run in turn, between(k) called after piece k (graphs.py)."""
        self.train, self._net_input = train, net_input  # as the step sets them eagerly
        if self.capturable:
            self.graphs.run(kind, key, (net_input, self.truth), step, self.layers, between)
        else:
            run_pieces(step, between)

    def _prepare_training(self):
        if self.options.adam and self.adam is None:
            self.adam = Adam(self.be, self.darknet, *self.options.adam_betas_eps)
            if self.adam.rules == "original" and any(l.type == "crnn" for l in self.layers):
                warnings.warn(
                    CfgWarning(
                        f"{self.path}: [crnn] with adam=1: pjreddie's GPU build fails here (it "
                        f"gives the inner convolutions no Adam state); darknet-py updates them "
                        f"with Adam"
                    ),
                    stacklevel=2,
                )
        self.inference_engine = None  # training runs on the backend; its weights move
        for layer in self.layers:
            layer.init_updates(self.be)
        self._training_ready = True

    def _checked_training_batch(self, x, truth, step="train_pass"):
        """(x as float32 images, truth as checked rows) for a training step, `step`
        ("train_pass" or "train_iteration"), or a ValueError naming what it wanted and what
        it got, raised before the step changes anything. The step's image count is fixed:
        images_per_pass for a pass, subdivisions of them for an iteration (on this process,
        of a data-parallel run); another count would change the iteration count and with
        it the learning rate, as Darknet never does (its net->batch is fixed at load)."""
        if not self._params_ready:
            raise NetworkError(
                f"{self.path}: the network was built without its arrays "
                f"(build_network); load it with load_network to train it"
            )
        shape = tuple(self.input_shape)
        images = self.images_per_pass * (self.subdivisions if step == "train_iteration" else 1)
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise ValueError(
                f"{step} takes float images (N, {', '.join(map(str, shape))}) with values "
                f"in [0, 1]; got dtype {x.dtype}"
                + (" (uint8 pixels: divide them by 255)" if x.dtype == np.uint8 else "")
            )
        if x.ndim < 2 or x.shape[1:] not in (shape, (self.inputs,)):
            rows = f" or flat rows ({images}, {self.inputs})" if len(shape) > 1 else ""
            raise ValueError(
                f"{step} takes images of shape ({images}, "
                f"{', '.join(map(str, shape))}){rows}; got shape {x.shape}"
            )
        if len(x) != images:
            if step == "train_iteration":
                passes = self.subdivisions
                what = (
                    f"subdivisions={passes} pass{'es' if passes != 1 else ''} of "
                    f"net.images_per_pass={self.images_per_pass}"
                    + (f" on each of {self.replicas} processes" if self.replicas > 1 else "")
                )
            else:
                what = "net.images_per_pass"
            raise ValueError(
                f"{step} takes {images} image{'s' if images != 1 else ''} "
                f"({what}), got {len(x)}; "
                f"load_network's batch= sets the images per pass"
            )
        truth = self.checked_truth(truth, images)
        truth_rows = self.truth_for_network(truth)
        for layer in self.layers:  # class ids beyond a head's classes, ...
            layer.check_truth(self, truth_rows)
        if self.be.name == "cpu" and (images != self.batch or not self.train_buffers):
            self._check_host_memory(images, True)  # before seen and the buffers change
        return x.astype(np.float32, copy=False), truth

    def train_iteration(self, x, truth):
        """One Darknet iteration (train_network): the images of one update, x (N, C, H, W)
        with N = images_per_pass * subdivisions (another N is refused), and their truth
        rows, run as `subdivisions` passes of images_per_pass images (gradients accumulate),
        then the weight update. Returns the loss per image (the passes' costs summed, over
        N), as Darknet's train_network does."""
        x, truth = self._checked_training_batch(x, truth, "train_iteration")
        n = self.images_per_pass
        total = 0.0
        for start in range(0, len(x), n):
            cost = self.train_pass(x[start : start + n], truth[start : start + n])
            total += cost if cost is not None else 0.0
        return total / len(x)

    def train_pass(self, x, truth):
        """One pass (train_network_datum): seen += N, training forward and backward of
        x (N, C, H, W) with N = images_per_pass (another N is refused), and the weight
        update when it is the last pass of an iteration.
        Returns Darknet's cost for the pass (the loss summed over its images)."""
        x, truth = self._checked_training_batch(x, truth, "train_pass")
        n = x.shape[0]
        if n != self.batch:
            self.set_batch(n)
        self.seen += n * self.replicas
        net_input = self._stage(x, self.truth_for_network(truth), True)
        passes = self.seen // (n * self.replicas)
        update = passes % self.subdivisions == 0
        if (passes - 1) % self.subdivisions == 0:
            self._clear_fork_deltas()
        self._write_step_seed()
        self.last_rate = self._write_update_rate() if update else None
        parallel, scaler = self.data_parallel, self.loss_scaler
        # The last pass of a data-parallel iteration sums the ranks' gradients bucket by
        # bucket while its backward runs (distributed/buckets.py); None: after the backward.
        buckets = parallel.buckets(self) if update and parallel is not None else None

        # A data-parallel pass records its forward and backward as the first passes of an
        # iteration are: the update waits for the replicas' gradients. A loss scaler's
        # update is recorded with the step: its state stays on the backend (LossScaler).
        fused_update = update and parallel is None

        def step():
            self._forward_layers(net_input, True)
            self.backward()
            if fused_update:
                if scaler is not None:
                    scaler.update(self)
                else:
                    self._update_layers()

        o = self.options
        key = (
            self.batch,
            fused_update,
            o.momentum,
            o.decay,
            self.images_per_iteration,
            scaler and scaler.graph_key(),
        )
        if buckets is None:
            self._run_step("train", key, net_input, True, step)
        else:
            # The pass in pieces, each ending after a layer that completes buckets, whose
            # sums start between the pieces. Each piece is its own CUDA graph and the NCCL
            # calls stay outside graphs, as the exchange after the backward always was: a
            # collective recorded into a graph runs only when every rank replays its graph,
            # and a capture that fails midway (the step then runs eagerly) would leave this
            # rank's NCCL calls out of step with the other ranks'. A split costs one graph
            # launch per piece (about a dozen for yolov4).
            self._run_step(
                "train",
                key + (buckets.stops,),
                net_input,
                True,
                self._train_pieces(net_input, buckets.stops),
                between=lambda piece: buckets.start(self, piece),
            )
        if parallel is not None:
            if update:  # the replicas' gradients are summed between backward and update
                if buckets is None:
                    parallel.reduce(self)
                else:
                    buckets.finish(self)
                if scaler is not None:
                    scaler.update(self)
                else:
                    self._update_layers()
                parallel.updated(self)
        self._params_updated()  # the update, and the forward's batch-norm rolling statistics
        self.collect_costs()  # after the update: the step's launches queue without a wait
        return self.cost

    def layer_delta(self, i):
        layer = self.layers[i]
        if layer.delta is None:
            raise NetworkError(f"layer {i} has no delta: the network has not been trained")
        if layer.shared_delta is not None:
            raise NetworkError(
                f"layer {i}: its delta shares an array with other layers' and "
                f"lasts only through the backward; set net.share_deltas = "
                f"False before training to read it"
            )
        return self.be.to_host(layer.delta).reshape(layer.output_shape(self.batch))
