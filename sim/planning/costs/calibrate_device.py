"""Measure this CPU's roofline (``gpipe-sim hardware --calibrate-cpu``): time generic kernels, count each as the
model counter does, and fit a :class:`~sim.planning.hardware.roofline.Roofline` to them.

On ``threads`` threads (one: what each executor worker uses on a CPU) it times the fixed cost of one eager
operator in a training step (Note [fixed cost per kernel]), a large copy, memory-bound kernels training runs
(ReLU, GELU, softmax, layer and batch norm, pooling, adds, copies of transposed tensors, masked writes,
reductions, their backwards) at activation sizes, matrix multiplies of several shapes and layouts, and 3x3
convolutions of several channel counts, sizes and strides, forward and backward. Each call's kernels are counted
on the ``meta`` device by :mod:`sim.planning.counting.operators`, so a fitted parameter prices the model's kernels as it
priced these; :func:`~sim.planning.costs.roofline_fit.fit_roofline` does the arithmetic. Times are the thread's CPU
time, operands out of cache (Note [cold operands]), each kernel's median over several passes over all of them, so
time spent waiting for a core on a shared machine does not count and a burst of other work there disturbs one
sample of each, not one kernel.
"""

from __future__ import annotations

import itertools
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpipe.interpreter.affinity import available_cores
from sim.planning.costs.calibrate_split import measure_split, with_split_overhead
from sim.planning.costs.roofline_fit import Fit, Timed, fit_roofline, predict_seconds
from sim.planning.counting.counts import VECTOR_MATH
from sim.planning.counting.flops import count_layers
from sim.planning.counting.operators import _Recorder
from sim.planning.hardware.catalog import DeviceSpec, GiB
from sim.planning.hardware.roofline import Roofline

__all__ = ["CONVOLUTIONS", "GEMMS", "MEMORY_SIZES", "POOL_BYTES", "Calibration", "Measurement", "calibrate_cpu",
           "check_threads"]

#: Matrix multiplies timed: (layout, batch, M, N, K); ``tn``/``nt`` read the first/second operand transposed (as a
#: linear layer's weight and input gradients do), ``bmm`` stacks ``batch`` products.
GEMMS = (("nn", 1, 64, 64, 64), ("nn", 1, 128, 128, 128), ("nn", 1, 256, 256, 256), ("nn", 1, 512, 512, 512),
         ("nn", 1, 1024, 1024, 1024), ("nn", 1, 2048, 64, 64), ("nn", 1, 2048, 256, 1024),
         ("nn", 1, 64, 1024, 1024), ("nn", 1, 4096, 32, 288), ("nn", 1, 512, 2048, 512),
         ("tn", 1, 512, 512, 2048), ("nt", 1, 2048, 512, 512), ("bmm", 16, 256, 256, 64), ("bmm", 16, 256, 64, 256))
#: 3x3 convolutions with bias, padding 1, timed forward and backward: (batch, in channels, size, out channels,
#: stride).
CONVOLUTIONS = ((16, 16, 32, 16, 1), (8, 24, 32, 48, 1), (32, 24, 32, 24, 1), (16, 48, 16, 48, 1),
                (8, 64, 16, 64, 1), (4, 128, 8, 128, 1), (16, 16, 32, 32, 2), (8, 48, 16, 96, 2),
                (32, 8, 16, 16, 1))
#: Elements of the memory-bound kernels' inputs (1 MiB and 4 MiB of fp32: activations, in cache or not).
MEMORY_SIZES = (1 << 18, 1 << 20)

_aten = torch.ops.aten
_Make = Callable[[Callable[..., torch.Tensor]], tuple[Any, ...]]


@dataclass(frozen=True)
class Measurement:
    """One timed call: what it is, its shape, FLOPs, bytes, measured seconds and the fitted roofline's seconds."""

    kind: str
    shape: tuple[int, ...]
    flops: float
    bytes: float
    seconds: float
    predicted: float = 0.0


@dataclass(frozen=True)
class Calibration:
    """The fitted device, the fit, and the measurements that set it."""

    device: DeviceSpec
    measurements: tuple[Measurement, ...]
    fit: Fit | None = None


class _Call:
    """One call to time: ``fn`` on fixed arguments, repeated within a sample to last at least ``floor`` seconds."""

    def __init__(self, fn: Callable[[], object], floor: float = 2e-3) -> None:
        self.fn = fn
        fn()  # warm-up
        start = time.thread_time()
        fn()
        self.inner = max(1, int(floor / max(time.thread_time() - start, 1e-7)))
        self.samples: list[float] = []

    def sample(self) -> None:
        """Time one sample: the thread's CPU seconds per call."""
        start = time.thread_time()
        for _ in range(self.inner):
            self.fn()
        self.samples.append((time.thread_time() - start) / self.inner)

    @property
    def seconds(self) -> float:
        return float(np.median(self.samples))


def _count(fn: Callable[..., object], make: _Make) -> np.ndarray:
    """The kernels ``fn`` runs on the arguments ``make`` builds, counted on meta
    (:mod:`sim.planning.counting.operators`)."""
    ops: list[tuple[float, ...]] = []
    args = make(lambda *shape: torch.empty(shape, device="meta"))
    with _Recorder(ops):  # type: ignore[arg-type]
        fn(*args)
    return np.asarray(ops, dtype=np.float64).reshape(-1, 7)[:, :6]  # the linear mark is not timed apart


# Note [cold operands]: a training step streams through more memory than the caches hold, so a kernel seldom
# finds its operands where the same kernel left them; called back to back on the same tensors, a matrix multiply
# or an elementwise kernel of a few MB runs from cache and looks faster than it is in the step. So each call's
# operands are views of a pool larger than the last-level cache, a new set of them for each call in turn, while
# the code stays warm as it is in a step.
#: Bytes of random values the timed calls' operands are views of (larger than this CPU's 32 MiB L3).
POOL_BYTES = 64 << 20


def _call(fn: Callable[..., object], make: _Make, pool: torch.Tensor) -> tuple[_Call, np.ndarray]:
    """``fn`` on operands ``make`` builds as views of ``pool``, a new set for each call in turn (Note [cold
    operands]), ready to time; and the kernels it runs."""
    offset = 0

    def view(*shape: int) -> torch.Tensor:
        nonlocal offset
        n = math.prod(shape)
        if offset + n > pool.numel():
            offset = 0
        out = pool[offset:offset + n].view(shape)
        offset += -(-n // 16) * 16  # 64-byte aligned, as an allocation is
        return out

    sets = [make(view)]
    sets += [make(view) for _ in range(min(4096, pool.numel() // max(offset, 1)) - 1)]
    turn = itertools.cycle(sets)
    return _Call(lambda: fn(*next(turn))), _count(fn, make)


def _gemm(layout: str, batch: int, m: int, n: int, k: int) -> tuple[Callable[..., object], _Make]:
    if layout == "bmm":
        return torch.bmm, lambda t: (t(batch, m, k), t(batch, k, n))
    if layout == "tn":
        return (lambda a, b: torch.mm(a.t(), b)), lambda t: (t(k, m), t(k, n))
    if layout == "nt":
        return (lambda a, b: torch.mm(a, b.t())), lambda t: (t(m, k), t(n, k))
    return torch.mm, lambda t: (t(m, k), t(k, n))


def _memory_calls(n: int) -> list[tuple[str, Callable[..., object], _Make]]:
    """Memory-bound calls on ``n`` elements: as rows of 256 features, or as 4-D maps of 64 channels."""
    rows, side = (n // 256, 256), int(math.isqrt(n // 1024))
    maps = (16, 64, side, side)
    pooled = (16, 64, side // 2, side // 2)

    def ln(t: Callable[..., torch.Tensor]) -> tuple[Any, ...]:
        return t(*rows), t(256), t(256)

    def ln_back(t: Callable[..., torch.Tensor]) -> tuple[Any, ...]:
        return t(*rows), t(*rows), t(rows[0], 1), t(rows[0], 1), t(256), t(256)

    def bn(t: Callable[..., torch.Tensor]) -> tuple[Any, ...]:
        return t(*maps), t(64), t(64)

    def bn_back(t: Callable[..., torch.Tensor]) -> tuple[Any, ...]:
        return t(*maps), t(*maps), t(64), t(64), t(64)

    def pool_back(t: Callable[..., torch.Tensor]) -> tuple[Any, ...]:
        x = t(*maps)
        _, idx = _aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
        return t(*pooled), x, idx

    return [
        ("relu", torch.relu, lambda t: (t(*rows),)),
        ("relu backward", lambda g, y: _aten.threshold_backward(g, y, 0.0), lambda t: (t(*rows), t(*rows))),
        ("add", torch.add, lambda t: (t(*rows), t(*rows))),
        ("gelu", F.gelu, lambda t: (t(*rows),)),
        ("gelu backward", _aten.gelu_backward, lambda t: (t(*rows), t(*rows))),
        ("softmax", lambda x: torch.softmax(x, -1), lambda t: (t(*rows),)),
        ("softmax backward", lambda g, y: _aten._softmax_backward_data(g, y, -1, torch.float32),
         lambda t: (t(*rows), t(*rows))),
        ("layer norm", lambda x, w, b: _aten.native_layer_norm(x, [256], w, b, 1e-5), ln),
        ("layer norm backward", lambda g, x, m, r, w, b: _aten.native_layer_norm_backward(
            g, x, [256], m, r, w, b, [True, True, True]), ln_back),
        ("batch norm", lambda x, w, b: _aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5), bn),
        ("batch norm backward", lambda g, x, w, m, r: _aten.native_batch_norm_backward(
            g, x, w, None, None, m, r, True, 1e-5, [True, True, True]), bn_back),
        ("max pool", lambda x: _aten.max_pool2d_with_indices(x, [2, 2], [2, 2]), lambda t: (t(*maps),)),
        ("max pool backward", lambda g, x, i: _aten.max_pool2d_with_indices_backward(
            g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, i), pool_back),
        ("copy", torch.clone, lambda t: (t(*rows),)),
        ("transposed copy", lambda x: x.t().contiguous(), lambda t: (t(*rows),)),
        ("masked fill", lambda x, m: x.masked_fill(m, 0.0), lambda t: (t(*rows), t(1, rows[1]) > 0)),
        ("sum over rows", lambda x: x.sum(0), lambda t: (t(*rows),)),
        ("concatenate", lambda a, b: torch.cat([a, b], -1), lambda t: (t(*rows), t(*rows))),
    ]


def _conv_calls(b: int, c: int, s: int, co: int, stride: int
                ) -> tuple[tuple[Callable[..., object], _Make], tuple[Callable[..., object], _Make]]:
    """A 3x3 convolution's forward, and its backward with every gradient (what autograd runs inside a network)."""
    out = (s + 2 - 3) // stride + 1

    def forward(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> object:
        return F.conv2d(x, w, bias, stride=stride, padding=1)

    def backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> object:
        return _aten.convolution_backward(g, x, w, [co], [stride, stride], [1, 1], [1, 1], False, [0, 0], 1,
                                          [True, True, True])

    return ((forward, lambda t: (t(b, c, s, s), t(co, c, 3, 3), t(co))),
            (backward, lambda t: (t(b, co, out, out), t(b, c, s, s), t(co, c, 3, 3))))


# Note [fixed cost per kernel]: in eager PyTorch on a CPU each operator of a training step costs microseconds
# besides its arithmetic: dispatch, the autograd node the forward records, the engine running it in the backward,
# the gradient's accumulation. A tiny operator timed alone shows only the first, so the fixed cost is measured
# as a training step of layers too small to compute anything (linear, ReLU and layer norm on 2 x 4 values),
# divided by the kernels the counter sees in it. The calls the fit times run alone and pay only the dispatch.
def _tiny_chain() -> tuple[torch.nn.Sequential, torch.Tensor]:
    """A chain of tiny layers, and its input (Note [fixed cost per kernel])."""
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = [torch.nn.Identity()]  # the first layer's input needs no gradient
        for _ in range(16):
            layers += [torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.LayerNorm(4)]
        chain = torch.nn.Sequential(*layers)
    return chain, torch.randn(2, 4, generator=gen)


def _measure(repeats: int, between: Callable[[], object] | None) -> tuple[float, float, float, list[Timed]]:
    """The fixed cost of one operator alone and in a training step (per kernel), the streaming bandwidth of a
    large copy, and every timed call: ``repeats``
    passes over all calls, one sample each, ``between`` called after each pass; medians over passes."""
    gen = torch.Generator().manual_seed(0)
    big = torch.rand(1 << 23, generator=gen)  # 32 MiB: beyond the caches
    out = torch.empty_like(big)
    pool = torch.rand(POOL_BYTES // 4, generator=gen) - 0.5
    chain, x = _tiny_chain()
    tiny = torch.ones(1)
    dispatch, step = _Call(lambda: torch.add(tiny, tiny)), _Call(lambda: chain(x).sum().backward())
    stream = _Call(lambda: out.copy_(big))
    described: list[tuple[str, tuple[int, ...], str, _Call, np.ndarray]] = []
    for n in MEMORY_SIZES:
        for name, fn, make in _memory_calls(n):
            call, ops = _call(fn, make, pool)
            described.append(("vector math" if (ops[:, 2] == VECTOR_MATH).all() else "memory", (n,), name, call, ops))
    for layout, batch, m, n, k in GEMMS:
        described.append(("matmul", (batch, m, n, k), f"matmul {layout}",
                          *_call(*_gemm(layout, batch, m, n, k), pool)))
    for shape in CONVOLUTIONS:
        (fwd, fwd_make), (bwd, bwd_make) = _conv_calls(*shape)
        described.append(("convolution", shape, "convolution", *_call(fwd, fwd_make, pool)))
        described.append(("convolution backward", shape, "convolution backward", *_call(bwd, bwd_make, pool)))
    for _ in range(repeats):
        for call in (dispatch, step, stream, *(d[3] for d in described)):
            call.sample()
        if between is not None:
            between()
    timings = [Timed(kind, shape, ops, call.seconds, name) for kind, shape, name, call, ops in described]
    counted = count_layers(chain, x)
    kernels = sum(layer.forward.kernels + layer.backward.kernels for layer in counted.layers) + 1  # and the sum
    return dispatch.seconds, step.seconds / kernels, 2 * big.nbytes / stream.seconds, timings


def check_threads(threads: int, what: str = "threads") -> None:
    """Refuse fewer than one thread, or more than the cores this process may run on: more threads than cores time
    contention, not the CPU, and torch crashes on tens of thousands of them.

    Raises:
        ValueError: one line naming ``what`` and the cores.
    """
    cores = len(available_cores())
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= cores:
        raise ValueError(f"{what} must be from 1 to {cores} (the cores this process may run on), got {threads!r}")


def calibrate_cpu(repeats: int = 5, threads: int = 1, name: str = "cpu-this-machine",
                  between: Callable[[], object] | None = None) -> Calibration:
    """Time kernels on this CPU with ``threads`` threads and fit its fp32 roofline (see the module docstring).

    ``repeats`` passes over every kernel, one sample each, and each kernel's median over them; ``between`` is
    called after each pass (a check that measures something else on a shared machine runs it there, so both
    sample the same minutes).

    The device's bandwidth is the largest of a large copy's and what the memory-bound kernels reach (those run in
    cache), its ``memory`` and ``vector_math`` fractions what the plain and the vector-math kernels reach of it;
    its peak is the fastest compute class's rate (Note [fitting order] in :mod:`sim.planning.costs.roofline_fit`).

    Raises:
        ValueError: ``repeats`` below 1, or ``threads`` not from 1 to this process's cores (:func:`check_threads`).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    check_threads(threads)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dispatch, kernel, stream, timings = _measure(repeats, between)
        fitted = _device(name, threads, dispatch, kernel, stream, timings)
        device = with_split_overhead(fitted[0], measure_split(fitted[0], repeats=10 * repeats))
    finally:
        torch.set_num_threads(before)
    return Calibration(device, *fitted[1:])


def _device(name: str, threads: int, dispatch: float, kernel: float, stream: float,
            timings: list[Timed]) -> tuple[DeviceSpec, tuple[Measurement, ...], Fit]:
    """The fitted device (no split seconds yet), each measurement beside its prediction, and the fit."""
    fit = fit_roofline(timings, dispatch)  # the calls were timed alone: each pays the dispatch only
    bandwidth = max(stream, fit.bandwidth, fit.vector_bandwidth)
    roofline = Roofline({"fp32": fit.matmul}, {"fp32": fit.convolution}, memory=fit.bandwidth / bandwidth,
                        kernel_seconds=kernel, half_dim=fit.half_dim, convolution_half_dim=fit.convolution_half_dim,
                        convolution_backward={"fp32": fit.convolution_backward},
                        vector_math=fit.vector_bandwidth / bandwidth,
                        source=f"measured by gpipe-sim hardware --calibrate-cpu on {platform.processor() or 'this CPU'}"
                               f" ({threads} thread{'s' if threads > 1 else ''}, {date.today().isoformat()})")
    device = DeviceSpec(name, {"fp32": fit.peak}, bandwidth, 16 * GiB, efficiency=1.0,
                        description=f"this machine's CPU, {threads} thread(s), measured", roofline=roofline)
    fractions = {"memory": 1.0, "vector math": 1.0, "matmul": fit.matmul, "convolution": fit.convolution,
                 "convolution backward": fit.convolution_backward}
    rows = [Measurement(t.name, t.shape, float(t.ops[:, 0].sum()), float(t.ops[:, 1].sum()), t.seconds,
                        predict_seconds(t, fit.peak, (fit.bandwidth, fit.vector_bandwidth), fractions[t.kind],
                                        fit.half_dim if t.kind == "matmul" else fit.convolution_half_dim, dispatch))
            for t in timings]
    return device, tuple(rows), fit
