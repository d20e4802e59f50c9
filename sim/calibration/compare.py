"""Predicted against measured: align two timelines of one schedule by task key and report the gaps.

Both timelines are taken from their own start (time zero is each one's first span), so a measured
step that began at an arbitrary host time lines up with the simulator's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpipe.schedule import Task
from gpipe.schedule.timeline import Span, Timeline

__all__ = ["Comparison", "DeviceComparison", "OpComparison", "compare", "order_agreement"]


@dataclass(frozen=True)
class DeviceComparison:
    """One device, predicted beside measured (seconds, fractions, bytes)."""

    device: int
    predicted_busy: float
    measured_busy: float
    predicted_bubble: float
    measured_bubble: float
    order_agreement: float
    order_identical: bool
    predicted_peak_bytes: int
    measured_peak_bytes: int

    @property
    def peak_bytes_error(self) -> float:
        """Relative error of the predicted peak bytes saved for backward (0 when both are 0)."""
        if self.measured_peak_bytes == 0:
            return 0.0 if self.predicted_peak_bytes == 0 else float("inf")
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes


@dataclass(frozen=True)
class OpComparison:
    """One kind of task (F, R, B or W), predicted beside measured, over the matched tasks of that kind.

    Attributes:
        op: ``"F"``, ``"R"``, ``"B"`` or ``"W"``.
        count: matched tasks of this kind.
        predicted_seconds: their total predicted duration.
        measured_seconds: their total measured duration.
    """

    op: str
    count: int
    predicted_seconds: float
    measured_seconds: float

    @property
    def error(self) -> float:
        """Relative error of the total duration (0 when both are 0)."""
        if self.measured_seconds == 0:
            return 0.0 if self.predicted_seconds == 0 else float("inf")
        return (self.predicted_seconds - self.measured_seconds) / self.measured_seconds


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` finds.

    Attributes:
        predicted_makespan: seconds.
        measured_makespan: seconds.
        makespan_error: ``(predicted - measured) / measured``; positive when the simulator is slow.
        start_error_mean: mean ``|predicted start - measured start|`` over matched tasks, seconds.
        start_error_max: the largest such difference, seconds.
        duration_error_mean: mean ``|predicted duration - measured duration|``, seconds.
        duration_error_max: the largest, seconds.
        order_agreement: the mean over devices of :func:`order_agreement` (1.0: identical orders).
        matched: compute tasks present in both timelines.
        only_predicted: tasks the measurement lacks (should be empty).
        only_measured: tasks the prediction lacks (should be empty).
        devices: per-device figures.
        ops: per kind of task, total predicted and measured durations (where a gap is: in the tasks
            themselves, or between them).
    """

    predicted_makespan: float
    measured_makespan: float
    makespan_error: float
    start_error_mean: float
    start_error_max: float
    duration_error_mean: float
    duration_error_max: float
    order_agreement: float
    matched: int
    only_predicted: tuple[str, ...]
    only_measured: tuple[str, ...]
    devices: tuple[DeviceComparison, ...]
    ops: tuple[OpComparison, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data; an error relative to a measured 0 (infinite) is ``None`` (JSON has no infinity)."""
        d = asdict(self)
        for dev, row in zip(d["devices"], self.devices, strict=True):
            dev["peak_bytes_error"] = _finite(row.peak_bytes_error)
        for op, kind in zip(d["ops"], self.ops, strict=True):
            op["error"] = _finite(kind.error)
        return d

    def table(self) -> str:
        """A plain-text table: overall figures, then one row per device."""
        lines = [
            f"{'':22}{'predicted':>14}{'measured':>14}{'error':>10}",
            f"{'makespan (ms)':22}{self.predicted_makespan * 1e3:>14.3f}{self.measured_makespan * 1e3:>14.3f}"
            f"{self.makespan_error:>+10.1%}",
            f"{'task start error (ms)':22}{'mean':>14}{self.start_error_mean * 1e3:>14.3f}",
            f"{'':22}{'max':>14}{self.start_error_max * 1e3:>14.3f}",
            f"{'task duration err (ms)':22}{'mean':>14}{self.duration_error_mean * 1e3:>14.3f}",
            f"{'':22}{'max':>14}{self.duration_error_max * 1e3:>14.3f}",
            f"{'task order agreement':22}{self.order_agreement:>14.1%}",
        ]
        for o in self.ops:
            lines.append(f"{o.op + ' tasks total (ms)':22}{o.predicted_seconds * 1e3:>14.3f}"
                         f"{o.measured_seconds * 1e3:>14.3f}{o.error:>+10.1%}")
        lines += [
            "",
            f"{'device':>6}{'busy pred':>11}{'busy meas':>11}{'bubble pred':>13}{'bubble meas':>13}"
            f"{'order':>8}{'peak pred':>12}{'peak meas':>12}",
        ]
        for r in self.devices:
            lines.append(
                f"{r.device:>6}{r.predicted_busy * 1e3:>9.2f}ms{r.measured_busy * 1e3:>9.2f}ms"
                f"{r.predicted_bubble:>13.1%}{r.measured_bubble:>13.1%}{r.order_agreement:>8.0%}"
                f"{_mib(r.predicted_peak_bytes):>12}{_mib(r.measured_peak_bytes):>12}"
            )
        return "\n".join(lines)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}MiB"


def order_agreement(a: Sequence[Task], b: Sequence[Task]) -> float:
    """The fraction of pairs of common tasks that ``a`` and ``b`` run in the same relative order.

    1.0 for identical orders, 0.0 for reversed ones (a normalised Kendall distance); tasks present
    in only one sequence are ignored. With fewer than two common tasks the orders agree trivially.
    """
    pos = {t: k for k, t in enumerate(b)}
    ranks = [pos[t] for t in a if t in pos]
    pairs = len(ranks) * (len(ranks) - 1) // 2
    if pairs == 0:
        return 1.0
    return 1.0 - _inversions(ranks) / pairs


def _inversions(xs: list[int]) -> int:
    if len(xs) < 2:
        return 0
    mid = len(xs) // 2
    left, right = xs[:mid], xs[mid:]
    count = _inversions(left) + _inversions(right)
    left.sort()
    right.sort()
    k = 0
    for x in right:  # count left elements greater than x
        while k < len(left) and left[k] <= x:
            k += 1
        count += len(left) - k
    return count


def compare(predicted: Timeline, measured: Timeline) -> Comparison:
    """Align ``predicted`` and ``measured`` compute spans by task and report the differences.

    Args:
        predicted: usually the simulator's timeline.
        measured: usually the executor's timeline of the same schedule.

    Returns:
        A :class:`Comparison`; see its attributes.

    Raises:
        ValueError: if the two timelines have no task in common.
    """
    p0, m0 = predicted.start, measured.start
    pspans = {s.task: s for s in predicted.compute_spans()}
    mspans = {s.task: s for s in measured.compute_spans()}
    common = [t for t in pspans if t in mspans]
    if not common:
        raise ValueError("the timelines have no task in common: are they of the same schedule?")
    start_err = [abs((pspans[t].start - p0) - (mspans[t].start - m0)) for t in common]
    dur_err = [abs(pspans[t].duration - mspans[t].duration) for t in common]
    devices = []
    for d in range(max(predicted.num_devices, measured.num_devices)):
        po, mo = predicted.task_order(d), measured.task_order(d)
        devices.append(DeviceComparison(
            device=d,
            predicted_busy=predicted.busy(d),
            measured_busy=measured.busy(d),
            predicted_bubble=predicted.bubble_fraction(d),
            measured_bubble=measured.bubble_fraction(d),
            order_agreement=order_agreement(po, mo),
            order_identical=po == mo,
            predicted_peak_bytes=predicted.peak_memory(d),
            measured_peak_bytes=measured.peak_memory(d),
        ))
    mk_m = measured.makespan
    return Comparison(
        predicted_makespan=predicted.makespan,
        measured_makespan=mk_m,
        makespan_error=(predicted.makespan - mk_m) / mk_m if mk_m > 0 else 0.0,
        start_error_mean=sum(start_err) / len(start_err),
        start_error_max=max(start_err),
        duration_error_mean=sum(dur_err) / len(dur_err),
        duration_error_max=max(dur_err),
        order_agreement=sum(r.order_agreement for r in devices) / len(devices),
        matched=len(common),
        only_predicted=tuple(sorted(str(t) for t in pspans.keys() - mspans.keys())),
        only_measured=tuple(sorted(str(t) for t in mspans.keys() - pspans.keys())),
        devices=tuple(devices),
        ops=tuple(_ops(common, pspans, mspans)),
    )


def _ops(common: list[Task], pspans: dict[Task, Span], mspans: dict[Task, Span]) -> list[OpComparison]:
    totals: dict[str, list[float]] = {}
    for t in common:
        row = totals.setdefault(t.op.value, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += pspans[t].duration
        row[2] += mspans[t].duration
    order = "FRBW"
    return [OpComparison(op, int(r[0]), r[1], r[2]) for op, r in sorted(totals.items(), key=lambda kv: order.index(
        kv[0]) if kv[0] in order else len(order))]
