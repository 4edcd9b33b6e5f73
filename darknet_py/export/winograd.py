"""3x3 stride-1 convolutions as Winograd F(4x4, 3x3), in standard ONNX operators: the CPU
engine's own graph only (export_model(winograd=...)); `darknet-py export` writes plain Conv.

Each 6x6 input tile (stride 4) is transformed to 36 values, the 36 tile positions are
36 independent channel products (a 1x1 Conv with group=36, which ONNX Runtime runs in
its NCHWc layout), and every 36 products become a 4x4 output tile: 4x fewer
multiplies in the products than the direct convolution's 9 per output. The transforms
are memory-bound and grow with the channels (C + K), the products shrink with C * K, so
a layer is rewritten only where a cost model measured on a 2-core AVX2 machine says it
pays (bench/NOTES.md, issue 39). Rounding: about 1e-5 relative on a layer against the
direct convolution (F(4x4)'s transform matrices hold 4, 5 and 8), well under the
engine's check tolerance.

Layouts (N the batch, T = tiles_h * tiles_w):
  input (N, C, H, W) -> (N*C, 1, H, W) -> Conv 6x6/4 -> (N*C, 36, th, tw)
  -> (N, C, 36, T) -> Transpose -> (N, 36, C, T) = (N, 36*C, th, tw)
  -> Conv 1x1 group=36 -> (N, 36*K, th, tw) = (N, 36, K*th, tw)
  -> ConvTranspose 36->1, 4x4/4 -> (N, 1, 4*K*th, 4*tw) = (N, K, 4th, 4tw) -> Slice
The output transform and the tiles' interleaving are one ConvTranspose: seen as a
36-channel image K*th rows tall, the products of tile (ty, tx) of filter k sit at pixel
(k*th + ty, tx), and a 4x4 kernel at stride 4 writes that tile's 4x4 outputs at rows
4*(k*th + ty) + i = k*4th + 4ty + i: where they belong in filter k's map. (A MatMul
then a DepthToSpace did the same in two passes, ~1.5x the time.)
"""

import numpy as np

from ..shapes import conv_strides

TILE = 4  # outputs per tile side: F(4x4, 3x3)
SPAN = TILE + 2  # input tile side
POSITIONS = SPAN * SPAN
# 3x3 kernels transformed per float64 product (transformed_weights): 9 MB a slice
_KERNELS_PER_SLICE = 1 << 15

# Lavin & Gray's F(4, 3) for correlation: input transform B^T, kernel G, output A^T.
B_T = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    dtype=np.float64,
)
G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ]
)
A_T = np.array(
    [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    dtype=np.float64,
)

# row 1, column 1 of the 6x6 positions: A^T's column 1 is all ones (see transformed_biases)
BIAS_POSITION = 1 * SPAN + 1

# The cost model's rates, measured with ONNX Runtime 1.32 on 2 threads of the shared AMD
# EPYC (bench/NOTES.md, issue 39): the direct NCHWc Conv's and the grouped product's
# arithmetic, the memory rate that bounds a product whose transformed weights outweigh
# its tiles, and the time per value the transforms read or write.
DIRECT_FLOPS = 150e9
PRODUCT_FLOPS = 145e9
WEIGHT_BYTES_PER_S = 14e9
TRANSFORM_S_PER_VALUE = 2.5e-9
# Rewrite only where the model predicts this fraction of the direct time or less: its
# rates move by tens of percent with the machine's load.
PAYS_BELOW = 0.8


def eligible(layer):
    """Whether a layer is a plain 3x3 stride-1 pad-1 [convolutional] layer."""
    return (
        layer.type == "convolutional"
        and layer.size == 3
        and conv_strides(layer.stride) == (1, 1)
        and layer.padding == 1
        and layer.dilation == 1
        and layer.groups == 1
        and not layer.xnor
        and (layer.out_h, layer.out_w) == (layer.h, layer.w)
    )


def tiles(h, w):
    return -(-h // TILE), -(-w // TILE)


def predicted_seconds(c, k, h, w):
    """(direct, Winograd) seconds the cost model predicts for one image."""
    th, tw = tiles(h, w)
    t = th * tw
    direct = 2 * 9 * c * k * h * w / DIRECT_FLOPS
    product = max(
        2 * POSITIONS * c * k * t / PRODUCT_FLOPS, 4 * POSITIONS * c * k / WEIGHT_BYTES_PER_S
    )
    transforms = TRANSFORM_S_PER_VALUE * (c + k) * POSITIONS * t
    return direct, product + transforms


def chosen(layer, which):
    """Whether export_model(winograd=which) rewrites this layer: "auto"
    where the cost model says it pays, "all" wherever it is eligible (for tests)."""
    if not which or not eligible(layer):
        return False
    if which == "all":
        return True
    direct, winograd = predicted_seconds(layer.c, layer.out_c, layer.h, layer.w)
    return winograd <= PAYS_BELOW * direct


def transformed_weights(w, dtype=np.float32):
    """(K, C, 3, 3) -> the group=36 product's (36*K, C, 1, 1): G g G^T per position,
    computed in float64 and stored as `dtype`."""
    k, c = w.shape[:2]
    # Matrix products by G (x) G in float64 (einsum's loop took 0.5 s on yolov3-tiny), a
    # slice of the kernels at a time, each stored (rounded) as it comes: the whole
    # float64 product (151 MB on yolov3-tiny) cost more in fresh pages than in arithmetic.
    kernels = np.asarray(w).reshape(k * c, 9)
    transform = np.kron(G, G)
    out = np.empty((POSITIONS, k * c), dtype)
    for start in range(0, k * c, _KERNELS_PER_SLICE):
        part = kernels[start : start + _KERNELS_PER_SLICE].astype(np.float64)
        out[:, start : start + len(part)] = transform @ part.T
    return out.reshape(POSITIONS * k, c, 1, 1)


def transformed_biases(biases):
    """The biases as the product's: added at the one tile position whose column of the
    output transform is all ones (A^T's column 1 squared), they reach every output once
    and the Add after the transform goes."""
    k = len(biases)
    out = np.zeros((POSITIONS, k))
    out[BIAS_POSITION] = biases
    return out.reshape(-1)


def input_kernels():
    """The input transform B^T d B as 36 fixed 6x6 kernels (36, 1, 6, 6)."""
    return np.einsum("ia,jb->ijab", B_T, B_T).reshape(POSITIONS, 1, SPAN, SPAN)


def output_matrix():
    """The output transform A^T m A as a (16, 36) matrix, rows the 4x4 outputs row-major."""
    return np.einsum("ia,jb->ijab", A_T, A_T).reshape(TILE * TILE, POSITIONS)


def output_kernels():
    """The output transform as ConvTranspose weights (36, 1, 4, 4): position p's
    contribution to output (i, j) of its tile."""
    return output_matrix().T.reshape(POSITIONS, 1, TILE, TILE)


def convolution(g, image, w, biases, c, k, h, width):
    """The graph of Conv(image, w, biases) with 3x3 kernels, stride 1 and padding 1, on
    the (c, h, width) per-image `image`: the Winograd form described above."""
    th, tw = tiles(h, width)
    t = th * tw
    planes = g.op("Reshape", [image, g.ints([-1, 1, h, width], "shape")])
    transformed = g.op(
        "Conv",
        [planes, g.const(input_kernels(), "winograd_input")],
        kernel_shape=[SPAN, SPAN],
        strides=[TILE, TILE],
        # the far edges padded out to whole tiles
        pads=[1, 1, th * TILE + 1 - h, tw * TILE + 1 - width],
    )
    by_channel = g.op("Reshape", [transformed, g.ints([-1, c, POSITIONS, t], "shape")])
    by_position = g.op("Transpose", [by_channel], (POSITIONS, c, t), perm=[0, 2, 1, 3])
    products = g.op(
        "Conv",
        [
            g.reshape(by_position, (POSITIONS * c, th, tw)),
            g.const(transformed_weights(w), "winograd_weights"),
            g.const(transformed_biases(biases), "winograd_biases"),
        ],
        (POSITIONS * k, th, tw),
        kernel_shape=[1, 1],
        group=POSITIONS,
    )
    # tile (ty, tx) of filter k at pixel (k*th + ty, tx) of a 36-channel image
    by_row = g.reshape(products, (POSITIONS, k * th, tw))
    tall = g.op(
        "ConvTranspose",
        [by_row, g.const(output_kernels(), "winograd_output")],
        (1, k * th * TILE, tw * TILE),
        kernel_shape=[TILE, TILE],
        strides=[TILE, TILE],
    )
    tiled = g.reshape(tall, (k, th * TILE, tw * TILE))
    if (th * TILE, tw * TILE) != (h, width):
        tiled = g.op(
            "Slice",
            [tiled, g.ints([0, 0]), g.ints([h, width]), g.ints([2, 3])],
            (k, h, width),
        )
    return tiled
