"""Zero-bubble schedules (Qi et al., 2024, "Zero Bubble Pipeline Parallelism"): the backward split into ``B``
(input gradient) and ``W`` (weight gradient), the ``W`` tasks moved into what would be bubbles.

``zb-h1`` is 1F1B with each stage's weight gradients held back to fill its tail; ``zb-h2`` runs more forwards
first and holds more weight gradients back, so each stage works without a gap from its first task to its last
(twice ZB-H1's activations); ``zb-v`` runs ``n = 2p`` stages on ``p`` devices in a V (stages ``d`` and ``2p - 1 -
d`` on device ``d``), so each device both starts and ends the pipeline's work. With ``t_F = t_B = t_W`` their
makespans are ``m (t_F + t_B + t_W) + (p - 1)(t_F + t_B - t_W)``, ``m (t_F + t_B + t_W) + (p - 1) t_F`` and
``2m (t_F + t_B + t_W) + (p - 1) t_F`` (``m >= p``, ``m >= p`` and ``m >= 2p - 1``), against 1F1B's ``(m + p -
1)(t_F + t_B + t_W)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.collector import collector_paused
from gpipe.schedule.placement import merge_stages, stage_placement, v_shape
from gpipe.schedule.registry import register
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed, unchecked_task

__all__ = ["zb_h1", "zb_h2", "zb_v"]


@register("zb-h1", "ZB-H1: 1F1B with the weight gradients (W) held back to fill the bubbles, 1F1B's memory",
          constraints="any m >= 1 and n >= 1, any placement; splits the backward (B then W); interleaves forwards "
                      "and backwards, so the executor trains it with step() only; closed-form makespan for m >= n")
def zb_h1(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    """ZB-H1 (Qi et al., 2024, the handcrafted H1): 1F1B's forwards and input gradients, stage ``j`` running
    the weight gradient ``W(k - j)`` after ``B(k)`` and its last ``j`` at the end::

        n=3, m=4:   dev0  F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3
                    dev1  F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
                    dev2  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3

    Stage ``j`` holds the activations of at most ``min(m, n - j)`` micro-batches between ``F`` and ``B``, as
    1F1B, and of at most ``min(m, n)`` between ``F`` and ``W`` (1F1B's first stage), so its peak memory is
    1F1B's. Note [H1 delay]: the last stage starts the pipeline's backward, so it may not hold up a ``B`` for
    a ``W``; each stage up the pipeline waits one gradient longer for its first ``B`` (the bubble of 1F1B),
    and the ``j`` weight gradients it holds back refill that wait at the end: with ``t_F = t_B = t_W`` every
    stage idles exactly ``(n - 1)`` units, ``j`` before its first task and ``n - 1 - j`` before its first ``B``.
    """
    placement_t = stage_placement(n, placement)
    per_stage: list[list[Task]] = []
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for j in range(n):
            warmup = min(n - j, m)
            order = [unchecked_task(Op.F, i, j) for i in range(warmup)]
            for k in range(m):
                order.extend(_input_gradient(checkpoint, k, j, m))
                if k >= j:  # Note [H1 delay]
                    order.append(unchecked_task(Op.W, k - j, j))
                if k + warmup < m:
                    order.append(unchecked_task(Op.F, k + warmup, j))
            order.extend(unchecked_task(Op.W, k, j) for k in range(max(m - j, 0), m))
            per_stage.append(order)
        per_device = merge_stages(m, n, checkpoint, placement_t, per_stage)
        return Schedule(m, n, checkpoint, placement_t, per_device, name="zb-h1")


@register("zb-h2", "ZB-H2: more forwards first and more W held back than ZB-H1, no gap on any device, 2x its memory",
          constraints="any m >= 1 and n >= 1, any placement; splits the backward (B then W); step() only; "
                      "closed-form makespan; holds up to 2n-1 micro-batches per stage")
def zb_h2(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    """ZB-H2 (Qi et al., 2024, the handcrafted H2): stage ``j`` runs ``w_j = min(m, 2n - 1 - 2j)`` forwards, then
    ``max(0, m - 2n + 1)`` triples ``B, W, F``, then each remaining ``B`` followed by the stage's next forward
    while one remains (``2j`` of them), else by the oldest ``W`` held back, and the ``W`` left last::

        n=3, m=6:   dev0  F0 F1 F2 F3 F4 B0 W0 F5 B1 W1 B2 W2 B3 W3 B4 W4 B5 W5
                    dev1  F0 F1 F2 B0 W0 F3 B1 F4 B2 F5 B3 W1 B4 W2 B5 W3 W4 W5
                    dev2  F0 B0 W0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 W1 W2 W3 W4 W5

    Note [H2 parallelogram], with ``t_F = t_B = t_W = 1`` and ``m >= 2n - 1``: micro-batch 0 reaches stage ``j``
    at ``t = j`` and its gradient at ``t = 2n - 1 - j``, the end of the ``w_j`` forwards; from then on stage ``j``
    starts ``B(i)`` at ``b_i - j``, with ``b_i = 2n - 1 + 3i`` for the triples (``i <= m - 2n + 1``) and two
    apart after them (``b_i = 3m - 2 - 2(m - 1 - i)``). Each ``B(i, j)`` starts as ``B(i, j + 1)`` ends (the
    last stage's after its own ``F(i)``) and each forward's input has arrived by its turn, so no task waits:
    stage ``j`` runs its ``3m`` tasks from ``t = j`` to ``3m + j`` without a gap, a parallelogram (stage 0 is
    free ``n - 1`` steps before the end, where the next step's first forwards could run). The makespan, ``3m +
    n - 1``, is the least any schedule has: the last stage starts after ``n - 1`` forwards and has ``3m`` units
    of work. ZB-H1 reaches it too with these costs; with ``t_B`` above ``t_W`` it cannot, and ZB-H2 still does
    (``m (t_F + t_B + t_W) + (n - 1) t_F`` while ``t_B <= 2 min(t_F, t_W)``, as the simulator tests check).
    Fewer micro-batches take ``3m + n - 1`` from ``m = n`` on and ``2m + 2n - 1`` below, as ZB-H1.

    Memory: stage ``j`` holds at most ``w_j`` micro-batches between ``F`` and ``B``, and at its peak, after the
    forwards that follow the last triple, ``min(max(m - w_j, 0), 2j)`` more between ``B`` and ``W``: ``min(m, 2n -
    1)`` between ``F`` and ``W`` on every stage (ZB-H1's first stage holds ``min(m, n)``). With ``S`` bytes kept
    until ``B`` and ``K <= S`` of them until ``W``, stage ``j`` peaks at ``min(m, w_j) S + min(max(m - w_j, 0),
    2j) K``.
    """
    placement_t = stage_placement(n, placement)
    per_stage: list[list[Task]] = []
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for j in range(n):
            per_stage.append(_h2_stage(m, n, j, checkpoint))
        per_device = merge_stages(m, n, checkpoint, placement_t, per_stage)
        return Schedule(m, n, checkpoint, placement_t, per_device, name="zb-h2")


def _h2_stage(m: int, n: int, j: int, checkpoint: Checkpoint) -> list[Task]:
    """Stage ``j``'s list of ZB-H2: warm-up forwards, ``B W F`` triples, then ``B`` each followed by a forward or a
    held-back ``W``, then the ``W`` left (Note [H2 parallelogram])."""
    warmup = min(m, 2 * n - 1 - 2 * j)
    triples = max(0, m - 2 * n + 1)
    order = [unchecked_task(Op.F, i, j) for i in range(warmup)]
    forward, weight = warmup, triples  # the next forward, and the oldest W held back
    for i in range(triples):
        order.extend(_input_gradient(checkpoint, i, j, m))
        order.append(unchecked_task(Op.W, i, j))
        order.append(unchecked_task(Op.F, forward, j))
        forward += 1
    for i in range(triples, m):
        order.extend(_input_gradient(checkpoint, i, j, m))
        if forward < m:
            order.append(unchecked_task(Op.F, forward, j))
            forward += 1
        elif i < m - 1:  # a W between two B, never after the last (it ends the list below)
            order.append(unchecked_task(Op.W, weight, j))
            weight += 1
    order.extend(unchecked_task(Op.W, i, j) for i in range(weight, m))
    return order


@register("zb-v", "ZB-V: two stages per device in a V, forwards, B and W interleaved to leave almost no bubble",
          constraints="n = 2p stages on p devices (stages d and 2p-1-d on device d); any m >= 1; splits the "
                      "backward (B then W); step() only; closed-form makespan for m >= 2p - 1",
          layout=v_shape)
def zb_v(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    """ZB-V (Qi et al., 2024, section 6): device ``d`` runs stage ``a = d`` (down the V) and ``b = 2p - 1 - d``
    (back up), in five phases; ``t`` below is a unit step when ``t_F = t_B = t_W``::

        n=4 (p=2), m=3:   dev0  Fa0 Fa1 Fa2 Fb0 Bb0 Wb0 Fb1 Bb1 Wb1 Ba0 Wa0 Fb2 Bb2 Wb2 Ba1 Wa1 Ba2 Wa2
                          dev1  Fa0 Fb0 Fa1 Fb1 Bb0 Wb0 Fa2 Ba0 Wa0 Fb2 Bb1 Wb1 Ba1 Bb2 Ba2 Wa1 Wb2 Wa2

    Note [V phases], counted for the first micro-batch: device ``d`` starts at ``t = d``; ``F(0, b)`` reaches it at
    ``t = b`` and ``B(0, b)`` at ``t = 2p + d``. (1) Before ``F(0, b)`` it runs ``2(p - d) - 1`` forwards of
    ``a``; (2) until ``B(0, b)``, ``d`` pairs ``F b, F a``; (3) ``p - d`` triples ``F b, B b, W b``, the time
    micro-batch 0's gradient takes to reach ``a``; (4) the steady triples ``F, B, W`` of ``a``, then of ``b``, until
    every forward ran; (5) the remaining ``B``, gradients first: ``d`` pairs ``B a, B b``, then ``B a, W a``, then
    every ``W`` left. Fewer than ``2p - 1`` micro-batches run the same lists without the tasks of the missing
    ones. A device holds at most ``2p`` (stage, micro-batch) activations between ``F`` and ``W``: with each stage
    half of a 1F1B stage, 1F1B's peak.

    Raises:
        ValueError: ``n`` odd, or a placement other than the V (:func:`v_shape`).
    """
    if not isinstance(n, int) or n < 2 or n % 2:
        raise ValueError(f"zb-v runs n = 2p stages, two per device in a V; got n={n!r}: give an even number of stages")
    p = n // 2
    placement_t = v_shape(n, p)
    if placement is not None and tuple(placement) != placement_t:
        raise ValueError(f"zb-v runs its own V placement {placement_t}; got {tuple(placement)}: leave placement "
                         f"out or give devices={p}")
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        lists = tuple(tuple(_v_device(m, p, d, checkpoint)) for d in range(p))
        return Schedule(m, n, checkpoint, placement_t, lists, name="zb-v")


def _v_device(m: int, p: int, d: int, checkpoint: Checkpoint) -> list[Task]:
    """Device ``d``'s list of ZB-V (Note [V phases]), for ``max(m, 2p - 1)`` micro-batches less those past ``m``.

    A step past micro-batch ``m - 1`` only counts (:func:`run`'s ``times``): a few micro-batches on many stages
    cost their tasks, not ``p`` steps per device (``p**2`` in all, minutes for 20,000 stages)."""
    total = max(m, 2 * p - 1)
    a, b = d, 2 * p - 1 - d
    done = {(op, s): 0 for op in (Op.F, Op.B, Op.W) for s in (a, b)}  # tasks issued per (op, stage)
    out: list[Task] = []

    def run(*steps: tuple[Op, int], times: int = 1) -> None:
        for k in range(times):
            if all(done[step] >= m for step in steps):  # the rest issue nothing: count them at once
                for step in steps:
                    done[step] += times - k
                return
            for op, s in steps:
                i = done[op, s]
                done[op, s] = i + 1
                if i < m:
                    out.extend(_input_gradient(checkpoint, i, s, m) if op is Op.B else [unchecked_task(op, i, s)])

    run((Op.F, a), times=2 * (p - d) - 1)  # (1)
    run((Op.F, b), (Op.F, a), times=d)  # (2)
    run((Op.F, b), (Op.B, b), (Op.W, b), times=p - d)  # (3)
    while done[Op.F, a] < total or done[Op.F, b] < done[Op.F, a]:  # (4)
        if min(done.values()) >= m:  # every task issued: the steps left issue none
            return out
        if done[Op.F, a] < total:
            run((Op.F, a))
        run((Op.B, a), (Op.W, a), (Op.F, b), (Op.B, b), (Op.W, b))
    run((Op.B, a), (Op.B, b), times=d)  # (5)
    run((Op.B, a), (Op.W, a), times=max(0, total - done[Op.B, a]))
    for s in (b, a):
        run((Op.W, s), times=max(0, total - done[Op.W, s]))
    return out


def _input_gradient(checkpoint: Checkpoint, i: int, j: int, m: int) -> list[Task]:
    """``B(i, j)``, after its ``R(i, j)`` when micro-batch ``i`` is checkpointed."""
    r = [unchecked_task(Op.R, i, j)] if checkpointed(checkpoint, i, m) else []
    return r + [unchecked_task(Op.B, i, j)]
