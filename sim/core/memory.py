"""Memory accounting: the bytes each device keeps for backward, sampled at every change."""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.timeline import MemorySample
from sim.core.cost import StageCost
from sim.core.tables import B, F

__all__ = ["Memory"]


class Memory:
    """Bytes saved for backward per device (model state is apart, in the timeline's ``meta``).

    Note [memory]: the end of F(i, j) adds ``saved_bytes`` (``checkpoint_bytes``, the stage input, for a
    checkpointed micro-batch); the start of R(i, j) adds ``saved_bytes``; the end of B(i, j) frees all
    that (i, j) held. When the schedule splits the weight gradient, the end of B(i, j) keeps the stage's
    ``weight_bytes`` of them (all, when ``None``) and the end of W(i, j), which reads them, frees those.
    Bytes scale with the micro-batch. One sample at t=0 per device and one at every change.
    """

    def __init__(self, stages: Sequence[StageCost], devices: int, checkpointed: Sequence[int],
                 scales: Sequence[float] | None, frees_at: int) -> None:
        self.stages, self.checkpointed, self.scales, self.frees_at = stages, checkpointed, scales, frees_at
        self.n = len(stages)
        self.tracked = any(s.saved_bytes or s.checkpoint_bytes for s in stages)
        # Note [memory]: what a split backward's B(i, j) keeps for its W, per stage (None: all it held)
        self.kept_for_weight = [s.weight_bytes if frees_at != B else None for s in stages]
        self.shrinks_at_b = any(k is not None for k in self.kept_for_weight)
        self.samples: list[list[MemorySample]] = [[MemorySample(d, 0.0, 0)] for d in range(devices)]
        self.held: dict[int, int] = {}  # i * n + j -> bytes micro-batch i keeps on stage j
        self.current = [0] * devices  # bytes saved for backward per device, now

    def hold(self, d: int, i: int, j: int, nbytes: int, now: float) -> None:
        if self.scales is not None:
            nbytes = round(nbytes * self.scales[i])
        if nbytes:
            key = i * self.n + j
            self.held[key] = self.held.get(key, 0) + nbytes
            self.current[d] += nbytes
            self.samples[d].append(MemorySample(d, now, self.current[d]))

    def after(self, d: int, op: int, i: int, j: int, now: float) -> None:
        """What task ``(op, i, j)`` on device ``d`` holds or frees as it ends at ``now``."""
        if op == F:
            stage = self.stages[j]
            self.hold(d, i, j, stage.checkpoint_bytes if self.checkpointed[i] else stage.saved_bytes, now)
        elif op == self.frees_at:
            freed = self.held.pop(i * self.n + j, 0)
            if freed:
                self.current[d] -= freed
                self.samples[d].append(MemorySample(d, now, self.current[d]))
        elif op == B:
            kept = self.kept_for_weight[j]
            if kept is not None:
                self.keep(d, i, j, kept, now)

    def keep(self, d: int, i: int, j: int, nbytes: int, now: float) -> None:
        """Note [memory]: at the end of a split ``B(i, j)``, ``(i, j)`` keeps ``nbytes`` (scaled) of what it held."""
        if self.scales is not None:
            nbytes = round(nbytes * self.scales[i])
        key = i * self.n + j
        held = self.held.get(key, 0)
        if held > nbytes:
            self.held[key] = nbytes
            self.current[d] -= held - nbytes
            self.samples[d].append(MemorySample(d, now, self.current[d]))
