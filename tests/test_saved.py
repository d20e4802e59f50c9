"""The saved-bytes rule (gpipe.schedule.saved): what each task holds and frees, read on small schedules as the
bytes a device holds while each of its tasks runs."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe.schedule import Op, Schedule, Task, gpipe, one_f_one_b
from gpipe.schedule.saved import held_bytes, held_while_running, task_arrays


def running(schedule: Schedule, saved: list[int], checkpoint: list[int] | None = None,
            weight: list[int | None] | None = None, scales: list[float] | None = None) -> list[list[int]]:
    """Per device, what it holds while each of its tasks runs."""
    held = held_bytes([schedule.is_checkpointed(i) for i in range(schedule.m)], schedule.splits_weight_gradient,
                      saved, checkpoint or (), weight or (), scales or ())
    return [held_while_running(ts, held).tolist() for ts in schedule.tasks]


def test_a_forward_holds_until_its_backward_ends() -> None:
    schedule = one_f_one_b(3, 2)
    assert [" ".join(map(str, ts)) for ts in schedule.tasks] == ["F0@0 F1@0 B0@0 F2@0 B1@0 B2@0",
                                                                  "F0@1 B0@1 F1@1 B1@1 F2@1 B2@1"]
    assert running(schedule, [10, 20]) == [[10, 20, 20, 20, 20, 10],
                                           [20, 20, 20, 20, 20, 20]]


def test_a_checkpointed_microbatch_keeps_its_input_and_holds_again_from_its_recompute() -> None:
    schedule = gpipe(2, 1, "always")
    assert " ".join(map(str, schedule.tasks[0])) == "F0@0 F1@0 R1@0 B1@0 R0@0 B0@0"
    #                                      F0  F1  R1        B1        R0       B0
    assert running(schedule, [100], [3]) == [[3, 6, 6 + 100, 6 + 100, 3 + 100, 3 + 100]]


def test_a_split_backward_keeps_what_its_weight_gradient_reads() -> None:
    order = tuple(Task(op, i, 0) for op, i in ((Op.F, 0), (Op.F, 1), (Op.B, 0), (Op.B, 1), (Op.W, 0), (Op.W, 1)))
    schedule = Schedule(2, 1, "never", (0,), (order,)).validate()
    #                                             F0   F1   B0   B1  W0  W1
    assert running(schedule, [100], weight=[30]) == [[100, 200, 200, 130, 60, 30]]
    assert running(schedule, [100], weight=[None]) == [[100, 200, 200, 200, 200, 100]]
    assert running(schedule, [100], weight=[500]) == [[100, 200, 200, 200, 200, 100]]  # no more than it has


def test_scaled_bytes_round_half_to_even() -> None:
    held = held_bytes([False, True], False, [5], [3], scales=[1.0, 0.5])
    assert held.at_end[:, :, 0].tolist() == [[5, 2], [-5, -4], [0, 0], [0, 0]]  # F, B, R, W by micro-batch
    assert held.at_start[:, :, 0].tolist() == [[0, 0], [0, 0], [0, 2], [0, 0]]  # 1.5 -> 2, 2.5 -> 2
    assert held.at_end.dtype == np.int64


def test_amounts_keep_their_type_and_nothing_is_tracked_without_bytes() -> None:
    assert held_bytes([False], False, [0.25]).at_end.dtype == np.float64
    assert not held_bytes([True, False], True, [0, 0], [0, 0]).tracked
    assert held_bytes([True], False, [0], [1]).tracked


def test_task_arrays_code_ops_in_their_order() -> None:
    tasks = (Task(Op.F, 1, 2), Task(Op.B, 0, 1), Task(Op.R, 3, 0), Task(Op.W, 2, 4))
    code, i, j = task_arrays(tasks)
    assert [list(Op)[c] for c in code] == [Op.F, Op.B, Op.R, Op.W]
    assert i.tolist() == [1, 0, 3, 2] and j.tolist() == [2, 1, 0, 4]
    assert task_arrays(tasks)[0] is code  # kept for the same list
    assert held_while_running((), held_bytes([False], False, [1])).tolist() == []


def test_a_task_outside_the_rule_is_an_error() -> None:
    with pytest.raises(IndexError):
        held_while_running((Task(Op.F, 2, 0),), held_bytes([False], False, [1]))
