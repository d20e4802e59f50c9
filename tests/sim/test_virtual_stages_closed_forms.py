"""Closed forms of interleaved 1F1B and looped BFS, simulated exactly: uniform per-stage costs, free copies, no
checkpointing; ``p`` devices, ``v`` stages each (``n = v·p``), ``t_f`` and ``t_b`` the seconds of one stage."""

from __future__ import annotations

import itertools

import pytest

from gpipe.schedule import SCHEDULES, Op, Schedule
from sim.core.cost import CostModel
from sim.core.engine import simulate

SHAPES = list(itertools.product((1, 2, 3, 4), (1, 2, 3)))  # (p, v)
COSTS = [(1.0, 1.0), (1.0, 2.0), (2.0, 1.0), (0.5, 2.5)]  # (t_f, t_b): binary fractions, so the sums are exact


def held(schedule: Schedule, device: int) -> int:
    """The most micro-batch-stages device ``device`` holds between their F and their B, in its order."""
    count = peak = 0
    for t in schedule.tasks[device]:
        count += (t.op is Op.F) - (t.op is Op.B)
        peak = max(peak, count)
    return peak


@pytest.mark.parametrize(("p", "v"), SHAPES)
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_interleaved_1f1b(p: int, v: int, rounds: int) -> None:
    """m = rounds·p: makespan ``(m·v + p − 1)(t_f + t_b)`` (Narayanan et al., 2021: the bubble of 1F1B, ``p − 1``
    steps of a whole device's ``t_f + t_b``, shrinks by ``v``; here ``t_f``, ``t_b`` are one stage's, a ``v``-th).

    Device ``d`` holds at most ``min(m·v, (v − 1)p + 2(p − 1 − d) + 1)`` micro-batch-stages (Megatron's warm-up
    plus the steady state's first forward, Note [warm-up] in :mod:`gpipe.schedule.virtual_stages`); with
    ``v = 1``, 1F1B's ``min(m, p − d)``.
    """
    m, n = rounds * p, v * p
    schedule = SCHEDULES["interleaved-1f1b"](m, n, "never", devices=p)
    peaks = [min(m * v, p - d if v == 1 else (v - 1) * p + 2 * (p - 1 - d) + 1) for d in range(p)]
    for t_f, t_b in COSTS:
        timeline = simulate(schedule, CostModel.uniform(n, t_f, t_b, saved_bytes=1))
        assert timeline.makespan == (m * v + p - 1) * (t_f + t_b)
        assert [row["peak_memory_bytes"] for row in timeline.summary()["devices"]] == peaks
    assert [held(schedule, d) for d in range(p)] == peaks


@pytest.mark.parametrize(("p", "v"), SHAPES)
@pytest.mark.parametrize("m", range(1, 10))
def test_looped_bfs(p: int, v: int, m: int) -> None:
    """Makespan ``((v − 1)·max(m, p) + m + p − 1)(t_f + t_b)``, any m: ``(m·v + p − 1)(t_f + t_b)`` from m = p on.

    Derivation (checked here). Forwards: device ``d`` runs ``F(i, c·p + d)`` (chunk ``c``) at
    ``(c·max(m, p) + d + i)·t_f``. Its input ``F(i, c·p + d − 1)`` ends then (for ``d = 0`` it ended on device
    ``p − 1`` at ``((c − 1)·max(m, p) + p + i)·t_f``, no later), and the device's previous forward ends then too
    (the previous micro-batch; for ``i = 0`` the previous chunk's last, at ``((c − 1)·max(m, p) + d + m)·t_f``,
    no later). So the last forward, ``F(m − 1, n − 1)``, ends at ``((v − 1)·max(m, p) + m + p − 1)·t_f``. The
    backwards mirror the forwards (device ``p − 1 − d``, chunk ``v − 1 − c``, micro-batch ``m − 1 − i``) from
    that moment, when ``B(m − 1, n − 1)`` starts on the device that ran the last forward, and every other
    device is done with its forwards; so they take as many steps of ``t_b``. Every device holds all its ``m·v``
    micro-batch-stages at the end of the forwards (Lamy-Poirier, 2023: looped BFS trades memory for the bubble).
    """
    n = v * p
    schedule = SCHEDULES["looped-bfs"](m, n, "never", devices=p)
    for t_f, t_b in COSTS:
        timeline = simulate(schedule, CostModel.uniform(n, t_f, t_b, saved_bytes=1))
        assert timeline.makespan == ((v - 1) * max(m, p) + m + p - 1) * (t_f + t_b)
        assert [row["peak_memory_bytes"] for row in timeline.summary()["devices"]] == [m * v] * p
    assert [held(schedule, d) for d in range(p)] == [m * v] * p
