"""delta_plan.place_in_arrays (the delta and output plans' colouring) places every layer
exactly as the first version did, a scan of every array's intervals, kept here as the
reference, on random interval sets and stock networks; and it takes a moment, not minutes,
for 20,000 layers."""

import os
import time

import numpy as np
import pytest

from darknet_py import delta_plan, output_plan
from darknet_py.delta_plan import ArrayTimes, place_in_arrays, plan_deltas
from darknet_py.network import build_network
from darknet_py.output_plan import plan_outputs

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared")


def reference_place_in_arrays(intervals, floats):
    """The first version: each layer, largest first, to the first array none of whose
    users' intervals it meets (every interval of every array scanned)."""
    buffer_of, buffer_floats, users = {}, [], []
    for i in sorted(intervals, key=lambda i: (-floats[i], i)):
        for number, taken in enumerate(users):  # noqa: B007 (number is read after a break)
            if all(high < a or b < low for low, high in intervals[i] for a, b in taken):
                break
        else:
            number = len(users)
            users.append([])
            buffer_floats.append(floats[i])
        users[number].extend(intervals[i])
        buffer_of[i] = number
    return buffer_of, buffer_floats


def random_intervals(rng, count, span, two, sizes):
    """count layers' intervals in [0, span): one each, or with `two` a second one (apart
    from, touching or overlapping the first), sizes drawn from `sizes`."""
    intervals = {}
    for _i in range(count):
        low = int(rng.integers(0, span))
        own = [(low, low + int(rng.integers(0, span // 4 + 1)))]
        if two and rng.random() < 0.7:
            other = int(rng.integers(0, span))
            own.append((other, other + int(rng.integers(0, span // 8 + 1))))
        intervals[int(rng.integers(0, 10 * count))] = tuple(own)
    floats = {i: int(rng.choice(sizes)) for i in intervals}
    return intervals, floats


@pytest.mark.parametrize("chunk", [ArrayTimes.CHUNK, 2])
def test_placement_matches_the_reference_on_random_interval_sets(monkeypatch, chunk):
    monkeypatch.setattr(ArrayTimes, "CHUNK", chunk)  # 2: chunks split all the time
    rng = np.random.default_rng(7)
    for trial in range(300):
        count = int(rng.integers(1, 120))
        sizes = [1, 2, 3] if trial % 3 else list(range(1, 1000))
        intervals, floats = random_intervals(
            rng, count, int(rng.integers(2, 400)), two=trial % 2 == 1, sizes=sizes
        )
        assert place_in_arrays(intervals, floats) == reference_place_in_arrays(intervals, floats), (
            trial
        )


def test_placement_of_chains_matches_the_reference():
    """A chain of layers: deltas live (i, i + 1); outputs live forward and backward."""
    count = 600
    floats = [4 + (i % 5 == 0) for i in range(count)]
    deltas = {i: ((i, i + 1),) for i in range(count)}
    outputs = {i: ((i, i + 1), (2 * count - 2 - i, 2 * count - 1 - i)) for i in range(count)}
    for intervals in (deltas, outputs):
        assert place_in_arrays(intervals, floats) == reference_place_in_arrays(intervals, floats)


def test_an_interval_that_ends_before_it_starts_is_refused():
    with pytest.raises(ValueError, match=r"interval \(5, 3\): low > high"):
        place_in_arrays({0: ((5, 3),)}, [1])


def test_twenty_thousand_layers_take_a_moment():
    count = 20000
    floats = [4] * count
    outputs = {i: ((i, i + 1), (2 * count - 2 - i, 2 * count - 1 - i)) for i in range(count)}
    start = time.perf_counter()
    buffer_of, buffer_floats = place_in_arrays(outputs, floats)
    assert time.perf_counter() - start < 10  # the scan of every array's took minutes
    assert buffer_floats == [4, 4] and buffer_of[0] == 0 and buffer_of[1] == 1


@pytest.mark.parametrize(
    "name",
    [
        "darknet-cfg-ab/yolov4.cfg",
        "darknet-cfg-ab/yolov7.cfg",
        "darknet-cfg-ab/csresnext50-panet-spp.cfg",
        "darknet-cfg/yolov3.cfg",
        "darknet-cfg/densenet201.cfg",
    ],
)
def test_stock_networks_plan_as_with_the_reference(monkeypatch, name):
    path = os.path.join(SHARED, name)
    if not os.path.isfile(path):
        pytest.skip(f"{path}: the stock cfgs (../shared) are not here")
    layers = build_network(path, batch=1).layers
    output_index = len(layers) - 1
    plans = (plan_deltas(layers), plan_outputs(layers, output_index))
    monkeypatch.setattr(delta_plan, "place_in_arrays", reference_place_in_arrays)
    monkeypatch.setattr(output_plan, "place_in_arrays", reference_place_in_arrays)
    references = (plan_deltas(layers), plan_outputs(layers, output_index))
    for plan, reference in zip(plans, references):
        assert plan.buffer_of and plan.buffer_of == reference.buffer_of
        assert plan.buffer_floats == reference.buffer_floats
