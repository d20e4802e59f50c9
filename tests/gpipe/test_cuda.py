"""The executor on CUDA devices: the same checks as on CPU, with several partitions sharing one GPU if need be.

Skipped without a GPU; unchanged on one (``pytest -m cuda``).
"""

from __future__ import annotations

import copy

import pytest
import torch

from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES
from tests.gpipe.models import convnet, mlp

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
