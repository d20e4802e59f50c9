"""Schedules for several stages per device, placed looped (stage ``s`` on device ``s mod p``): interleaved 1F1B
(Narayanan et al., 2021, Megatron-LM's order) and looped breadth-first (Lamy-Poirier, 2023).

``n = v·p`` stages on ``p`` devices: each device holds ``v`` model chunks, its local stages ``d, d + p, ...``.
Both run ``(m·v + p - 1)(t_f + t_b)`` (uniform costs, free copies, no checkpointing) when ``p`` divides ``m``
(interleaved 1F1B: when its round, ``p`` by default, divides ``m``); interleaved 1F1B keeps fewer micro-batches'
activations, looped BFS runs its forwards first::

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
          constraints="n stages on p devices, stage s on device s mod p, n a multiple of p; any m; option round=N: "
                      "N micro-batches per chunk in turn (default p, Megatron's; m: breadth-first); step() only",
          layout=looped, options={"round": "round_size"})
def interleaved_one_f_one_b(
    m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None, *,
    round_size: int | None = None,
) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., 2021, Megatron-LM's order): 1F1B over ``v = n / p`` chunks per device,
    micro-batches taken in rounds of ``N`` per chunk (Llama 3, 2024, section 3.3.2).

    Device ``d`` counts its forwards in rounds: ``N`` micro-batches on its first chunk, the same ``N`` on its
    next, ..., then the next ``N``; forward number ``k`` is micro-batch ``(k // (N·v))·N + k mod N`` of its chunk
    ``(k mod N·v) // N`` (stage ``chunk·p + d``); backward number ``k`` likewise, chunks taken from the last. It
    runs Note [warm-up] forwards, then one forward and one backward in turn, then the remaining backwards; a last
    round of fewer than ``N`` micro-batches runs as a full one without the missing ones (Note [partial round])::

        n=4 on p=2, m=4, never:
          dev0  F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0
          dev1  F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1

    ``N = p`` is Megatron's depth-first order, ``N = m`` breadth-first (every micro-batch on a chunk before the
    next chunk; with ``v = 1`` the round changes nothing: 1F1B). The trade: device ``d`` holds at most
    ``min(m·v, (v - 1)N + 2·min(p - 1 - d, N) + 1)`` micro-batch-stages between ``F`` and ``B`` (exactly that
    when ``N`` divides ``m``), so each micro-batch a round holds beyond ``p`` costs ``v - 1`` more; in exchange
    a micro-batch's output waits longer before the next chunk needs it, time to hide its copy. With free copies
    and uniform costs every ``N >= p`` that divides ``m`` runs ``(m·v + p - 1)(t_f + t_b)``; ``N < p`` leaves
    devices waiting for micro-batch 0 to come round, and a round that does not divide ``m`` may add a few steps.

    Args:
        m: micro-batches (>= 1).
        n: stages; a multiple of ``p``.
        checkpoint: ``always``, ``except_last`` or ``never``; ``R`` right before each checkpointed ``B``.
        placement: ``None`` (one device per stage: 1F1B) or the looped one, ``looped(n, p)``.
        round_size: ``N``, micro-batches per chunk in a round, clamped to ``m``; ``None``: ``p`` (by name:
            ``"interleaved-1f1b:round=8"``).

    Raises:
        ValueError: a placement that is not looped, ``n`` not a multiple of ``p``, or ``m`` or ``round_size``
            not a positive integer (the message names the fix).
    """
    placement_t, p = _looped_devices("interleaved-1f1b", n, placement)
    if n % p:
        raise ValueError(f"interleaved-1f1b runs v stages on each device: use a number of stages that is a multiple "
                         f"of the {p} devices: {_multiples(n, p)}")
    for what, value in (("m", m), ("round_size", p if round_size is None else round_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"interleaved-1f1b takes {what} as a whole number >= 1, got {value!r}"
                             + (f" (None: one micro-batch per device, {p})" if what == "round_size" else ""))
    v = n // p
    size = min(p if round_size is None else round_size, m)
    total = -(-m // size) * size * v  # Note [partial round]: the last round counted full
    rounds = [_round(k, size, v) for k in range(total)]  # (micro-batch, chunk) of every device's k-th
    per_device: list[list[Task]] = []
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for d in range(p):
            # Note [warm-up]: 1F1B's p - 1 - d with one chunk; Megatron's count with several, at most 2N apart
            warmup = min(total, p - 1 - d if v == 1 else (v - 1) * size + 2 * min(p - 1 - d, size))
            order = [_forward(rounds[k], d, p) for k in range(warmup)]
            for k in range(total - warmup):
                order.append(_forward(rounds[warmup + k], d, p))
                order.extend(_backward_at(checkpoint, m, rounds[k], d, p, v))
            for k in range(total - warmup, total):
                order.extend(_backward_at(checkpoint, m, rounds[k], d, p, v))
            per_device.append([t for t in order if t.microbatch < m])  # Note [partial round]
        return Schedule(m, n, checkpoint, placement_t, tuple(map(tuple, per_device)), name="interleaved-1f1b")


# Note [warm-up]: with v >= 2 chunks device d runs Megatron's warm-up, every forward it can run before its first
# backward can (equal forward and backward times): that backward is micro-batch 0's on the last chunk, whose
# forward is number (v - 1)N in the device's order; its output crosses the p - 1 - d devices below and its
# gradient comes back, 2(p - 1 - d) steps in which the device runs as many forwards. So (v - 1)N + 2(p - 1 - d),
# Megatron's count; the steady state's first forward runs before that backward too.
# With N < p - 1 the count stops at (v - 1)N + 2N: device 0's forward of a micro-batch on chunk c waits for
# device p - 1's on chunk c - 1, N forwards earlier in the order, which device p - 1 runs after its backwards up
# to there, which wait for device 0's backwards N earlier still; so two devices' warm-ups may differ by 2N at
# most, or device 0 waits for a backward behind its own forward (a deadlock). With one chunk per device Megatron
# runs 1F1B, whose p - 1 - d keeps p - d; so does this.
#
# Note [partial round]: a last round of L < N micro-batches runs as a full round of N whose N - L missing
# micro-batches are left out: every count above (the rounds, the warm-up, the pairs of the steady state) is
# taken in the full round's positions, then the missing micro-batches' tasks are dropped. Nothing waits for the
# tasks of a micro-batch but its own, so dropping all of them from a valid schedule leaves a valid one: every m
# is as safe as the next multiple of N. Megatron's last group runs the same forwards in the same order; counting
# its warm-up in real forwards instead can deadlock (p = 4, v = 3, m = 9, N = 4).


def _round(k: int, size: int, v: int) -> tuple[int, int]:
    """The micro-batch and the chunk (counted from the first) of a device's ``k``-th forward or backward, in
    rounds of ``size`` micro-batches per chunk."""
    group, r = divmod(k, size * v)
    return group * size + r % size, r // size


def _forward(at: tuple[int, int], d: int, p: int) -> Task:
    i, chunk = at
    return unchecked_task(Op.F, i, chunk * p + d)


def _backward_at(checkpoint: Checkpoint, m: int, at: tuple[int, int], d: int, p: int, v: int) -> list[Task]:
    """Device ``d``'s backward of micro-batch and chunk ``at``: chunks from the last."""
    i, chunk = at
    return _backward(checkpoint, m, i, (v - 1 - chunk) * p + d)


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
