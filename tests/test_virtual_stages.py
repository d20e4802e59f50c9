"""Interleaved 1F1B and looped BFS: their orders as the diagrams, 1F1B and GPipe with one stage per device, every
policy's recompute right before its backward, and the errors that name the fix."""

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
    (lambda: interleaved_one_f_one_b(10, 8, placement=looped(8, 4)),
     r"use a number of micro-batches that is a multiple of the 4 devices: 8 or 12$"),
    (lambda: interleaved_one_f_one_b(3, 8, placement=looped(8, 4)),
     r"use a number of micro-batches that is a multiple of the 4 devices: 4$"),
    (lambda: interleaved_one_f_one_b(8, 6, placement=looped(6, 4)),
     r"use a number of stages that is a multiple of the 4 devices: 4 or 8$"),
    (lambda: interleaved_one_f_one_b(4, 4, placement=[0, 0, 1, 1]),
     r"places stage s on device s mod p: for 4 stages on 2 devices use the placement \(0, 1, 0, 1\) "
     r"\(or give the number of devices: devices=2\)$"),
    (lambda: looped_bfs(4, 3, placement=[1, 0, 1]), r"^looped-bfs places stage s on device s mod p: .* \(0, 1, 0\)"),
    (lambda: SCHEDULES["interleaved-1f1b"](6, 8, devices=4), r"multiple of the 4 devices: 4 or 8$"),
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
    assert "m a multiple of p when n > p" in SCHEDULES["interleaved-1f1b"].constraints
    assert not interleaved_one_f_one_b(4, 4, placement=looped(4, 2)).forwards_first
