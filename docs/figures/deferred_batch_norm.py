"""The figure of "Deferred batch norm" (docs/concepts/deferred-batch-norm.md): real layers, no executor."""

from __future__ import annotations

from pathlib import Path

from figures import figure
from figures.common import save


# --8<-- [start:deferred_bn]
@figure("deferred_bn.png")
def deferred_bn(path: Path) -> None:
    """Running mean of one channel over training steps: plain batch norm fed micro-batches, deferred batch norm,
    and the un-pipelined model (batch norm on the whole mini-batch). Real layers, no executor needed."""
    import matplotlib.pyplot as plt
    import torch
    from torch import nn

    from gpipe.batchnorm import DeferredBatchNorm

    steps, batch, chunks = 30, 32, 8
    generator = torch.Generator().manual_seed(0)
    data = [1.0 + 2.0 * torch.randn(batch, 1, generator=generator) for _ in range(steps)]  # mean 1, std 2
    whole, plain, deferred = nn.BatchNorm1d(1), nn.BatchNorm1d(1), DeferredBatchNorm(1, chunks=chunks)
    curves: dict[str, list[float]] = {"whole": [0.0], "plain": [0.0], "deferred": [0.0]}
    with torch.no_grad():
        for x in data:
            whole(x)
            for piece in x.chunk(chunks):
                plain(piece)
                deferred(piece)
            for name, layer in (("whole", whole), ("plain", plain), ("deferred", deferred)):
                assert layer.running_mean is not None
                curves[name].append(float(layer.running_mean[0]))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = range(steps + 1)
    ax.plot(xs, curves["whole"], color="#4c72b0", lw=2.5, alpha=0.5, label="un-pipelined: BatchNorm on the mini-batch")
    ax.plot(xs, curves["deferred"], "o", color="#4c72b0", ms=3.5,
            label=f"pipelined, DeferredBatchNorm (chunks={chunks}): one update per step")
    ax.plot(xs, curves["plain"], color="#dd8452", lw=1.4,
            label=f"pipelined, plain BatchNorm: {chunks} updates per step")
    ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("training step")
    ax.set_ylabel("running_mean (true mean 1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    gap = max(abs(a - b) for a, b in zip(curves["whole"], curves["deferred"], strict=True))
    ax.set_title(f"Running mean, momentum 0.1, mini-batch {batch}: deferred vs un-pipelined differ by at most "
                 f"{gap:.0e}", fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:deferred_bn]
