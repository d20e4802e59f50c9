"""Measure a device's roofline: time GEMMs, convolutions and memory-bound kernels of several shapes and fit a
:class:`~sim.planning.roofline.Roofline` (``gpipe-sim hardware --calibrate-cpu``).

On one thread (what each executor worker uses on a CPU), per kernel class: the fixed cost per kernel is the
fastest time of a one-element add; the memory bandwidth is the bytes a large add and copy move per second; the
matrix peak and ``half_dim`` are the pair whose roofline best explains every GEMM (least log error over a grid
of ``half_dim``), and the convolution fraction is what the convolutions reach of that roofline. Every fitted
number comes back with the measurements behind it, so a reader can see what set it.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

import numpy as np
import torch
import torch.nn.functional as F

from sim.planning.hardware import DeviceSpec, GiB
from sim.planning.roofline import Roofline, shape_factor

__all__ = ["CONVOLUTIONS", "GEMMS", "Calibration", "Measurement", "calibrate_cpu"]

#: GEMM shapes (M, N, K) timed: small to large, narrow and square.
GEMMS = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
         (2048, 64, 64), (2048, 256, 1024), (64, 1024, 1024), (4096, 32, 288), (512, 2048, 512))
#: Convolution shapes (batch, in channels, size, out channels), 3x3, padding 1.
CONVOLUTIONS = ((8, 3, 32, 32), (8, 32, 32, 32), (8, 32, 16, 64), (4, 64, 16, 64), (2, 128, 8, 128))
_HALF_DIMS = (0.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)


@dataclass(frozen=True)
class Measurement:
    """One timed kernel: its class, shape, FLOPs, bytes and the fastest of its repeats, seconds."""

    kind: str
    shape: tuple[int, ...]
    flops: float
    bytes: float
    seconds: float
    predicted: float = 0.0


@dataclass(frozen=True)
class Calibration:
    """The fitted device and the measurements that set it."""

    device: DeviceSpec
    measurements: tuple[Measurement, ...]


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _bind(fn: Callable[..., object], *args: object, **kwargs: object) -> Callable[[], object]:
    return lambda: fn(*args, **kwargs)


def _conv_shape(b: int, c: int, s: int, co: int) -> tuple[float, float, float, float, float]:
    """FLOPs, bytes and implicit-GEMM M, N, K of a 3x3 convolution, padding 1, fp32."""
    m, n, k = b * s * s, co, c * 9
    return 2.0 * m * n * k, 4.0 * (b * c * s * s + co * c * 9 + b * co * s * s), m, n, k


def calibrate_cpu(repeats: int = 5, threads: int = 1, name: str = "cpu-this-machine") -> Calibration:
    """Time kernels on this CPU with ``threads`` threads and fit its fp32 roofline (see the module docstring).

    Raises:
        ValueError: ``repeats`` or ``threads`` below 1.
    """
    if repeats < 1 or threads < 1:
        raise ValueError(f"repeats and threads must be >= 1, got {repeats} and {threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        tiny = torch.ones(1)
        kernel = _best_seconds(lambda: torch.add(tiny, tiny), 50 * repeats)
        big = torch.rand(1 << 23, generator=gen)  # 32 MiB: far beyond the caches
        out = torch.empty_like(big)
        add = _best_seconds(lambda: torch.add(big, big, out=out), repeats)
        copy = _best_seconds(lambda: out.copy_(big), repeats)
        bandwidth = max(3 * big.nbytes / max(add - kernel, 1e-9), 2 * big.nbytes / max(copy - kernel, 1e-9))
        memory = [Measurement("memory", (big.numel(),), 0.0, 3.0 * big.nbytes, add),
                  Measurement("memory", (big.numel(),), 0.0, 2.0 * big.nbytes, copy)]
        gemms = []
        for m, n, k in GEMMS:
            a, b = torch.rand(m, k, generator=gen), torch.rand(k, n, generator=gen)
            gemms.append(Measurement("matmul", (m, n, k), 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n),
                                     _best_seconds(_bind(torch.mm, a, b), repeats)))
        convs = []
        for bsz, c, s, co in CONVOLUTIONS:
            x, w = torch.rand(bsz, c, s, s, generator=gen), torch.rand(co, c, 3, 3, generator=gen)
            flops, nbytes, *_ = _conv_shape(bsz, c, s, co)
            convs.append(Measurement("convolution", (bsz, c, s, co), flops, nbytes,
                                     _best_seconds(_bind(F.conv2d, x, w, padding=1), repeats)))
    finally:
        torch.set_num_threads(before)
    gemm_dims = np.array([g.shape for g in gemms], dtype=np.float64)
    conv_dims = np.array([_conv_shape(*c.shape)[2:] for c in convs], dtype=np.float64)
    peak, half_dim = _fit_gemm(gemms, gemm_dims, kernel)
    conv_rates = [c.flops / (max(c.seconds - kernel, 1e-9) * peak * f)
                  for c, f in zip(convs, shape_factor(conv_dims, half_dim), strict=True)]
    conv_fraction = float(min(1.0, np.median(conv_rates)))
    roofline = Roofline({"fp32": 1.0}, {"fp32": conv_fraction}, memory=1.0, kernel_seconds=kernel,
                        half_dim=half_dim,
                        source=f"measured by gpipe-sim hardware --calibrate-cpu on {platform.processor() or 'this CPU'}"
                               f" ({threads} thread{'s' if threads > 1 else ''}, {date.today().isoformat()})")
    device = DeviceSpec(name, {"fp32": peak}, bandwidth, 16 * GiB, efficiency=1.0,
                        description=f"this machine's CPU, {threads} thread(s), measured", roofline=roofline)

    def predict(meas: Measurement, dims: np.ndarray | None, fraction: float) -> Measurement:
        compute = 0.0 if dims is None else meas.flops / (peak * fraction * float(shape_factor(dims, half_dim)))
        seconds = max(compute, meas.bytes / bandwidth) + kernel
        return Measurement(meas.kind, meas.shape, meas.flops, meas.bytes, meas.seconds, seconds)

    rows = [predict(m, None, 1.0) for m in memory]
    rows += [predict(g, d, 1.0) for g, d in zip(gemms, gemm_dims, strict=True)]
    rows += [predict(c, d, conv_fraction) for c, d in zip(convs, conv_dims, strict=True)]
    return Calibration(device, tuple(rows))


def _fit_gemm(gemms: list[Measurement], dims: np.ndarray, kernel: float) -> tuple[float, float]:
    """The peak FLOP/s and ``half_dim`` whose roofline best explains the timed GEMMs (least mean log error)."""
    flops = np.array([g.flops for g in gemms])
    seconds = np.maximum(np.array([g.seconds for g in gemms]) - kernel, 1e-9)
    best = (math.inf, 0.0, 0.0)
    for half_dim in _HALF_DIMS:
        factor = shape_factor(dims, half_dim)
        peak = float(np.exp(np.median(np.log(flops / (seconds * factor)))))
        error = float(np.mean(np.abs(np.log(flops / (peak * factor) / seconds))))
        best = min(best, (error, half_dim, peak))
    return best[2], best[1]
