"""``GPipe(..., schedule=a_schedule)``: the executor runs any valid :class:`Schedule`, as it is (Note [a given
schedule] in :mod:`gpipe.frontend`): generated, hand-edited, read back from the text form or torch pipelining's CSV,
trains like the plain model; ``chunks`` and ``checkpoint`` follow it; every disagreement is named at construction."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpipe import GPipe
from gpipe.schedule import (
    SCHEDULES,
    Op,
    Schedule,
    ScheduleError,
    gpipe,
    one_f_one_b,
    parse_schedule,
    parse_tasks,
    read_pipelining_csv,
    read_schedule,
    schedule_text,
    write_pipelining_csv,
    write_schedule,
)


def chain(layers: int = 4) -> nn.Sequential:
    """``layers`` layers: Linear(6, 6) and Tanh pairs, the last Linear(6, 3)."""
    body = [nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(layers - 1)]
    return nn.Sequential(*body, nn.Linear(6, 3))


def trains_like_the_model(schedule: Schedule, batch: int | None = None, *, step: bool = True) -> GPipe:
    """A step (or forward + backward) of a pipeline built on ``schedule``: the plain model's loss and gradients, and
    every worker ran its list in the schedule's order. Returns the pipeline."""
    torch.manual_seed(0)
    model = chain(schedule.stages)
    reference = copy.deepcopy(model)
    rows = 2 * schedule.m if batch is None else batch
    x, y = torch.randn(rows, 6), torch.randn(rows, 3)
    pipe = GPipe(model, [1] * schedule.stages, devices=["cpu"] * schedule.num_devices, schedule=schedule, record=True)
    if step:
        loss = pipe.step(x, y, F.mse_loss)
    else:
        loss = F.mse_loss(pipe(x), y)
        loss.backward()
    expected = F.mse_loss(reference(x), y)
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach())
    for (name, p), q in zip(pipe.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, name=name: f"{name}: {m}")
    assert pipe.timeline is not None
    ran = pipe.schedule if pipe.training else pipe.schedule_for(schedule.m, "never")
    for d in range(schedule.num_devices):
        assert pipe.timeline.task_order(d) == list(ran.tasks[d])
    return pipe


def _generated() -> dict[str, Schedule]:
    """Each registered schedule built by its generator: a stage per device, or 4 stages on 2 by its layout."""
    made = {}
    for name, kind in SCHEDULES.items():
        n, devices = (4, 2) if kind.place is not None else (2, None)
        made[name] = kind(4, n, "except_last", devices=devices)
    return made


GENERATED = _generated()

# 1F1B on 2 devices with device 0's list reordered (its F1@0 after B0@0): valid, and not what any generator builds
EDITED = schedule_text(one_f_one_b(4, 2, "always")).replace("device 0: F0@0 F1@0 R0@0 B0@0",
                                                            "device 0: F0@0 R0@0 B0@0 F1@0")


@pytest.mark.parametrize("name", list(GENERATED))
def test_a_generated_schedule_trains_like_the_plain_model(name: str) -> None:
    pipe = trains_like_the_model(GENERATED[name])
    assert pipe.schedule is GENERATED[name] and pipe.schedule_name == name
    assert (pipe.chunks, pipe.checkpoint) == (4, "except_last")  # the schedule's, by default


def test_a_hand_edited_schedule_runs_in_its_own_order() -> None:
    edited = parse_schedule(EDITED)
    assert edited.tasks[0][:4] == parse_tasks("F0@0 R0@0 B0@0 F1@0") and edited != one_f_one_b(4, 2, "always")
    pipe = trains_like_the_model(edited)
    assert pipe.checkpoint == "always"


def test_schedules_read_back_from_files_train_like_the_plain_model(tmp_path: Path) -> None:
    text = read_schedule(write_schedule(parse_schedule(EDITED), tmp_path / "edited.txt"))
    trains_like_the_model(text)
    csv = read_pipelining_csv(write_pipelining_csv(GENERATED["zb-h1"], tmp_path / "zb.csv"), "always")
    assert csv.splits_weight_gradient and sum(t.op is Op.R for t in csv.all_tasks()) == 4 * 2
    trains_like_the_model(csv)


def test_a_forwards_first_schedule_trains_through_forward_and_backward() -> None:
    trains_like_the_model(gpipe(4, 2, "always"), step=False)


def test_forward_refuses_to_train_a_schedule_that_interleaves() -> None:
    pipe = GPipe(chain(2), [1, 1], devices=["cpu", "cpu"], schedule=one_f_one_b(4, 2))
    with pytest.raises(RuntimeError, match=r"the '1f1b' schedule interleaves forward and backward.*pipe\.step"):
        pipe(torch.randn(8, 6))


def test_eval_mode_steps_without_the_recomputes() -> None:
    """Eval mode checkpoints nothing: the step runs the schedule's lists without their R tasks."""
    schedule = one_f_one_b(4, 2, "always")
    torch.manual_seed(0)
    model = chain(2)
    pipe = GPipe(copy.deepcopy(model), [1, 1], devices=["cpu", "cpu"], schedule=schedule, record=True).eval()
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    loss = pipe.step(x, y, F.mse_loss)
    torch.testing.assert_close(loss, F.mse_loss(model(x), y).detach())
    assert pipe.timeline is not None
    for d in range(2):
        assert pipe.timeline.task_order(d) == [t for t in schedule.tasks[d] if t.op is not Op.R]


@pytest.mark.parametrize("rows", [8, 3])
def test_inference_runs_gpipes_forwards_on_the_schedules_placement(rows: int) -> None:
    """Without grad, any batch (3 rows: 3 micro-batches of a schedule of 4) infers, on the schedule's placement."""
    torch.manual_seed(0)
    model = chain(4)
    schedule = GENERATED["interleaved-1f1b"]
    pipe = GPipe(copy.deepcopy(model), [1] * 4, devices=["cpu", "cpu"], schedule=schedule)
    x = torch.randn(rows, 6)
    with torch.no_grad():
        torch.testing.assert_close(pipe(x), model(x))
    assert pipe.schedule_for(min(rows, 4), "never", "gpipe").placement == schedule.placement


@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda s: GPipe(chain(2), [1, 1], schedule=s, chunks=8), ValueError,
     "chunks=8, but schedule '1f1b' runs m=4 micro-batches: leave chunks out (it defaults to the schedule's m) or give "
     "chunks=4"),
    (lambda s: GPipe(chain(2), [1, 1], schedule=s, checkpoint="always"), ValueError,
     "checkpoint='always', but schedule '1f1b' was built for checkpoint='never'"),
    (lambda s: GPipe(chain(2), [1, 1], schedule=s, checkpoint="sometimes"), ValueError,
     "unknown checkpoint mode 'sometimes'"),
    (lambda s: GPipe(chain(3), [1, 1, 1], schedule=s), ValueError,
     "schedule '1f1b' has 2 stages, but the balance makes 3 partitions: give a balance of 2 partitions"),
    (lambda s: GPipe(chain(2), [1, 1], devices=["cpu"], schedule=s), ValueError, "too few devices"),
])
def test_a_schedule_that_disagrees_is_refused_naming_both(build: Callable[[Schedule], GPipe], error: type,
                                                          message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        build(one_f_one_b(4, 2))


def test_agreeing_arguments_are_accepted() -> None:
    pipe = GPipe(chain(2), [1, 1], devices=["cpu", "cpu"], schedule=one_f_one_b(4, 2), chunks=4, checkpoint="never")
    assert pipe.schedule == one_f_one_b(4, 2)


def test_a_deadlocking_schedule_is_refused_when_the_pipeline_is_built() -> None:
    deadlock = Schedule(2, 2, "never", (0, 1), (parse_tasks("F0@0 F1@0 B1@0 B0@0"), parse_tasks("B0@1 F0@1 F1@1 B1@1")),
                        name="stuck")
    with pytest.raises(ScheduleError, match="schedule 'stuck' deadlocks"):
        GPipe(chain(2), [1, 1], devices=["cpu", "cpu"], schedule=deadlock)


@pytest.mark.parametrize("step", [True, False])
def test_a_batch_smaller_than_the_schedule_is_refused(step: bool) -> None:
    pipe = GPipe(chain(2), [1, 1], devices=["cpu", "cpu"], schedule=gpipe(4, 2))
    x, y = torch.randn(3, 6), torch.randn(3, 3)
    with pytest.raises(ValueError, match=re.escape("this batch splits into 3 micro-batches, but schedule 'gpipe' is "
                                                  "fixed to m=4: give batches of at least 4 samples")):
        pipe.step(x, y, F.mse_loss) if step else pipe(x)
    assert pipe.step(torch.randn(4, 6), torch.randn(4, 3), F.mse_loss).isfinite()  # the pipeline still runs


def test_the_name_path_keeps_its_defaults() -> None:
    pipe = GPipe(chain(2), [1, 1], devices=["cpu", "cpu"], schedule="1f1b")
    assert (pipe.chunks, pipe.checkpoint, pipe.schedule_name) == (1, "except_last", "1f1b")
    assert pipe.schedule == SCHEDULES["1f1b"](1, 2, "except_last")
