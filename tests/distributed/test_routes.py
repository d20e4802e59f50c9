"""gpipe.transport.routes: what each task sends to other stages, and each rank's incoming streams, in order."""

from __future__ import annotations

from gpipe.schedule import SCHEDULES, Op, Task
from gpipe.skip.layout import SkipLayout
from gpipe.transport.routes import LOSS, incoming, loss_key, outgoing

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")
# a stashed in 0 and popped in 2; b stashed in 0, popped in 1; c stashed and popped in 1 (never crosses)
LAYOUT = SkipLayout({A: 0, B: 0, C: 1}, {A: 2, B: 1, C: 1})  # type: ignore[dict-item]
NONE = SkipLayout({}, {})


def test_a_forward_sends_its_activation_then_its_skips_in_the_layouts_order() -> None:
    f0, f1, f2 = (Task(Op.F, 3, j) for j in range(3))
    assert outgoing(f0, 3, LAYOUT) == [((f0, ""), 1), ((f0, A), 2), ((f0, B), 1)]
    assert outgoing(f1, 3, LAYOUT) == [((f1, ""), 2)]
    assert outgoing(f2, 3, LAYOUT) == []  # the last stage's output stays with it (the loss)


def test_a_backward_sends_its_gradient_then_each_popped_skips_gradient_to_its_stash() -> None:
    b0, b1, b2 = (Task(Op.B, 1, j) for j in range(3))
    assert outgoing(b2, 3, LAYOUT) == [((b2, ""), 1), ((b2, A), 0)]
    assert outgoing(b1, 3, LAYOUT) == [((b1, ""), 0), ((b1, B), 0)]
    assert outgoing(b0, 3, LAYOUT) == []


def test_recomputations_and_weight_gradients_send_nothing() -> None:
    assert outgoing(Task(Op.R, 0, 1), 3, LAYOUT) == [] and outgoing(Task(Op.W, 0, 1), 3, LAYOUT) == []


def test_one_stage_per_rank_streams_follow_the_senders_task_order() -> None:
    schedule = SCHEDULES["1f1b"](3, 2, "never").validate()
    f = [Task(Op.F, i, 0) for i in range(3)]
    b = [Task(Op.B, i, 1) for i in range(3)]
    assert incoming(schedule, NONE, 1) == {0: [((t, ""), 1) for t in f]}
    order = [t for t in schedule.tasks[1] if t.op is Op.B]
    assert incoming(schedule, NONE, 0) == {1: [*(((t, ""), 0) for t in order), (loss_key(schedule), 0)]}
    assert sorted(order) == sorted(b) and loss_key(schedule) == (Task(Op.F, 2, 1), LOSS)


def test_stages_placed_by_a_layout_send_across_in_the_senders_order() -> None:
    """Interleaved 1F1B on two ranks, stages 0, 2 on rank 0 and 1, 3 on rank 1: rank 1 sends rank 0 F(i, 1) to
    stage 2, B(i, 1) to stage 0 and B(i, 3) to stage 2, in its list order, then the loss (stage 3 is rank 1's)."""
    schedule = SCHEDULES["interleaved-1f1b"](4, 4, "never", placement=(0, 1, 0, 1)).validate()
    expected = [((t, ""), t.stage + 1 if t.op is Op.F else t.stage - 1) for t in schedule.tasks[1]
                if (t.op is Op.F and t.stage == 1) or t.op is Op.B]
    assert incoming(schedule, NONE, 0) == {1: [*expected, (loss_key(schedule), 0)]}
    assert len(expected) == 4 * 3
    sent = [((t, ""), t.stage + 1 if t.op is Op.F else t.stage - 1) for t in schedule.tasks[0]
            if (t.op is Op.F and t.stage in (0, 2)) or (t.op is Op.B and t.stage == 2)]
    assert incoming(schedule, NONE, 1) == {0: sent}
