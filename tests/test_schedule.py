"""Schedules: the clock-cycle literals, generated schedules pass the validator, deadlocks are shown;
the linear validator agrees with the step grid; one registry names every generator."""

from __future__ import annotations

import dataclasses
import gc
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpipe.schedule import (
    CHECKPOINT_MODES,
    SCHEDULES,
    Checkpoint,
    Op,
    Schedule,
    ScheduleError,
    Task,
    clock_cycles,
    collector_paused,
    dualpipe,
    dualpipe_v,
    gpipe,
    interleaved_one_f_one_b,
    looped,
    looped_bfs,
    one_f_one_b,
    parse_tasks,
    register,
    schedule_kind,
    step_grid,
    unregister,
    zb_h1,
    zb_h2,
    zb_v,
)
from gpipe.schedule.grid import run_unit_steps
from gpipe.schedule.validator import _runs_to_completion, _walk


def test_clock_cycles_match_torchgpipe() -> None:
    assert list(clock_cycles(3, 3)) == [
        [(0, 0)],
        [(1, 0), (0, 1)],
        [(2, 0), (1, 1), (0, 2)],
        [(2, 1), (1, 2)],
        [(2, 2)],
    ]
    assert list(clock_cycles(4, 2)) == [[(0, 0)], [(1, 0), (0, 1)], [(2, 0), (1, 1)], [(3, 0), (2, 1)], [(3, 1)]]


@pytest.mark.parametrize("text", ["F0@0", "B12@3", "R3@0", "W7@11"])
def test_task_text_round_trip(text: str) -> None:
    task = Task.parse(text)
    assert str(task) == text
    assert Task.parse(str(task)) == task


@pytest.mark.parametrize("bad", ["", "X1@2", "F1", "F-1@0", "F1@", "1F0"])
def test_task_parse_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="not a task"):
        Task.parse(bad)


def test_gpipe_order_looks_like_the_diagram() -> None:
    s = gpipe(3, 2, "never")
    assert s.tasks == (
        parse_tasks("F0@0 F1@0 F2@0 B2@0 B1@0 B0@0"),
        parse_tasks("F0@1 F1@1 F2@1 B2@1 B1@1 B0@1"),
    )
    assert s.grid().splitlines() == [
        "step   dev0  dev1",
        "   0   F0@0     .",
        "   1   F1@0  F0@1",
        "   2   F2@0  F1@1",
        "   3      .  F2@1",
        "   4      .  B2@1",
        "   5   B2@0  B1@1",
        "   6   B1@0  B0@1",
        "   7   B0@0     .",
    ]
    import inspect

    doc = inspect.getdoc(gpipe) or ""  # the docstring's picture is this grid, not a drawing that can drift
    assert "\n".join("    " + line for line in s.grid().splitlines()) in doc


def test_recompute_right_before_its_backward() -> None:
    s = gpipe(3, 2, "except_last")
    assert s.tasks[0] == parse_tasks("F0@0 F1@0 F2@0 B2@0 R1@0 B1@0 R0@0 B0@0")
    for policy in CHECKPOINT_MODES:
        for ts in gpipe(4, 3, policy).tasks + one_f_one_b(4, 3, policy).tasks:
            for k, t in enumerate(ts):
                if t.op is Op.R:
                    assert ts[k + 1] == Task(Op.B, t.microbatch, t.stage)


def test_one_f_one_b_order() -> None:
    s = one_f_one_b(3, 2)
    assert s.tasks == (
        parse_tasks("F0@0 F1@0 B0@0 F2@0 B1@0 B2@0"),
        parse_tasks("F0@1 B0@1 F1@1 B1@1 F2@1 B2@1"),
    )


def test_backward_in_reverse_microbatch_order_per_stage() -> None:
    s = gpipe(5, 3, "always", placement=[0, 1, 0])
    for j in range(3):
        order = [t.microbatch for t in s.tasks[s.device_of(j)] if t.op is Op.B and t.stage == j]
        assert order == [4, 3, 2, 1, 0]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    m=st.integers(1, 9),
    n=st.integers(1, 6),
    policy=st.sampled_from(CHECKPOINT_MODES),
    kind=st.sampled_from(["gpipe", "1f1b"]),
    data=st.data(),
)
def test_generated_schedules_are_valid(m: int, n: int, policy: str, kind: str, data: st.DataObject) -> None:
    devices = data.draw(st.integers(1, n))
    placement = [j % devices for j in range(n)] if data.draw(st.booleans()) else None
    gen = gpipe if kind == "gpipe" else one_f_one_b
    s = gen(m, n, policy, placement)  # type: ignore[arg-type]
    assert s.validate() is s
    assert sorted(s.all_tasks()) == sorted(s.expected_tasks())
    assert sum(r is not None for row in step_grid(s) for r in row) == len(list(s.all_tasks()))


def test_deadlock_shows_grid_and_cycle() -> None:
    bad = Schedule(
        2, 2, "never", (0, 1),
        (parse_tasks("F0@0 B0@0 F1@0 B1@0"), parse_tasks("F1@1 B1@1 F0@1 B0@1")),
        name="crossed",
    )
    with pytest.raises(ScheduleError) as info:
        bad.validate()
    text = str(info.value)
    assert "deadlocks at step 1" in text
    assert "waiting cycle B0@0 -> F1@1 -> B0@0" in text
    assert text.splitlines()[-1] == "   1! >B0@0 >F1@1"


def test_missing_and_duplicate_tasks_are_named() -> None:
    s = gpipe(2, 2, "never")
    missing = Schedule(2, 2, "never", (0, 1), (s.tasks[0][:-1], s.tasks[1]))
    with pytest.raises(ScheduleError, match="missing B0@0"):
        missing.validate()
    dup = Schedule(2, 2, "never", (0, 1), (s.tasks[0] + (Task.parse("F0@0"),), s.tasks[1]))
    with pytest.raises(ScheduleError, match="appears twice"):
        dup.validate()
    wrong_dev = Schedule(2, 2, "never", (0, 1), (s.tasks[1], s.tasks[0]))
    with pytest.raises(ScheduleError, match="placed on device"):
        wrong_dev.validate()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gpipe(0, 2), "at least one micro-batch"),
        (lambda: gpipe(2, 0), "at least one stage"),
        (lambda: gpipe(2, 2, "sometimes"), "unknown checkpoint mode"),  # type: ignore[arg-type]
        (lambda: gpipe(2, 2, placement=[0]), "placement has 1 entries"),
        (lambda: gpipe(2, 2, placement=[0, 2]), "without gaps"),
    ],
)
def test_bad_shapes(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


@settings(max_examples=150, deadline=None)
@given(
    m=st.integers(1, 4),
    n=st.integers(1, 4),
    policy=st.sampled_from(CHECKPOINT_MODES),
    kind=st.sampled_from(["gpipe", "1f1b"]),
    data=st.data(),
)
def test_linear_deadlock_check_agrees_with_the_unit_step_grid(
    m: int, n: int, policy: str, kind: str, data: st.DataObject
) -> None:
    """Note [linear validation]: shuffled task lists deadlock or not exactly as the step grid says."""
    gen = gpipe if kind == "gpipe" else one_f_one_b
    s = gen(m, n, policy)  # type: ignore[arg-type]
    shuffled = Schedule(m, n, s.checkpoint, s.placement, tuple(data.draw(st.permutations(ts)) for ts in s.tasks))
    _, stuck = run_unit_steps(shuffled)
    assert (_walk(shuffled, [shuffled.is_checkpointed(i) for i in range(m)]) >= 0) == (stuck is None)
    assert _runs_to_completion(shuffled) == (stuck is None)  # the same on task objects (a subclass's edges)
    if stuck is None:
        assert shuffled.validate() is shuffled
    else:
        with pytest.raises(ScheduleError, match="deadlocks at step"):
            shuffled.validate()


def test_validation_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule is immutable, so it is checked once; an equal new one is checked again."""
    calls = []
    monkeypatch.setattr("gpipe.schedule.validator._walk", lambda *args: calls.append(1) or _walk(*args))
    s = gpipe(64, 8, "except_last")
    assert s.validate() is s and s.validate() is s and len(calls) == 1
    fresh = Schedule(s.m, s.n, s.checkpoint, s.placement, s.tasks, s.name)
    assert fresh == s and fresh.validate() is fresh and len(calls) == 2


def test_tasks_stay_frozen_ordered_dataclasses() -> None:
    t = Task("F", 2, 1)  # Note [fast frozen records]: the op is coerced, indices checked, fields frozen
    assert t.op is Op.F and t == Task.parse("F2@1") and hash(t) == hash(Task.parse("F2@1"))
    assert repr(t) == "Task('F2@1')" and [f.name for f in dataclasses.fields(t)] == ["op", "microbatch", "stage"]
    assert sorted([Task.parse("F1@0"), Task.parse("F0@1")]) == [Task.parse("F0@1"), Task.parse("F1@0")]
    assert dataclasses.replace(t, stage=3) == Task.parse("F2@3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.stage = 0  # type: ignore[misc]
    with pytest.raises(ValueError, match=">= 0"):
        Task(Op.B, -1, 0)
    with pytest.raises(ValueError):
        Task("X", 0, 0)
    assert pickle.loads(pickle.dumps(t)) == t


def test_every_problem_is_named_in_task_order() -> None:
    s = gpipe(2, 2, "never")
    outside = Schedule(2, 2, "never", (0, 1), (s.tasks[0] + (Task.parse("F5@0"),), s.tasks[1]))
    with pytest.raises(ScheduleError, match="F5@0 is outside m=2, n=2"):
        outside.validate()
    recompute = Schedule(2, 2, "never", (0, 1), (s.tasks[0][:-1] + parse_tasks("R0@0 B0@0"), s.tasks[1]))
    with pytest.raises(ScheduleError, match="wrong tasks: unexpected R0@0"):
        recompute.validate()
    early = Schedule(2, 2, "never", (0, 1), (parse_tasks("B0@0") + s.tasks[0][:-1], s.tasks[1]))
    with pytest.raises(ScheduleError, match="deadlocks"):
        early.validate()


def test_a_subclass_with_its_own_edges_is_validated_by_them() -> None:
    class Independent(Schedule):
        def dependencies(self, task: Task) -> tuple[Task, ...]:
            return ()  # no task waits for another

    s = gpipe(2, 2, "never")
    backwards_first = Independent(2, 2, "never", (0, 1), tuple(ts[::-1] for ts in s.tasks))
    assert backwards_first.validate() is backwards_first
    with pytest.raises(ScheduleError, match="deadlocks"):
        Schedule(2, 2, "never", (0, 1), backwards_first.tasks).validate()
@pytest.mark.parametrize(("m", "n", "checkpoint", "expected"), [
    (1, 2, "never", False),        # F0@0, F0@1, B0@1, B0@0: a chain
    (1, 2, "except_last", False),  # the one micro-batch is the last: no recompute
    (1, 2, "always", True),        # R0@0 may run beside F0@1 and R0@1
    (2, 2, "never", True),         # F1@0 beside F0@1
    (4, 1, "always", False),       # one device
    (3, 4, "except_last", True),
])
def test_overlaps(m: int, n: int, checkpoint: Checkpoint, expected: bool) -> None:
    assert gpipe(m, n, checkpoint).overlaps() is expected


def test_overlaps_follows_the_device_lists() -> None:
    """Two stages on one device with nothing else: however the edges allow, one device runs one task at a time."""
    assert gpipe(2, 2, "never", placement=[0, 0]).overlaps() is False


def test_collector_paused_restores_the_collector_and_ages_what_it_built() -> None:
    """Note [gc]: paused inside, restored after; a big block's survivors leave the young generation unscanned,
    and objects the program froze itself stay frozen."""
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        big = [[] for _ in range(150_000)]
    assert gc.isenabled() and gc.get_count()[0] < 1000 and gc.get_freeze_count() == 0
    gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        with collector_paused():
            more = [[] for _ in range(150_000)]
        # neither frozen again (150,000 more) nor thawed (0); a frozen object another thread frees may leave
        assert gc.isenabled() and frozen - 1000 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off: it stays off
    finally:
        gc.enable()
    assert len(big) == len(more) and gpipe(3, 2).tasks == gpipe(3, 2).tasks and gc.isenabled()


NAMES = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "dualpipe-v", "dualpipe"]


def test_the_registry_names_every_generator_once() -> None:
    """Note [one registry]: the built-in generators, in order, each with its description, constraints and policy."""
    assert list(SCHEDULES) == NAMES
    assert [SCHEDULES[k].generator for k in SCHEDULES] == [gpipe, one_f_one_b, interleaved_one_f_one_b, looped_bfs,
                                                           zb_h1, zb_h2, zb_v, dualpipe_v, dualpipe]
    assert [k.default_checkpoint for k in SCHEDULES.values()] == ["except_last"] + ["never"] * 8
    for kind in SCHEDULES.values():
        assert kind.description and kind.constraints and "\n" not in kind.description + kind.constraints
        assert kind(4, 2) == kind.generator(4, 2) and kind(4, 2).name == kind.name
        assert kind(4, 2, "always", [0, 0]) == kind.generator(4, 2, "always", [0, 0])
    with pytest.raises(TypeError):
        SCHEDULES["mine"] = SCHEDULES["gpipe"]  # type: ignore[index]


def test_an_unknown_name_lists_the_registered_ones() -> None:
    registered = ", ".join(NAMES)
    with pytest.raises(ValueError, match=rf"^unknown schedule 'zero-bubble'; registered: {registered}$"):
        schedule_kind("zero-bubble")
    with pytest.raises(ValueError, match="unknown schedule 'zero-bubble'"):
        unregister("zero-bubble")


def test_register_and_unregister() -> None:
    def reversed_gpipe(m: int, n: int, checkpoint: Checkpoint = "always") -> Schedule:
        return dataclasses.replace(gpipe(m, n, checkpoint), name="reversed")

    assert register("reversed", "GPipe again")(reversed_gpipe) is reversed_gpipe
    try:
        assert list(SCHEDULES)[-1] == "reversed" and schedule_kind("reversed")(2, 2).checkpoint == "always"
        with pytest.raises(ValueError, match="already registered"):
            register("reversed", "twice")(reversed_gpipe)
    finally:
        assert unregister("reversed").generator is reversed_gpipe
    assert list(SCHEDULES) == NAMES


@pytest.mark.parametrize(("name", "description", "message"), [
    ("My Schedule", "one line", "lower-case word"),
    ("a,b", "one line", "lower-case word"),
    ("gpipe", "one line", "already registered"),
    ("mine", "two\nlines", "one line"),
    ("mine", " ", "one line"),
])
def test_register_refuses(name: str, description: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        register(name, description)
    assert "mine" not in SCHEDULES


def test_register_refuses_a_generator_without_a_default_policy() -> None:
    def no_default(m: int, n: int, checkpoint: Checkpoint) -> Schedule:
        return gpipe(m, n, checkpoint)

    def no_policy(m: int, n: int) -> Schedule:
        return gpipe(m, n)

    for generator, message in ((no_default, "has no default checkpoint"), (no_policy, "lacks checkpoint")):
        with pytest.raises(ValueError, match=message):
            register("mine", "one line")(generator)
    assert "mine" not in SCHEDULES


def test_forwards_first() -> None:
    """Whether every device runs all its forwards before anything else: GPipe's does, 1F1B's does not."""
    assert all(gpipe(m, n, policy).forwards_first for m in (1, 4) for n in (1, 3) for policy in CHECKPOINT_MODES)
    assert gpipe(4, 3, placement=[0, 1, 0]).forwards_first  # stage 2's forwards on device 0 still come first
    assert not one_f_one_b(4, 3).forwards_first
    assert one_f_one_b(4, 1).forwards_first is False and one_f_one_b(1, 3).forwards_first is True


def test_a_layout_places_n_stages_on_p_devices() -> None:
    """A schedule built for several stages per device registers its layout; one without runs one per device."""
    assert looped(5, 2) == (0, 1, 0, 1, 0) and looped(3, 3) == (0, 1, 2)
    with pytest.raises(ValueError, match="3 stages go on 1 to 3 devices, got 4"):
        looped(3, 4)

    def v_shape(n: int, p: int) -> tuple[int, ...]:
        return tuple(min(s, n - 1 - s) for s in range(n))  # deliberately wrong for p != n // 2

    register("looped-gpipe", "GPipe, looped", layout=looped)(gpipe)
    register("v-gpipe", "GPipe in a V", layout=v_shape)(gpipe)
    try:
        kind = schedule_kind("looped-gpipe")
        assert kind.layout(4, 2) == (0, 1, 0, 1) and kind(2, 4, devices=2).placement == (0, 1, 0, 1)
        assert kind(2, 4).placement == (0, 1, 2, 3)  # neither placement nor devices: the generator's own
        with pytest.raises(ValueError, match="not both"):
            kind(2, 4, placement=[0, 0, 1, 1], devices=2)
        with pytest.raises(ValueError, match="at least one of the devices"):
            kind.layout(4, 0)
        assert schedule_kind("v-gpipe").layout(4, 2) == (0, 1, 1, 0)
        with pytest.raises(ValueError, match=r"put 4 stages on devices \(0, 1, 1, 0\), not on each of 3"):
            schedule_kind("v-gpipe").layout(4, 3)
        with pytest.raises(ValueError, match=r"'gpipe' runs one stage per device: give as many devices as stages "
                                             r"\(4, not 2\).*\(interleaved-1f1b, looped-bfs, zb-v, dualpipe-v, "
                                             r"dualpipe, looped-gpipe, v-gpipe\)"):
            SCHEDULES["gpipe"].layout(4, 2)
        assert SCHEDULES["gpipe"].layout(3, 3) == (0, 1, 2)
    finally:
        unregister("looped-gpipe")
        unregister("v-gpipe")
