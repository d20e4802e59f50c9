"""Memory accounting: the bytes each device keeps for backward, sampled at every change."""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.saved import held_bytes
from gpipe.schedule.timeline import MemorySample
from sim.core.cost import StageCost

__all__ = ["Memory"]


class Memory:
    """Bytes saved for backward per device (model state is apart, in the timeline's ``meta``).

    Note [memory]: the simulator applies the saved-bytes rule (Note [saved bytes] in :mod:`gpipe.schedule.saved`,
    with each stage's ``saved_bytes``, ``checkpoint_bytes`` and ``weight_bytes``) as each task starts and ends, at
    the simulated times. One sample at t=0 per device and one at every change.
    """

    def __init__(self, stages: Sequence[StageCost], devices: int, checkpointed: Sequence[int],
                 scales: Sequence[float] | None, splits: bool) -> None:
        held = held_bytes(checkpointed, splits, [s.saved_bytes for s in stages],
                          [s.checkpoint_bytes for s in stages], [s.weight_bytes for s in stages], scales or ())
        self.n = len(stages)
        self.tracked = held.tracked
        # [op code][i * n + j]: the change as task (op, i, j) starts or ends (sim.core.tables' op codes are Held's)
        self.at_start: list[list[int]] = held.at_start.reshape(4, -1).tolist() if self.tracked else []
        self.at_end: list[list[int]] = held.at_end.reshape(4, -1).tolist() if self.tracked else []
        self.samples: list[list[MemorySample]] = [[MemorySample(d, 0.0, 0)] for d in range(devices)]
        self.current = [0] * devices  # bytes saved for backward per device, now

    def start(self, d: int, op: int, i: int, j: int, now: float) -> None:
        """What task ``(op, i, j)`` on device ``d`` holds as it starts at ``now``."""
        change = self.at_start[op][i * self.n + j]
        if change:
            self.current[d] += change
            self.samples[d].append(MemorySample(d, now, self.current[d]))

    def after(self, d: int, op: int, i: int, j: int, now: float) -> None:
        """What task ``(op, i, j)`` on device ``d`` holds or frees as it ends at ``now``."""
        change = self.at_end[op][i * self.n + j]
        if change:
            self.current[d] += change
            self.samples[d].append(MemorySample(d, now, self.current[d]))
