"""A torchgpipe training script, unchanged but for the imports.

With torchgpipe this script began::

    from torchgpipe import GPipe, is_recomputing
    from torchgpipe.balance import balance_by_time
    from torchgpipe.skip import Namespace, pop, skippable, stash

Everything below the imports is torchgpipe code: a residual block whose skip connection crosses
partitions, batch norm deferred to the mini-batch, balance by time, ``model.devices[0]`` and
``model.devices[-1]`` for the input and the target, an optimizer step.

Run: ``python examples/torchgpipe_example.py`` (CPU devices here; CUDA devices when there are two).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpipe import GPipe, is_recomputing
from gpipe.balance import balance_by_time
from gpipe.skip import Namespace, pop, skippable, stash


@skippable(stash=["residual"])
class Fork(nn.Module):
    def forward(self, x):
        yield stash("residual", x)
        return x


@skippable(pop=["residual"])
class Merge(nn.Module):
    def forward(self, x):
        residual = yield pop("residual")
        return F.relu(x + residual)


class Trace(nn.Module):
    """Counts forwards, not recomputes, as a layer that must not do its work twice would."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        if not is_recomputing():
            self.calls += 1
        return x


def block(width, ns):
    return [Fork().isolate(ns), nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), Merge().isolate(ns)]


def build(width=8, classes=10):
    layers = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU()]
    for _ in range(2):
        layers += block(width, Namespace())
    layers += [Trace(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)]
    return nn.Sequential(*layers)


def main(steps=3, batch=16, chunks=4):
    torch.manual_seed(0)
    model = build()
    sample = torch.randn(batch // chunks, 3, 16, 16)
    balance = balance_by_time(2, model, sample, device="cpu", timeout=0.2)
    devices = ["cuda:0", "cuda:1"] if torch.cuda.device_count() >= 2 else ["cpu", "cpu"]
    model = GPipe(model, balance, devices=devices, chunks=chunks, deferred_batch_norm=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    in_device, out_device = model.devices[0], model.devices[-1]
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, 3, 16, 16, device=in_device)
        y = torch.randint(0, 10, (batch,), device=out_device)
        output = model(x)
        loss = F.cross_entropy(output, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    trace = next(layer for layer in model if isinstance(layer, Trace))
    print(f"balance {balance}, losses {[round(v, 4) for v in losses]}, forwards counted {trace.calls}")
    return model, losses, trace.calls


if __name__ == "__main__":
    main()
