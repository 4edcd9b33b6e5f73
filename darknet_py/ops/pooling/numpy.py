"""The NumPy reference of the pooling ops (mixed into NumpyBackend): Darknet's maxpool (its
strict '>' keeps the first maximum of a window), the fork's separate strides,
maxpool_depth and [local_avgpool], and global average pooling."""

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...backends.cpu_threads import GRAIN_FLOATS, parallel
from ..common.numpy import one_storage, scratch


class NumpyPooling:
    """maxpool, local and global average pooling."""

    def maxpool_forward(self, x, batch, c, h, w, size, stride, padding, out, indexes):
        """Darknet maxpool: windows start at -padding//2; indexes get the flat argmax
        (into x, over the whole batch) for backward, or are None in inference (no argmax
        kept). out_h = (h + padding - size)//stride + 1. x and out of one storage (a 16-bit
        x's values are already its rounded ones: the maxima are copied)."""
        one_storage("maxpool_forward", self.storage_of, x=x, out=out)
        out_h = (h + padding - size) // stride + 1
        out_w = (w + padding - size) // stride + 1
        off = padding // 2
        n = batch * c * out_h * out_w
        if indexes is None or size != stride or off or out_h * size > h or out_w * size > w:
            self.maxpool_forward_xy(x, batch, c, h, w, size, stride, stride, padding, out, indexes)
            return
        # Training with non-overlapping windows inside the image (the usual 2x2/2): compare
        # the size*size strided views in window order, keeping the first maximum (Darknet's
        # strict '>'); no padded or index copies (several times faster).
        src = x[: batch * c * h * w].reshape(batch * c, h, w)
        rows, cols = out_h * size, out_w * size
        best = src[:, 0:rows:size, 0:cols:size].copy()
        which = np.zeros(best.shape, dtype=np.int64)
        for k in range(1, size * size):
            dy, dx = divmod(k, size)
            cand = src[:, dy:rows:size, dx:cols:size]
            better = cand > best
            np.copyto(best, cand, where=better)
            which[better] = k
        out[:n] = best.reshape(-1)
        dy, dx = np.divmod(which, size)
        plane = (np.arange(batch * c) * (h * w)).reshape(-1, 1, 1)
        top = np.arange(out_h).reshape(1, -1, 1) * (size * w)
        left = np.arange(out_w).reshape(1, 1, -1) * size
        indexes[:n] = (plane + top + left + dy * w + dx).reshape(-1)

    def maxpool_forward_xy(
        self, x, batch, c, h, w, size, stride_x, stride_y, padding, out, indexes
    ):
        """maxpool_forward with the AlexeyAB fork's separate strides across and down."""
        one_storage("maxpool_forward", self.storage_of, x=x, out=out)
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        off = padding // 2
        if indexes is None:
            src = x[: batch * c * h * w].reshape(batch * c, h, w)
            dst = out[: batch * c * out_h * out_w].reshape(batch * c, out_h, out_w)
            parallel(
                batch * c,
                lambda p0, p1: _maxpool_values(
                    src[p0:p1], size, stride_y, stride_x, off, dst[p0:p1]
                ),
                max(1, GRAIN_FLOATS // (h * w)),
            )
            return
        # Pad so every window is in range; padded cells never win (-inf).
        ph = max(0, (out_h - 1) * stride_y + size - off - h)
        pw = max(0, (out_w - 1) * stride_x + size - off - w)
        src = x[: batch * c * h * w].reshape(batch * c, h, w)
        padded = np.full((batch * c, off + h + ph, off + w + pw), -np.inf, dtype=x.dtype)
        padded[:, off : off + h, off : off + w] = src
        idx = np.full(padded.shape, -1, dtype=np.int64)
        idx[:, off : off + h, off : off + w] = np.arange(batch * c * h * w).reshape(batch * c, h, w)
        sb, sh, sw = padded.strides
        win = as_strided(
            padded,
            (batch * c, out_h, out_w, size, size),
            (sb, sh * stride_y, sw * stride_x, sh, sw),
        ).reshape(batch * c, out_h, out_w, -1)
        arg = win.argmax(axis=3)  # first max in row-major window order, as Darknet's strict '>'
        ib, ih, iw = idx.strides
        iwin = as_strided(
            idx, (batch * c, out_h, out_w, size, size), (ib, ih * stride_y, iw * stride_x, ih, iw)
        ).reshape(batch * c, out_h, out_w, -1)
        out[: batch * c * out_h * out_w] = np.take_along_axis(win, arg[..., None], 3).reshape(-1)
        indexes[: batch * c * out_h * out_w] = np.take_along_axis(iwin, arg[..., None], 3).reshape(
            -1
        )

    def maxpool_backward(self, delta_out, indexes, n_out, delta_in):
        """delta_in[indexes[i]] += delta_out[i] for i < n_out; index -1 (a window wholly
        in the padding) routes nowhere."""
        idx = indexes[:n_out]
        hit = idx >= 0
        np.add.at(delta_in, idx[hit], delta_out[:n_out][hit])

    def maxpool_backward_xy(
        self, delta_out, indexes, batch, c, h, w, size, stride_x, stride_y, padding, delta_in
    ):
        """maxpool_backward of a spatial maxpool given its geometry (the CUDA backend gathers
        per input cell there, deterministically); np.add.at adds in output order."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        self.maxpool_backward(delta_out, indexes, batch * c * out_h * out_w, delta_in)

    def maxpool_depth_forward(self, x, batch, c, spatial, out_c, out, indexes):
        """The fork's maxpool_depth: out[b, g, p] = max over channels g, g+out_c, g+2*out_c, ...
        of x[b, :, p]; indexes get the flat argmax (the first maximum)."""
        planes = x[: batch * c * spatial].reshape(batch, c, spatial)
        best = np.full((batch, out_c, spatial), -np.inf, dtype=x.dtype)
        where = np.zeros((batch, out_c, spatial), dtype=np.int64)
        base = (np.arange(batch) * c * spatial).reshape(-1, 1, 1) + np.arange(spatial)
        for k in range(c):
            g = k % out_c
            better = planes[:, k] > best[:, g]
            best[:, g] = np.where(better, planes[:, k], best[:, g])
            where[:, g] = np.where(better, base[:, 0] + k * spatial, where[:, g])
        out[: batch * out_c * spatial] = best.reshape(-1)
        indexes[: batch * out_c * spatial] = where.reshape(-1)

    def local_avgpool(
        self, x, batch, c, h, w, size, stride_x, stride_y, padding, out, forward=True
    ):
        """The fork's [local_avgpool]: the mean of each size x size window over its cells
        inside the image (windows start at -padding/2). forward=False: the adjoint, adding
        each out value / its cell count into those cells of x."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        off = padding // 2
        img = x[: batch * c * h * w].reshape(batch * c, h, w)
        res = out[: batch * c * out_h * out_w].reshape(batch * c, out_h, out_w)
        rows = np.arange(out_h) * stride_y - off
        cols = np.arange(out_w) * stride_x - off
        # cells of each window inside the image, per output row / column
        row_count = np.array([len(range(max(r, 0), min(r + size, h))) for r in rows])
        col_count = np.array([len(range(max(q, 0), min(q + size, w))) for q in cols])
        count = (row_count[:, None] * col_count[None, :]).astype(x.dtype)
        if forward:
            res[...] = 0
        else:
            share = res / count
        for n in range(size):
            for m in range(size):
                ys, xs = rows + n, cols + m
                vy, vx = (ys >= 0) & (ys < h), (xs >= 0) & (xs < w)
                yi, xi = np.nonzero(vy)[0], np.nonzero(vx)[0]
                if not len(yi) or not len(xi):
                    continue
                sel = np.ix_(ys[yi], xs[xi])
                if forward:
                    res[:, yi[:, None], xi[None, :]] += img[:, sel[0], sel[1]]
                else:
                    np.add.at(
                        img, (slice(None), sel[0], sel[1]), share[:, yi[:, None], xi[None, :]]
                    )
        if forward:
            res /= count

    def avgpool_forward(self, x, batch, c, spatial, out):
        out[: batch * c] = x[: batch * c * spatial].reshape(batch * c, spatial).mean(axis=1)

    def avgpool_backward(self, delta_out, batch, c, spatial, delta_in):
        d = delta_in[: batch * c * spatial].reshape(batch * c, spatial)
        d += (delta_out[: batch * c] / spatial).reshape(-1, 1)


def _maxpool_values(src, size, stride_y, stride_x, off, out):
    """out (planes, out_h, out_w) = the maximum of each window, without argmax or index
    arrays, taken in two running np.maximum passes: down the window's rows over whole
    image rows (contiguous, vectorised), then across its columns on that smaller result.
    Cells outside the image (padding) are -inf, so a window wholly in the padding gives
    -inf."""
    planes, h, w = src.shape
    _, out_h, out_w = out.shape
    ph = max(0, (out_h - 1) * stride_y + size - off - h)
    pw = max(0, (out_w - 1) * stride_x + size - off - w)
    if off or ph or pw:
        padded = np.full((planes, off + h + ph, off + w + pw), -np.inf, dtype=src.dtype)
        padded[:, off : off + h, off : off + w] = src
        src = padded
    rows, cols = stride_y * (out_h - 1) + 1, stride_x * (out_w - 1) + 1
    width = src.shape[2]
    down = scratch(planes * out_h * width, src.dtype).reshape(planes, out_h, width)
    down[...] = src[:, 0:rows:stride_y]
    for dy in range(1, size):
        np.maximum(down, src[:, dy : dy + rows : stride_y], out=down)
    out[...] = down[:, :, 0:cols:stride_x]
    for dx in range(1, size):
        np.maximum(out, down[:, :, dx : dx + cols : stride_x], out=out)
