"""Train two replicas of a two-stage pipeline: ``torchrun --nproc-per-node 4 examples/train_replicated.py``.

The four ranks form a ``(pp, dp) = (2, 2)`` device mesh: each replica's pipeline runs on two ranks, and each stage's
gradients are all-reduced with its other replica in buckets during the backward. Each replica reads its own half of
the global batch, as with ``DistributedDataParallel``; the first step's gradients are checked against the whole model
in one process on the whole batch, then a few SGD steps train it, and rank 0 prints the recorded collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from gpipe.distributed import DistributedGPipe, materialize
from gpipe.schedule.timeline import COLLECTIVE


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def main() -> None:
    with torch.device("meta"):
        layers = model()
    pipe = DistributedGPipe(layers, balance=[3, 2], chunks=4, schedule="1f1b", checkpoint="except_last", seed=0,
                            data_parallel=2, record=True)
    assert pipe.replicas is not None
    with torch.device("meta"):
        reference = materialize(model(), "cpu", seed=0)  # the same weights, whole, in this process
    torch.manual_seed(1)
    x, y = torch.randn(64, 16), torch.randn(64, 4)  # the global batch: each replica takes its half
    mine = slice(32 * pipe.replicas.replica, 32 * (pipe.replicas.replica + 1))
    loss = pipe.step(x[mine], y[mine], nn.functional.mse_loss)  # read on the replica's first and last stage's rank
    nn.functional.mse_loss(reference(x), y).backward()
    whole = dict(reference.named_parameters())
    equal = all(torch.allclose(p.grad, whole[name.split(".", 2)[2]].grad, atol=1e-6)
                for name, p in pipe.named_parameters())
    flags = torch.tensor([int(equal)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=pipe.replicas.control)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.1)
    losses = [loss.item()]
    for _ in range(5):
        optimizer.step()
        optimizer.zero_grad()
        losses.append(pipe.step(x[mine], y[mine], nn.functional.mse_loss).item())
    timeline = pipe.gather_timeline()  # replica r's schedule device d is device 2 r + d
    if timeline is not None:
        verdict = "equal to" if flags.item() else "DIFFERENT from"
        print(f"first step: gradients on every rank {verdict} one process")
        print("losses:", " ".join(f"{v:.4f}" for v in losses))
        for s in sorted((s for s in timeline.spans if s.stream == COLLECTIVE), key=lambda s: (s.device, s.start)):
            print(f"device {s.device}: {s.name} at {1e3 * s.start:.2f} ms for {1e3 * s.duration:.2f} ms")
    pipe.close()
    dist.destroy_process_group()
    if not flags.item():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
