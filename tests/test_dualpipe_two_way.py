"""DeepSeek-V3's two-direction DualPipe (``dualpipe``): stage slots in the schedule language (Note [stage slots] in
:mod:`gpipe.schedule.schedule`), the generator's structure, its text form and grid, and its bubble, activations
and parameters in the simulator against the DeepSeek-V3 report's Table 2 (arXiv 2412.19437)."""

from __future__ import annotations

import dataclasses

import pytest

from gpipe.schedule import (
    CHECKPOINT_MODES,
    Checkpoint,
    Op,
    Schedule,
    ScheduleError,
    Task,
    dualpipe,
    dualpipe_v,
    one_f_one_b,
    parse_schedule,
    schedule_kind,
    schedule_text,
    to_pipelining,
    v_shape,
)
from sim.core.config import SimConfig
from sim.core.cost import CostModel, IdealRunner, StageCost, copied_stages
from sim.core.engine import simulate
from tests.test_dualpipe import assert_recompute_right_before_its_backward


@pytest.mark.parametrize(("m", "p"), [(2, 1), (4, 2), (5, 2), (7, 4), (8, 4), (9, 3), (12, 6)])
def test_each_device_holds_stage_d_and_a_copy_of_stage_p_minus_1_minus_d(m: int, p: int) -> None:
    s = dualpipe(m, 2 * p).validate()
    assert (s.copies, s.stages, s.placement) == (2, p, v_shape(2 * p, p))
    for d in range(p):
        held = s.stages_on(d)
        assert held == (d, 2 * p - 1 - d) and [s.model_stage(j) for j in held] == [d, p - 1 - d]
        assert {t.stage for t in s.tasks[d]} == set(held)


@pytest.mark.parametrize(("m", "p"), [(4, 2), (5, 2), (8, 4), (9, 4), (6, 3)])
def test_half_the_microbatches_flow_down_from_device_0_and_half_up_from_device_p_minus_1(m: int, p: int) -> None:
    """The first ``ceil(m/2)`` travel copy 0 (slots ``0..p-1``, device 0 first), the rest copy 1 (device
    ``p-1`` first); every task is on its micro-batch's route, each once."""
    s = dualpipe(m, 2 * p).validate()
    down = [i for i in range(m) if s.copy_of(i) == 0]
    assert down == list(range((m + 1) // 2))
    for i in range(m):
        route = s.route(i)
        assert list(route) == (list(range(p)) if i in down else list(range(p, 2 * p)))
        assert s.device_of(route[0]) == (0 if i in down else p - 1)
        assert s.is_last(route[-1]) and not any(s.is_last(j) for j in route[:-1])
        assert s.dependencies(Task(Op.F, i, route[0])) == ()
        assert s.dependencies(Task(Op.B, i, route[-1])) == (Task(Op.F, i, route[-1]),)
    assert sorted(s.all_tasks()) == sorted(s.expected_tasks())
    assert all(t.stage in s.route(t.microbatch) for t in s.all_tasks())


@pytest.mark.parametrize(("m", "p"), [(4, 2), (10, 4), (12, 6), (6, 3)])
def test_each_pair_is_a_forward_and_a_backward_of_opposite_directions(m: int, p: int) -> None:
    s = dualpipe(m, 2 * p).validate()
    assert s.splits_weight_gradient and s.pairs
    for f, b in s.pairs:
        assert (f.op, b.op) == (Op.F, Op.B)
        assert s.copy_of(f.microbatch) != s.copy_of(b.microbatch)
        assert s.device_of(f.stage) == s.device_of(b.stage)
    # every device's steady phase pairs: m/2 - p + h + 1 rounds of two, the middle devices' first one not paired
    for d in range(p):
        h, fold = min(d, p - 1 - d), (p + 1) // 2
        rounds = m // 2 - 2 * fold + h + 1
        paired = sum(1 for f, _ in s.pairs if s.device_of(f.stage) == d)
        assert paired == 2 * rounds + (fold - h - 1) - (h == fold - 1)


@pytest.mark.parametrize(("m", "p"), [(4, 2), (8, 2), (8, 4), (12, 6)])
def test_the_two_directions_mirror_each_other(m: int, p: int) -> None:
    """Device ``p-1-d`` runs device ``d``'s list with the directions swapped: micro-batch ``i`` for ``i + m/2``, and
    stage ``s`` of one copy for stage ``s`` of the other (even ``p`` and ``m``, DeepSeek's shapes)."""
    s = dualpipe(m, 2 * p)

    def mirrored(t: Task) -> Task:
        return Task(t.op, (t.microbatch + m // 2) % m, (t.stage + p) % (2 * p))

    for d in range(p):
        assert tuple(map(mirrored, s.tasks[d])) == s.tasks[p - 1 - d]


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("m", "p"), [(2, 1), (3, 2), (8, 4), (9, 3)])
def test_every_policy_gives_a_valid_schedule_with_r_before_its_b(checkpoint: Checkpoint, m: int, p: int) -> None:
    assert_recompute_right_before_its_backward(dualpipe(m, 2 * p, checkpoint).validate(), dualpipe(m, 2 * p))


def test_dualpipe_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="even number of slots n = 2p >= 2, got 3"):
        dualpipe(4, 3)
    with pytest.raises(ValueError, match=r"give m >= 7 \(2 and n - 1\), got m=6"):
        dualpipe(6, 8)
    with pytest.raises(ValueError, match=r"give m >= 2 \(2 and n - 1\), got m=1"):
        dualpipe(1, 2)
    with pytest.raises(ValueError, match=r"places stage d and a copy of stage p-1-d on device d, \(0, 1, 1, 0\)"):
        dualpipe(4, 4, placement=[0, 1, 0, 1])
    with pytest.raises(ValueError, match="unknown checkpoint mode"):
        dualpipe(4, 4, "sometimes")  # type: ignore[arg-type]
    kind = schedule_kind("dualpipe")
    assert kind.copies == 2 and kind.layout(4, 2) == (0, 1, 1, 0) and kind(4, 4, devices=2) == dualpipe(4, 4)


def test_the_validator_follows_each_microbatch_s_route() -> None:
    """A task off its micro-batch's route is a wrong task; copies must divide the stages; one copy is the language
    as it was (F of the first stage of each copy waits for nothing only when there are copies)."""
    s = dualpipe(4, 4)
    off = Task(Op.F, 0, 2)  # micro-batch 0 travels copy 0 (slots 0, 1), not slot 2
    moved = dataclasses.replace(s, tasks=tuple(tuple(off if t == Task(Op.F, 0, 1) else t for t in ts)
                                               for ts in s.tasks), pairs=())
    with pytest.raises(ScheduleError, match="has the wrong tasks: missing F0@1; unexpected F0@2"):
        moved.validate()
    with pytest.raises(ScheduleError, match="3 copies of the stages .* need a divisor of n=4"):
        dataclasses.replace(s, copies=3).validate()
    with pytest.raises(ScheduleError, match="wrong tasks"):  # read as one copy, each micro-batch misses half
        dataclasses.replace(s, copies=1).validate()
    assert s.dependencies(Task(Op.F, 2, 2)) == () and one_f_one_b(2, 4).dependencies(Task(Op.F, 0, 2)) != ()


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_the_text_form_round_trips_with_its_copies(checkpoint: Checkpoint) -> None:
    s = dualpipe(7, 6, checkpoint)
    text = schedule_text(s)
    assert "\ncopies: 2\n" in text and parse_schedule(text) == s
    assert "copies" not in schedule_text(one_f_one_b(2, 2))
    with pytest.raises(ValueError, match="line 5: 4 copies of the stages must divide line 4's 6 stages"):
        parse_schedule(text.replace("copies: 2", "copies: 4"))


def test_the_grid_shows_both_directions_start_at_once() -> None:
    s = dualpipe(4, 4)
    assert str(s).splitlines()[:5] == [
        "dualpipe schedule: m=4, n=4, copies=2, checkpoint=never",
        "step       dev0      dev1",
        "   0       F0@0      F2@2",
        "   1       F2@3      F0@1",
        "   2       F1@0      F3@2",
    ]
    assert "F3@3+B0@0" in s.grid()  # a forward going up beside a backward going down


def _idle(timeline: object, p: int) -> list[float]:
    return [timeline.makespan - timeline.busy(d) for d in range(p)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 0.5), (1.5, 1.0, 0.5), (2.0, 2.0, 1.0)])
@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_the_bubble_is_table_2_s(f: float, b: float, w: float, p: int) -> None:
    """DeepSeek-V3 report, Table 2, DualPipe: bubble ``(PP/2 - 1)(F&B + B - 3W)``, with ``F&B`` the overlapped
    pair's time; here its two tasks one after the other (``F + B``), as the report's count has it, on uniform
    costs and free copies. Every device idles that long, whatever ``m``."""
    for m in (2 * p, 3 * p):
        timeline = simulate(dualpipe(m, 2 * p), CostModel((StageCost(f, b, weight=w),) * (2 * p), copy_seconds=0.0),
                            SimConfig(overlap_pairs=False))
        assert _idle(timeline, p) == pytest.approx([(p / 2 - 1) * ((f + b) + b - 3 * w)] * p)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("p", [2, 4, 6])
def test_dualpipe_idles_as_dualpipe_v_on_half_the_devices(overlap: bool, p: int) -> None:
    """Note [one order, two shapes]: each device runs DualPipeV's order at its place of the folded line."""
    stage = StageCost(1.0, 1.25, weight=0.5)
    two_way = simulate(dualpipe(3 * p, 2 * p), CostModel((stage,) * (2 * p)), SimConfig(overlap_pairs=overlap))
    v = simulate(dualpipe_v(3 * p // 2, p), CostModel((stage,) * p), SimConfig(overlap_pairs=overlap))
    assert _idle(two_way, p) == pytest.approx([_idle(v, p // 2)[0]] * p)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_activations_are_p_plus_1_and_parameters_twice(p: int) -> None:
    """Table 2: DualPipe keeps ``PP + 1`` micro-batches' activations (1F1B: ``PP``) and ``2x`` the parameters."""
    model = CostModel((StageCost(1.0, 1.0, weight=0.5, saved_bytes=1, parameter_bytes=10),) * p)
    timeline = simulate(dualpipe(2 * p + 2, 2 * p), copied_stages(model, 2))
    assert [timeline.peak_memory(d) for d in range(p)] == [p + 1] * p
    assert timeline.meta["model_state_bytes"] == [20] * p and timeline.meta["copies"] == 2
    plain = simulate(one_f_one_b(2 * p + 2, p), model)
    assert plain.peak_memory(0) == p and plain.meta["model_state_bytes"] == [10] * p and "copies" not in plain.meta


@dataclasses.dataclass(frozen=True)
class _Measured(IdealRunner):
    """A runner with a host cost per stage and one measured pair, to see them read through the slots."""

    pairs = (("F", 0, "B", 1, 0.5),)  # type: ignore[assignment]

    def host_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        return 0.1 * (stage + 1)


def test_copied_stages_reads_every_per_stage_cost_through_the_slots() -> None:
    model = CostModel((StageCost(1.0, 2.0), StageCost(3.0, 4.0)), copy_seconds=0.25, runner=_Measured())
    slots = copied_stages(model, 2)
    assert slots.stages == model.stages * 2 and slots.copy_seconds == 0.25
    assert [slots.runner.host_seconds(Op.F, j, False) for j in range(4)] == pytest.approx([0.1, 0.2, 0.1, 0.2])
    assert set(slots.runner.pairs) == {("F", a, "B", b, 0.5) for a in (0, 2) for b in (1, 3)}
    assert copied_stages(model, 1) is model and copied_stages(CostModel.uniform(2, 1, 1), 3).runner is \
        CostModel.uniform(2, 1, 1).runner
    with pytest.raises(ValueError, match="copies of the stages is a positive integer, got 0"):
        copied_stages(model, 0)
    with pytest.raises(ValueError, match="the cost model has 2 stages but the schedule has 4 .*copied_stages"):
        simulate(dualpipe(4, 4), model)
    with pytest.raises(ValueError, match="lockstep_forward .* has 2 copies"):
        simulate(dualpipe(4, 4), slots, SimConfig(lockstep_forward=True, overlap_pairs=False))


def test_a_schedule_of_copies_is_a_schedule() -> None:
    """Nothing else changes for one copy: the default, the text and the expected tasks of every other schedule."""
    s = one_f_one_b(3, 2)
    assert s.copies == 1 and s.stages == 2 and list(s.route(2)) == [0, 1] and s.copy_of(2) == 0
    assert isinstance(dualpipe(4, 4), Schedule) and "copies" not in str(s).splitlines()[0]


def test_torch_pipelining_s_format_has_no_copies() -> None:
    with pytest.raises(ValueError, match="runs 2 copies of its stages.*torch pipelining's actions run every"):
        to_pipelining(dualpipe(4, 4))
