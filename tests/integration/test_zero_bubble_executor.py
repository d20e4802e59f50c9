"""The executor trains ZB-H1 and ZB-H2 (four stages, four workers) and ZB-V (four stages in a V on two workers)
exactly like the plain model, under every checkpoint policy, each worker running its schedule's list in order; and
interleaved 1F1B with a micro-batch count that is no multiple of the devices, in rounds chosen by name."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES, Op, schedule_kind
from tests.gpipe.models import dropnet, mlp, skipnet


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("schedule", "devices", "placement"), [("zb-h1", 4, (0, 1, 2, 3)), ("zb-h2", 4, (0, 1, 2, 3)),
                                                               ("zb-v", 2, (0, 1, 1, 0))])
@pytest.mark.parametrize("build", [mlp, skipnet], ids=["mlp", "skipnet"])
def test_trains_like_the_plain_model(checkpoint: str, schedule: str, devices: int, placement: tuple[int, ...],
                                     build: Callable[[], nn.Sequential]) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    model = build()
    reference = copy.deepcopy(model)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    pipe = GPipe(model, [1, 1, 2, 1], devices=["cpu"] * devices, chunks=4, checkpoint=checkpoint, schedule=schedule,
                 record=True)
    assert pipe.schedule.placement == placement and pipe.schedule.splits_weight_gradient
    torch.testing.assert_close(pipe.step(x, y, nn.functional.mse_loss), expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    timeline = pipe.timeline
    assert timeline is not None and timeline.num_devices == devices
    assert sum(span.task.op is Op.W for span in timeline.spans) == 4 * 4
    for d in range(devices):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2", "zb-v"])
def test_dropout_draws_what_gpipe_draws(schedule: str) -> None:
    """Checkpointed dropout: the draws are a function of the task, so the split backward's gradients are GPipe's."""
    def grads(name: str, devices: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = dropnet()
        pipe = GPipe(model, [1, 1, 2, 1], devices=["cpu"] * devices, chunks=4, checkpoint="always", schedule=name)
        torch.manual_seed(1)
        pipe.step(torch.randn(8, 6), torch.randn(8, 8), nn.functional.mse_loss)
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    for ours, theirs in zip(grads(schedule, 2 if schedule == "zb-v" else 4), grads("gpipe", 4), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_zb_v_on_a_device_count_it_cannot_use_names_the_fix() -> None:
    with pytest.raises(ValueError, match="4 stages cannot go on 3 devices; give 2 devices"):
        GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"] * 3, schedule="zb-v")
    with pytest.raises(ValueError, match=r"5 stages cannot go on 2 devices; give an even number of stages \(4 or 6\)"):
        GPipe(mlp(), [1, 1, 1, 1, 1], devices=["cpu"] * 2, schedule="zb-v")
    pipe = GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"] * 2, chunks=4, schedule="zb-v")
    with pytest.raises(RuntimeError, match=r"train with pipe.step\(input, target, loss_fn\)"):
        pipe(torch.randn(8, 6))


@pytest.mark.parametrize(("schedule", "devices", "chunks"), [
    ("zb-h2", 4, 3),  # fewer micro-batches than stages: no B W F triple, W held back from the first B
    ("zb-h2", 4, 9),  # 2n - 1 = 7 and more: the triples, then the gap-free end
    ("interleaved-1f1b", 2, 5),  # rounds of p = 2, the last of one micro-batch
    ("interleaved-1f1b:round=3", 2, 5),  # rounds of 3: three, then two
    ("interleaved-1f1b:round=1", 2, 3),  # rounds below p - 1: the warm-up capped (Note [warm-up])
])
@pytest.mark.parametrize("checkpoint", ["except_last", "never"])
def test_any_micro_batch_count_trains_like_the_plain_model(schedule: str, devices: int, chunks: int,
                                                            checkpoint: str) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(9, 6), torch.randn(9, 3)
    model = mlp()
    reference = copy.deepcopy(model)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    pipe = GPipe(model, [1, 1, 2, 1], devices=["cpu"] * devices, chunks=chunks, checkpoint=checkpoint,
                 schedule=schedule, record=True)
    assert pipe.schedule == schedule_kind(schedule)(chunks, 4, checkpoint, devices=devices)  # type: ignore[arg-type]
    assert pipe.schedule.name == schedule
    torch.testing.assert_close(pipe.step(x, y, nn.functional.mse_loss), expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    timeline = pipe.timeline
    assert timeline is not None
    for d in range(devices):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])
