"""Output shapes of convolution-like layers, shared by the layers and both backends (below
them all: it imports nothing of darknet_py)."""


def conv_strides(stride):
    """(down, across) of a convolution's stride: an int, or the AlexeyAB fork's
    (stride_y, stride_x) pair."""
    return (stride, stride) if isinstance(stride, int) else tuple(stride)


def conv_out_size(height, width, ksize, stride, pad, dilation=1):
    """Output (height, width); stride is an int or a (stride_y, stride_x) pair."""
    sy, sx = conv_strides(stride)
    span = dilation * (ksize - 1) + 1
    return (height + 2 * pad - span) // sy + 1, (width + 2 * pad - span) // sx + 1
