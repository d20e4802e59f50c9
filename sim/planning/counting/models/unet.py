"""U-Net (B, C) as a flat ``nn.Sequential``: the simplified U-Net that torchgpipe benchmarks.

Five levels down and five up (Ronneberger et al., 2015, with a fifth level); ``B`` stacked convolutions
in every block and ``C`` channels at the top level, doubling per level down::

    [encode 0]-stash----------------------------pop-[decode 0]-[segment]
       [encode 1]-stash------------------pop-[decode 1]
          ...                               ...
             [encode 4]-stash--pop-[decode 4]
                     [bottleneck]

A convolution unit is four layers, conv 3x3 (no bias), channel dropout (p=0.1), instance norm and
leaky ReLU; an encoder level is ``B`` units, a stash and a 2x2 max pool; a decoder level is a 2x
upsample, a pop that concatenates the stashed tensor, and ``B`` units. So the sequential has
``44·B + 21`` layers (torchgpipe's pipeline balances count the same: 505 for B=11, 1077 for B=24).
The long skips travel as a tuple (see :mod:`sim.planning.counting.models.layers`): a stash appends the activation,
a pop takes the last one back. Input: ``(N, 3, 192, 192)`` images, as torchgpipe's U-Net benchmarks.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.counting.models.layers import Fork, OnFirst
from sim.planning.counting.models.limits import check_unet_size

__all__ = ["PopCat", "check_unet", "unet", "unet_sample"]

DEPTH = 5  # levels of the U


class PopCat(nn.Module):
    """Ends the innermost open skip: ``(x, *skips, s) -> (cat(x, s), *skips)``; a bare tensor if none are left."""

    def forward(self, x: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out, skip, rest = x[0], x[-1], x[1:-1]
        if out.shape[2:] != skip.shape[2:]:  # odd sizes lose a row or column on the way down
            dh, dw = skip.shape[2] - out.shape[2], skip.shape[3] - out.shape[3]
            out = F.pad(out, (0, dw, 0, dh))
        joined = torch.cat((out, skip), dim=1)
        return (joined, *rest) if rest else joined


def _units(prefix: str, c_in: int, c_mid: int, c_out: int, count: int) -> list[tuple[str, nn.Module]]:
    """``count`` convolution units, c_in -> c_mid -> ... -> c_mid -> c_out, four layers each."""
    layers: list[tuple[str, nn.Module]] = []
    for k in range(count):
        a = c_in if k == 0 else c_mid
        b = c_out if k == count - 1 else c_mid
        layers += [
            (f"{prefix}_conv{k}", OnFirst(nn.Conv2d(a, b, 3, padding=1, bias=False))),
            (f"{prefix}_drop{k}", OnFirst(nn.Dropout2d(p=0.1))),
            (f"{prefix}_norm{k}", OnFirst(nn.InstanceNorm2d(b))),
            (f"{prefix}_relu{k}", OnFirst(nn.LeakyReLU(negative_slope=1e-2))),
        ]
    return layers


def check_unet(blocks: int, channels: int) -> None:
    """Raise ``ValueError`` unless B >= 1 and C is even and >= 2 (the last decoder level has C/2), both within the
    planner's caps (Note [size caps] in :mod:`sim.planning.counting.models.limits`)."""
    if blocks < 1 or channels < 2 or channels % 2:
        raise ValueError(f"U-Net needs B >= 1 and an even C >= 2, got B={blocks}, C={channels}")
    check_unet_size(blocks, channels)


def unet(blocks: int = 5, channels: int = 64, in_channels: int = 3, out_channels: int = 1) -> nn.Sequential:
    """U-Net (B, C): ``blocks`` = B convolutions per block, ``channels`` = C at the top level.

    Raises:
        ValueError: see :func:`check_unet`.
    """
    check_unet(blocks, channels)
    c = channels
    layers: list[tuple[str, nn.Module]] = []
    for i in range(DEPTH):
        c_in = in_channels if i == 0 else c * 2 ** (i - 1)
        layers += _units(f"encode{i}", c_in, c * 2**i, c * 2**i, blocks)
        layers += [(f"encode{i}_stash", Fork()), (f"encode{i}_down", OnFirst(nn.MaxPool2d(2, stride=2)))]
    layers += _units("bottleneck", c * 2 ** (DEPTH - 1), c * 2**DEPTH, c * 2 ** (DEPTH - 1), blocks)
    for i in reversed(range(DEPTH)):
        layers += [(f"decode{i}_up", OnFirst(nn.Upsample(scale_factor=2))), (f"decode{i}_pop", PopCat())]
        c_out = c * 2 ** (i - 1) if i > 0 else c // 2
        layers += _units(f"decode{i}", c * 2 ** (i + 1), c_out, c_out, blocks)
    layers.append(("segment", nn.Conv2d(c // 2, out_channels, 1, bias=False)))
    return nn.Sequential(OrderedDict(layers))


def unet_sample(batch: int, size: int = 192, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of images, ``(batch, 3, size, size)``; random on a real device."""
    if str(device) == "meta":
        return torch.empty(batch, 3, size, size, device="meta")
    return torch.rand(batch, 3, size, size, device=device)
