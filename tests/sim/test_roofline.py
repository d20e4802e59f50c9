"""Costs per operator: each kernel's roofline by its kind and GEMM shape, unknown operators and missing device
parameters stopped with a message that names them, devices saved and loaded as JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import CONVOLUTION, MATMUL, MEMORY_BOUND
from sim.planning.counting.flops import UnknownOperatorError, count_layers
from sim.planning.hardware.catalog import DeviceSpec, get_device, load_device
from sim.planning.hardware.roofline import MissingDeviceParameterError, Roofline, shape_factor

ROOF = Roofline({"fp32": 0.5}, {"fp32": 0.25}, memory=0.5, kernel_seconds=1e-6, half_dim=16.0,
                convolution_backward={"fp32": 0.125}, vector_math=0.25)
DEVICE = DeviceSpec("toy", {"fp32": 1e12}, 1e11, 2**30, roofline=ROOF)


def test_counter_records_kind_and_gemm_shape() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 5 * 5, 6))
    profile = count_layers(model, torch.randn(2, 3, 5, 5))
    conv, relu, _, linear = profile.layers
    assert conv.forward.kinds.tolist() == [CONVOLUTION]
    b = 7
    dims = conv.forward.dims[0, :, 0] + conv.forward.dims[0, :, 1] * b
    assert dims.tolist() == [b * 25, 8, 3 * 9]  # implicit GEMM: batch x pixels, out channels, in x kernel
    assert relu.forward.kinds.tolist() == [MEMORY_BOUND]
    assert MATMUL in linear.forward.kinds.tolist()
    mm = linear.forward.kinds.tolist().index(MATMUL)
    assert (linear.forward.dims[mm, :, 0] + linear.forward.dims[mm, :, 1] * b).tolist() == [b, 6, 200]


def test_each_kernel_takes_its_own_roofline() -> None:
    b, d = 4, 64
    model = nn.Sequential(nn.Identity(), nn.Linear(d, d, bias=False))
    profile = count_layers(model, torch.randn(b, d))
    table = profile.layers[1].forward
    flops, nbytes = table.flops_at(b)[0], table.bytes_at(b)[0]
    factor = (b / (b + 16)) * (d / (d + 16)) ** 2
    expected = max(flops / (1e12 * 0.5 * factor), nbytes / (1e11 * 0.5)) + 1e-6
    assert FlopCosts(profile, DEVICE, "fp32-sgd").layer_seconds(b)[0][1] == pytest.approx(expected, rel=1e-12)


def test_convolution_uses_the_convolution_fraction() -> None:
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False))
    profile = count_layers(model, torch.randn(2, 16, 32, 32))
    slow = FlopCosts(profile, DEVICE, "fp32-sgd").layer_seconds(64)[0][0]
    fast = FlopCosts(profile, replace(DEVICE, roofline=replace(ROOF, convolution={"fp32": 0.5})),
                     "fp32-sgd").layer_seconds(64)[0][0]
    assert slow - 1e-6 == pytest.approx(2 * (fast - 1e-6))  # compute-bound: half the fraction, twice the time


def test_shape_factor_saturates_and_ignores_unknown_dimensions() -> None:
    got = shape_factor(np.array([[16.0, 0.0, 48.0], [1e12, 1e12, 1e12]]), 16.0)
    assert got[0] == pytest.approx(0.5 * 0.75) and got[1] == pytest.approx(1.0)


def test_unknown_operator_is_named_with_what_to_add() -> None:
    class Cumprod(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumprod(x, dim=1)

    model = nn.Sequential(Cumprod(), nn.Linear(4, 4))  # first layer: its input needs no gradient, no backward
    with pytest.raises(UnknownOperatorError, match=r"aten::cumprod.*memory_bound=\{'cumprod'\}.*flop_registry"):
        count_layers(model, torch.randn(2, 4))
    profile = count_layers(model, torch.randn(2, 4), memory_bound={"cumprod"})
    assert profile.layers[0].forward.kinds.tolist() == [MEMORY_BOUND]
    assert profile.layers[0].forward.bytes_at(2)[0] == 2 * 2 * 4 * 4  # read and written: nothing is free


def test_device_without_a_convolution_fraction_names_the_operator() -> None:
    profile = count_layers(nn.Sequential(nn.Conv2d(3, 4, 3)), torch.randn(2, 3, 8, 8))
    bare = replace(DEVICE, roofline=replace(ROOF, convolution={}))
    with pytest.raises(MissingDeviceParameterError, match=r"convolutions \(aten::convolution.*Roofline\.convolution"
                                                          r"\['fp32'\]"):
        FlopCosts(profile, bare, "fp32-sgd")
    linear = count_layers(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4))
    FlopCosts(linear, bare, "fp32-sgd")  # a model without convolutions does not need it


def test_device_without_the_dtype_peak_names_the_operator() -> None:
    profile = count_layers(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4))
    with pytest.raises(MissingDeviceParameterError, match=r"matrix multiplies.*no peak_flops\['fp16'\]"):
        FlopCosts(profile, DEVICE, "fp16-sgd")


def test_bad_roofline_fractions_are_refused() -> None:
    with pytest.raises(ValueError, match="matmul fraction for fp32 is a fraction"):
        Roofline({"fp32": 1.5}, {}, 0.5, 0.0, 0.0)
    with pytest.raises(ValueError, match="memory fraction"):
        Roofline({}, {}, 0.0, 0.0, 0.0)


def test_catalog_gpus_carry_a_roofline_with_its_source() -> None:
    for name in ("tesla-p40", "v100-sxm2-32gb", "a100-80gb", "h100-sxm", "h200"):
        roofline = get_device(name).roofline
        assert roofline is not None and roofline.source


def test_device_round_trips_through_json(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(DEVICE.to_dict()))
    assert load_device(path) == DEVICE and get_device(str(path)) == DEVICE
    path.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="needs peak_flops, memory_bandwidth, memory_bytes"):
        load_device(path)
