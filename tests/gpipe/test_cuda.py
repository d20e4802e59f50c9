"""The executor on CUDA devices: the same checks as on CPU, with several partitions sharing one GPU if need be:
every schedule (several stages per worker where it places them so) and the split backward included.

Skipped without a GPU; unchanged on one (``pytest -m cuda``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.autograd.split_backward import backward_input
from gpipe.schedule import CHECKPOINT_MODES, Op, schedule_kind
from tests.gpipe.models import convnet, mlp, skipnet
from tests.gpipe.test_split_backward import _Matmuls

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _devices(n: int) -> list[str]:
    count = torch.cuda.device_count()
    return [f"cuda:{j % count}" for j in range(n)]


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("chunks", [1, 4])
def test_transparency_on_cuda(chunks: int, checkpoint: str) -> None:
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model).cuda()
    pipe = GPipe(model, [1, 2, 2], devices=_devices(3), chunks=chunks, checkpoint=checkpoint)
    x = torch.randn(9, 6, device=pipe.devices[0], requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = pipe(x)
    assert out.device == pipe.devices[-1]
    expected = reference(x_ref)
    torch.testing.assert_close(out, expected.to(out.device))
    out.square().sum().backward()
    expected.square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad.to(p.device))
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_cuda_timeline_holds_the_schedule() -> None:
    torch.manual_seed(0)
    pipe = GPipe(convnet(), [2, 3], devices=_devices(2), chunks=4, deferred_batch_norm=True, record=True)
    pipe(torch.randn(8, 2, 5, 5, device=pipe.devices[0])).sum().backward()
    timeline = pipe.timeline
    assert timeline is not None
    for d in range(2):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])
    assert timeline.makespan > 0
    assert all(s.end >= s.start for s in timeline.spans)


def test_cpu_and_cuda_mixed() -> None:
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    pipe = GPipe(model, [2, 3], devices=["cpu", "cuda:0"], chunks=3, record=True)
    x = torch.randn(6, 6)
    out = pipe(x)
    torch.testing.assert_close(out.cpu(), reference(x))
    out.sum().backward()
    assert pipe.timeline is not None and pipe.timeline.copy_spans()


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_cuda_memory_samples_mean_what_they_mean_on_cpu(checkpoint: str) -> None:
    """Bytes saved for backward are counted by the same hooks on CUDA as on CPU: the same samples, the same peaks;
    the allocator's own peak comes beside them in the meta."""
    peaks = {}
    for devices in (["cpu", "cpu"], _devices(2)):
        torch.manual_seed(0)
        pipe = GPipe(mlp(), [2, 3], devices=devices, chunks=3, checkpoint=checkpoint, record=True)
        pipe(torch.randn(9, 6, device=pipe.devices[0])).square().sum().backward()
        timeline = pipe.timeline
        assert timeline is not None
        peaks[devices[0]] = [timeline.peak_memory(d) for d in range(2)]
        if devices[0] != "cpu":
            assert set(timeline.meta["allocator_peak_bytes"]) == {str(torch.device(d)) for d in devices}
            assert all(b > 0 for b in timeline.meta["allocator_peak_bytes"].values())
    cpu, cuda = peaks.values()
    assert cuda == cpu and all(b > 0 for b in cpu)


def test_random_draws_equal_under_every_policy_on_cuda() -> None:
    """Note [random state]: dropout, F.dropout, rand_like, bernoulli and a custom op on CUDA devices (partitions
    sharing one GPU share its generator), equal under every policy, schedule and repeat."""
    from tests.gpipe.models import dropnet

    def grads(checkpoint: str, schedule: str) -> torch.Tensor:
        torch.manual_seed(0)
        model = dropnet()
        pipe = GPipe(model, [2, 1, 2], devices=_devices(3), chunks=4, checkpoint=checkpoint, schedule=schedule)
        x = torch.randn(8, 6, device=pipe.devices[0])
        torch.manual_seed(1)
        pipe.step(x, torch.zeros(8, 8, device=pipe.devices[-1]), torch.nn.MSELoss())
        return torch.cat([p.grad.flatten().cpu() for p in model.parameters()])

    reference = grads("never", "gpipe")
    for schedule in ("gpipe", "1f1b"):
        for checkpoint in CHECKPOINT_MODES:
            torch.testing.assert_close(grads(checkpoint, schedule), reference)


def _placed(schedule: str) -> list[str]:
    """The devices the CPU tests give ``schedule`` (two workers for one with a layout, else four), all on the GPUs
    there are: on one GPU every worker issues to ``cuda:0``."""
    return _devices(2 if schedule_kind(schedule).place is not None else 4)


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "looped-bfs", "zb-h1", "zb-v", "dualpipe-v"])
@pytest.mark.parametrize("build", [mlp, skipnet], ids=["mlp", "skipnet"])
def test_every_schedule_trains_like_the_plain_model_on_cuda(checkpoint: str, schedule: str,
                                                            build: Callable[[], nn.Sequential]) -> None:
    """Four stages, four micro-batches, several stages per worker where the schedule places them so: the loss and
    every gradient equal the plain model's on the GPU, and each worker's CUDA-event spans follow its list."""
    torch.manual_seed(0)
    model = build().cuda()
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 6, device="cuda"), torch.randn(8, 3, device="cuda")
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    pipe = GPipe(model, [1, 1, 2, 1], devices=_placed(schedule), chunks=4, checkpoint=checkpoint, schedule=schedule,
                 record=True)
    loss = pipe.step(x, y, nn.functional.mse_loss)
    torch.testing.assert_close(loss.to(expected.device), expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad.to(p.device))
    timeline = pipe.timeline
    assert timeline is not None and timeline.num_devices == pipe.schedule.num_devices
    for d in range(timeline.num_devices):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])
    assert any(s.task.op is Op.W for s in timeline.spans) == pipe.schedule.splits_weight_gradient


def test_split_backward_on_cuda_runs_one_backward_and_gives_its_gradients() -> None:
    """gpipe.autograd.split_backward on the GPU: B's input gradient and W's weight gradients equal the plain backward's,
    and B + W run each of its matrix multiplies once (Note [split backward] in gpipe.autograd.split_backward)."""
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).cuda()
    x, grad = torch.randn(4, 8, device="cuda", requires_grad=True), torch.randn(4, 8, device="cuda")
    out = stage(x)
    with _Matmuls() as plain:
        out.backward(grad)
    expected = [p.grad.clone() for p in stage.parameters()]  # type: ignore[union-attr]
    stage.zero_grad(set_to_none=True)
    leaf = x.detach().requires_grad_()
    out = stage(leaf)
    with _Matmuls() as b:
        (found,), kept = backward_input([out], [grad], [leaf], list(stage.parameters()))
    assert all(p.grad is None for p in stage.parameters())
    with _Matmuls() as w:
        kept.accumulate()
    torch.testing.assert_close(found, x.grad)
    for p, q in zip(stage.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, q)
    assert b.count + w.count == plain.count == 6 and b.count == 3
