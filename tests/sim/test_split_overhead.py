"""The split backward's host work in the planner (Note [split overhead] in sim.planning.hardware.roofline): a device's
seconds per parameter tensor reach B and W of a counted model exactly, survive JSON, and are measured on the
executor's own split."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from sim.planning.costs.calibrate_split import LAYERS, measure_split, with_split_overhead
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import count_layers
from sim.planning.hardware.catalog import DeviceSpec
from sim.planning.hardware.roofline import Roofline

ROOF = Roofline({"fp32": 0.5}, {"fp32": 0.25}, memory=0.5, kernel_seconds=1e-6, half_dim=16.0, vector_math=0.25)
DEVICE = DeviceSpec("toy", {"fp32": 1e12}, 1e11, 2**30, roofline=ROOF)


def _profile():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 4))
    return count_layers(model, torch.randn(2, 8))


def test_split_seconds_add_per_parameter_tensor_to_b_and_w_and_keep_the_whole_backward() -> None:
    plain = FlopCosts(_profile(), DEVICE)
    split = FlopCosts(_profile(), replace(DEVICE, roofline=replace(ROOF, split_input_seconds=2e-6,
                                                                   split_weight_seconds=5e-6)))
    b0, w0 = plain.split_backward_seconds(2)
    b1, w1 = split.split_backward_seconds(2)
    tensors = np.array([2, 0, 2, 2])  # weight and bias of each Linear; none for the ReLU
    np.testing.assert_allclose(b1 - b0, tensors * 2e-6)
    np.testing.assert_allclose(w1 - w0, tensors * 5e-6)
    np.testing.assert_allclose(split.layer_seconds(2)[1], plain.layer_seconds(2)[1])  # an unsplit backward pays none
    cost = split.stages([2, 2], 2, split=True)
    assert cost[0].weight == pytest.approx(float(w1[:2].sum()))
    assert cost[1].backward == pytest.approx(float(b1[2:].sum()))


def test_split_seconds_round_trip_and_default_to_none_measured() -> None:
    roof = replace(ROOF, split_input_seconds=1e-6, split_weight_seconds=3e-6)
    assert Roofline.from_dict(roof.to_dict()) == roof
    old = ROOF.to_dict()
    del old["split_input_seconds"], old["split_weight_seconds"]
    assert Roofline.from_dict(old).split_weight_seconds == 0.0
    for bad in (-1e-6, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="split_weight_seconds must be a finite number >= 0"):
            replace(ROOF, split_weight_seconds=bad)


def test_measured_on_the_executors_split() -> None:
    torch.set_num_threads(1)
    found = measure_split(DEVICE, repeats=3)
    assert found.tensors == 2 * LAYERS and 0 < found.input_share < 1
    assert min(found.backward, found.input, found.weight) > 0
    assert found.input_seconds >= 0 and found.weight_seconds >= 0
    device = with_split_overhead(DEVICE, found)
    assert device.roofline is not None and device.roofline.split_weight_seconds == found.weight_seconds
    assert with_split_overhead(replace(DEVICE, roofline=None), found).roofline is None
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        measure_split(DEVICE, repeats=0)
