"""Fit a :class:`~sim.planning.hardware.roofline.Roofline` to timed kernels: pure arithmetic, no clock and no torch.

Each timing is a call whose kernels were counted as the model counter counts them (:class:`Timed`), so a fitted
parameter means in the planner what it meant here. The parameters come one class at a time, each from the
classes before it (Note [fitting order]); :func:`predict_seconds` is the roofline's time for one timing, the same
sum :class:`~sim.planning.costs.from_flops.FlopCosts` takes over a model's kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.planning.counting.counts import CONVOLUTION, MATMUL, MEMORY_BOUND, VECTOR_MATH
from sim.planning.hardware.roofline import roofline_seconds

__all__ = ["CLASSES", "HALF_DIMS", "Fit", "Timed", "fit_roofline", "predict_seconds"]

#: The classes of timed calls: memory-bound kernels (plain, and with arithmetic per element), matrix multiplies,
#: convolutions, their backward.
CLASSES = ("memory", "vector math", "matmul", "convolution", "convolution backward")
#: The ``half_dim`` values tried (Note [GEMM shape factor] in :mod:`sim.planning.hardware.roofline`).
HALF_DIMS = (0.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)


@dataclass(frozen=True, eq=False)
class Timed:
    """One timed call: its class (one of :data:`CLASSES`), a shape for display, the kernels it runs, its seconds
    (the median of its repeats) and, for display, what it is.

    Attributes:
        ops: shape ``(kernels, 6)``: FLOPs, bytes, kind (:mod:`sim.planning.counting.counts`), GEMM ``M, N, K`` of each
            kernel, as :mod:`sim.planning.counting.operators` counts them.
    """

    kind: str
    shape: tuple[int, ...]
    ops: np.ndarray = field(repr=False)
    seconds: float
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CLASSES:
            raise ValueError(f"a timed call is one of {', '.join(CLASSES)}, got {self.kind!r}")
        if not self.seconds > 0:
            raise ValueError(f"a timed call takes a positive time, got {self.seconds!r} s")


@dataclass(frozen=True)
class Fit:
    """The fitted parameters: peak FLOP/s (the fastest compute class's), bytes/s plain and vector-math
    memory-bound kernels reach, fractions of that peak per class, ``half_dim``, the fixed cost per kernel
    (seconds) and the convolutions' ``half_dim``."""

    peak: float
    bandwidth: float
    vector_bandwidth: float
    matmul: float
    convolution: float
    convolution_backward: float
    half_dim: float
    kernel_seconds: float
    convolution_half_dim: float


def predict_seconds(timed: Timed, peak: float, bandwidth: tuple[float, float], fraction: float, half_dim: float,
                    kernel_seconds: float) -> float:
    """The roofline's seconds for ``timed``: its compute kernels at ``peak * fraction``, the rest at ``bandwidth``
    (plain, vector math)."""
    ops = timed.ops
    compute = (ops[:, 2] == MATMUL) | (ops[:, 2] == CONVOLUTION)
    rates = np.where(compute, peak * fraction, 1.0)
    per_op = np.where(ops[:, 2] == VECTOR_MATH, bandwidth[1], bandwidth[0])
    return float(roofline_seconds(ops[:, 0], ops[:, 1], rates, ops[:, 3:6], half_dim, per_op,
                                  kernel_seconds).sum())


def _solve(seconds: Callable[[float], float], target: float) -> float:
    """The ``x > 0`` with ``seconds(x) == target`` for ``seconds`` falling in ``x``; NaN when none (the call is
    bound by bytes or by its fixed cost, whatever the rate)."""
    lo, hi = math.log(1e-12), math.log(1e18)
    if seconds(math.exp(hi)) > target or seconds(math.exp(lo)) < target:
        return math.nan
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if seconds(math.exp(mid)) > target else (lo, mid)
    return math.exp(0.5 * (lo + hi))


def _median(values: Sequence[float], what: str) -> float:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        raise ValueError(f"no timed {what} is compute-bound enough to fit its rate; time larger shapes")
    return float(np.median(finite))


# Note [fitting order]: the fixed cost per kernel is measured (what one operator alone costs). The bandwidths come
# next, from memory-bound calls alone: bytes / (seconds - kernels x fixed cost), the median over the plain calls
# and over the vector-math ones. ``half_dim`` comes from the matrix multiplies, the convolutions' own from the
# convolutions (their algorithms tile otherwise): for each, the one of :data:`HALF_DIMS` whose median rate per
# class explains the class's calls best (least log error). Then each compute class (matrix multiplies,
# convolutions, their backward) gets the median of the rates that explain its calls; the peak is the fastest
# class's, each class's fraction its rate over the peak, so none exceeds 1. Medians, so one call disturbed by a
# neighbour moves nothing; every step inverts the same sum :func:`predict_seconds` takes, so timings a roofline
# made give its parameters back.
def fit_roofline(timings: Sequence[Timed], kernel_seconds: float, half_dims: Sequence[float] = HALF_DIMS) -> Fit:
    """Fit the roofline's parameters to ``timings`` (Note [fitting order]).

    Raises:
        ValueError: a class is missing, a memory call runs other kernels than its class, or none of a class's
            calls is bound by its rate (the message names it).
    """
    by_class = {c: [t for t in timings if t.kind == c] for c in CLASSES}
    missing = [c for c, ts in by_class.items() if not ts]
    if missing:
        raise ValueError(f"a roofline fit needs timed {', '.join(missing)} calls")

    def bandwidth_of(kind: str, op_kind: int) -> float:
        if any((t.ops[:, 2] != op_kind).any() for t in by_class[kind]):
            raise ValueError(f"a timed {kind} call must run {kind} kernels only")
        return _median([float(t.ops[:, 1].sum()) / (t.seconds - len(t.ops) * kernel_seconds)
                        if t.seconds > len(t.ops) * kernel_seconds else math.nan for t in by_class[kind]],
                       f"{kind} call")

    bandwidth = (bandwidth_of("memory", MEMORY_BOUND), bandwidth_of("vector math", VECTOR_MATH))

    def rate_of(t: Timed, half_dim: float) -> float:
        return _solve(lambda r: predict_seconds(t, r, bandwidth, 1.0, half_dim, kernel_seconds), t.seconds)

    def best_half_dim(kinds: tuple[str, ...]) -> float:
        """The ``half_dim`` whose median rate per class explains the calls of ``kinds`` best."""
        best = (math.inf, 0.0)
        for half_dim in half_dims:
            error = 0.0
            for kind in kinds:
                rate = _median([rate_of(t, half_dim) for t in by_class[kind]], kind)
                error += sum(abs(math.log(predict_seconds(t, rate, bandwidth, 1.0, half_dim, kernel_seconds)
                                          / t.seconds)) for t in by_class[kind])
            best = min(best, (error, half_dim))
        return best[1]

    half_dim = best_half_dim(("matmul",))
    conv_half_dim = best_half_dim(("convolution", "convolution backward"))
    rates = {"matmul": _median([rate_of(t, half_dim) for t in by_class["matmul"]], "matmul")}
    rates |= {kind: _median([rate_of(t, conv_half_dim) for t in by_class[kind]], kind)
              for kind in ("convolution", "convolution backward")}
    peak = max(rates.values())
    return Fit(peak, bandwidth[0], bandwidth[1], rates["matmul"] / peak, rates["convolution"] / peak,
               rates["convolution backward"] / peak, half_dim, kernel_seconds, conv_half_dim)
