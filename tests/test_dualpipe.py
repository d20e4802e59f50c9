"""Overlapped pairs in the schedule type (validator, deadlock check, grid) and the DualPipeV generator, checked
against the order of torch's ``ScheduleDualPipeV``."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from gpipe.schedule import (
    CHECKPOINT_MODES,
    Op,
    Schedule,
    ScheduleError,
    Task,
    dualpipe_v,
    gpipe,
    one_f_one_b,
    parse_tasks,
    schedule_kind,
)
from gpipe.schedule.dualpipe import v_shape
from gpipe.schedule.validator import _runs_to_completion, _walk


def paired(m: int, n: int, lists: list[str], placement: tuple[int, ...] | None = None) -> Schedule:
    """A schedule from device lists in the grid's text, ``F1@0+B0@1`` an overlapped pair."""
    tasks, pairs = [], []
    for text in lists:
        words: list[Task] = []
        for word in text.split():
            group = parse_tasks(word.split("+"))
            if len(group) == 2:
                pairs.append((group[0], group[1]))
            words += group
        tasks.append(tuple(words))
    return Schedule(m, n, "never", placement or tuple(range(n)), tuple(tasks), name="paired", pairs=tuple(pairs))


def test_existing_schedules_have_no_pairs() -> None:
    assert gpipe(3, 2).pairs == () and one_f_one_b(3, 2).pairs == ()
    assert gpipe(3, 2).pair_starts == (frozenset(), frozenset())


def test_a_pair_prints_in_one_cell_and_starts_when_both_are_ready() -> None:
    # one device, two stages: F1@0 and B0@1 run together once F0@1 (B0@1's input) has run
    s = paired(2, 2, ["F0@0 F0@1 F1@0+B0@1 F1@1 B1@1 B1@0 B0@0"], placement=(0, 0)).validate()
    assert s.pair_starts == (frozenset({2}),)
    assert s.grid().splitlines()[1:] == [
        "   0       F0@0",
        "   1       F0@1",
        "   2  F1@0+B0@1",
        "   3       F1@1",
        "   4       B1@1",
        "   5       B1@0",
        "   6       B0@0",
    ]


def test_a_pair_waits_for_its_second_task_s_inputs() -> None:
    """Without the pair, dev0 would run F2@0 at step 2; paired with B0@0 it waits for B0@1 (step 3)."""
    s = paired(3, 2, ["F0@0 F1@0 F2@0+B0@0 B1@0 B2@0", "F0@1 B0@1 F1@1 B1@1 F2@1 B2@1"]).validate()
    rows = s.grid().splitlines()[1:]
    assert [r.split()[1] for r in rows[:4]] == ["F0@0", "F1@0", ".", "F2@0+B0@0"]


def test_a_pair_that_cannot_start_together_deadlocks_with_its_cycle() -> None:
    # B0@0 needs B0@1, which needs F1@1's device to pass F1@1, which needs F1@0: paired with B0@0
    s = paired(2, 2, ["F0@0 F1@0+B0@0 B1@0", "F0@1 F1@1 B0@1 B1@1"])
    with pytest.raises(ScheduleError, match=r"deadlocks at step 2: waiting cycle F1@0 -> F1@1 -> F1@0") as caught:
        s.validate()
    assert ">F1@0+B0@0" in str(caught.value)
    ck = [False, False]
    assert _walk(s, ck, [{1}, set()]) == -1 and not _runs_to_completion(s)
    assert _walk(s, ck) == 0  # the same lists without the pair run


@pytest.mark.parametrize(("lists", "pairs", "message"), [
    (["F0@0 F1@0 B1@0 B0@0"], [("F0@0", "F9@0")], "F9@0 is in no device's list"),
    (["F0@0 F1@0 B1@0 B0@0"], [("F0@0", "B1@0")], "B1@0 must come right after F0@0 in one device's list"),
    (["F0@0 F1@0 B1@0 B0@0"], [("F1@0", "F0@0")], "F0@0 must come right after F1@0"),
    (["F0@0 F1@0 B1@0 B0@0"], [("F0@0", "F1@0"), ("F1@0", "B1@0")], "F1@0 is already in another pair"),
    (["F0@0 F1@0 B1@0 B0@0"], [("F1@0", "B1@0")], "B1@0 waits for F1@0, so the two cannot start together"),
])
def test_a_bad_pair_is_named(lists: list[str], pairs: list[tuple[str, str]], message: str) -> None:
    base = Schedule(2, 1, "never", (0,), tuple(parse_tasks(t) for t in lists))
    s = dataclasses.replace(base, pairs=tuple((Task.parse(a), Task.parse(b)) for a, b in pairs))
    with pytest.raises(ScheduleError, match=message):
        s.validate()


def test_dualpipe_v_looks_like_the_diagram() -> None:
    """p=2, m=4: dev0 holds stages 0 and 3, dev1 stages 1 and 2; ``+`` joins an overlapped pair."""
    s = dualpipe_v(4, 4).validate()
    assert s.placement == (0, 1, 1, 0)
    expected = paired(4, 4, [
        "F0@0 F1@0 F2@0 F0@3 B0@3 W0@3 F1@3 F3@0+B1@3 W1@3 F2@3+B0@0 W0@0 B2@3 W2@3 F3@3+B1@0 W1@0 B3@3 W3@3 "
        "B2@0 W2@0 B3@0 W3@0",
        "F0@1 F0@2 F1@1 F1@2 F2@1 B0@2 W0@2 F2@2+B0@1 W0@1 F3@1+B1@2 W1@2 F3@2+B1@1 W1@1 B2@2 W2@2 B2@1 W2@1 "
        "B3@2 B3@1 W3@2 W3@1",
    ], placement=(0, 1, 1, 0))
    assert s.tasks == expected.tasks and s.pairs == expected.pairs


def _torch_order(m: int, p: int) -> tuple[tuple[tuple[Task, ...], ...], set[tuple[Task, Task]]]:
    """torch's ScheduleDualPipeV order for ``p`` ranks in our type: a full backward is ``B`` then ``W``; an
    OVERLAP_F_B action is a pair of its forward and its backward's ``B``, its ``W`` right after."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    ops = {Kind.FORWARD: "F", Kind.FULL_BACKWARD: "BW", Kind.BACKWARD_INPUT: "B", Kind.BACKWARD_WEIGHT: "W"}
    lists, pairs = [], set()
    for rank in range(p):
        out: list[Task] = []
        # the method reads only these two attributes of the schedule object: the real order, without stages
        shape = SimpleNamespace(pp_group_size=p, _n_microbatches=m)
        for action in ScheduleDualPipeV._calculate_single_rank_operations(shape, rank):  # type: ignore[arg-type]
            subs = action.sub_actions or (action,)
            for a in subs:
                out += [Task(Op(o), a.microbatch_index, a.stage_index) for o in ops[a.computation_type]]
            if len(subs) == 2:  # F, B, W: the pair is F and B
                pairs.add((out[-3], out[-2]))
        lists.append(tuple(out))
    return tuple(lists), pairs


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_dualpipe_v_is_torch_s_order(p: int) -> None:
    for m in range(2 * p, 2 * p + 5):
        s = dualpipe_v(m, 2 * p)
        lists, pairs = _torch_order(m, p)
        assert s.tasks == lists and set(s.pairs) == pairs and len(s.pairs) == len(pairs)
        assert s.placement == v_shape(2 * p, p)


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("m", "p"), [(2, 1), (5, 1), (4, 2), (7, 2), (6, 3), (9, 4)])
def test_every_policy_gives_a_valid_schedule_with_r_before_its_pair_or_b(checkpoint: str, m: int, p: int) -> None:
    s = dualpipe_v(m, 2 * p, checkpoint).validate()  # type: ignore[arg-type]
    assert s.splits_weight_gradient and s.pairs
    assert_recompute_right_before_its_backward(s, dualpipe_v(m, 2 * p))


def assert_recompute_right_before_its_backward(s: Schedule, unchecked: Schedule) -> None:
    """Each ``R`` of ``s`` comes right before its ``B``, or before the pair that starts its ``B``, and ``s`` less its
    ``R`` tasks is ``unchecked``, the same schedule without checkpointing."""
    firsts = dict(s.pairs)
    for ts in s.tasks:
        for k, t in enumerate(ts):
            if t.op is Op.R:
                after = ts[k + 1] if ts[k + 1].op is Op.B else firsts[ts[k + 1]]
                assert after == Task(Op.B, t.microbatch, t.stage)
    assert [t for t in s.all_tasks() if t.op is not Op.R] == list(unchecked.all_tasks())


def test_dualpipe_v_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="even number of stages"):
        dualpipe_v(6, 3)
    with pytest.raises(ValueError, match=r"m >= n = 6.*raise chunks to 6 or more"):
        dualpipe_v(5, 6)
    with pytest.raises(ValueError, match=r"places its stages in a V, \(0, 1, 1, 0\).*leave the placement out"):
        dualpipe_v(4, 4, placement=[0, 1, 0, 1])
    with pytest.raises(ValueError, match="unknown checkpoint mode"):
        dualpipe_v(4, 4, "sometimes")  # type: ignore[arg-type]
    kind = schedule_kind("dualpipe-v")
    assert kind.layout(6, 3) == (0, 1, 2, 2, 1, 0) and kind(6, 6, devices=3) == dualpipe_v(6, 6)
    with pytest.raises(ValueError, match=r"n = 2p: 6 stages cannot go on 2 devices; give 3 devices"):
        kind.layout(6, 2)
