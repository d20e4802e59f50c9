"""Schedules for several stages per device, placed looped (stage ``s`` on device ``s mod p``): interleaved 1F1B
(Narayanan et al., 2021, Megatron-LM's order) and looped breadth-first (Lamy-Poirier, 2023).

``n = v·p`` stages on ``p`` devices: each device holds ``v`` model chunks, its local stages ``d, d + p, ...``.
Both run ``(m·v + p - 1)(t_f + t_b)`` (uniform costs, free copies, no checkpointing) when ``p`` divides ``m``;
interleaved 1F1B keeps fewer micro-batches' activations, looped BFS runs its forwards first::

    n=4 on p=2, m=2, never:
      interleaved-1f1b  dev0  F0@0 F1@0 F0@2 F1@2 B0@2 B1@2 B0@0 B1@0
                        dev1  F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 B0@1 B1@1
      looped-bfs        dev0  F0@0 F1@0 F0@2 F1@2 B1@2 B0@2 B1@0 B0@0
                        dev1  F0@1 F1@1 F0@3 F1@3 B1@3 B0@3 B1@1 B0@1
"""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.collector import collector_paused
from gpipe.schedule.placement import stage_placement
from gpipe.schedule.registry import looped, register
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed, unchecked_task

__all__ = ["interleaved_one_f_one_b", "looped_bfs"]


@register("interleaved-1f1b", "Megatron's interleaved 1F1B: v model chunks per device, 1F1B across them",
          constraints="n stages on p devices, stage s on device s mod p, n a multiple of p; m a multiple of p when "
                      "n > p (n = p is 1F1B, any m); step() only", layout=looped)
def interleaved_one_f_one_b(
    m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None
) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., 2021, Megatron-LM's order): 1F1B over ``v = n / p`` chunks per device.

    Device ``d`` counts its ``m·v`` forwards in rounds of ``p`` micro-batches per chunk: forward number ``k``
    is micro-batch ``(k // (p·v))·p + k mod p`` of its chunk ``(k mod p·v) // p`` (stage ``chunk·p + d``);
    backward number ``k`` likewise, chunks taken from the last. It runs Note [warm-up] forwards, then one
    forward and one backward in turn, then the remaining backwards::

        n=4 on p=2, m=4, never:
          dev0  F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0
          dev1  F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1

    Args:
        m: micro-batches; a multiple of ``p`` when ``v >= 2``.
        n: stages; a multiple of ``p``.
        checkpoint: ``always``, ``except_last`` or ``never``; ``R`` right before each checkpointed ``B``.
        placement: ``None`` (one device per stage: 1F1B) or the looped one, ``looped(n, p)``.

    Raises:
        ValueError: a placement that is not looped, or ``m`` or ``n`` not a multiple of ``p`` (the message
            names the fix).
    """
    placement_t, p = _looped_devices("interleaved-1f1b", n, placement)
    if n % p:
        raise ValueError(f"interleaved-1f1b runs v stages on each device: use a number of stages that is a multiple "
                         f"of the {p} devices: {_multiples(n, p)}")
    v = n // p
    if v > 1 and m % p:
        raise ValueError(f"interleaved-1f1b runs micro-batches in rounds of one per device: use a number of "
                         f"micro-batches that is a multiple of the {p} devices: {_multiples(m, p)}")
    total = m * v
    per_device: list[list[Task]] = []
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for d in range(p):
            # Note [warm-up]: 1F1B's p - 1 - d with one chunk; Megatron's count with several
            warmup = min(total, p - 1 - d if v == 1 else (v - 1) * p + 2 * (p - 1 - d))
            order = [_forward(k, d, p, v) for k in range(warmup)]
            for k in range(total - warmup):
                order.append(_forward(warmup + k, d, p, v))
                order.extend(_backward(checkpoint, m, *_backward_at(k, d, p, v)))
            for k in range(total - warmup, total):
                order.extend(_backward(checkpoint, m, *_backward_at(k, d, p, v)))
            per_device.append(order)
        return Schedule(m, n, checkpoint, placement_t, tuple(map(tuple, per_device)), name="interleaved-1f1b")


# Note [warm-up]: with v >= 2 chunks device d runs Megatron's warm-up, every forward it can run before its first
# backward can (equal forward and backward times): micro-batch 0 crosses all n stages and comes back p - 1 - d,
# while d started d steps late, so n + p - 1 - 2d = (v - 1)p + 2(p - 1 - d) + 1 steps, the last being the steady
# state's first forward. Megatron's runtime pairs each send with a receive, which this count lines up; with
# copies that do not block, fewer would not lengthen the makespan, but this is the order people run and the
# memory it holds, (v - 1)p + 2(p - 1 - d) + 1 micro-batch-stages. With one chunk per device Megatron runs 1F1B,
# whose p - 1 - d keeps p - d; so does this.


def _round(k: int, p: int, v: int) -> tuple[int, int]:
    """The micro-batch and the chunk (counted from the first) of a device's ``k``-th forward or backward."""
    group, r = divmod(k, p * v)
    return group * p + r % p, r // p


def _forward(k: int, d: int, p: int, v: int) -> Task:
    i, chunk = _round(k, p, v)
    return unchecked_task(Op.F, i, chunk * p + d)


def _backward_at(k: int, d: int, p: int, v: int) -> tuple[int, int]:
    """Micro-batch and stage of device ``d``'s ``k``-th backward: chunks from the last."""
    i, chunk = _round(k, p, v)
    return i, (v - 1 - chunk) * p + d


@register("looped-bfs", "looped breadth-first: every forward of each local stage in turn, then the backwards back",
          constraints="n stages on any p <= n devices, stage s on device s mod p; any m; forwards first, so "
                      "forward() + backward() runs it", layout=looped)
def looped_bfs(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    """Looped breadth-first (Lamy-Poirier, 2023; ``torch.distributed.pipelining.ScheduleLoopedBFS``).

    Each device runs the forwards of all ``m`` micro-batches on its first local stage, then on its next, ...;
    then the backwards, local stages from the last, each in reverse micro-batch order (``R`` right before
    each checkpointed ``B``). One device per stage, it is GPipe's fill-drain::

        n=4 on p=2, m=2, never:   dev0  F0@0 F1@0 F0@2 F1@2 B1@2 B0@2 B1@0 B0@0
                                  dev1  F0@1 F1@1 F0@3 F1@3 B1@3 B0@3 B1@1 B0@1

    Args:
        m: micro-batches (>= 1).
        n: stages (>= 1).
        checkpoint: ``always``, ``except_last`` or ``never``.
        placement: ``None`` (one device per stage) or the looped one, ``looped(n, p)``.

    Raises:
        ValueError: a placement that is not looped (the message names the fix).
    """
    placement_t, p = _looped_devices("looped-bfs", n, placement)
    per_device: list[list[Task]] = [[] for _ in range(p)]
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for j in range(n):
            per_device[j % p].extend(unchecked_task(Op.F, i, j) for i in range(m))
        for j in reversed(range(n)):
            for i in reversed(range(m)):
                per_device[j % p].extend(_backward(checkpoint, m, i, j))
        return Schedule(m, n, checkpoint, placement_t, tuple(map(tuple, per_device)), name="looped-bfs")


def _looped_devices(name: str, n: int, placement: Sequence[int] | None) -> tuple[tuple[int, ...], int]:
    """``placement`` checked (``None``: one device per stage) and its number of devices ``p``.

    Raises:
        ValueError: the placement is not ``looped(n, p)`` (the message names it).
    """
    placement_t = stage_placement(n, placement)
    p = max(placement_t) + 1
    if placement_t != looped(n, p):
        raise ValueError(f"{name} places stage s on device s mod p: for {n} stages on {p} devices use the placement "
                         f"{looped(n, p)} (or give the number of devices: devices={p})")
    return placement_t, p


def _multiples(x: int, p: int) -> str:
    """The multiples of ``p`` around ``x``, for a message: ``"8 or 12"``, or ``"4"`` below ``p``."""
    below = x // p * p
    return f"{below} or {below + p}" if below else f"{p}"


def _backward(checkpoint: Checkpoint, m: int, i: int, j: int) -> list[Task]:
    """``B(i, j)``, after its ``R(i, j)`` when micro-batch ``i`` is checkpointed."""
    r = [unchecked_task(Op.R, i, j)] if checkpointed(checkpoint, i, m) else []
    return r + [unchecked_task(Op.B, i, j)]
