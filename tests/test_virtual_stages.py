"""Interleaved 1F1B and looped BFS: their orders as the diagrams, 1F1B and GPipe with one stage per device, every
policy's recompute right before its backward, and the errors that name the fix; interleaved 1F1B's rounds of N
micro-batches per chunk for any m: valid, what they hold, and the closed form they keep."""

from __future__ import annotations

import pytest

from gpipe.schedule import (
    CHECKPOINT_MODES,
    SCHEDULES,
    Checkpoint,
    Op,
    Task,
    gpipe,
    interleaved_one_f_one_b,
    looped,
    looped_bfs,
    one_f_one_b,
    parse_tasks,
)
from sim.core.cost import CostModel
from sim.core.engine import simulate


def test_interleaved_looks_like_the_diagram() -> None:
    """Megatron's order, n=4 stages on p=2 devices, m=4: device 0 warms up (v-1)p + 2(p-1) = 4 forwards."""
    s = interleaved_one_f_one_b(4, 4, "never", looped(4, 2)).validate()
    assert s.placement == (0, 1, 0, 1) and s.name == "interleaved-1f1b"
    assert s.tasks == (
        parse_tasks("F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0"),
        parse_tasks("F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1"),
    )
    assert interleaved_one_f_one_b(2, 4, "never", looped(4, 2)).tasks == (
        parse_tasks("F0@0 F1@0 F0@2 F1@2 B0@2 B1@2 B0@0 B1@0"),
        parse_tasks("F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 B0@1 B1@1"),
    )


def test_interleaved_runs_micro_batches_in_rounds_of_p_per_chunk() -> None:
    """m=4 on p=2 devices with v=3 chunks: device 0's forwards go 0 1 | 0 1 | 0 1, then 2 3 | 2 3 | 2 3 by chunk;
    its backwards likewise, from the last chunk (stage 4) to the first (stage 0)."""
    s = interleaved_one_f_one_b(4, 6, "never", looped(6, 2)).validate()
    forwards = [(t.microbatch, t.stage) for t in s.tasks[0] if t.op is Op.F]
    backwards = [(t.microbatch, t.stage) for t in s.tasks[0] if t.op is Op.B]
    rounds = [(i, j) for group in (0, 2) for j in (0, 2, 4) for i in (group, group + 1)]
    assert forwards == rounds
    assert backwards == [(i, 4 - j) for i, j in rounds]


def test_looped_bfs_looks_like_the_diagram() -> None:
    s = looped_bfs(2, 4, "never", looped(4, 2)).validate()
    assert s.placement == (0, 1, 0, 1) and s.name == "looped-bfs" and s.forwards_first
    assert s.tasks == (parse_tasks("F0@0 F1@0 F0@2 F1@2 B1@2 B0@2 B1@0 B0@0"),
                       parse_tasks("F0@1 F1@1 F0@3 F1@3 B1@3 B0@3 B1@1 B0@1"))
    three = looped_bfs(3, 5, "never", looped(5, 2)).validate()  # any n: device 0 holds stages 0, 2 and 4
    assert three.tasks[0] == parse_tasks("F0@0 F1@0 F2@0 F0@2 F1@2 F2@2 F0@4 F1@4 F2@4 "
                                         "B2@4 B1@4 B0@4 B2@2 B1@2 B0@2 B2@0 B1@0 B0@0")


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("m", "n"), [(1, 1), (3, 2), (5, 4), (8, 3)])
def test_one_device_per_stage_is_1f1b_and_gpipe(m: int, n: int, checkpoint: Checkpoint) -> None:
    """v = 1: interleaved 1F1B is 1F1B (any m), looped BFS is GPipe's fill-drain (per device)."""
    for placement in (None, looped(n, n)):
        assert interleaved_one_f_one_b(m, n, checkpoint, placement).tasks == one_f_one_b(m, n, checkpoint).tasks
        assert looped_bfs(m, n, checkpoint, placement).tasks == gpipe(m, n, checkpoint).tasks


@pytest.mark.parametrize("name", ["interleaved-1f1b", "looped-bfs"])
@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("m", "n", "p"), [(1, 2, 1), (2, 4, 2), (6, 6, 3), (8, 8, 4), (4, 12, 2), (9, 9, 3)])
def test_every_policy_recomputes_right_before_its_backward(name: str, checkpoint: Checkpoint, m: int, n: int,
                                                           p: int) -> None:
    s = SCHEDULES[name](m, n, checkpoint, devices=p).validate()
    assert s.placement == looped(n, p) and s.num_devices == p
    assert sorted(s.all_tasks()) == sorted(s.expected_tasks())
    plain = SCHEDULES[name](m, n, "never", devices=p)
    for ts, plain_ts in zip(s.tasks, plain.tasks, strict=True):
        assert tuple(t for t in ts if t.op is not Op.R) == plain_ts  # the policy adds R tasks and moves nothing
        for k, t in enumerate(ts):
            if t.op is Op.R:
                assert ts[k + 1] == Task(Op.B, t.microbatch, t.stage)
        assert sum(t.op is Op.R for t in ts) == sum(s.is_checkpointed(t.microbatch) for t in ts if t.op is Op.B)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: interleaved_one_f_one_b(8, 8, placement=looped(8, 4), round_size=0),
     r"^interleaved-1f1b takes round_size as a whole number >= 1, got 0 \(None: one micro-batch per device, 4\)$"),
    (lambda: interleaved_one_f_one_b(8, 8, placement=looped(8, 4), round_size=True),
     r"takes round_size as a whole number >= 1, got True"),
    (lambda: interleaved_one_f_one_b(0, 8, placement=looped(8, 4)), r"takes m as a whole number >= 1, got 0$"),
    (lambda: interleaved_one_f_one_b(8, 6, placement=looped(6, 4)),
     r"use a number of stages that is a multiple of the 4 devices: 4 or 8$"),
    (lambda: interleaved_one_f_one_b(4, 4, placement=[0, 0, 1, 1]),
     r"places stage s on device s mod p: for 4 stages on 2 devices use the placement \(0, 1, 0, 1\) "
     r"\(or give the number of devices: devices=2\)$"),
    (lambda: looped_bfs(4, 3, placement=[1, 0, 1]), r"^looped-bfs places stage s on device s mod p: .* \(0, 1, 0\)"),
    (lambda: SCHEDULES["interleaved-1f1b"](6, 6, devices=4), r"multiple of the 4 devices: 4 or 8$"),
    (lambda: looped_bfs(4, 3, placement=[0, 1]), "placement has 2 entries for 3 stages"),
])
def test_bad_shapes_and_placements_name_the_fix(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


def test_registered_with_the_looped_layout() -> None:
    for name in ("interleaved-1f1b", "looped-bfs"):
        kind = SCHEDULES[name]
        assert kind.place is looped and kind.layout(8, 4) == (0, 1, 2, 3, 0, 1, 2, 3)
        assert kind.default_checkpoint == "never" and "s mod p" in kind.constraints
    assert "any m; option round=N" in SCHEDULES["interleaved-1f1b"].constraints
    assert SCHEDULES["interleaved-1f1b"].options == (("round", "round_size"),)
    assert not interleaved_one_f_one_b(4, 4, placement=looped(4, 2)).forwards_first


# -- rounds of N micro-batches per chunk (Llama 3's knob) and any m --------------------------------------------


def _held(tasks: tuple[Task, ...]) -> int:
    """The most micro-batch-stages one device's list holds between their F and their B."""
    count = peak = 0
    for t in tasks:
        count += (t.op is Op.F) - (t.op is Op.B)
        peak = max(peak, count)
    return peak


def test_a_last_partial_round_runs_as_a_full_one_without_its_missing_micro_batches() -> None:
    """Note [partial round]: m=3 in rounds of p=2 is m=4's order (the diagram above) without micro-batch 3."""
    s = interleaved_one_f_one_b(3, 4, "never", looped(4, 2)).validate()
    assert s.tasks == (parse_tasks("F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 B1@2 F2@2 B0@0 B1@0 B2@2 B2@0"),
                       parse_tasks("F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 B1@1 F2@3 B2@3 B2@1"))
    for p, v, m, size in [(2, 2, 3, 2), (4, 3, 9, 4), (3, 2, 7, 5), (4, 2, 10, 3), (4, 2, 9, 1)]:
        padded = -(-m // size) * size
        for checkpoint in ("never", "always"):
            ours = interleaved_one_f_one_b(m, v * p, checkpoint, looped(v * p, p), round_size=size)
            full = interleaved_one_f_one_b(padded, v * p, checkpoint, looped(v * p, p), round_size=size)
            assert ours.tasks == tuple(tuple(t for t in ts if t.microbatch < m) for ts in full.tasks)


def test_round_p_is_the_default_and_round_m_goes_breadth_first() -> None:
    for p, v, m in [(2, 2, 4), (4, 2, 8), (3, 3, 7), (4, 2, 3)]:
        n = v * p
        default = interleaved_one_f_one_b(m, n, "never", looped(n, p))
        assert interleaved_one_f_one_b(m, n, "never", looped(n, p), round_size=p).tasks == default.tasks
        assert interleaved_one_f_one_b(m, n, "never", looped(n, p), round_size=m + 5).tasks == \
            interleaved_one_f_one_b(m, n, "never", looped(n, p), round_size=m).tasks  # clamped to m
    s = interleaved_one_f_one_b(4, 4, "never", looped(4, 2), round_size=4).validate()
    assert s.tasks == (  # every micro-batch on chunk 0, then on chunk 1; backwards from the last chunk
        parse_tasks("F0@0 F1@0 F2@0 F3@0 F0@2 F1@2 F2@2 B0@2 F3@2 B1@2 B2@2 B3@2 B0@0 B1@0 B2@0 B3@0"),
        parse_tasks("F0@1 F1@1 F2@1 F3@1 F0@3 B0@3 F1@3 B1@3 F2@3 B2@3 F3@3 B3@3 B0@1 B1@1 B2@1 B3@1"),
    )


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_every_m_and_round_is_valid(checkpoint: Checkpoint) -> None:
    """Any m >= 1 and any round N >= 1 (also N < p - 1, where Note [warm-up] caps the count): every task once,
    no deadlock, R right before its B, the forwards and backwards of each device in rounds."""
    for p in range(1, 6):
        for v in range(1, 4):
            n = v * p
            for m in range(1, 2 * p + 4):
                for size in range(1, m + 2):
                    s = interleaved_one_f_one_b(m, n, checkpoint, looped(n, p), round_size=size).validate()
                    assert sorted(s.all_tasks()) == sorted(s.expected_tasks()) and s.placement == looped(n, p)
                    for ts in s.tasks:
                        for k, t in enumerate(ts):
                            if t.op is Op.R:
                                assert ts[k + 1] == Task(Op.B, t.microbatch, t.stage)
                    if v == 1:  # one chunk: the round changes nothing
                        assert s.tasks == one_f_one_b(m, n, checkpoint).tasks


def test_what_a_round_holds() -> None:
    """Device d holds at most min(m·v, (v - 1)N + 2·min(p - 1 - d, N) + 1) micro-batch-stages between F and B
    (Note [warm-up]), exactly that when N divides m; one chunk: 1F1B's min(m, p - d)."""
    for p in range(1, 6):
        for v in range(1, 4):
            n = v * p
            for m in range(1, 3 * p + 2):
                for size in range(1, m + 1):
                    s = interleaved_one_f_one_b(m, n, "never", looped(n, p), round_size=size)
                    for d in range(p):
                        bound = min(m * v, p - d if v == 1 else (v - 1) * size + 2 * min(p - 1 - d, size) + 1)
                        held = _held(s.tasks[d])
                        assert held == bound if m % size == 0 else held <= bound, (p, v, m, size, d)


@pytest.mark.parametrize(("p", "v"), [(2, 2), (3, 2), (4, 2), (2, 3), (4, 3)])
@pytest.mark.parametrize(("t_f", "t_b"), [(1.0, 2.0), (2.0, 1.0), (0.5, 2.5)])
def test_a_round_of_at_least_p_that_divides_m_keeps_the_closed_form(p: int, v: int, t_f: float, t_b: float) -> None:
    """Free copies, uniform costs: (m·v + p − 1)(t_f + t_b) whatever the round N >= p dividing m; a round below p
    waits for micro-batch 0 to come round, so it takes longer."""
    n = v * p
    cost = CostModel.uniform(n, t_f, t_b)
    for m in (p, 2 * p, 3 * p, 2 * p + 2):
        for size in (s for s in range(p, m + 1) if m % s == 0):
            s = interleaved_one_f_one_b(m, n, "never", looped(n, p), round_size=size)
            assert simulate(s, cost).makespan == (m * v + p - 1) * (t_f + t_b), (m, size)
        if p > 1:
            slow = interleaved_one_f_one_b(m, n, "never", looped(n, p), round_size=1)
            assert simulate(slow, cost).makespan > (m * v + p - 1) * (t_f + t_b)
