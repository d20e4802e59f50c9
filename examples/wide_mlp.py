"""A compute-heavy model for ``gpipe-sim compare`` on a GPU: 8 x (Linear(4096) + ReLU), batch 512.

Each layer's forward is 2 x 512 x 4096 x 4096 = 17 GFLOP, so a micro-batch's kernels run long past
their launch on a GPU; on two CPU cores a step takes seconds (use ``GPIPE_WIDE_MLP_WIDTH=512`` there)::

    gpipe-sim compare examples/wide_mlp.py:build --devices cuda:0 --balance 16 --chunks 4
    GPIPE_WIDE_MLP_WIDTH=512 gpipe-sim compare examples/wide_mlp.py:build --devices cpu,cpu
"""

from __future__ import annotations

import os

import torch
from torch import nn


def build() -> tuple[nn.Sequential, torch.Tensor]:
    """``(model, batch)`` for ``gpipe-sim compare``; the width comes from ``GPIPE_WIDE_MLP_WIDTH`` (default 4096)."""
    width = int(os.environ.get("GPIPE_WIDE_MLP_WIDTH", "4096"))
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(512, width)
