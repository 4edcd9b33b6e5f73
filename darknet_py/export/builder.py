"""The ONNX graph under construction: nodes, constants and each tensor's per-image shape.

Tensors carry the batch as their first dimension, symbolic or fixed; shapes here leave
it out (per image), so a reshape is written as [0, ...] and keeps whatever batch comes."""

import numpy as np


class GraphBuilder:
    def __init__(self, onnx, opset, dtype=np.float32):
        self.onnx = onnx
        self.opset = opset
        self.helper = onnx.helper
        self.dtype = np.dtype(dtype)  # the float type of activations and weights
        self.nodes = []
        # The model under construction: each constant is written into its graph once, as
        # it is made (a network's weights are then never copied from message to message).
        self.model = onnx.ModelProto()
        self.shapes = {}  # tensor name -> per-image shape (tuple)
        self.outputs = {}  # layer index -> its output tensor
        self._names = 0
        self.winograd = None  # which 3x3 convolutions become Winograd (winograd.py)

    def fresh(self, hint):
        self._names += 1
        return f"{hint}_{self._names}"

    # ---- constants -------------------------------------------------------------------
    def const(self, value, hint="const", dtype=None):
        """A constant tensor (an initializer) in the graph's float type unless dtype says."""
        array = np.asarray(value, dtype=dtype or self.dtype)
        name = self.fresh(hint)
        tensor = self.model.graph.initializer.add()
        tensor.name = name
        tensor.data_type = self.helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        # ONNX's raw data is little-endian whatever the machine's order
        tensor.raw_data = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
        return name

    def ints(self, values, hint="ints"):
        return self.const(np.asarray(values, dtype=np.int64), hint, np.int64)

    def scalar(self, value, hint="scalar"):
        return self.const(np.asarray(value, dtype=self.dtype), hint)

    # ---- nodes -----------------------------------------------------------------------
    def op(self, op_type, inputs, shape=None, hint=None, outputs=1, **attrs):
        """Add a node; returns its output name (or names, for outputs > 1). shape: the
        first output's per-image shape, when known."""
        names = [self.fresh(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(
            self.helper.make_node(
                op_type, list(inputs), names, name=self.fresh(f"n_{op_type}"), **attrs
            )
        )
        if shape is not None:
            self.shapes[names[0]] = tuple(int(d) for d in shape)
        return names[0] if outputs == 1 else names

    def reduce(self, op_type, x, axes, shape=None):
        """ReduceMax/ReduceSum/... keeping dims; axes moved from attribute to input
        (ReduceSum at opset 13, the others at 18)."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, [x, self.ints(axes)], shape, keepdims=1)
        return self.op(op_type, [x], shape, axes=list(axes), keepdims=1)

    def reshape(self, x, shape):
        """x with per-image shape `shape` (no node when it already has it)."""
        shape = tuple(int(d) for d in shape)
        if self.shapes.get(x) == shape:
            return x
        return self.op("Reshape", [x, self.ints((0,) + shape, "shape")], shape)

    def image(self, x, c, h, w):
        return self.reshape(x, (c, h, w))

    def flat(self, x):
        return self.reshape(x, (int(np.prod(self.shapes[x])),))

    def slice(self, x, axis, start, end, step=1, shape=None):
        return self.op(
            "Slice",
            [x, self.ints([start]), self.ints([end]), self.ints([axis]), self.ints([step])],
            shape,
        )

    def concat(self, inputs, axis, shape):
        if len(inputs) == 1:
            return inputs[0]
        return self.op("Concat", inputs, shape, axis=axis)

    def mul(self, x, value, shape=None):
        return self.op(
            "Mul",
            [x, self.scalar(value) if np.isscalar(value) else value],
            shape or self.shapes.get(x),
        )

    def add(self, x, value, shape=None):
        return self.op(
            "Add",
            [x, self.scalar(value) if np.isscalar(value) else value],
            shape or self.shapes.get(x),
        )
