"""The roofline's fit (timings a roofline made give its parameters back), the backward convolutions' and vector-math
kernels' own parameters (closed forms), and the messages for a device that lacks one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from sim.planning.costs.from_flops import FlopCosts
from sim.planning.costs.roofline_fit import Fit, Timed, fit_roofline, predict_seconds
from sim.planning.counting.counts import CONVOLUTION, MATMUL, MEMORY_BOUND, VECTOR_MATH
from sim.planning.counting.flops import count_layers
from sim.planning.hardware.catalog import DEVICES, DeviceSpec
from sim.planning.hardware.roofline import MissingDeviceParameterError, Roofline, shape_factor

ROOF = Roofline({"fp32": 0.5}, {"fp32": 0.25}, memory=0.5, kernel_seconds=1e-6, half_dim=16.0,
                convolution_backward={"fp32": 0.125}, vector_math=0.25)
DEVICE = DeviceSpec("toy", {"fp32": 1e12}, 1e11, 2**30, roofline=ROOF)
TRUE = Fit(peak=8e10, bandwidth=3e10, vector_bandwidth=6e9, matmul=1.0, convolution=0.7, convolution_backward=0.45,
           half_dim=24.0, kernel_seconds=2e-6, convolution_half_dim=8.0)


def _gemm(kind: int, m: float, n: float, k: float) -> list[float]:
    return [2.0 * m * n * k, 4.0 * (m * k + k * n + m * n), kind, m, n, k]


def _synthetic(true: Fit = TRUE) -> list[Timed]:
    """Calls of every class, timed by the roofline ``true`` (compute-bound where they compute)."""
    calls = [("memory", [[0, 4e6, MEMORY_BOUND, 0, 0, 0]]), ("memory", [[0, 1e5, MEMORY_BOUND, 0, 0, 0]] * 2),
             ("vector math", [[0, 2e6, VECTOR_MATH, 0, 0, 0]]), ("vector math", [[0, 8e6, VECTOR_MATH, 0, 0, 0]])]
    calls += [("matmul", [_gemm(MATMUL, *d)]) for d in ((64, 64, 64), (512, 512, 512), (2048, 32, 288),
                                                      (128, 1024, 256), (16, 4096, 4096))]
    calls += [("convolution", [_gemm(CONVOLUTION, *d)]) for d in ((16384, 16, 144), (2048, 128, 1152))]
    calls += [("convolution backward", [_gemm(CONVOLUTION, *d), _gemm(CONVOLUTION, n, 9 * c, m),
                                        [0, 4.0 * m * n, MEMORY_BOUND, 0, 0, 0]])
              for m, n, c, d in ((16384, 16, 16, (16384, 16, 144)), (2048, 64, 64, (2048, 64, 576)))]
    fractions = {"matmul": true.matmul, "convolution": true.convolution,
                 "convolution backward": true.convolution_backward}
    out = []
    for kind, ops in calls:
        timed = Timed(kind, (0,), np.array(ops, dtype=np.float64), 1.0)
        half_dim = true.convolution_half_dim if kind.startswith("convolution") else true.half_dim
        seconds = predict_seconds(timed, true.peak, (true.bandwidth, true.vector_bandwidth),
                                  fractions.get(kind, 1.0), half_dim, true.kernel_seconds)
        out.append(replace(timed, seconds=seconds))
    return out


@pytest.mark.parametrize("true", [TRUE, replace(TRUE, matmul=0.8, convolution=1.0, half_dim=8.0,
                                                 convolution_half_dim=32.0)])
def test_fit_gives_back_the_roofline_that_made_the_timings(true: Fit) -> None:
    fit = fit_roofline(_synthetic(true), true.kernel_seconds)
    assert fit.half_dim == true.half_dim and fit.convolution_half_dim == true.convolution_half_dim
    assert fit.kernel_seconds == true.kernel_seconds
    for name in ("peak", "bandwidth", "vector_bandwidth", "matmul", "convolution", "convolution_backward"):
        assert getattr(fit, name) == pytest.approx(getattr(true, name), rel=1e-9), name


def test_fit_ignores_one_disturbed_matrix_multiply() -> None:
    timings = _synthetic()
    slowed = [replace(t, seconds=3 * t.seconds) if k == 4 else t for k, t in enumerate(timings)]
    assert slowed[4].kind == "matmul"
    fit = fit_roofline(slowed, TRUE.kernel_seconds)
    assert fit.half_dim == TRUE.half_dim
    for name in ("peak", "matmul", "convolution", "convolution_backward"):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-9), name


def test_fit_names_what_is_missing_or_wrong() -> None:
    timings = _synthetic()
    with pytest.raises(ValueError, match="needs timed vector math calls"):
        fit_roofline([t for t in timings if t.kind != "vector math"], 1e-6)
    wrong = [replace(timings[0], ops=timings[4].ops), *timings[1:]]
    with pytest.raises(ValueError, match="a timed memory call must run memory kernels only"):
        fit_roofline(wrong, 1e-6)
    with pytest.raises(ValueError, match="one of memory, vector math"):
        Timed("gemm", (1,), timings[4].ops, 1.0)
    with pytest.raises(ValueError, match="positive time"):
        Timed("matmul", (1,), timings[4].ops, 0.0)


def test_backward_convolutions_take_their_own_fraction_and_half_dim() -> None:
    model = nn.Sequential(nn.Identity(), nn.Conv2d(16, 16, 3, padding=1))
    profile = count_layers(model, torch.randn(2, 16, 8, 8))
    b = 4
    table = profile.layers[1].backward
    kinds, flops, nbytes = table.kinds_or_default(), table.flops_at(b), table.bytes_at(b)
    dims = table.dims_or_default()[:, :, 0] + table.dims_or_default()[:, :, 1] * b
    assert (kinds == CONVOLUTION).sum() == 2  # the input's and the filter's gradients
    rates = np.where(kinds == CONVOLUTION, 1e12 * 0.125, 1.0)
    expected = sum(max(f / (r * s), n / (1e11 * 0.5)) + 1e-6
                   for f, n, r, s in zip(flops, nbytes, rates, shape_factor(dims, 4.0), strict=True))
    costs = FlopCosts(profile, replace(DEVICE, roofline=replace(ROOF, convolution_half_dim=4.0)), "fp32-sgd")
    assert costs.layer_seconds(b)[1][1] == pytest.approx(expected, rel=1e-12)
    forward = profile.layers[1].forward
    f, n = forward.flops_at(b)[0], forward.bytes_at(b)[0]
    s = float(shape_factor((forward.dims[0, :, 0] + forward.dims[0, :, 1] * b)[None], 4.0)[0])
    assert costs.layer_seconds(b)[0][1] == pytest.approx(max(f / (1e12 * 0.25 * s), n / 5e10) + 1e-6, rel=1e-12)


def test_vector_math_kernels_take_their_own_bandwidth() -> None:
    profile = count_layers(nn.Sequential(nn.Identity(), nn.GELU(), nn.ReLU()), torch.randn(2, 64))
    gelu, relu = profile.layers[1], profile.layers[2]
    assert gelu.forward.kinds.tolist() == [VECTOR_MATH] and gelu.backward.kinds.tolist() == [VECTOR_MATH]
    assert relu.forward.kinds.tolist() == [MEMORY_BOUND]
    b = 8
    fwd, _ = FlopCosts(profile, DEVICE, "fp32-sgd").layer_seconds(b)
    assert fwd[1] == pytest.approx(gelu.forward.bytes_at(b)[0] / (1e11 * 0.25) + 1e-6, rel=1e-12)
    assert fwd[2] == pytest.approx(relu.forward.bytes_at(b)[0] / (1e11 * 0.5) + 1e-6, rel=1e-12)


def test_device_without_backward_or_vector_math_parameters_is_named() -> None:
    conv = count_layers(nn.Sequential(nn.Conv2d(3, 4, 3)), torch.randn(2, 3, 8, 8))
    no_backward = replace(DEVICE, roofline=replace(ROOF, convolution_backward={}))
    with pytest.raises(MissingDeviceParameterError, match=r"backward's convolutions \(input and filter gradients.*"
                                                          r"Roofline\.convolution_backward\['fp32'\].*--calibrate-cpu"):
        FlopCosts(conv, no_backward, "fp32-sgd")
    gelu = count_layers(nn.Sequential(nn.Linear(4, 4), nn.GELU()), torch.randn(2, 4))
    no_vector = replace(DEVICE, roofline=replace(ROOF, vector_math=None))
    with pytest.raises(MissingDeviceParameterError, match=r"arithmetic per element.*Roofline\.vector_math.*"
                                                          r"--calibrate-cpu"):
        FlopCosts(gelu, no_vector, "fp32-sgd")
    linear = count_layers(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4))
    FlopCosts(linear, replace(DEVICE, roofline=replace(ROOF, convolution_backward={}, vector_math=None)), "fp32-sgd")


def test_saved_description_without_the_new_parameters_loads_without_them() -> None:
    data = ROOF.to_dict()
    del data["convolution_backward"], data["vector_math"]
    old = Roofline.from_dict(data)
    assert dict(old.convolution_backward) == {} and old.vector_math is None
    assert Roofline.from_dict(ROOF.to_dict()) == ROOF
    with pytest.raises(ValueError, match="vector_math fraction"):
        replace(ROOF, vector_math=1.5)


def test_catalog_gpus_price_backward_and_vector_math_as_before() -> None:
    for name in ("tesla-p40", "v100-sxm2-32gb", "a100-80gb", "h100-sxm", "h200"):
        roofline = DEVICES[name].roofline
        assert roofline is not None
        assert dict(roofline.convolution_backward) == dict(roofline.convolution)
        assert roofline.vector_math == roofline.memory


def test_calibration_calls_count_as_the_class_they_fit() -> None:
    from sim.planning.costs.calibrate_device import CONVOLUTIONS, GEMMS, _conv_calls, _count, _gemm, _memory_calls

    vector = {"gelu", "gelu backward", "softmax", "softmax backward", "layer norm", "layer norm backward",
              "batch norm", "batch norm backward", "max pool", "max pool backward"}
    for name, fn, make in _memory_calls(1 << 18):
        kinds = set(_count(fn, make)[:, 2].tolist())
        assert kinds == ({VECTOR_MATH} if name in vector else {MEMORY_BOUND}), name
    for layout, batch, m, n, k in GEMMS:
        ops = _count(*_gemm(layout, batch, m, n, k))
        assert ops[:, 2].tolist() == [MATMUL] and ops[0, 0] == 2.0 * batch * m * n * k
        assert ops[0, 3:].tolist() == [batch * m, n, k]
    for b, c, s, co, stride in CONVOLUTIONS:
        (fwd, fwd_make), (bwd, bwd_make) = _conv_calls(b, c, s, co, stride)
        out = (s - 1) // stride + 1
        forward = _count(fwd, fwd_make)
        assert forward[:, 2].tolist() == [CONVOLUTION] and forward[0, 3:].tolist() == [b * out * out, co, c * 9]
        backward = _count(bwd, bwd_make)
        assert backward[:, 2].tolist() == [CONVOLUTION, CONVOLUTION, MEMORY_BOUND]  # input, filter, bias gradients
        assert backward[:2, 0].tolist() == [2.0 * b * out * out * co * c * 9] * 2
