"""Softmax trees on the GPU (ops/losses/softmax.cu's softmax_tree_kernel and mask_kernel,
ops/losses/region_loss.cu's tree and map= branches) against the NumPy reference, outputs
poisoned with NaN first."""

from pathlib import Path

import numpy as np
import pytest
from helpers import write_synthetic_tree
from test_cuda_region_loss import region_output, truth_rows

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.losses.region import REGION_SCALARS, RegionClasses, RegionHead
from darknet_py.tree import NO_TRUTH, TreeArrays, int_array, read_tree

pytestmark = pytest.mark.gpu
F32 = np.float32
REF = NumpyBackend(np.float32)
SMALL_TREE = Path(__file__).resolve().parent / "fixtures" / "tree" / "small.tree"


def relative_error(got, want):
    assert not np.isnan(got).any(), "elements left unwritten"
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)


@pytest.mark.parametrize(
    "tree,spatial,batch,temp",
    [("small", 1, 3, 2.0), ("small", 13 * 13, 10, 1.0), ("big", 4, 6, 1.0)],
)
def test_softmax_tree(cuda, tmp_path, tree, spatial, batch, temp):
    hier = read_tree(
        SMALL_TREE if tree == "small" else write_synthetic_tree(tmp_path / "big.tree", 2000)
    )
    rng = np.random.default_rng(spatial)
    stride = hier.n * spatial + 7  # room between instances, left untouched
    x = rng.uniform(-4, 4, batch * stride).astype(F32)
    out = []
    for be in (REF, cuda):
        arrays = TreeArrays(be, hier)
        o = be.from_host(np.full(x.size, np.nan, dtype=F32))
        be.softmax_tree(
            be.from_host(x), spatial, batch, stride, temp, arrays.offset, arrays.size, hier.n, o
        )
        out.append(be.to_host(o))
    want, got = out
    written = ~np.isnan(want)
    np.testing.assert_array_equal(written, ~np.isnan(got))
    assert written.sum() == batch * hier.n * spatial
    assert relative_error(got[written], want[written]) < 1e-6


def test_mask(cuda):
    rng = np.random.default_rng(3)
    x = rng.normal(size=1001).astype(F32)
    truth = np.where(rng.random(1001) < 0.4, NO_TRUTH, rng.random(1001)).astype(F32)
    out = []
    for be in (REF, cuda):
        a = be.from_host(x)
        be.mask(a, be.from_host(truth), NO_TRUTH)
        out.append(be.to_host(a))
    np.testing.assert_array_equal(out[1], out[0])
    assert (out[0][truth == NO_TRUTH] == 0).all() and (out[0] != 0).sum() > 500


@pytest.mark.parametrize("with_map", [False, True])
def test_region_loss_with_a_tree(cuda, with_map):
    hier = read_tree(SMALL_TREE)
    rng = np.random.default_rng(7 + with_map)
    head = RegionHead(
        batch=3,
        n=3,
        h=5,
        w=5,
        classes=hier.n,
        softmax=1,
        bias_match=1,
        rescore=1,
        thresh=0.6,
        coord_scale=1.0,
        object_scale=5.0,
        noobject_scale=1.0,
        class_scale=1.5,
    )
    class_map = rng.permutation(hier.n)[:8] if with_map else None
    truth = truth_rows(rng, 3, 30, [2, 5, 0], classes=8 if with_map else hier.n)
    out = region_output(rng, head)
    anchors = np.array([0.57, 0.68, 1.87, 2.06, 3.34, 5.47], dtype=F32)
    results = []
    for be in (REF, cuda):
        classes = RegionClasses(
            int_array(be, class_map) if with_map else None, TreeArrays(be, hier)
        )
        delta = be.from_host(np.full(out.size, np.nan, dtype=F32))
        scalars = be.from_host(np.full(len(REGION_SCALARS), np.nan, dtype=F32))
        be.region_loss(
            head,
            be.from_host(out),
            be.from_host(truth.reshape(-1)),
            5,
            be.from_host(anchors),
            20000,
            delta,
            scalars,
            classes,
        )
        results.append((be.to_host(delta), be.to_host(scalars)))
    (want_delta, want_scalars), (delta, scalars) = results
    assert relative_error(delta, want_delta) < 1e-5
    np.testing.assert_allclose(scalars, want_scalars, rtol=1e-5)
    # the tree branch ran: class deltas of more than one sibling group in some cell
    classes_delta = want_delta.reshape(3, 3, 5 + hier.n, 25)[:, :, 5:]
    assert (classes_delta != 0).any(axis=(0, 1, 3)).sum() > 4
