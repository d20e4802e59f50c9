"""Stage placement for generators: which device runs each stage, and per-stage orders merged into per-device
task lists when several stages share a device."""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed, dependencies

__all__ = ["merge_stages", "stage_placement", "v_shape"]


def stage_placement(n: int, placement: Sequence[int] | None) -> tuple[int, ...]:
    """``placement`` checked, as a tuple: the device of each of ``n`` stages; ``None``: one device per stage.

    Raises:
        ValueError: not one entry per stage, a negative device, or devices with gaps (``0..max`` all used).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"need at least one stage, got {n!r}")
    if placement is None:
        return tuple(range(n))
    p = tuple(int(d) for d in placement)
    if len(p) != n:
        raise ValueError(f"placement has {len(p)} entries for {n} stages")
    if min(p) < 0:
        raise ValueError(f"placement has a negative device: {p}")
    if sorted(set(p)) != list(range(max(p) + 1)):
        raise ValueError(f"placement must use devices 0..{max(p)} without gaps, got {p}")
    return p


def v_shape(n: int, p: int) -> tuple[int, ...]:
    """The V layout of ZB-V and DualPipeV: ``n = 2p`` stages, stages ``d`` and ``2p - 1 - d`` on device ``d``
    (down the devices, then back up)::

        n=6, p=3:   stage   0 1 2 3 4 5
                    device  0 1 2 2 1 0

    Raises:
        ValueError: ``n != 2p`` (the message names the device count, or the stage counts, that fit).
    """
    if p < 1 or n != 2 * p:
        fix = f"give {n // 2} devices" if n % 2 == 0 and n else f"give an even number of stages ({n - 1} or {n + 1})"
        raise ValueError(f"a V places two stages on each device, so n = 2p: {n} stages cannot go on {p} devices; "
                         f"{fix}")
    return tuple(s if s < p else n - 1 - s for s in range(n))


def merge_stages(
    m: int, n: int, checkpoint: Checkpoint, placement: tuple[int, ...], per_stage: list[list[Task]]
) -> tuple[tuple[Task, ...], ...]:
    """Merge per-stage orders into per-device orders: at each unit step a device runs the ready head
    task of its lowest-numbered stage that has one. One stage per device keeps each order as it is."""
    devices = max(placement) + 1
    if len(set(placement)) == n:
        out: list[tuple[Task, ...]] = [() for _ in range(devices)]
        for j, ts in enumerate(per_stage):
            out[placement[j]] = tuple(ts)
        return tuple(out)
    done: set[Task] = set()
    heads = [0] * n
    merged: list[list[Task]] = [[] for _ in range(devices)]
    stages_of: list[list[int]] = [[] for _ in range(devices)]  # each device's stages, found once, not each step
    for s, d in enumerate(placement):
        stages_of[d].append(s)
    remaining = sum(len(ts) for ts in per_stage)
    while remaining:
        ran: list[Task] = []
        for d in range(devices):
            for j in stages_of[d]:
                if heads[j] < len(per_stage[j]):
                    t = per_stage[j][heads[j]]
                    # an R waits until its B could follow at once, so the two stay adjacent
                    gate = per_stage[j][heads[j] + 1] if t.op is Op.R else t
                    needs = dependencies(gate, n, checkpointed(checkpoint, gate.microbatch, m))
                    if all(dep in done or dep == t for dep in needs):
                        ran.append(t)
                        heads[j] += 1
                        merged[d].append(t)
                        break
        if not ran:  # cannot happen for a valid per-stage order; keep what is left in stage order
            for j in range(n):
                merged[placement[j]].extend(per_stage[j][heads[j]:])
            break
        done.update(ran)
        remaining -= len(ran)
    return tuple(map(tuple, merged))
