"""Train a pipeline with one process per stage: ``torchrun --nproc-per-node 2 examples/train_distributed.py``.

Every rank builds the model on the meta device and holds only its stage's layers; the first step's gradients
are checked against the whole model in one process (built by :func:`gpipe.distributed.materialize` from the
same seed), then a few SGD steps train it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from gpipe.distributed import DistributedGPipe, materialize


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def main() -> None:
    with torch.device("meta"):
        layers = model()
    pipe = DistributedGPipe(layers, balance=[3, 2], chunks=4, schedule="1f1b", checkpoint="except_last", seed=0)
    with torch.device("meta"):
        reference = materialize(model(), "cpu", seed=0)  # the same weights, whole, in this process
    torch.manual_seed(1)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    loss = pipe.step(x, y, nn.functional.mse_loss)  # x is read on rank 0, y on the last rank
    nn.functional.mse_loss(reference(x), y).backward()
    whole = dict(reference.named_parameters())
    equal = all(torch.allclose(p.grad, whole[name.split(".", 2)[2]].grad) for name, p in pipe.named_parameters())
    flags = torch.tensor([int(equal)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=pipe.ranks.control)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.1)
    losses = [loss.item()]
    for _ in range(5):
        optimizer.step()
        optimizer.zero_grad()
        losses.append(pipe.step(x, y, nn.functional.mse_loss).item())
    if pipe.rank == 0:
        verdict = "equal to" if flags.item() else "DIFFERENT from"
        print(f"first step: gradients on every rank {verdict} one process")
        print("losses:", " ".join(f"{v:.4f}" for v in losses))
    pipe.close()
    dist.destroy_process_group()
    if not flags.item():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
