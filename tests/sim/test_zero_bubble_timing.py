"""Zero-bubble schedules in the simulator: ZB-H1's, ZB-H2's and ZB-V's makespans in closed form, ZB-V against the
order torch.distributed.pipelining's ScheduleZBVZeroBubble runs, and the bytes a micro-batch keeps from B to W."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

from gpipe.schedule import Op, Schedule, Task, one_f_one_b, v_shape, zb_h1, zb_h2, zb_v
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate


def costs(n: int, forward: float, backward: float, weight: float, **bytes_: int) -> CostModel:
    return CostModel((StageCost(forward, backward, weight=weight, **bytes_),) * n, copy_seconds=0.0)


@pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
def test_zb_h1_makespan_in_closed_form(t: float) -> None:
    """``t_F = t_B = t_W = t``: ``m (t_F + t_B + t_W) + (p - 1)(t_F + t_B - t_W)``, for every ``m >= p``; 1F1B
    running each backward as one task of ``t_B + t_W`` takes ``(m + p - 1)(t_F + t_B + t_W)``."""
    for p in range(1, 7):
        for m in range(p, 2 * p + 3):
            assert simulate(zb_h1(m, p), costs(p, t, t, t)).makespan == m * 3 * t + (p - 1) * t
            assert simulate(one_f_one_b(m, p), costs(p, t, 2 * t, 0)).makespan == (m + p - 1) * 3 * t


@pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
def test_zb_h2_makespan_in_closed_form(t: float) -> None:
    """``t_F = t_B = t_W = t`` (Note [H2 parallelogram]): ``(3m + p - 1) t`` from ``m = p`` on, ``(2m + 2p - 1) t``
    below; from ``m = 2p - 1`` on, device ``d`` is busy without a gap from ``d t`` to ``(3m + d) t``."""
    for p in range(1, 7):
        for m in range(1, 3 * p + 3):
            timeline = simulate(zb_h2(m, p), costs(p, t, t, t))
            assert timeline.makespan == (3 * m + p - 1 + max(0, p - m)) * t, (p, m)
            if m >= 2 * p - 1:
                for d in range(p):
                    spans = [s for s in timeline.spans if s.device == d]
                    assert min(s.start for s in spans) == d * t and max(s.end for s in spans) == (3 * m + d) * t
                    assert sum(s.end - s.start for s in spans) == 3 * m * t


@pytest.mark.parametrize("forward", [0.5, 1.0, 2.0, 3.0])
def test_zb_h2_reaches_the_least_makespan_while_b_is_at_most_twice_f_and_w(forward: float) -> None:
    """The last device starts after ``(p - 1) t_F`` and works ``m (t_F + t_B + t_W)``: ZB-H2 ends then, for ``m >=
    2p - 1``, exactly when ``t_B <= 2 min(t_F, t_W)`` (with ``p >= 2``); ZB-H1 only when ``t_B <= t_W`` too."""
    values = (0.5, 1.0, 2.0, 3.0)
    for backward, weight in ((b, w) for b in values for w in values):
        for p in range(2, 6):
            for m in range(2 * p - 1, 2 * p + 3):
                cost = costs(p, forward, backward, weight)
                least = m * (forward + backward + weight) + (p - 1) * forward
                h2, h1 = simulate(zb_h2(m, p), cost).makespan, simulate(zb_h1(m, p), cost).makespan
                assert (h2 == least) == (backward <= 2 * min(forward, weight)), (forward, backward, weight, p, m)
                assert h1 > least or backward <= weight


@pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
def test_zb_v_makespan_in_closed_form(t: float) -> None:
    """``t_F = t_B = t_W = t`` on ``p`` devices, ``2p`` stages: ``2m (t_F + t_B + t_W) + (p - 1) t_F``, for every
    ``m >= 2p - 1``: each device idles ``d`` units before its first task and ``p - 1 - d`` after its last."""
    for p in range(1, 6):
        for m in range(2 * p - 1, 2 * p + 4):
            timeline = simulate(zb_v(m, 2 * p), costs(2 * p, t, t, t))
            assert timeline.makespan == 2 * m * 3 * t + (p - 1) * t
            for d in range(p):
                spans = [s for s in timeline.spans if s.device == d]
                assert min(s.start for s in spans) == d * t
                assert max(s.end for s in spans) == timeline.makespan - (p - 1 - d) * t


_TORCH_OPS = {"FORWARD": Op.F, "BACKWARD_INPUT": Op.B, "BACKWARD_WEIGHT": Op.W}


def torch_zbv(m: int, p: int) -> Schedule:
    """The per-rank order of torch's ScheduleZBVZeroBubble for ``m`` micro-batches on ``p`` ranks, as a Schedule.

    The schedule computes every rank's order when built, from two stages that say only the group's shape (no
    process group, no module: ``submod=None`` skips its torch.compile check); its idle steps (``None``) go."""
    stages = [SimpleNamespace(group_size=p, group_rank=0, num_stages=2 * p, submod=None) for _ in range(2)]
    order = ScheduleZBVZeroBubble(stages, m).pipeline_order  # type: ignore[arg-type]
    lists = [[Task(_TORCH_OPS[a.computation_type.name], a.microbatch_index, a.stage_index)
              for a in order[rank] if a is not None] for rank in range(p)]
    return Schedule(m, 2 * p, "never", v_shape(2 * p, p), lists, name="torch-zbv").validate()


def test_torch_zbv_is_read_as_the_paper_draws_it() -> None:
    """The import reads the V: rank 0 runs stages 0 and 3 of four, every F, B and W once."""
    s = torch_zbv(4, 2)
    assert s.stages_on(0) == (0, 3) and s.splits_weight_gradient
    assert s.tasks[0][:4] == (Task(Op.F, 0, 0), Task(Op.F, 1, 0), Task(Op.F, 2, 0), Task(Op.F, 0, 3))


@pytest.mark.parametrize(("forward", "backward", "weight"), [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 2), (1, 2, 3)])
def test_zb_v_is_no_slower_than_torch_zbv(forward: float, backward: float, weight: float) -> None:
    for p in range(1, 5):
        for m in range(1, 2 * p + 3):
            cost = costs(2 * p, forward, backward, weight)
            ours, theirs = simulate(zb_v(m, 2 * p), cost).makespan, simulate(torch_zbv(m, p), cost).makespan
            assert ours <= theirs, (p, m, ours, theirs)


SAVED, KEPT, INPUT = 1000, 300, 70


@pytest.mark.parametrize("copy_streams", [True, False], ids=["fast-path", "general-path"])
def test_zb_h1_peak_memory(copy_streams: bool) -> None:
    """Stage ``j`` holds ``n - j`` micro-batches before B and ``j`` more from B to W: ``(n - j) S + j K`` bytes,
    K what one keeps for its W (``weight_bytes``); all it held (K = S) by default: ``n S``, 1F1B's first stage."""
    config = SimConfig(copy_streams=copy_streams)
    for n in range(1, 6):
        for m in range(n, 2 * n + 2):
            kept = simulate(zb_h1(m, n), costs(n, 1, 1, 1, saved_bytes=SAVED, weight_bytes=KEPT), config)
            held = simulate(zb_h1(m, n), costs(n, 1, 1, 1, saved_bytes=SAVED), config)
            f1b = simulate(one_f_one_b(m, n), costs(n, 1, 2, 0, saved_bytes=SAVED), config)
            for j in range(n):
                assert kept.peak_memory(j) == (n - j) * SAVED + j * KEPT
                assert held.peak_memory(j) == n * SAVED == f1b.peak_memory(0)
                assert [s.bytes for s in kept.memory if s.device == j][-1] == 0  # every W freed its bytes


@pytest.mark.parametrize("copy_streams", [True, False], ids=["fast-path", "general-path"])
def test_zb_h2_peak_memory(copy_streams: bool) -> None:
    """Stage ``j`` holds ``min(m, w_j)`` micro-batches before B, ``w_j = 2n - 1 - 2j``, and ``min(max(m - w_j, 0),
    2j)`` more from B to W at its peak: ``min(m, w_j) S + min(max(m - w_j, 0), 2j) K`` bytes; all it held by
    default (K = S): ``min(m, 2n - 1) S`` on every stage, any m (below n and not a multiple of it too)."""
    config = SimConfig(copy_streams=copy_streams)
    for n in range(1, 6):
        for m in range(1, 3 * n + 2):
            kept = simulate(zb_h2(m, n), costs(n, 1, 1, 1, saved_bytes=SAVED, weight_bytes=KEPT), config)
            held = simulate(zb_h2(m, n), costs(n, 1, 1, 1, saved_bytes=SAVED), config)
            for j in range(n):
                w = 2 * n - 1 - 2 * j
                assert kept.peak_memory(j) == min(m, w) * SAVED + min(max(m - w, 0), 2 * j) * KEPT, (n, m, j)
                assert held.peak_memory(j) == min(m, 2 * n - 1) * SAVED
                assert [s.bytes for s in kept.memory if s.device == j][-1] == 0


def test_what_b_keeps_for_w_steps_down_and_w_frees_it() -> None:
    """One micro-batch, one stage, checkpointed: F keeps the input, R adds the activation, B keeps K, W frees."""
    cost = CostModel((StageCost(1, 2, weight=4, saved_bytes=SAVED, checkpoint_bytes=INPUT, weight_bytes=KEPT),),
                     copy_seconds=0.0)
    timeline = simulate(zb_h1(1, 1, "always"), cost)
    assert [(s.time, s.bytes) for s in timeline.memory] == [(0, 0), (1, INPUT), (1, INPUT + SAVED), (4, KEPT),
                                                           (8, 0)]
    with pytest.raises(ValueError, match="weight_bytes must be >= 0"):
        StageCost(1, 1, weight_bytes=-1)


def test_a_schedule_that_does_not_split_ignores_weight_bytes() -> None:
    plain = simulate(one_f_one_b(6, 3), costs(3, 1, 2, 0, saved_bytes=SAVED))
    weighted = simulate(one_f_one_b(6, 3), costs(3, 1, 2, 0, saved_bytes=SAVED, weight_bytes=KEPT))
    assert plain.memory == weighted.memory
